"""What a window asset reports to Dagster, per partition, checked against what Wire committed
(issue 25 items 3, 4 and 7), without `dagster dev`.

Pure (no store): the check verdicts and their reasons (final / provisional / not ready, the
event-time lag newest event − W, conservation, dead-letter rate), the per-epoch progress line,
a stream's report advancing only forward, and the chart's series (event times per stream and
segment, integer epochs, the lag).

Against the embedded S3 server and local Spark, the pipeline's own Dagster job in process:

1. A run of one partition: for every window its metadata holds the partition's own rows (equal
   to the manifest's file and to the published Parquet copy `dagster/uri` names), the window's
   rows over all partitions (`dagster/row_count`), the column schema of the published file, W
   and the epoch as numbers, and the counts of the epoch that wrote the partition (labelled as
   that epoch's); the stream asset is reported with the chunks the epoch read; every check is
   evaluated for that partition, with a description; the run log has one INFO line per epoch;
   the chart's Markdown is short enough to render inline and its link serves the PNG.
2. A run of a range of three partitions after late events: one materialization and one
   evaluation per check for each partition, each with its own rows; no planned check left
   unevaluated (no "Skipped").
3. The checks alone, with no partition (the UI's "Execute all"): commits nothing, evaluates every
   partition holding results plus one summary per check.
4. A stage over that window (a derived stream): its window depends on the upstream window (which
   depends on the stream's asset), reports its partition's rows and checks, and no stream.
"""

from __future__ import annotations

