"""Streams on the real embedded S3 server: append, read by offsets, seal, concurrent producers,
and malformed input landing in the dead letters at its exact source position."""

from __future__ import annotations

import json
import subprocess
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from wire_dagster import ingest, streams
from wire_dagster.errors import WireInputError
from wire_dagster.extract import read_chunk
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import Pipeline, load_pipeline, pipeline_from_dict
from wire_dagster.timeutil import now_ms

ROOT = Path(__file__).resolve().parent.parent
CLICKS = ROOT / "pipelines" / "clicks.yaml"


@pytest.fixture(scope="module")
def spec() -> Pipeline:
    return load_pipeline(CLICKS)


def T(spec: Pipeline, ms: int = 0) -> int:
    """An event time `ms` after the pipeline's start (always in range)."""
    return spec.start + ms


def event(i: int, t: int, key: str = "u1", amount: float = 1.0, prefix: str = "e") -> dict:
    return {"ts": t, "user_id": key, "event_id": f"{prefix}{i}", "amount": amount}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def chunk_data(store: ObjectStore, spec: Pipeline, meta: streams.ChunkMeta) -> list[dict]:
    """The events `spec` makes of a chunk (its stream's records, read as the pipeline reads them)."""
    return read_chunk(store, spec, meta).to_pylist()


def all_chunks(store: ObjectStore, stream: str) -> dict[str, list[streams.ChunkMeta]]:
    return {seg: v.chunks for seg, v in streams.read_stream(store, stream, {}).items()}


# ------------------------------------------------------------ append and read
def test_append_and_read_two_segments_by_offsets(store: ObjectStore, spec: Pipeline, tmp_path: Path) -> None:
    a1 = [event(i, T(spec, 1000 * i), key=f"k{i % 3}", amount=i * 0.5) for i in range(25)]
    b1 = [event(100 + i, T(spec, 777 + 10 * i), key="kb", amount=2.0) for i in range(5)]
    a2 = [event(200 + i, T(spec, 90_000 - i), key="k9", amount=-1.0) for i in range(4)]
    before = now_ms()
    ra1 = streams.produce(store, spec, write_jsonl(tmp_path / "a1.jsonl", a1), segment="a", chunk_rows=10)
    rb1 = streams.produce(store, spec, write_jsonl(tmp_path / "b1.jsonl", b1), segment="b", chunk_rows=10)
    ra2 = streams.produce(store, spec, write_jsonl(tmp_path / "a2.jsonl", a2), segment="a", chunk_rows=10)
    after = now_ms()
    assert (ra1.chunks, ra1.events, ra1.malformed) == ([0, 1, 2], 25, 0)
    assert (rb1.chunks, rb1.events) == ([0], 5)
    assert (ra2.chunks, ra2.events) == ([3], 4)

    # From the start: every chunk, gapless, with metadata matching the input slices.
    views = streams.read_stream(store, spec.stream, {})
    assert sorted(views) == ["a", "b"]
    expected = {"a": [a1[0:10], a1[10:20], a1[20:25], a2], "b": [b1]}
    for seg, slices in expected.items():
        chunks = views[seg].chunks
        assert [c.seq for c in chunks] == list(range(len(slices)))
        assert views[seg].sealed_at is None
        for c, recs in zip(chunks, slices, strict=True):
            assert (c.stream, c.segment, c.rows, c.malformed, c.dlq_key) == (spec.stream, seg, len(recs), 0, None)
            assert c.min_t == min(r["ts"] for r in recs) and c.max_t == max(r["ts"] for r in recs)
            assert before <= c.ingest_ms <= after
            rows = chunk_data(store, spec, c)
            assert [(r["_t"], r["_key"], r["_id"], r["f_amount"], r["_row"]) for r in rows] == [
                (r["ts"], r["user_id"], r["event_id"], r["amount"], i) for i, r in enumerate(recs)
            ]
    # Ingestion times follow the append order within a segment.
    ingests = [c.ingest_ms for c in views["a"].chunks]
    assert ingests == sorted(ingests)

    # After an offset vector: only the chunks from the offset on; a missing segment reads from 0.
    v = streams.read_stream(store, spec.stream, {"a": 3, "b": 1})
    assert [c.seq for c in v["a"].chunks] == [3] and v["b"].chunks == []
    v = streams.read_stream(store, spec.stream, {"a": 2})
    assert [c.seq for c in v["a"].chunks] == [2, 3] and [c.seq for c in v["b"].chunks] == [0]
    v = streams.read_stream(store, spec.stream, {"a": 4, "b": 1})
    assert v["a"].chunks == [] and v["b"].chunks == []


