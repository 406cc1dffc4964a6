"""Issue 24: `wire backfill` of a computation over a derived stream, and each upstream row counted
once by such a computation.

The stage `cb_busy` runs `busy:Busy` over the clicks per user and minute of `cb_up` (a window's
derived stream, allowed lateness 3 min upstream), reading only the minutes with 2 clicks or more
(`where: "clicks >= 2"`). Both are ticked after each batch (in this process; the backfills run
through the real `wire` CLI), so the stage's timeline has an epoch per upstream commit, with two
late firings of partition p1 (minutes 5-9) while its filtered rows are not final yet:

    minute   0 1 2 3 4 | 5 6 7 8 9 | 10 ... 14          (5 min partitions p0 | p1 | p2)
    batch A  ==========+==                               minutes 0-5
    batch B              ========                        minutes 6-9 (W ~ 9:33: 5-8 fire)
    batch L1                 ^ late click, u0 minute 7   (p1 re-fired; W ~ 9:43)
    batch L2               ^ late click, u1 minute 6     (p1 re-fired again)
    batch C                          ==============      minutes 10-14, then the stream closes

1. a backfill with the same code reports every partition `reproduced`: no new epoch, the bucket
   byte for byte as it was;
2. the code changes (Busy's threshold 3 -> 2): a backfill commits exactly the partitions whose
   content changed (p0, p1), each byte-identical to what a fresh pipeline with the new code
   (`cb_fresh`, ticked along from the start) committed, p2 untouched, no duplicate id;
3. before and after, the committed records equal the reference executor's (tests/
   test_computations.py) over the deliveries computed here in plain Python from the clicks and
   the tick schedule;
4. conservation over the timeline: each distinct upstream row version is counted once, as
   delivered or filtered, however often its partition was read again;
5. once an upstream epoch the timeline read is garbage-collected, a backfill is one line.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from commit_scenario import scratch_objects
from conftest import run_wire
from test_computations import (
    COMPS,
    ZOO,
    _committed,
    _derived_origin,
    _events,
    _modules,
    _pipeline,
    _positions,
    _sorted,
    reference,
)
from wire_dagster import computestage, engine, streams
from wire_dagster.backfill import backfill
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.computation import load_class
from wire_dagster.computestage import CARRIED_SCHEMA, RECORD_SCHEMA, Loaded, run_bucket
from wire_dagster.deliveries import Sync
from wire_dagster.errors import WireInputError
from wire_dagster.manifest import sha256
from wire_dagster.spec import ComputationSpec, load_pipeline, stream_spec
from wire_dagster.timeutil import INF, NEG_INF

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
S, M = 1_000, 60_000
OOO = 2_000  # the upstream's max out-of-orderness
LATENESS = 3 * M  # the upstream's allowed lateness
WHERE = 2  # the stage reads minutes with at least this many clicks

UP = {
    "name": "cb_up",
    "stream": "cb_clicks",
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
    "lateness": {"allowed": "3m"},
    "partition": "5m",
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-02T00:00:00Z",
    "windows": [{"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"clicks": "count"}}],
}


def stage(name: str, module: str) -> dict:
    return {
        "name": name,
        "inputs": [
            {
                "name": "minutes",
                "pipeline": "cb_up",
                "output": "per_minute",
                "key": "key",
                "where": f"clicks >= {WHERE}",
            }
        ],
        "partition": "5m",
        "start": "2026-01-01T00:00:00Z",
        "end": "2026-01-02T00:00:00Z",
        "computations": [{"name": "busy", "input": "minutes", "code": f"{module}:Busy", "outputs": ["busy"]}],
    }


BUSY = '''
from wire_dagster.computation import Computation

THRESHOLD = {threshold}


class Busy(Computation):
    """A user's busy minutes: a record per minute of THRESHOLD clicks or more, numbered by the
    minutes the user had so far (state); a late firing of a busy minute, a revised record."""

    def process_record(self, ctx, record):
        if record["_update"]:
            if record["clicks"] >= THRESHOLD:
                ctx.produce({{"minute": record["window_start"], "clicks": record["clicks"], "revised": True}}, "busy")
            return
        nth = ctx.state["seen"] = ctx.state.get("seen", 0) + 1
        if record["clicks"] >= THRESHOLD:
            ctx.produce({{"minute": record["window_start"], "clicks": record["clicks"], "nth": nth}}, "busy")
'''

# Clicks per user and minute 0-14: 2 only in p0 and p1 (the threshold change moves those), 1s
# (filtered) in p1 around the late firings.
COUNTS = {
    "u0": [1, 3, 2, 1, 4, 3, 1, 3, 2, 1, 3, 1, 4, 1, 3],
    "u1": [2, 1, 1, 3, 1, 1, 2, 1, 1, 3, 1, 3, 1, 1, 1],
}


def _clicks(user: str, minute: int, n: int, first: int = 5) -> list[dict]:
    return [{"user": user, "ts": T0 + minute * M + (first + 10 * j) * S} for j in range(n)]


def batches() -> list[list[dict]]:
    """A: minutes 0-5; B: 6-9 (the last click at 9:35); L1, L2: one late click each (and a click
    at 9:40, 9:45 of a user with none in minute 9: W moves, minute 9 does not fire); C: 10-14."""

    def minutes(lo: int, hi: int) -> list[dict]:
        rows = [c for m in range(lo, hi) for u in sorted(COUNTS) for c in _clicks(u, m, COUNTS[u][m])]
        return sorted(rows, key=lambda r: r["ts"])

    out = [
        minutes(0, 6),
        minutes(6, 10),
        [{"user": "u0", "ts": T0 + 7 * M + 50 * S}, {"user": "u2", "ts": T0 + 9 * M + 40 * S}],
        [{"user": "u1", "ts": T0 + 6 * M + 50 * S}, {"user": "u2", "ts": T0 + 9 * M + 45 * S}],
        minutes(10, 15),
    ]
    n = 0
    for b in out:
        for c in b:
            c["eid"] = f"c{n}"
            n += 1
    return out


# ---------------------------------------------------------------------------
# The plain-Python expectation


def deliveries(rounds: list[list[dict]]) -> tuple[list[dict], set[tuple[str, int, int]]]:
    """What the stage delivers, round by round (a tick after each batch, then one after the stream
    closed): the upstream fires a minute once W = max time - OOO passes its end (a closed stream:
    every minute) and counts a late click while end + lateness > W before its round; the stage
    is given each row with `clicks >= WHERE` when it first appears (`_update` false) and again
    when its count changes (`_update` true, the delivery's number n). Also the distinct row
    versions (user, minute, count) the stage read, and how many of them it filtered."""
    seen: list[dict] = []
    counts: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], tuple[int, int]] = {}  # row -> (clicks delivered, deliveries)
    versions: set[tuple[str, int, int]] = set()
    w = NEG_INF
    for i, batch in enumerate([*rounds, []]):
        for c in batch:
            start = c["ts"] - (c["ts"] - T0) % M
            assert c["ts"] >= w or start + M + LATENESS > w, "the test's late clicks are within lateness"
            counts[(c["user"], start)] = counts.get((c["user"], start), 0) + 1
        w = max(w, max((c["ts"] for b in rounds[: i + 1] for c in b), default=NEG_INF) - OOO)
        if i == len(rounds):
            w = INF
        for (u, start), n in sorted(counts.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            if start + M > w:
                continue
            versions.add((u, start, n))
            if n < WHERE:
                continue
            was = last.get((u, start))
            if was is not None and was[0] == n:
                continue
            k = 0 if was is None else was[1]
            row = {"key": u, "window_start": start, "window_end": start + M, "clicks": n, "_update": k > 0}
            seen.append({"row": row, "n": k})
            last[(u, start)] = (n, k + 1)
    return seen, versions


def expected(module_dir: Path, module: str, seen: list[dict]) -> list[tuple]:
    """The reference executor over the deliveries: (key, time, id, record) of each record."""
    cls = load_class(f"{module}:Busy", str(module_dir), module)
    spec = ComputationSpec(name="busy", input="minutes", code=f"{module}:Busy", outputs=("busy",))
    events = [
        {
            "t": d["row"]["window_end"] - 1,
            "key": d["row"]["key"],
            "pos": ("minutes", d["row"]["window_start"], d["n"]),
            "rec": d["row"],
            "origin": _derived_origin(d["row"], d["n"]),
        }
        for d in seen
    ]
    produced, failures = reference(cls, spec, events)
    assert not failures
    return sorted((k, t, rid, rec) for _, k, t, rid, rec in produced)


def committed(store, spec) -> list[tuple]:
    rows = computestage.read_output(store, spec, "busy")
    return sorted((r["key"], r["window_start"], r["id"], json.dumps(r["record"], sort_keys=True)) for r in rows)


def bucket_snapshot(store) -> set[tuple[str, str]]:
    """Every object and its checksum, less the watermark charts a Dagster run draws for an epoch
    that has none (the in-process ticks draw none; a display, not committed content)."""
    return {(o.key, o.etag) for o in store.list("") if "/charts/" not in o.key}


def backfill_rows(env: dict[str, str], name: str) -> list[dict]:
    p = run_wire(["backfill", "--pipeline", name, "--format", "jsonl"], env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]


def tick(store, spark, up, *stages) -> None:
    """What `wire tick --upstream` runs for each stage, in this process (a `wire` process costs
    ~15 s here): the upstream's pending epochs, then an epoch of each stage."""
    while engine.process(store, up, spark, max_epochs=5).committed:
        pass
    for s in stages:
        computestage.process(store, s, spark, max_epochs=1)


def test_backfill_of_a_computation_over_a_derived_stream(store, spark, cli_env, spark_remote, tmp_path: Path) -> None:
    from wire_dagster.spec import load_pipeline
    from wire_dagster.streams import close_stream, produce

    pdir = tmp_path / "pipelines"
    pdir.mkdir()
    (pdir / "cb_up.yaml").write_text(yaml.safe_dump(UP))
    (pdir / "cb_busy.yaml").write_text(yaml.safe_dump(stage("cb_busy", "busy")))
    (pdir / "cb_fresh.yaml").write_text(yaml.safe_dump(stage("cb_fresh", "busy_new")))
    (pdir / "busy.py").write_text(BUSY.format(threshold=3))
    (pdir / "busy_new.py").write_text(BUSY.format(threshold=2))
    up, busy, fresh = (load_pipeline(pdir / f"{n}.yaml") for n in ("cb_up", "cb_busy", "cb_fresh"))
    env = dict(cli_env, WIRE_PIPELINES=str(pdir), DAGSTER_HOME=str(tmp_path / "dagster-home"))
    env.pop("WIRE_SPARK_REMOTE", None)
    env["WIRE_SPARK_MASTER"] = "local[2]"
    if spark_remote:
        env["WIRE_SPARK_REMOTE"] = spark_remote

    rounds = batches()
    for i, batch in enumerate(rounds):
        f = tmp_path / f"b{i}.jsonl"
        f.write_text("".join(json.dumps(c) + "\n" for c in batch))
        assert produce(store, up, f).events == len(batch)
        tick(store, spark, up, busy, fresh)
    close_stream(store, up)
    tick(store, spark, up, busy, fresh)

    cp = Checkpoints(store, "cb_busy")
    m1 = cp.latest()
    assert m1 is not None and m1.watermark == INF
    assert [cp.load(n).kind for n in cp.committed()] == ["process"] * 6, "an epoch per upstream commit"
    seen, versions = deliveries(rounds)
    assert sum(d["row"]["_update"] for d in seen) == 2, "two late firings delivered as updates"
    old = expected(pdir, "busy", seen)
    assert committed(store, busy) == old
    assert committed(store, fresh) == expected(pdir, "busy_new", seen)

    # conservation over the timeline: each distinct upstream row version counted once
    t = m1.totals
    assert t.filtered == sum(1 for _, _, n in versions if n < WHERE)
    assert t.events_in == len(versions) == t.counted["busy"] + t.malformed + t.filtered
    assert t.counted["busy"] == len(seen)
    for n in cp.committed():
        c = cp.load(n).counts
        assert c.events_in == c.counted["busy"] + c.malformed + c.filtered

    # 1. the same code: every partition reproduced, nothing written
    before = bucket_snapshot(store)
    rows = backfill_rows(env, "cb_busy")
    parts = [T0, T0 + 5 * M, T0 + 10 * M]
    assert len(rows) == len(parts) and {r["result"] for r in rows} == {"reproduced"}, rows
    assert bucket_snapshot(store) == before and cp.latest() == m1

    # 2. the threshold changes: p0 and p1 change, each as the fresh pipeline committed it
    (pdir / "busy.py").write_text(BUSY.format(threshold=2))
    rows = backfill_rows(env, "cb_busy")
    assert [r["result"] for r in rows] == ["changed", "changed", "reproduced"], rows
    m2 = cp.latest()
    assert m2 is not None and m2.kind == "backfill" and m2.changed == {"busy": parts[:2]}
    mf = Checkpoints(store, "cb_fresh").latest()
    assert mf is not None
    for p in parts[:2]:
        assert m2.outputs["busy"][str(p)].sha256 == mf.outputs["busy"][str(p)].sha256, p
    assert m2.outputs["busy"][str(parts[2])] == m1.outputs["busy"][str(parts[2])]
    new = committed(store, busy)
    assert new == expected(pdir, "busy_new", seen) and new != old
    assert len({r[2] for r in new}) == len(new), "no duplicate id"

    # an upstream epoch the timeline read, garbage-collected: one line, nothing committed
    Checkpoints(store, "cb_up").gc(keep=1)
    with pytest.raises(WireInputError) as e:
        backfill(store, busy, spark, parts)
    assert "garbage collection deleted" in str(e.value) and "\n" not in str(e.value)
    assert cp.latest() == m2


# ---------------------------------------------------------------------------
# Each upstream row version counted once (issue 24's residual double counting), on the per-key
# executor alone: a transcript of one upstream partition as the stage syncs to it.

ECHO = """
from wire_dagster.computation import Computation


class Echo(Computation):
    def process_record(self, ctx, record):
        ctx.produce({"seen": record}, "echoes")
"""


def _partition(rows: list[tuple[dict, str | None]]) -> pa.Table:
    """An upstream partition (p0) as the executors read it: (row, why it makes no event)."""
    return pa.Table.from_pylist(
        [
            {
                "_t": r["window_end"] - 1,
                "_key": None if err else r["key"],
                "_id": None,
                "_row": i,
                "_err": err,
                "_src": json.dumps(r) if err not in (None, "filtered") else None,
                "_seg": "minutes",
                "_seq": T0,
                "_json": json.dumps(r),
            }
            for i, (r, err) in enumerate(rows)
        ],
        RECORD_SCHEMA,
    )


def test_a_set_aside_upstream_row_is_counted_once_per_version(tmp_path: Path) -> None:
    """Upstream lateness 2 min; p0 is read again each time a late firing changes one of its rows.
    The filtered row F and the malformed row X are counted (X a dead letter) once — not each
    time p0 is read again before they are final — and again only when they change; B, delivered,
    then refused by the filter, is retracted (a delivery) and its filtered version counted once.

        upstream W   1:00             1:10             1:20             1:30              10:00
        p0 holds     A=2 B=2 F=1 X    A=3 B=2 F=1 X    A=4 B=2 F=1 X    A=4 B=1 F=2 X'    (not read)
        counted      A B F X          A (update)       A (update)       B (retracted),    nothing
                                                                        B F X'
    """
    (tmp_path / "echo.py").write_text(ECHO)
    spec = ComputationSpec(name="echo", input="minutes", code="echo:Echo", outputs=("echoes",))
    loaded = Loaded((spec,), (load_class(spec.code, str(tmp_path), "echo"),), str(tmp_path))
    sync = Sync({"minutes": (T0,)}, {"minutes": 2 * M}, {"minutes": (T0, 5 * M)})

    def row(key: str, n: int, minute: int = 0) -> dict:
        return {"key": key, "window_start": T0 + minute * M, "window_end": T0 + (minute + 1) * M, "clicks": n}

    bad, f = "malformed: key is not a string", "filtered"
    script = [  # (p0's rows, W after), then the counts the epoch must report
        ([(row("a", 2), None), (row("b", 2), None), (row("f", 1), f), (row("x", 1), bad)], 60),
        ([(row("a", 3), None), (row("b", 2), None), (row("f", 1), f), (row("x", 1), bad)], 70),
        ([(row("a", 4), None), (row("b", 2), None), (row("f", 1), f), (row("x", 1), bad)], 80),
        ([(row("a", 4), None), (row("b", 1), f), (row("f", 2), None), (row("x", 2), bad)], 90),
    ]
    want = [(4, 1, 1), (1, 0, 0), (1, 0, 0), (4, 1, 1)]  # (events_in, filtered, malformed)
    comps, carried, w = loaded.instances(), CARRIED_SCHEMA.empty_table(), NEG_INF
    dead, given = [], []
    for (rows, w_new), (n_in, n_filtered, n_bad) in zip(script, want, strict=True):
        out = run_bucket(loaded, comps, _partition(rows), carried, w, T0 + w_new * S, sync)
        carried, w = out[("carried", "")], T0 + w_new * S
        n = out[("n", "")].to_pylist()[0]
        delivered = out[("produced", "")].num_rows
        assert (n["events_in"], n["filtered"], n["malformed"]) == (n_in, n_filtered, n_bad), (w_new, n)
        assert n["events_in"] == delivered + n["filtered"] + n["malformed"]
        dead += [json.loads(e)["clicks"] for e in out[("dead", "")]["event"].to_pylist()]
        seen = [json.loads(r)["seen"] for r in out[("produced", "")]["record"].to_pylist()]
        given.append(sorted((r["key"], r["clicks"], r["_update"], "_retract" in r) for r in seen))
    assert dead == [1, 2], "X a dead letter once per version"
    assert given == [
        [("a", 2, False, False), ("b", 2, False, False)],
        [("a", 3, True, False)],
        [("a", 4, True, False)],
        [("b", 2, True, True), ("f", 2, False, False)],  # B retracted; F delivered for the first time
    ]
    out = run_bucket(loaded, comps, _partition([]), carried, w, T0 + 10 * M, Sync({"minutes": ()}, **_rest(sync)))
    assert out[("carried", "")].num_rows == 0, "every row final: nothing remembered"


def _rest(sync: Sync) -> dict:
    return {"lateness": sync.lateness, "partitioning": sync.partitioning}


# ---------------------------------------------------------------------------
# The replay in jobs of bounded size (memory a job's, not the timeline's): many small Spark jobs,
# the state handed from one to the next through a scratch object in the store, commit the bytes
# one job does. The jobs are counted by the replay's own `progress(epochs done, epochs)`, called
# once before the first job and once after each.
#
#   timeline   e1 e2 e3 e4 e5 e6 e7 e8 e9          one job:  [e1 .......... e9]
#   bound 1    [] [] [] [] [] [] [] [] []          bound 80: [e1 e2][e3 e4] ... (2 batches of 40)


def replayed(store, spec, spark, parts: list[int]) -> tuple[dict[tuple[str, int], bytes], int]:
    """`recompute`'s content as Parquet bytes per (output, partition), and the Spark jobs it ran."""
    from wire_dagster.parquetio import parquet_bytes

    calls: list[tuple[int, int]] = []
    contents = computestage.recompute(store, spec, spark, parts, lambda done, total: calls.append((done, total)))
    done = [d for d, _ in calls]
    assert done[0] == 0 and done == sorted(set(done)) and calls[-1][0] == calls[-1][1], calls
    out = {(w, p): parquet_bytes(t) for w, ps in contents.items() for p, t in ps.items() if t is not None}
    return out, len(calls) - 1


def committed_bytes(store, spec) -> dict[tuple[str, int], str]:
    """(output, partition) -> the sha256 of its committed file."""
    m = Checkpoints(store, spec.name).latest()
    assert m is not None
    return {(w, int(p)): ref.sha256 for w, ps in m.outputs.items() for p, ref in ps.items()}


def in_one_job(monkeypatch) -> None:
    monkeypatch.delenv("WIRE_COMPUTATION_EPOCH_ROWS", raising=False)
    monkeypatch.setenv("WIRE_EPOCHS_PER_JOB", "1000")


def in_small_jobs(monkeypatch, rows: int) -> None:
    monkeypatch.setenv("WIRE_COMPUTATION_EPOCH_ROWS", str(rows))
    monkeypatch.delenv("WIRE_EPOCHS_PER_JOB", raising=False)


def test_a_backfill_over_a_raw_stream_in_small_jobs_commits_the_bytes_of_one_job(
    store, spark, cli_env, spark_remote, tmp_path: Path, monkeypatch
) -> None:
    """Quiet, spikes and the timer zoo (tests/test_computations.py) over 8 batches of 40 clicks,
    an epoch each, then the close. A replay in one job, in a job per epoch (bound: 1 row), in
    jobs of two epochs (bound: 80 rows) and in a job per epoch by key bucket rebuild the
    committed bytes; a `wire backfill` killed between two jobs leaves its scratch object, which
    neither the next backfill (new code, small jobs: exactly what a fresh replay of the new code
    commits, and the reference executor's records) nor a tick trips over, and garbage collection
    deletes."""
    mods = _modules(tmp_path / "m")
    spec = load_pipeline(_pipeline(mods, name="rb_users"))
    events = _events(random.Random(7), 320)
    level = stream_spec("clicks", "ts", "event_id", spec)
    for i in range(0, len(events), 40):
        f = tmp_path / f"b{i}.jsonl"
        f.write_text("".join(json.dumps(e) + "\n" for e in events[i : i + 40]))
        streams.produce(store, level, f)
        assert computestage.process(store, spec, spark, max_epochs=1).committed
    streams.close_stream(store, "clicks")
    while computestage.process(store, spec, spark, max_epochs=5).committed:
        pass
    cp = Checkpoints(store, spec.name)
    m1 = cp.latest()
    assert m1 is not None and m1.watermark == INF
    steps = cp.timeline(m1.epoch)
    assert len(steps) >= 9, "an epoch a batch, then the close"

    def want() -> list[tuple]:  # the reference executor over every click at once (none is late)
        pos = _positions(store, spec)
        clicks = [{"t": e["ts"], "key": e["user_id"], "pos": pos[e["event_id"]], "rec": e} for e in events]
        return _sorted(r for c in COMPS for r in reference(load_class(c.code, str(mods), c.code), c, clicks)[0])

    assert _committed(store, spec) == want() and _committed(store, spec)
    parts = sorted({p for _, p in committed_bytes(store, spec)})
    before = bucket_snapshot(store)
    in_one_job(monkeypatch)
    one, jobs = replayed(store, spec, spark, parts)
    assert jobs == 1
    assert {k: sha256(b) for k, b in one.items()} == committed_bytes(store, spec)
    in_small_jobs(monkeypatch, 1)
    small, jobs = replayed(store, spec, spark, parts)
    assert small == one and jobs == len(steps), "a job per epoch"
    in_small_jobs(monkeypatch, 80)
    pairs, jobs = replayed(store, spec, spark, parts)
    assert pairs == one and 1 < jobs < len(steps), jobs
    monkeypatch.setenv("WIRE_SINGLE_TASK_ROWS", "0")  # each epoch by key bucket: the state handed by the driver
    bucketed, jobs = replayed(store, spec, spark, parts)
    monkeypatch.delenv("WIRE_SINGLE_TASK_ROWS")
    assert bucketed == one and jobs == len(steps), jobs
    assert bucket_snapshot(store) == before, "a replay leaves nothing behind"

    # a `wire backfill` killed (its process group) while held before its third job
    env = dict(cli_env, WIRE_PIPELINES=str(mods), DAGSTER_HOME=str(tmp_path / "dagster-home"))
    env.update(WIRE_COMPUTATION_EPOCH_ROWS="1", WIRE_PAUSE="before-spark:3", WIRE_PAUSE_DIR=str(tmp_path))
    env.pop("WIRE_SPARK_REMOTE", None)
    env["WIRE_SPARK_MASTER"] = "local[2]"
    if spark_remote:
        env["WIRE_SPARK_REMOTE"] = spark_remote
    wire = str(Path(sys.executable).parent / "wire")
    held = tmp_path / "before-spark.paused"
    log = tmp_path / "killed-backfill.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [wire, "backfill", "--pipeline", spec.name], env=env, start_new_session=True, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 300
        while not held.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # polling for the pause file, a condition, until a deadline
        assert held.exists(), f"exit {proc.poll()}: {log.read_text()[-3000:]}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    left = scratch_objects(store, spec.name, "backfill-state")
    assert len(left) == 1 and left[0].endswith(f"after-{steps[1].epoch}.parquet"), left
    assert cp.latest() == m1

    # the next backfill, new code (the zoo no longer echoes), in a job per epoch
    (mods / "zoo.py").write_text(ZOO.replace('ctx.produce({"echo": record["v"]}, "zoo", time=ctx.time + 1)', "pass"))
    spec = load_pipeline(mods / "rb_users.yaml")
    in_small_jobs(monkeypatch, 1)
    m2 = backfill(store, spec, spark, parts)
    assert m2 is not None and m2.kind == "backfill" and set(m2.changed) == {"zoo"}
    assert scratch_objects(store, spec.name, "backfill-state") == left, (
        "its own scratch deleted, the dead one's untouched"
    )
    in_one_job(monkeypatch)
    fresh, jobs = replayed(store, spec, spark, parts)
    assert jobs == 1 and {k: sha256(b) for k, b in fresh.items()} == committed_bytes(store, spec)
    got = _committed(store, spec)
    assert got == want() and not any('"echo"' in r[4] for r in got)

    # a tick: nothing to do, no failure; garbage collection deletes the dead backfill's scratch
    assert not computestage.process(store, spec, spark, max_epochs=1).committed
    cp.gc(keep=50, grace_s=0)
    assert scratch_objects(store, spec.name, "backfill-state") == [] and cp.latest() == m2 and not cp.verify(m2)


def test_a_backfill_over_a_derived_stream_in_small_jobs_commits_the_bytes_of_one_job(
    store, spark, tmp_path: Path, monkeypatch
) -> None:
    """`cb_busy`'s timeline above (an epoch per upstream commit, two late firings: the memory of
    the rows not final yet is handed from job to job with the state). A job per epoch (bound: 1
    row; a derived epoch's rows are those of the upstream partition files it reads) rebuilds the
    committed bytes of one job; with the new threshold its backfill commits what a replay in one
    job of the new code gives, the reference executor's records."""
    pdir = tmp_path / "pipelines"
    pdir.mkdir()
    (pdir / "cb_up.yaml").write_text(yaml.safe_dump(UP))
    (pdir / "cb_busy.yaml").write_text(yaml.safe_dump(stage("cb_busy", "busy")))
    (pdir / "busy.py").write_text(BUSY.format(threshold=3))
    up, busy = (load_pipeline(pdir / f"{n}.yaml") for n in ("cb_up", "cb_busy"))
    rounds = batches()
    for i, batch in enumerate(rounds):
        f = tmp_path / f"b{i}.jsonl"
        f.write_text("".join(json.dumps(c) + "\n" for c in batch))
        assert streams.produce(store, up, f).events == len(batch)
        tick(store, spark, up, busy)
    streams.close_stream(store, up)
    tick(store, spark, up, busy)
    cp = Checkpoints(store, "cb_busy")
    m1 = cp.latest()
    assert m1 is not None and m1.watermark == INF
    steps = cp.timeline(m1.epoch)
    seen, _ = deliveries(rounds)
    old = expected(pdir, "busy", seen)
    assert len(steps) == 6 and committed(store, busy) == old

    parts = [T0, T0 + 5 * M, T0 + 10 * M]
    in_one_job(monkeypatch)
    one, jobs = replayed(store, busy, spark, parts)
    assert jobs == 1 and {k: sha256(b) for k, b in one.items()} == committed_bytes(store, busy)
    in_small_jobs(monkeypatch, 1)
    small, jobs = replayed(store, busy, spark, parts)
    assert small == one and jobs == len(steps), jobs

    (pdir / "busy.py").write_text(BUSY.format(threshold=2))
    m2 = backfill(store, busy, spark, parts)
    assert (
        m2 is not None
        and m2.changed == {"busy": parts[:2]}
        and scratch_objects(store, "cb_busy", "backfill-state") == []
    )
    in_one_job(monkeypatch)
    fresh, jobs = replayed(store, busy, spark, parts)
    assert jobs == 1 and {k: sha256(b) for k, b in fresh.items()} == committed_bytes(store, busy)
    assert committed(store, busy) == expected(pdir, "busy", seen) != old