import io
import json
import sys
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from wire_dagster.manifest import Counts, FileRef, Manifest, SegmentRecord
from wire_dagster.spec import pipeline_from_dict

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
M = 60_000
PIPELINE = {
    "name": "am",
    "stream": "am_s",
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
    "lateness": {"allowed": "10s"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-01T01:00:00Z",
    "windows": [
        {"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"n": "count", "total": "sum(amount)"}},
        {"name": "two_min", "type": "sliding", "size": "2m", "slide": "1m", "aggregates": {"n": "count"}},
    ],
    "dagster": {"max_watermark_lag": "30s"},
}


def key_of(p: int) -> str:
    return datetime.fromtimestamp(p / 1000, tz=UTC).strftime("%Y-%m-%d-%H:%M")


def manifest(epoch: int, w: int, segments: dict[str, tuple[int, int]], counts: Counts, **kw) -> Manifest:
    """A hand-made manifest: segments name -> (chunks read, newest event time)."""
    return Manifest(
        pipeline="am",
        epoch=epoch,
        previous=epoch - 1 if epoch > 1 else None,
        run_id=f"r{epoch}",
        fingerprint="f",
        config={},
        remap={s: n for s, (n, _) in segments.items()},
        segments={s: SegmentRecord(next_seq=n, max_t=t, last_ingest=t + 5) for s, (n, t) in segments.items()},
        segment_watermarks={s: w for s in segments},
        decisions={},
        watermark=w,
        prev_watermark=w - 1,
        counts=counts,
        totals=kw.pop("totals", counts),
        **kw,
    )


# -- pure ----------------------------------------------------------------------------------------


def test_partition_complete_says_why() -> None:
    from wire_dagster.assetview import check_partition_complete

    spec = pipeline_from_dict(PIPELINE)
    c = Counts()
    p = T0 + 2 * M
    final = check_partition_complete(spec, manifest(1, p + M + 10_000, {"0": (1, p + M + 12_000)}, c), p)
    assert final.passed and final.description.startswith("final: W = 2026-01-01T00:03:10.000Z >= ")
    prov = check_partition_complete(spec, manifest(1, p + M + 9_999, {"0": (1, p + M + 12_000)}, c), p)
    assert not prov.passed and prov.metadata["status"] == "provisional"
    assert "late events may still change it" in prov.description and "2026-01-01T00:03:10.000Z" in prov.description
    early = check_partition_complete(spec, manifest(1, p + 5, {"0": (1, p + 7)}, c), p)
    assert not early.passed and early.description.startswith("not ready: W = 2026-01-01T00:02:00.005Z < ")


def test_one_meaning_of_lag_newest_event_minus_w() -> None:
    from wire_dagster.assetview import check_watermark_lag, lag_ms
    from wire_dagster.timeutil import INF

    spec = pipeline_from_dict(PIPELINE)  # max_watermark_lag 30 s
    # Year-old data replayed: the wall clock plays no part, only the stream's own newest event.
    m = manifest(3, T0 + 10 * M, {"0": (4, T0 + 10 * M + 20_000), "1": (2, T0 + 10 * M + 45_000)}, Counts())
    assert lag_ms(m) == 45_000
    v = check_watermark_lag(spec, m)
    assert not v.passed and v.metadata["lag_s"] == 45.0 and v.metadata["max_lag_s"] == 30.0
    assert v.description.startswith("event-time lag of the watermark (newest event read - W) = 45 s > 30 s")
    ok = check_watermark_lag(spec, manifest(3, T0, {"0": (1, T0 + 29_000)}, Counts()))
    assert ok.passed and "29 s <= 30 s" in ok.description
    closed = check_watermark_lag(spec, manifest(4, INF, {"0": (5, T0 + 99 * M)}, Counts()))
    assert closed.passed and closed.description == "no lag: the stream is closed (W = +inf)"


def test_conservation_and_dead_letter_rate_name_the_numbers() -> None:
    from wire_dagster.assetview import check_conservation, check_dead_letter_rate

    spec = pipeline_from_dict(PIPELINE)
    good = Counts(
        events_in=10, counted={"per_minute": 7, "two_min": 8}, late={"per_minute": 2, "two_min": 1}, duplicate=1
    )
    v = check_conservation(manifest(2, T0, {"0": (1, T0)}, good))
    assert v.passed and "epoch 2 (10 in)" in v.description
    assert v.metadata["epoch_counts"]["counted"] == {"per_minute": 7, "two_min": 8}
    bad = good.model_copy(update={"counted": {"per_minute": 6, "two_min": 8}})
    v = check_conservation(manifest(2, T0, {"0": (1, T0)}, bad))
    assert not v.passed
    assert "epoch 2: per_minute: in 10 != counted 6 + late 2 + duplicate 1 + malformed 0 + filtered 0 = 9" in (
        v.description
    )
    rate = check_dead_letter_rate(spec, manifest(2, T0, {"0": (1, T0)}, good))  # 1 duplicate + 2 late (max)
    assert not rate.passed and rate.metadata["dead_letters"] == 3
    assert "dead letters / events since epoch 0 = 3 / 10 = 30.00% > 25.00%" in rate.description


def test_epoch_line_is_a_streaming_progress_line() -> None:
    from wire_dagster.assetview import epoch_line

    out = {
        "per_minute": {
            str(T0): FileRef(key="a", sha256="x", rows=3, bytes=10, epoch=2),
            str(T0 + M): FileRef(key="b", sha256="y", rows=4, bytes=10, epoch=1),
        }
    }
    state = {"per_minute": FileRef(key="s", sha256="z", rows=12, bytes=2_400, epoch=2)}
    c = Counts(
        events_in=1500, counted={"per_minute": 1490}, late={"per_minute": 4}, duplicate=3, malformed=2, filtered=1
    )
    m = manifest(2, T0 + M + 5_000, {"0": (3, T0 + M + 9_000)}, c, outputs=out, state=state, chunks={"0": [1, 2]})
    line = epoch_line(m, 0.5)
    assert line.startswith("epoch 2 committed (segment 0: chunks 1–2): 1,500 events in, counted 1,490, late 4, ")
    assert "duplicate 3, malformed 2, filtered 1; 3 rows in 1 partition files; 3,000 events/s in 0.50 s;" in line
    assert "W 2026-01-01T00:01:05.000Z (lag 4 s); state 12 rows / 2.4 kB" in line


def test_a_stream_report_only_moves_forward() -> None:
    from wire_dagster.assetview import advance_stream

    a = {"0": {"chunks": 3, "sealed": False, "newest_event_ms": 30, "last_chunk_ms": 31}}
    first = advance_stream(None, a)
    assert first is not None and first["segments"]["0"]["chunks"] == 3
    assert advance_stream(first["segments"], a) is None  # a second reader at the same offsets
    behind = {"0": {"chunks": 2, "sealed": False, "newest_event_ms": 20, "last_chunk_ms": 21}}
    assert advance_stream(first["segments"], behind) is None  # a slower reader never reports it back
    other = {"1": {"chunks": 1, "sealed": True, "newest_event_ms": 50, "last_chunk_ms": 51}}
    both = advance_stream(first["segments"], other)
    assert both is not None and both["segments"] == {**first["segments"], **other}
    assert both["version"] != first["version"]


def test_chart_series_event_time_per_stream_and_segment() -> None:
    from wire_dagster.status import chart_series
    from wire_dagster.timeutil import INF, NEG_INF

    union = pipeline_from_dict(
        {
            **{k: v for k, v in PIPELINE.items() if k not in ("stream", "event")},
            "inputs": [
                {"name": "web", "stream": "web_s", "time": "ts", "id": "eid", "key": "user"},
                {"name": "app", "stream": "app_s", "time": "ts", "id": "eid", "key": "user"},
            ],
        }
    )

    def seg(wm: int, t: int) -> dict:
        return {"wm": wm, "max_t": t, "ingest": t + 1}

    hist = [
        {"epoch": 1, "watermark": NEG_INF, "segments": {"web.0": seg(T0, T0 + 5_000)}},
        {
            "epoch": 2,
            "watermark": T0 + M,
            "segments": {"web.0": seg(T0 + 2 * M, T0 + 2 * M + 2_000), "web.1": seg(T0 + M, T0 + M + 500)},
        },
        {"epoch": 3, "watermark": INF, "segments": {"web.0": seg(INF, T0 + 3 * M), "app.0": seg(INF, T0 + 4 * M)}},
    ]
    s = chart_series(union, hist)
    assert s["epochs"] == [1, 2, 3] and s["closed_at"] == 3
    web, app = s["streams"]["web_s"], s["streams"]["app_s"]
    assert web["watermark"] == [T0, T0 + M, None]  # the minimum over its segments; +inf is not drawn
    assert web["newest_event"] == [T0 + 5_000, T0 + 2 * M + 2_000, T0 + 3 * M]
    assert web["lag"] == [5_000, M + 2_000, None]
    assert set(web["segments"]) == {"web.0", "web.1"} and web["segments"]["web.1"] == [None, T0 + M, None]
    assert app["watermark"] == [None, None, None] and app["newest_event"] == [None, None, T0 + 4 * M]


# -- in process, against the store ---------------------------------------------------------------


def _events(lo_ms: int, hi_ms: int, step: int, tag: str) -> list[dict]:
    return [
        {"user": f"u{i % 2}", "ts": t, "amount": i % 5, "eid": f"{tag}{i}"}
        for i, t in enumerate(range(lo_ms, hi_ms, step))
    ]


def _produce(store, spec, tmp: Path, name: str, events: list[dict], segment: str) -> None:
    from wire_dagster.streams import produce

    f = tmp / f"{name}.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    produce(store, spec, f, segment=segment)


def _meta(entry) -> object:
    return getattr(entry, "value", entry)


def _mats(instance, run_id: str, key) -> dict[str | None, dict]:
    import dagster as dg

    recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(key)), limit=1000).records
    out: dict[str | None, dict] = {}
    for r in recs:
        m = r.event_log_entry.asset_materialization
        if r.event_log_entry.run_id == run_id and m is not None:
            out[m.partition] = {k: _meta(v) for k, v in m.metadata.items()} | {"_tags": dict(m.tags or {})}
    return out