def test_read_stops_at_a_gap(store: ObjectStore, spec: Pipeline, tmp_path: Path) -> None:
    """A reader never skips a sequence: with chunk 1's claim missing it reads up to chunk 0 only."""
    streams.produce(
        store, spec, write_jsonl(tmp_path / "x.jsonl", [event(i, T(spec, i)) for i in range(6)]), chunk_rows=2
    )
    store.delete(streams.index_key(spec.stream, "0", 1))
    assert [c.seq for c in streams.read_stream(store, spec.stream, {})["0"].chunks] == [0]
    assert [c.seq for c in streams.read_stream(store, spec.stream, {"0": 2})["0"].chunks] == [2]


def test_index_objects_are_read_once_per_process_and_by_content(
    store: ObjectStore, spec: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader of the stream reads each chunk's index object once in a process (the sensor, then
    the run of one `wire tick`): the listing's ETag keys what was read, so an index object whose
    content differs (rewritten by hand here; claimed chunks never change) is read again."""
    streams.produce(
        store, spec, write_jsonl(tmp_path / "x.jsonl", [event(i, T(spec, i)) for i in range(6)]), chunk_rows=2
    )
    gets: list[str] = []
    real_get = ObjectStore.get
    monkeypatch.setattr(ObjectStore, "get", lambda self, key: gets.append(key) or real_get(self, key))
    index = [streams.index_key(spec.stream, "0", n) for n in range(3)]

    first = streams.read_stream(store, spec.stream, {})["0"].chunks
    assert [c.seq for c in first] == [0, 1, 2] and sorted(k for k in gets if k in index) == index
    gets.clear()
    assert streams.read_stream(store, spec.stream, {})["0"].chunks == first
    assert [k for k in gets if k in index] == []  # every index object came from the first reading

    meta = json.loads(real_get(store, index[1]))
    store.put(index[1], json.dumps({**meta, "rows": meta["rows"] + 1}).encode())
    again = streams.read_stream(store, spec.stream, {})["0"].chunks
    assert [k for k in gets if k in index] == [index[1]]
    assert again[1].rows == first[1].rows + 1 and (again[0], again[2]) == (first[0], first[2])


def test_large_input_is_split_into_chunks_of_chunk_rows(store: ObjectStore, spec: Pipeline, tmp_path: Path) -> None:
    n, size = 2_345, 500
    recs = [event(i, T(spec, (i * 7919) % 600_000), key=f"k{i % 11}", amount=float(i)) for i in range(n)]
    rep = streams.produce(store, spec, write_jsonl(tmp_path / "big.jsonl", recs), chunk_rows=size)
    assert rep.chunks == [0, 1, 2, 3, 4] and rep.events == n
    chunks = all_chunks(store, spec.stream)["0"]
    assert [c.rows for c in chunks] == [500, 500, 500, 500, 345]
    seen = []
    for c in chunks:
        rows = chunk_data(store, spec, c)
        part = recs[c.seq * size : (c.seq + 1) * size]
        assert [r["_row"] for r in rows] == list(range(len(part)))
        assert (c.min_t, c.max_t) == (min(r["ts"] for r in part), max(r["ts"] for r in part))
        seen += [r["_id"] for r in rows]
    assert seen == [r["event_id"] for r in recs]


def test_pipeline_chunk_rows_is_the_default(store: ObjectStore, tmp_path: Path) -> None:
    raw = yaml.safe_load(CLICKS.read_text())
    raw["limits"] = {"chunk_rows": 3}
    spec = pipeline_from_dict(raw)
    rep = streams.produce(store, spec, write_jsonl(tmp_path / "x.jsonl", [event(i, T(spec, i)) for i in range(7)]))
    assert rep.chunks == [0, 1, 2]
    assert [c.rows for c in all_chunks(store, spec.stream)["0"]] == [3, 3, 1]


def test_close_stream_seals_every_segment(store: ObjectStore, spec: Pipeline, tmp_path: Path) -> None:
    f = write_jsonl(tmp_path / "x.jsonl", [event(i, T(spec, i)) for i in range(5)])
    streams.produce(store, spec, f, segment="s1", chunk_rows=2)  # chunks 0..2
    streams.produce(store, spec, f, segment="s2", chunk_rows=5)  # chunk 0
    assert streams.close_stream(store, spec) == {"s1": 2, "s2": 0}
    for seg, last in (("s1", 2), ("s2", 0)):
        assert json.loads(store.get(streams.segment_prefix(spec.stream, seg) + "_SEALED")) == {"last_seq": last}
        assert streams.read_stream(store, spec.stream, {})[seg].sealed_at == last
    # Idempotent: a second close keeps the seals.
    assert streams.close_stream(store, spec) == {"s1": 2, "s2": 0}
    keys = sorted(o.key for o in store.list(""))
    with pytest.raises(WireInputError, match="sealed"):
        streams.produce(store, spec, f, segment="s1")
    assert sorted(o.key for o in store.list("")) == keys  # nothing written, not even a data file


def test_a_segment_sealed_during_a_produce_stops_it_at_the_next_claim(
    store: ObjectStore, spec: Pipeline, tmp_path: Path
) -> None:
    """Only a producer's first chunk checks the seal before writing; every claim checks it after.
    Sealed after chunk 1: chunk 2 is written and claimed beyond the seal, reported, and the
    produce stops there (nothing of chunks 3..4)."""
    f = write_jsonl(tmp_path / "x.jsonl", [event(i, T(spec, i)) for i in range(10)])

    def seal_after_two(rows: int, _total: int) -> None:
        if rows == 4:
            assert streams.close_stream(store, spec) == {"s": 1}

    with pytest.raises(WireInputError, match="segment 's' was sealed during the append; chunk 2 is ignored"):
        streams.produce(store, spec, f, segment="s", chunk_rows=2, progress=seal_after_two)
    view = streams.read_stream(store, spec.stream, {})["s"]
    assert view.sealed_at == 1 and [c.seq for c in view.chunks] == [0, 1]
    assert streams.last_seq(store, spec.stream, "s") == 2  # the chunk claimed after the seal, and no later one


def test_produce_to_a_sealed_segment_via_cli_exits_2(
    store: ObjectStore, spec: Pipeline, cli_env, tmp_path: Path
) -> None:
    from conftest import run_wire

    f = write_jsonl(tmp_path / "x.jsonl", [event(i, T(spec, i)) for i in range(3)])
    streams.produce(store, spec, f, segment="0")
    p = run_wire(["close", "--pipeline", "clicks"], cli_env, check=True)
    assert "sealed 1 segments" in p.stdout
    keys = sorted(o.key for o in store.list(""))
    p = run_wire(["produce", "--pipeline", "clicks", "--file", str(f), "--segment", "0"], cli_env)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "sealed" in p.stderr and "Traceback" not in p.stderr
    assert sorted(o.key for o in store.list("")) == keys


# ------------------------------------------------------ concurrent producers
def _check_segment_exactly_once(
    store: ObjectStore, spec: Pipeline, seg: str, expect_ids: list[str], n_chunks: int
) -> None:
    """Gapless 0..n-1, every data file referenced once, every event id present exactly once."""
    seg_prefix = streams.segment_prefix(spec.stream, seg)
    index = sorted(o.key for o in store.list(seg_prefix + "index/"))
    assert index == [streams.index_key(spec.stream, seg, s) for s in range(n_chunks)]
    chunks = streams.read_stream(store, spec.stream, {})[seg].chunks
    assert [c.seq for c in chunks] == list(range(n_chunks))
    data_keys = [c.data_key for c in chunks if c.data_key is not None]
    assert len(set(data_keys)) == n_chunks  # every chunk has data; none overwrote another's claim
    assert sorted(o.key for o in store.list(seg_prefix + "data/")) == sorted(data_keys)
    ids = Counter()
    for c in chunks:
        assert c.data_key is not None
        t = read_chunk(store, spec, c)
        assert t.num_rows == c.rows
        ids.update(t.column("_id").to_pylist())
    assert ids == Counter(expect_ids)


def test_two_producer_threads_on_one_segment(store: ObjectStore, spec: Pipeline, tmp_path: Path) -> None:
    n, size = 400, 50  # 8 chunks each
    files = [
        write_jsonl(tmp_path / f"p{p}.jsonl", [event(i, T(spec, i), prefix=f"p{p}-") for i in range(n)])
        for p in range(2)
    ]
    barrier = threading.Barrier(2)
    reports: dict[int, streams.ProduceReport] = {}
    errors: list[BaseException] = []

    def run(p: int) -> None:
        try:
            barrier.wait(timeout=30)
            reports[p] = streams.produce(store, spec, files[p], segment="0", chunk_rows=size)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(p,)) for p in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(reports) == 2
    assert sorted(reports[0].chunks + reports[1].chunks) == list(range(16))
    # Each producer's chunks are its own file's slices, in order.
    chunks = {c.seq: c for c in streams.read_stream(store, spec.stream, {})["0"].chunks}
    for p in range(2):
        got = [r["_id"] for s in reports[p].chunks for r in chunk_data(store, spec, chunks[s])]
        assert got == [f"p{p}-{i}" for i in range(n)]
    _check_segment_exactly_once(store, spec, "0", [f"p{p}-{i}" for p in range(2) for i in range(n)], n_chunks=16)


def test_a_producer_with_a_stale_view_takes_the_next_free_sequence(
    store: ObjectStore, spec: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The losing side of a claim race, made deterministic: a producer that believes the segment
    is empty collides on 0, 1, 2 (create-if-absent refuses), then claims 3 and 4; nothing is overwritten."""
    first = write_jsonl(tmp_path / "a.jsonl", [event(i, T(spec, i), prefix="a") for i in range(6)])
    second = write_jsonl(tmp_path / "b.jsonl", [event(i, T(spec, i), prefix="b") for i in range(4)])
    streams.produce(store, spec, first, chunk_rows=2)
    before = {k: store.get(k) for k in (streams.index_key(spec.stream, "0", s) for s in range(3))}
    monkeypatch.setattr(streams, "last_seq", lambda *a: -1)
    rep = streams.produce(store, spec, second, chunk_rows=2)
    assert rep.chunks == [3, 4]
    assert {k: store.get(k) for k in before} == before
    _check_segment_exactly_once(store, spec, "0", [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(4)], n_chunks=5)


