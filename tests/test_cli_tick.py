"""`wire tick`: one real sensor evaluation, then every requested run executed through the
Dagster job, in a subprocess, with a private DAGSTER_HOME.

A closed stream (three minutes of events over two keys, in order within the 2 s
bound, no duplicates): after one tick the committed results equal a plain batch
aggregation (tests/reference.py), and Dagster's instance holds one
materialization per window and partition whose data_version is the content hash
of the committed partition file. A second tick launches nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from cli_setup import local_spark, pipeline_env
from conftest import run_wire
from reference import batch_of_clicks

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
M = 60_000

PIPELINE = {
    "name": "ticky",
    "stream": "ticky",
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
    "lateness": {"allowed": "10s"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "windows": [
        {
            "name": "per_minute",
            "type": "tumbling",
            "size": "1m",
            "aggregates": {"n": "count", "total": "sum(amount)", "top": "max(amount)"},
        },
        {
            "name": "two_by_one",
            "type": "sliding",
            "size": "2m",
            "slide": "1m",
            "aggregates": {"n": "count", "mean": "avg(amount)"},
        },
        {"name": "sessions", "type": "session", "gap": "20s", "aggregates": {"n": "count", "total": "sum(amount)"}},
    ],
}


def make_events() -> list[dict]:
    """Two users; u1 every 7 s over 0:00-2:48, u2 in two bursts (two sessions per burst gap > 20 s)."""
    evs = [{"user": "u1", "ts": T0 + i * 7000, "amount": i % 5} for i in range(25)]
    evs += [{"user": "u2", "ts": T0 + 30_000 + i * 3000, "amount": 10 + i} for i in range(8)]
    evs += [{"user": "u2", "ts": T0 + 130_000 + i * 4000, "amount": 2 * i} for i in range(6)]
    evs.sort(key=lambda e: e["ts"])
    for i, e in enumerate(evs):
        e["eid"] = f"e{i}"
    return evs


def parse_iso(s: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() * 1000)


def read_window(env: dict[str, str], window: str) -> list[dict]:
    p = run_wire(["read", "--pipeline", "ticky", "--window", window, "--format", "jsonl"], env, timeout=180, check=True)
    rows = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]
    for r in rows:
        r["window_start"], r["window_end"] = parse_iso(r["window_start"]), parse_iso(r["window_end"])
    return sorted(rows, key=lambda r: (r["key"], r["window_start"], r["window_end"]))


def launched(stdout: str) -> dict[str, str]:
    """run key -> status, from `wire tick`'s output lines `run <key>: <STATUS>`."""
    return dict(re.findall(r"^run (\S+): (\S+)$", stdout, flags=re.MULTILINE))


def test_tick_runs_the_sensor_requests_to_their_commits(store, cli_env, spark_remote, tmp_path: Path) -> None:
    import dagster as dg

    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.streams import close_stream, produce

    # The runs attach to the session's Spark Connect server when there is one, else boot local[2].
    (spec,), env, _, home = pipeline_env(tmp_path, local_spark(cli_env, spark_remote), PIPELINE)

    events = make_events()
    f = tmp_path / "events.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert produce(store, spec, f, segment="0").events == len(events)
    close_stream(store, spec)

    first = run_wire(["tick", "--pipeline", "ticky"], env, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    runs = launched(first.stdout)
    assert runs and set(runs.values()) == {"SUCCESS"}, first.stdout

    # Closed stream, nothing late: the committed results are the batch aggregation.
    want = batch_of_clicks(spec, events)
    for w in spec.windows:
        got = read_window(env, w.name)
        assert [(r["key"], r["window_start"], r["window_end"]) for r in got] == [
            (r["key"], r["window_start"], r["window_end"]) for r in want[w.name]
        ], w.name
        for g, x in zip(got, want[w.name], strict=True):
            for a in w.aggregates:
                # sums and averages are decimal(38, 9) in the kernel: equal to 9 decimal places
                assert g[a.name] == pytest.approx(x[a.name], rel=1e-12, abs=1e-9), (w.name, a.name, x)

    # Runs: every partition holding a result, none beyond the data's last window, all of epoch 1.
    holding = {T0 + (r["window_end"] - 1 - T0) // M * M for rows in want.values() for r in rows}
    bound = T0 + (max(e["ts"] for e in events) + 2 * M - 1 - T0) // M * M  # the longest window is 2m
    # One run per epoch: its key names the epoch and the range of partitions it reports.
    assert all(":e1:" in k for k in runs), runs
    parts = set()
    for k in runs:
        first, _, last = k.split(":e1:")[1].partition("..")
        parts |= set(range(parse_iso(first), parse_iso(last or first) + M, M))
    assert holding <= parts, sorted(holding - parts)
    assert all(T0 <= p <= bound for p in parts), sorted(parts)

    # A second tick: the sensor asks for the committed epoch's partitions again; their run keys
    # already ran, so nothing is launched.
    second = run_wire(["tick", "--pipeline", "ticky"], env, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert launched(second.stdout) == {}, second.stdout

    # Dagster's instance: one successful run per launched run key, and per window and partition the
    # latest materialization's data_version is the content hash of the committed partition file.
    m = Checkpoints(store, spec.name).latest()
    assert m is not None
    assert m.epoch == 1
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        recorded = instance.get_runs()
        assert sorted(r.tags["dagster/run_key"] for r in recorded) == sorted(runs)
        assert all(r.is_success for r in recorded)
        for w in spec.windows:
            key = dg.AssetKey(["ticky", w.name])
            for p in sorted(parts):
                pk = f"2026-01-01-00:{(p - T0) // M:02d}"
                recs = instance.fetch_materializations(
                    dg.AssetRecordsFilter(asset_key=key, asset_partitions=[pk]), limit=1
                ).records
                assert recs, (w.name, pk)
                mat = recs[0].asset_materialization
                assert mat is not None and mat.tags is not None, (w.name, pk)
                ref = m.outputs.get(w.name, {}).get(str(p))
                want_version = hashlib.sha256(store.get(ref.key)).hexdigest()[:32] if ref else "empty"
                assert mat.tags["dagster/data_version"] == want_version, (w.name, pk)
                assert (ref is not None) == (p in {T0 + (r["window_end"] - 1 - T0) // M * M for r in want[w.name]})
                assert mat.metadata["watermark"].value == "+inf"
                assert mat.metadata["status"].value == "final"
                assert mat.metadata["rows"].value == (ref.rows if ref else 0)
    finally:
        instance.dispose()