def _checks(instance, key, name: str) -> list:
    import dagster as dg

    return instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(dg.AssetKey(key), name), limit=1000
    )


@pytest.fixture
def am(store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster-home"))
    monkeypatch.setenv("WIRE_SPARK_MASTER", "local[2]")
    monkeypatch.delenv("WIRE_SPARK_REMOTE", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    (tmp_path / "dagster-home").mkdir()
    pdir = tmp_path / "pipelines"  # where a derived stage finds its upstream pipeline by name
    pdir.mkdir()
    (pdir / "am.yaml").write_text(yaml.safe_dump(PIPELINE))
    monkeypatch.setenv("WIRE_PIPELINES", str(pdir))
    return pipeline_from_dict(PIPELINE)


def test_window_metadata_per_partition_matches_what_is_committed(
    store, spark, am, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dagster as dg

    from definitions import build_definitions
    from sensors import job_name
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.status import partition_range

    spec = am
    cp = Checkpoints(store, spec.name)
    _produce(store, spec, tmp_path, "a0", _events(T0, T0 + 4 * M, 3_000, "a"), "0")
    _produce(store, spec, tmp_path, "a1", _events(T0 + 1_000, T0 + 4 * M, 7_000, "b"), "1")
    defs = build_definitions(pipelines=[spec])
    job = defs.resolve_job_def(job_name(spec))
    instance = dg.DagsterInstance.ephemeral()

    # 1. One partition.
    p0 = T0
    res = job.execute_in_process(instance=instance, partition_key=key_of(p0))
    assert res.success
    m = cp.latest()
    assert m is not None and m.epoch >= 1
    for w in spec.windows:
        got = _mats(instance, res.run_id, [spec.name, w.name])[key_of(p0)]
        ref = m.outputs[w.name][str(p0)]
        assert got["rows"] == got["dagster/partition_row_count"] == ref.rows > 0
        assert got["dagster/row_count"] == sum(r.rows for r in m.outputs[w.name].values()) > ref.rows
        published = cp.published_key(w.name, p0)
        assert got["dagster/uri"] == f"s3://{store.bucket}/{published}"
        table = pq.read_table(io.BytesIO(store.get(published)))
        assert table.num_rows == ref.rows
        assert [c.name for c in got["dagster/column_schema"].columns] == table.column_names
        assert got["epoch"] == m.epoch and got["written_by_epoch"] == ref.epoch
        assert got["watermark"].startswith("2026-01-01T00:03:5") and got["watermark_time"] == m.watermark / 1000
        wc = got["writer_epoch_counts"]
        assert wc["epoch"] == ref.epoch and wc["events_in"] == cp.load(ref.epoch).counts.events_in
        assert "not this partition alone" in wc["scope"]
        assert got["_tags"]["dagster/data_version"] == ref.sha256[:32]
        assert got["_tags"]["dagster/input_data_version/streams/am_s"] == "INITIAL"  # the stream: no version
        md = got["watermark_chart"]
        assert isinstance(md, str) and len(md) < 1000 and md.startswith("![watermarks in event time")
        url = md[md.index("](") + 2 : -1]
        assert store.cfg.secret_key not in url and store.cfg.access_key in url  # the key id, never the secret
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.read(8) == b"\x89PNG\r\n\x1a\n"
    stream = _mats(instance, res.run_id, ["streams", "am_s"])[None]
    assert {s: v["chunks"] for s, v in stream["segments"].items()} == {s: r.next_seq for s, r in m.segments.items()}
    assert stream["chunks"] == sum(r.next_seq for r in m.segments.values()) and stream["reported_by"] == "am"
    for w in spec.windows:
        (ev,) = _checks(instance, [spec.name, w.name], "partition_complete")
        assert ev.partition == key_of(p0) and ev.status.value == "SUCCEEDED", ev
        assert ev.evaluation.description.startswith("final: W = ")
    for name in ("watermark_lag", "conservation", "dead_letter_rate"):
        (ev,) = _checks(instance, [spec.name, "dead_letters"], name)
        assert ev.partition == key_of(p0) and ev.evaluation.description, (name, ev)
    logs = [e.user_message for e in instance.all_logs(res.run_id) if e.level == 20]
    lines = [ln for ln in logs if " committed (" in ln and " events in, " in ln]
    assert [int(ln.split()[1]) for ln in lines] == cp.committed(), logs

    # 2. Late events and more, then a range of three partitions in one run.
    _produce(store, spec, tmp_path, "late", _events(T0 + 10_000, T0 + 20_000, 5_000, "late"), "1")
    _produce(store, spec, tmp_path, "more", _events(T0 + 4 * M, T0 + 6 * M, 4_000, "c"), "0")
    tags = {"dagster/asset_partition_range_start": key_of(T0), "dagster/asset_partition_range_end": key_of(T0 + 2 * M)}
    monkeypatch.setenv("WIRE_CHART_LINKS", "0")  # no presigned link: the chart by its path only
    res = job.execute_in_process(instance=instance, tags=tags)
    assert res.success
    monkeypatch.delenv("WIRE_CHART_LINKS")
    m = cp.latest()
    assert m is not None and m.counts.late.get("per_minute", 0) >= 1
    parts = [T0, T0 + M, T0 + 2 * M]
    for w in spec.windows:
        got = _mats(instance, res.run_id, [spec.name, w.name])
        assert set(got) == {key_of(p) for p in parts}
        for p in parts:
            assert got[key_of(p)]["rows"] == m.outputs[w.name][str(p)].rows
            assert "watermark_chart" not in got[key_of(p)] and got[key_of(p)]["watermark_chart_path"]
            # As the output path records it: no partition is "unsynced" by the stream's growth.
            assert got[key_of(p)]["_tags"]["dagster/input_data_version/streams/am_s"] == "INITIAL"
        evs = [e for e in _checks(instance, [spec.name, w.name], "partition_complete") if e.run_id == res.run_id]
        assert sorted(e.partition for e in evs) == [key_of(p) for p in parts]
    for name in ("watermark_lag", "conservation", "dead_letter_rate", "partition_complete"):
        key = [spec.name, "dead_letters" if name != "partition_complete" else "per_minute"]
        assert all(e.status.value in ("SUCCEEDED", "FAILED") for e in _checks(instance, key, name)), name

    # 3. The checks alone, no partition: nothing committed, every partition with results evaluated.
    epoch = m.epoch
    keys = set(defs.get_repository_def().asset_graph.asset_check_keys)
    res = job.get_subset(asset_selection=set(), asset_check_selection=keys).execute_in_process(instance=instance)
    assert res.success
    assert cp.latest().epoch == epoch  # pyright: ignore[reportOptionalMemberAccess]
    with_results = partition_range(spec, m)
    evs = [e for e in _checks(instance, [spec.name, "per_minute"], "partition_complete") if e.run_id == res.run_id]
    assert sorted(e.partition for e in evs if e.partition) == [key_of(p) for p in with_results]
    (summary,) = [e for e in evs if e.partition is None]
    assert f"of {len(with_results)} partitions holding committed results pass" in summary.evaluation.description
    assert all(e.status.value in ("SUCCEEDED", "FAILED") for e in evs)

    # 4. A stage over the window (a derived stream): reported the same way; it reads no raw stream.
    down_body = {
        "name": "am_down",
        "inputs": [{"name": "minutes", "pipeline": "am", "output": "per_minute", "key": "key"}],
        "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
        "lateness": {"allowed": "0s"},
        "partition": "2m",
        "start": "2026-01-01T00:00:00Z",
        "end": "2026-01-01T01:00:00Z",
        "windows": [{"name": "per_2m", "type": "tumbling", "size": "2m", "aggregates": {"total": "sum(total)"}}],
    }
    (tmp_path / "pipelines" / "am_down.yaml").write_text(yaml.safe_dump(down_body))
    down = pipeline_from_dict(down_body)
    defs = build_definitions(pipelines=[spec, down])
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey(["am_down", "per_2m"])).parent_keys == {dg.AssetKey(["am", "per_minute"])}
    assert graph.get(dg.AssetKey(["am", "per_minute"])).parent_keys == {dg.AssetKey(["streams", "am_s"])}
    res = defs.resolve_job_def(job_name(down)).execute_in_process(instance=instance, partition_key=key_of(T0))
    assert res.success
    dm = Checkpoints(store, "am_down").latest()
    assert dm is not None
    got = _mats(instance, res.run_id, ["am_down", "per_2m"])[key_of(T0)]
    assert got["rows"] == dm.outputs["per_2m"][str(T0)].rows > 0
    assert _mats(instance, res.run_id, ["streams", "am_s"]) == {}
    (ev,) = [e for e in _checks(instance, ["am_down", "per_2m"], "partition_complete") if e.run_id == res.run_id]
    assert ev.partition == key_of(T0) and ev.evaluation.description