def test_two_wire_produce_processes_on_one_segment(store: ObjectStore, spec: Pipeline, cli_env, tmp_path: Path) -> None:
    import shutil
    import sys

    n = 3_000  # chunk-rows 250: 12 chunks each
    files = [
        write_jsonl(tmp_path / f"c{p}.jsonl", [event(i, T(spec, i), prefix=f"c{p}-") for i in range(n)])
        for p in range(2)
    ]
    exe = shutil.which("wire", path=str(Path(sys.executable).parent))
    assert exe is not None, "no `wire` beside the interpreter"
    procs = [
        subprocess.Popen(
            [exe, "produce", "--pipeline", "clicks", "--file", str(f), "--segment", "0", "--chunk-rows", "250"],
            env=cli_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for f in files
    ]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (so, se) in zip(procs, outs, strict=True):
        assert p.returncode == 0, se
        assert f"appended {n} events in 12 chunks" in so
    _check_segment_exactly_once(store, spec, "0", [f"c{p}-{i}" for p in range(2) for i in range(n)], n_chunks=24)


# -------------------------------------------------------------- dead letters
def _small_limits_spec(**limits) -> Pipeline:
    raw = yaml.safe_load(CLICKS.read_text())
    raw["limits"] = limits
    return pipeline_from_dict(raw)


def test_every_bad_input_kind_is_a_dead_letter_at_its_position(store: ObjectStore, tmp_path: Path) -> None:
    spec = _small_limits_spec(max_record_bytes=200)
    t0 = spec.start + 60_000
    iso_z = datetime.fromtimestamp((t0 + 1_234) / 1000, tz=UTC).isoformat(timespec="milliseconds")
    iso_z = iso_z.replace("+00:00", "Z")  # e.g. 2026-01-01T00:01:01.234Z
    iso_plus2 = datetime.fromtimestamp((t0 + 3_600_000) / 1000, tz=timezone(timedelta(hours=2))).isoformat()
    assert iso_z.endswith("Z") and iso_plus2.endswith("+02:00")

    def line(d: dict) -> bytes:
        return json.dumps(d).encode()

    def ok(i: int, **kw: object) -> bytes:
        return line({**event(i, t0 + i), **kw})

    # (line, expected reason prefix or None for a valid record, expected event time if valid)
    cases: list[tuple[bytes, str | None, int | None]] = [
        (ok(0), None, t0 + 0),  # first record, after the BOM: valid
        (b"{not json", "malformed: unparsable JSON", None),
        (line({"user_id": "u", "event_id": "x2", "amount": 1}), "malformed: missing time field ts", None),
        (ok(3, ts=None), "malformed: null time field ts", None),
        (ok(4, ts="abc"), "malformed: non-numeric time field ts", None),
        (ok(5), None, t0 + 5),
        (ok(6, ts="2026-01-01T00:01:00"), "malformed: naive time in ts", None),
        (ok(7, ts=spec.start - 1), "malformed: time out of range in ts", None),
        (ok(8, ts=now_ms() + 400 * 86_400_000), "malformed: time out of range in ts", None),
        (ok(9, amount="x"), "malformed: field amount has wrong type", None),
        (ok(10, user_id={"a": 1}), "malformed: key field user_id has wrong type", None),
        (b"", "malformed: empty line", None),
        (
            b'{"ts": ' + str(t0).encode() + b', "user_id": "\xff\xfe", "event_id": "x12"}',
            "malformed: invalid UTF-8",
            None,
        ),
        (ok(13, pad="p" * 300), "malformed: record larger than 200 bytes", None),
        (ok(14, ts=iso_z), None, t0 + 1_234),
        (ok(15, ts=iso_plus2), None, t0 + 3_600_000),
        (ok(16, ts=spec.start), None, spec.start),  # the first valid instant
        (b"[1, 2]", "malformed: not a JSON object", None),
        (ok(18, amount=None), None, t0 + 18),  # a null payload value is allowed
        (ok(19), None, t0 + 19),
    ]
    size = 6
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(c[0] for c in cases) + b"\n")
    rep = streams.produce(store, spec, path, segment="mix", chunk_rows=size)
    n_bad = sum(1 for c in cases if c[1])
    assert (rep.events, rep.malformed, rep.chunks) == (len(cases) - n_bad, n_bad, [0, 1, 2, 3])

    dl = {(d["chunk"], d["row"]): d for d in streams.iter_dead_letters(store, spec.stream)}
    assert sorted(dl) == sorted((i // size, i % size) for i, c in enumerate(cases) if c[1])
    for i, (raw, reason, _) in enumerate(cases):
        if not reason:
            continue
        d = dl[(i // size, i % size)]
        assert d["reason"].startswith(reason), (i, d["reason"])
        assert (d["stream"], d["segment"]) == (spec.stream, "mix")
        if reason.endswith("invalid UTF-8"):
            assert d["record"] == raw.decode("utf-8", "replace")
        else:
            assert d["record"] == raw.decode()[: ingest.RAW_KEEP]

    valid = {}
    chunks = all_chunks(store, spec.stream)["mix"]
    for c in chunks:
        part = cases[c.seq * size : (c.seq + 1) * size]
        assert c.rows == sum(1 for x in part if not x[1]) and c.malformed == len(part) - c.rows
        for r in chunk_data(store, spec, c):
            valid[(c.seq, r["_row"])] = r["_t"]
    assert valid == {(i // size, i % size): c[2] for i, c in enumerate(cases) if not c[1]}


def test_bom_is_not_a_record(store: ObjectStore, spec: Pipeline, tmp_path: Path) -> None:
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps(event(0, T(spec, 5))).encode() + b"\r\n")
    rep = streams.produce(store, spec, p)
    assert (rep.events, rep.malformed) == (1, 0)
    assert [r["_t"] for r in chunk_data(store, spec, all_chunks(store, spec.stream)["0"][0])] == [T(spec, 5)]


def test_parquet_input_good_and_bad_rows(store: ObjectStore, spec: Pipeline, tmp_path: Path) -> None:
    t0 = T(spec, 10_000)
    table = pa.table(
        {
            "ts": pa.array([t0, None, t0 + 2, spec.start - 5, t0 + 4], pa.int64()),
            "user_id": ["a", "b", "c", "d", "e"],
            "event_id": [f"q{i}" for i in range(5)],
            "amount": pa.array([1.0, 2.0, None, 4.0, 5.5]),
        }
    )
    pq.write_table(table, tmp_path / "ev.parquet")
    rep = streams.produce(store, spec, tmp_path / "ev.parquet", segment="pq", chunk_rows=3)
    assert (rep.events, rep.malformed, rep.chunks) == (3, 2, [0, 1])
    dl = sorted((d["chunk"], d["row"], d["reason"]) for d in streams.iter_dead_letters(store, spec.stream))
    assert dl == [(0, 1, "malformed: null time field ts"), (1, 0, "malformed: time out of range in ts")]
    rows = [
        (c.seq, r["_row"], r["_t"], r["_id"], r["f_amount"])
        for c in all_chunks(store, spec.stream)["pq"]
        for r in chunk_data(store, spec, c)
    ]
    assert rows == [(0, 0, t0, "q0", 1.0), (0, 2, t0 + 2, "q2", None), (1, 1, t0 + 4, "q4", 5.5)]

    # A zoned Parquet timestamp column and integer keys/ids are accepted as they are.
    tz = pa.table(
        {
            "ts": pa.array([t0, t0 + 1], pa.timestamp("ms", tz="UTC")),
            "user_id": pa.array([7, 8], pa.int64()),
            "event_id": pa.array([70, 80], pa.int64()),
            "amount": pa.array([1, 2], pa.int32()),
        }
    )
    pq.write_table(tz, tmp_path / "tz.parquet")
    rep = streams.produce(store, spec, tmp_path / "tz.parquet", segment="tz")
    assert (rep.events, rep.malformed) == (2, 0)
    got = [
        (r["_t"], r["_key"], r["_id"], r["f_amount"])
        for r in chunk_data(store, spec, all_chunks(store, spec.stream)["tz"][0])
    ]
    assert got == [(t0, "7", "70", 1.0), (t0 + 1, "8", "80", 2.0)]


def test_200k_events_produce_correctly(store: ObjectStore, spec: Pipeline, tmp_path: Path) -> None:
    """The vectorised path at size (timing bounds live in benchmarks/produce.py, not here)."""
    n, size = 200_000, 50_000
    bad_at = 123_456  # one malformed line deep inside chunk 2
    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        for i in range(n):
            if i == bad_at:
                f.write('{"ts": "soon", "user_id": "u", "event_id": "bad"}\n')
            else:
                f.write(
                    f'{{"ts": {spec.start + (i * 37) % 3_600_000}, "user_id": "u{i % 97}", '
                    f'"event_id": "b{i}", "amount": {i % 10}}}\n'
                )
    rep = streams.produce(store, spec, path, chunk_rows=size)
    assert (rep.events, rep.malformed, rep.chunks) == (n - 1, 1, [0, 1, 2, 3])
    [d] = list(streams.iter_dead_letters(store, spec.stream))
    assert (d["chunk"], d["row"]) == (bad_at // size, bad_at % size) and "non-numeric time" in d["reason"]
    total = 0
    ids: set[str] = set()
    amount_sum = 0.0
    for c in all_chunks(store, spec.stream)["0"]:
        assert c.data_key is not None
        t = read_chunk(store, spec, c)
        lo = c.seq * size
        times = [spec.start + (i * 37) % 3_600_000 for i in range(lo, lo + size) if i != bad_at]
        assert (c.min_t, c.max_t, c.rows) == (min(times), max(times), len(times))
        total += t.num_rows
        ids.update(t.column("_id").to_pylist())
        amount_sum += sum(t.column("f_amount").to_pylist())
    assert total == n - 1 and ids == {f"b{i}" for i in range(n) if i != bad_at}
    assert amount_sum == sum(i % 10 for i in range(n) if i != bad_at)


# ------------------------------------------------------------ Parquet: typed columns vs JSON lines
TYPED_SPEC = {
    "name": "typed",
    "stream": "typed",
    "event": {"key": "k", "time": "ts", "id": "eid"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "limits": {"max_record_bytes": 300},
    "windows": [
        {"name": "tum", "type": "tumbling", "size": "1m", "aggregates": {"s": "sum(v)", "d": "count_distinct(u)"}},
        {"name": "ses", "type": "session", "gap": "10s", "gap_field": "g", "aggregates": {"n": "count"}},
    ],
}


def _plain(t: pa.Table) -> tuple[pa.Schema, list[dict[str, Any]]]:
    """A table as (schema, rows) with NaN made comparable."""
    import math

    rows = [{k: ("NaN" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in t.to_pylist()]
    return t.schema, rows


def _both_paths(spec: Pipeline, table: pa.Table, ingest_ms: int):
    """(typed path, JSON-lines path) of one Parquet table's rows, each (valid, dead letters) as
    `_plain` (schema, rows)."""
    typed = ingest.normalize_table(spec, table, ingest_ms)
    via_json = ingest.normalize_lines(spec, ingest.parquet_to_lines(table), ingest_ms)
    return tuple(map(_plain, typed)), tuple(map(_plain, via_json))


def _typed_cases(spec: Pipeline, seed: int) -> pa.Table:
    """A random table: each field the pipeline reads is absent or one of several Arrow types,
    its values drawn among valid ones, nulls and the edge values of that type."""
    import random

    rng = random.Random(seed)
    n = 60
    t0 = spec.start + 86_400_000
    iso = datetime.fromtimestamp(t0 / 1000, tz=UTC)
    floats = [0.5, 3.0, -0.0, 1e20, 1e-7, 123456789.123456789, 1.7976931348623157e308, float("nan"), float("inf"), None]
    ints = [0, 7, -3, 2**62, 2**53, -(2**53) - 1, None]
    texts = ["a", 'q"uote', "é\n\t\x01", "", "12", "-4", "x" * 80, None]

    def column(kind: str, times: bool = False):
        if kind == "int64" and times:  # mostly valid times, so that the later checks are reached
            vals = [
                t0 + rng.randrange(10**6) if rng.random() < 0.8 else rng.choice([spec.start - 1, t0 * 10**6, None])
                for _ in range(n)
            ]
            return pa.array(vals, pa.int64())
        if kind == "int64":
            return pa.array([rng.choice(ints) for _ in range(n)], pa.int64())
        if kind == "uint64":
            return pa.array([rng.choice([5, 2**63 + 5, None]) for _ in range(n)], pa.uint64())
        if kind == "int16":
            return pa.array([rng.choice([1, -2, None]) for _ in range(n)], pa.int16())
        if kind == "float64":
            return pa.array(
                [rng.choice(floats + ([float(t0), t0 + 0.5] if times else [])) for _ in range(n)], pa.float64()
            )
        if kind == "string" and times:
            bad = ["2026-01-02T00:00:00", "2026-01-02 00:00:00Z", "soon", None, ""]
            return pa.array(
                [
                    (iso + timedelta(seconds=rng.randrange(3600))).isoformat()
                    if rng.random() < 0.7
                    else rng.choice(bad)
                    for _ in range(n)
                ],
                pa.string(),
            )
        if kind == "string":
            return pa.array([rng.choice(texts) for _ in range(n)], pa.string())
        if kind == "large_string":
            return pa.array([rng.choice(texts) for _ in range(n)], pa.large_string())
        if kind == "bool":
            return pa.array([rng.choice([True, False, None]) for _ in range(n)], pa.bool_())
        return pa.nulls(n)

    kinds = ["int64", "uint64", "int16", "float64", "string", "large_string", "bool", "null"]
    cols = {}
    for f in ("ts", "k", "eid", "v", "u", "g", "extra"):
        if f != "ts" and rng.random() < 0.15:
            continue  # the field is missing from every row
        kind = rng.choice(kinds if f != "u" else [k for k in kinds if k != "float64"])
        if f == "ts":
            kind = rng.choice(["int64"] * 4 + ["string"] * 3 + ["float64", "bool", "null"])
        elif f in ("k", "eid") and rng.random() < 0.6:
            kind = rng.choice(["string", "int64"])
        cols[f] = column(kind, times=f == "ts")
    return pa.table(cols)


def test_parquet_typed_columns_give_what_json_lines_give() -> None:
    """Parquet rows are validated from their typed columns (no JSON is written or parsed for a
    valid row): every valid event, dead letter, reason and record text must be the one the
    JSON-lines path gives for the same rows. Edge cases first, then random tables."""
    spec = pipeline_from_dict(TYPED_SPEC)
    ingest_ms = now_ms()
    t0 = spec.start + 86_400_000
    edge = pa.table(
        {
            "ts": pa.array(
                [t0, t0 + 1, None, t0 + 3, spec.start - 1, t0 + 5, t0 + 6, t0 + 7, t0 + 8, t0 + 9], pa.int64()
            ),
            "k": pa.array(["a", None, "b", 'c"', "d", "é", "", "x", "y", "z"]),
            "eid": pa.array([1, 2, 3, -4, 5, 2**62, 7, 8, 9, 10], pa.int64()),
            "v": pa.array([1.5, 3.0, None, float("nan"), 1e20, -0.0, float("inf"), 2.0, 5e-324, 7.25]),
            "u": pa.array(["p", "q", None, "p", "", "r", "s", "t", "u", "v"]),
            "g": pa.array([1000, 0, -5, None, 10, 20, 30, 40, 50, 60], pa.int64()),
            "pad": pa.array(
                ["", "", "", "", "", "", "", "", "p" * 400, '"' * 60]
            ),  # larger than 300 bytes once in JSON
            "flag": pa.array([True, False, None, True, True, True, True, True, True, True]),
            "nothing": pa.nulls(10),
        }
    )
    assert ingest.typed_columns(spec, edge.schema)
    typed, via_json = _both_paths(spec, edge, ingest_ms)
    assert typed == via_json, (typed, via_json)
    reasons = [r["reason"] for r in typed[1][1]]
    assert any("larger than 300" in r for r in reasons)
    assert len(typed[0][1]) >= 3  # and some rows are valid
    tried = 0
    for seed in range(40):
        t = _typed_cases(spec, seed)
        if not ingest.typed_columns(spec, t.schema):
            continue
        tried += 1
        typed, via_json = _both_paths(spec, t, ingest_ms)
        assert typed[0] == via_json[0], (seed, t.schema)
        assert typed[1] == via_json[1], (seed, t.schema)
    assert tried >= 30


def _valid_typed_table(spec: Pipeline, seed: int) -> pa.Table:
    """A random table in which every row is a valid event: the fields in each of the types the
    Arrow path takes, with nulls where a field may be null, edge values, and other columns."""
    import random

    rng = random.Random(seed)
    n = rng.choice([1, 7, 60])
    t0 = spec.start + 86_400_000
    texts = ["a", 'q"uote', "é\n\t\x01", "", "12", "-4", "x" * 40]

    def pick(kinds: list[str], nulls: bool, number: bool = False):
        """A column of one of `kinds`; `number`: values within the aggregates' domain (|x| <= 2^53, finite)."""
        kind = rng.choice(kinds)

        def v(x):
            return None if nulls and rng.random() < 0.2 else x

        if kind == "absent":
            return None
        if kind == "null":
            return pa.nulls(n)
        if kind in ("int64", "int16", "uint64", "int32"):
            hi = {"int16": 2**15 - 1, "int32": 2**31 - 1, "int64": 2**62, "uint64": 2**64 - 1}[kind]
            hi = min(hi, 2**53) if number else hi
            lo = 1 if kind == "uint64" else -hi
            return pa.array([v(rng.choice([lo, 1, 7, hi, rng.randint(lo, hi)])) for _ in range(n)], getattr(pa, kind)())
        if kind == "positive":
            ty, top = rng.choice([(pa.int64(), 2**53), (pa.int32(), 2**31 - 1)])
            return pa.array([v(rng.choice([1, 10_000, top])) for _ in range(n)], ty)
        if kind == "float64" and number:
            return pa.array(
                [v(rng.choice([0.5, -0.0, 5e-324, -(2.0**53), 2.0**53, 123456.789])) for _ in range(n)], pa.float64()
            )
        if kind == "float64":
            return pa.array(
                [v(rng.choice([0.5, -0.0, 1e20, 5e-324, float("nan"), float("inf"), 2.0**60])) for _ in range(n)],
                pa.float64(),
            )
        return pa.array(
            [v(rng.choice(texts)) for _ in range(n)], pa.large_string() if kind == "large_string" else pa.string()
        )

    cols = {"ts": pa.array([t0 + rng.randrange(10**6) for _ in range(n)], rng.choice([pa.int64(), pa.uint64()]))}
    cols["k"] = pick(["int64", "int16", "string", "large_string"], nulls=False)
    cols["eid"] = pick(["int64", "uint64", "string"], nulls=False)
    cols["v"] = pick(["int64", "uint64", "float64", "null", "absent"], nulls=True, number=True)
    cols["u"] = pick(["int64", "string", "large_string", "null", "absent"], nulls=True)
    cols["g"] = pick(["positive", "null", "absent"], nulls=True)
    cols["extra"] = pick(["float64", "string", "null", "absent"], nulls=True)
    if rng.random() < 0.3:
        cols["flag"] = pa.array([rng.choice([True, False, None]) for _ in range(n)], pa.bool_())
    return pa.table({k: c for k, c in cols.items() if c is not None})


def test_parquet_valid_tables_skip_sql_with_the_same_events() -> None:
    """A typed table none of whose rows can fail a check is normalized by Arrow casts, without
    the SQL: its events must be those of the JSON-lines path (and of the typed SQL), over random
    tables of every type the Arrow path takes; a table with one bad row goes through the SQL."""
    spec = pipeline_from_dict({**TYPED_SPEC, "limits": {"max_record_bytes": 2000}})
    ingest_ms = now_ms()
    for seed in range(60):
        t = _valid_typed_table(spec, seed)
        assert ingest.typed_columns(spec, t.schema), (seed, t.schema)
        assert ingest._all_valid(spec, t, ingest_ms) is not None, (seed, t.schema)
        typed, via_json = _both_paths(spec, t, ingest_ms)
        assert typed == via_json, (seed, t.schema)
        assert typed[1][1] == [] and len(typed[0][1]) == t.num_rows
        src = t.rename_columns([f"c{k}" for k in range(t.num_columns)])
        sql_valid = ingest._validate(spec, "src", src, ingest_ms, typed=t.schema)[0]
        assert typed[0] == _plain(sql_valid)
    t0 = spec.start + 86_400_000
    good = pa.table(
        {
            "ts": pa.array([t0, t0 + 1], pa.int64()),
            "k": ["a", "b"],
            "eid": pa.array([1, 2]),
            "g": pa.array([5, 6]),
            "v": pa.array([1.0, 2.0]),
            "u": ["x", "y"],
        }
    )
    assert ingest._all_valid(spec, good, ingest_ms) is not None
    one_bad = {
        "null key": {"k": pa.array(["a", None])},
        "null id": {"eid": pa.array([1, None])},
        "no id field": {"eid": None},
        "time before start": {"ts": pa.array([t0, spec.start - 1], pa.int64())},
        "time too far ahead": {"ts": pa.array([t0, ingest_ms + spec.max_future + 1], pa.int64())},
        "null time": {"ts": pa.array([t0, None], pa.int64())},
        "text time": {"ts": pa.array(["2026-01-02T00:00:00Z"] * 2)},
        "gap of 0": {"g": pa.array([5, 0])},
        "number as text": {"v": pa.array(["1", "2"])},
        "maybe over max_record_bytes": {"pad": pa.array(["p" * 400, ""])},  # 6 * 400 + 2 bytes if all escaped
        "over max_record_bytes": {"pad": pa.array(["p" * 2100, ""])},
        "distinct of booleans": {"u": pa.array([True, False])},
        # the aggregates' value domain (aggregates.MAX_EXACT): the SQL gives each its reason
        "NaN number": {"v": pa.array([1.0, float("nan")])},
        "infinite number": {"v": pa.array([float("-inf"), 2.0])},
        "number above 2^53": {"v": pa.array([1.0, 1e20])},
        "integer above 2^53": {"v": pa.array([1, 2**53 + 1], pa.int64())},
        "integer below -2^53": {"v": pa.array([-(2**53) - 1, 1], pa.int64())},
        "unsigned integer above 2^53": {"v": pa.array([1, 2**63], pa.uint64())},
        "gap above 2^53": {"g": pa.array([5, 2**53 + 1])},
    }
    for what, change in one_bad.items():
        cols = {**{n: good[n] for n in good.column_names}, **change}
        t = pa.table({n: c for n, c in cols.items() if c is not None})
        assert ingest._all_valid(spec, t, ingest_ms) is None, what
        typed, via_json = _both_paths(spec, t, ingest_ms)
        assert typed == via_json, what


def test_parquet_columns_the_typed_path_leaves_to_json_lines() -> None:
    """Types, names and fields the typed path does not model fall back to JSON lines (same result)."""
    spec = pipeline_from_dict(TYPED_SPEC)
    t0 = spec.start + 86_400_000
    base = {"ts": pa.array([t0], pa.int64()), "k": pa.array(["a"]), "eid": pa.array(["e"])}
    for extra in (
        {"when": pa.array([t0], pa.timestamp("ms", tz="UTC"))},
        {"f32": pa.array([0.1], pa.float32())},
        {"lst": pa.array([[1]])},
        {"K": pa.array(["dup"])},
        {"u": pa.array([1.5])},
    ):
        t = pa.table({**base, **extra})
        assert not ingest.typed_columns(spec, t.schema), extra
        typed, via_json = _both_paths(spec, t, now_ms())
        assert typed == via_json
