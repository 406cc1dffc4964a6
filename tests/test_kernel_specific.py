"""Specific kernel behaviours, and one run through the real path (S3 chunks → engine.process).

Each test states the expectation it checks independently: hand-computed values,
the plain-Python reference, or invariants (determinism, conservation).
"""

from __future__ import annotations

import itertools
import json

import pyarrow as pa
import pytest

import reference
from commit_scenario import results_read, scratch_objects
from kernel_harness import (
    KernelRun,
    check_balance,
    diff_rows,
    diff_views,
    event,
    events_table,
)
from wire_dagster import engine, events, kernel, results, streams
from wire_dagster.parquetio import parquet_bytes
from wire_dagster.spec import pipeline_from_dict
from wire_dagster.timeutil import INF, NEG_INF


def spec_of(windows, lateness=0, key: str | None = "k", id: str | None = "id", **extra):
    ev = {"time": "t", **({"key": key} if key else {}), **({"id": id} if id else {})}
    return pipeline_from_dict(
        {
            "name": "sp",
            "event": ev,
            "lateness": {"allowed": lateness},
            "partition": 60,
            "start": "1970-01-01T00:00:00Z",
            "windows": windows,
            **extra,
        }
    )


def outputs(res, name):
    return res.windows[name].outputs.to_pylist()


def test_decimal_sums_are_exact_and_runs_are_byte_identical(spark):
    """Sums are exact decimals (0.1 + 0.2 == 0.3), and the same epoch twice gives the same bytes."""
    spec = spec_of(
        [
            {
                "name": "tum",
                "type": "tumbling",
                "size": 10,
                "aggregates": {"n": "count", "total": "sum(v)", "mean": "avg(v)", "d": "count_distinct(v)"},
            },
            {"name": "se", "type": "session", "gap": 3, "aggregates": {"n": "count", "total": "sum(v)"}},
        ],
        lateness=5,
    )
    evs = [event(spec, t, "a", f"i{t}", row=t, v=v) for t, v in [(1, 0.1), (2, 0.2), (3, 0.1), (12, 1e-9), (13, 3e-9)]]
    evs.append(event(spec, 4, "a", "i1", row=99, v=100.0))  # a repeated id: a duplicate, not counted
    runs = [KernelRun(spec), KernelRun(spec)]
    results = [r.epoch(spark, evs, 20) for r in runs]
    rows = {(r["window_start"], r["window_end"]): r for r in outputs(results[0], "tum")}
    assert rows[(0, 10)]["total"] == 0.4 and rows[(0, 10)]["n"] == 3  # not 0.30000000000000004 + 0.1
    assert rows[(0, 10)]["d"] == 2  # 0.1 twice, 0.2
    assert rows[(10, 20)]["total"] == 4e-9  # nine decimals are kept exactly
    se = {(r["window_start"], r["window_end"]): r["total"] for r in outputs(results[0], "se")}
    assert se == {(1, 6): 0.4, (12, 16): 4e-9}
    assert results[0].duplicate == 1
    for name in ("tum", "se"):
        assert parquet_bytes(results[0].windows[name].outputs) == parquet_bytes(results[1].windows[name].outputs)
        assert parquet_bytes(results[0].windows[name].state) == parquet_bytes(results[1].windows[name].state)
    assert parquet_bytes(results[0].dead_letters) == parquet_bytes(results[1].dead_letters)
    assert parquet_bytes(results[0].ids) == parquet_bytes(results[1].ids)
    assert not check_balance(spec, results[0])


def test_pipeline_without_key_or_id(spark):
    """No key field: every event has the null key, and null keys still merge sessions."""
    spec = spec_of(
        [
            {"name": "tum", "type": "tumbling", "size": 10, "aggregates": {"n": "count"}},
            {"name": "se", "type": "session", "gap": 10, "aggregates": {"n": "count", "hi": "max(v)"}},
        ],
        lateness=100,
        key=None,
        id=None,
    )
    run, ref = KernelRun(spec), reference.RefState()
    e1 = [event(spec, 0, row=0, v=1.0), event(spec, 20, row=1, v=2.0)]
    e2 = [event(spec, 10, seq=1, row=0, v=5.0)]  # bridges [0, 10) and [20, 30)
    for evs, w in [(e1, 40), (e2, 41)]:
        res = run.epoch(spark, evs, w)
        want = reference.run_epoch(spec, ref, evs, w)
        assert res.ids is None and res.duplicate == 0
        assert not check_balance(spec, res)
        for name in ("tum", "se"):
            assert not diff_rows(outputs(res, name), want[name], name)
    #  0         10        20        30
    #  [---------)         [---------)   fired at W = 40
    #            [---------)             t = 10 (null key, like the others)
    #  [-----------------------------)   merged; both old sessions retracted
    got = {(r["key"], r["window_start"], r["window_end"], r["retract"]) for r in outputs(res, "se")}
    assert got == {(None, 0, 30, False), (None, 0, 10, True), (None, 20, 30, True)}
    assert run.view["se"] == {(None, 0, 30): {"key": None, "window_start": 0, "window_end": 30, "n": 3, "hi": 5.0}}


def test_retry_into_a_long_open_session_is_a_duplicate(spark):
    """An id stays remembered while the session that counted it is open, even past t + gap + lateness.

    gap 10, lateness 0: events every 5 ms keep one session [0, 30) open; at W = 15 the
    first event's own extent (0 + 10 + 0) has passed, but a retry of it touches the
    open session — without the memory it would be rescued and counted twice."""
    spec = spec_of([{"name": "se", "type": "session", "gap": 10, "aggregates": {"n": "count"}}])
    run, ref = KernelRun(spec), reference.RefState()
    e1 = [event(spec, t, "a", f"e{i}", row=i) for i, t in enumerate([0, 5, 10, 15, 20])]
    e2 = [event(spec, 0, "a", "e0", seq=1)]
    run.epoch(spark, e1, 15)
    reference.run_epoch(spec, ref, e1, 15)
    res = run.epoch(spark, e2, 16)
    reference.run_epoch(spec, ref, e2, 16)
    assert res.duplicate == 1 and res.windows["se"].counted == 0
    assert [(r["key"], r["start"], r["end"], r["p_n_n"]) for r in run.state["se"].to_pylist()] == [("a", 0, 30, 5)]
    assert ref.counts["duplicate"] == 1 and ref.windows["se"][("a", 0, 30)]["p_n_n"] == 5
    # once the session is purged (W >= 30 + 0), the ids are forgotten
    res = run.epoch(spark, [], 30)
    assert res.ids is not None and res.ids.num_rows == 0


# ---------------------------------------------------------------------------
# The real path: chunks in the object store, engine.process epochs, committed results.


PIPE = {
    "name": "realpath",
    "stream": "realpath",
    "event": {"key": "user", "time": "ts", "id": "event_id"},
    "watermark": {"max_out_of_orderness": 5, "idle_timeout": "1h"},
    "lateness": {"allowed": 10},
    "partition": 20,
    "start": "1970-01-01T00:00:00Z",
    "windows": [
        {
            "name": "tum",
            "type": "tumbling",
            "size": 10,
            "aggregates": {"n": "count", "total": "sum(amount)", "hi": "max(amount)"},
        },
        {"name": "sl", "type": "sliding", "size": 10, "slide": 5, "aggregates": {"n": "count", "mean": "avg(amount)"}},
        {"name": "se", "type": "session", "gap": 4, "aggregates": {"n": "count", "users": "count_distinct(user)"}},
    ],
}


def _produce(store, spec, tmp_path, segment: str, records: list, name: str):
    """Append JSON lines as one chunk; returns the reference events (with source positions)."""
    path = tmp_path / f"{name}.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    rep = streams.produce(store, spec, path, segment=segment)
    assert len(rep.chunks) == 1
    out = []
    for row, r in enumerate(records):
        if isinstance(r, dict):
            out.append(
                event(
                    spec,
                    r["ts"],
                    r["user"],
                    r["event_id"],
                    seg=segment,
                    seq=rep.chunks[0],
                    row=row,
                    amount=r.get("amount"),
                    user=r["user"],
                )
            )
    return out


@pytest.mark.parametrize(
    ("single_task_rows", "room"),
    [("0", None), ("1000000", None), ("0", "1")],
    ids=["key buckets", "single task", "key buckets, results through the store"],
)
def test_real_path_s3_engine_matches_reference(store, spark, tmp_path, monkeypatch, single_task_rows, room):
    """With a room of 1 byte (WIRE_DRIVER_RESULT_BYTES) every bucket's tables come to Wire
    through the store (handover.py), are read from there, then deleted."""
    monkeypatch.setenv("WIRE_SINGLE_TASK_ROWS", single_task_rows)
    if room is not None:
        monkeypatch.setenv("WIRE_DRIVER_RESULT_BYTES", room)
    fetched = results_read(monkeypatch)
    spec = pipeline_from_dict(PIPE)
    assert "f_user" in events.chunk_schema(spec).names  # count_distinct(user) stores the field
    ref = reference.RefState()

    def rec(ts, user, i, amount=None):
        return {"ts": ts, "user": user, "event_id": f"x{i}", **({"amount": amount} if amount is not None else {})}

    # epoch 1: two segments; W = min(50 - 5, 30 - 5) = 25
    first = [rec(1, "a", 1, 1.5), rec(3, "a", 2, 2.0), rec(12, "b", 3, 4.0), rec(50, "a", 4, 1.0)]
    ev1 = _produce(store, spec, tmp_path, "s0", first, "a")
    ev1 += _produce(store, spec, tmp_path, "s1", [rec(8, "b", 5, 3.0), "not json", rec(30, "b", 6)], "b")
    out = engine.process(store, spec, spark)
    m1 = out.manifest
    assert m1 is not None and out.committed == [1] and m1.watermark == 25
    reference.run_epoch(spec, ref, ev1, m1.watermark)

    # epoch 2: the first chunk retried (duplicates), late events within and past lateness; W = min(45, 55) = 45
    ev2 = _produce(store, spec, tmp_path, "s0", first, "c")
    ev2 += _produce(
        store,
        spec,
        tmp_path,
        "s1",
        [rec(24, "a", 7, 5.0), rec(2, "b", 8, 1.0), rec(60, "b", 9, 2.0), rec(46, "a", 10, 7.0)],
        "d",
    )
    m2 = engine.process(store, spec, spark).manifest
    assert m2 is not None and m2.epoch == 2 and m2.watermark == 45
    reference.run_epoch(spec, ref, ev2, m2.watermark)

    # epoch 3: the stream closes: W = +inf and every open window fires
    streams.close_stream(store, spec)
    m3 = engine.process(store, spec, spark).manifest
    assert m3 is not None and m3.epoch == 3 and m3.watermark == INF
    reference.run_epoch(spec, ref, [], INF)

    for w in spec.windows:
        got = results.read_results(store, spec, w.name).to_pylist()
        assert len(got) == len({(r["key"], r["window_start"], r["window_end"]) for r in got})
        problems = diff_views(
            {(r["key"], r["window_start"], r["window_end"]): r for r in got}, ref.view[w.name], w.name
        )
        assert not problems, "\n".join(problems)
        assert m3.totals.counted[w.name] == ref.window_counts[w.name]["counted"]
        assert m3.totals.late[w.name] == ref.window_counts[w.name]["late"]
    assert bool(fetched) == (room is not None), fetched
    assert scratch_objects(store, spec.name, "results") == [], "each read and deleted"
    # The retry of the first chunk: ids are kept until t + extent 10 + lateness 10 > W, so at
    # W = 25 x1 (t=1) and x2 (t=3) are forgotten — and late anyway — while x3, x4 are duplicates.
    assert m3.totals.duplicate == ref.counts["duplicate"] == 2
    assert m3.totals.malformed == 1 and m3.totals.events_in == ref.counts["in"] + 1
    assert m3.totals.balanced()
    dls = results.read_dead_letters(store, spec)
    got_dead = sorted((d["reason"], d["window"] or "", d["segment"], d["chunk"], d["row"]) for d in dls)
    want_dead = sorted(
        [(r, w or "", e["_seg"], e["_seq"], e["_row"]) for r, w, e in ref.dead]
        + [("malformed: unparsable JSON", "", "s1", 0, 1)]
    )
    assert got_dead == want_dead
    late_rows = {(seg, chunk, row) for r, w, seg, chunk, row in got_dead if r == "late"}
    assert {("s0", 1, 0), ("s0", 1, 1), ("s1", 1, 1)} <= late_rows  # retried x1, x2 and t=2: late


@pytest.mark.parametrize("w_prev,w_new", [(NEG_INF, NEG_INF), (NEG_INF, INF)], ids=["W-stays", "W-to-inf"])
def test_empty_epoch(spark, w_prev, w_new):
    """No events: nothing counted, nothing late; with W = +inf nothing to fire either."""
    spec = spec_of([{"name": "tum", "type": "tumbling", "size": 10, "aggregates": {"n": "count"}}])
    res = kernel.run_epoch(spark, spec, events_table(spec, []), {}, None, w_prev, w_new)
    assert res.events == 0 and res.windows["tum"].outputs.num_rows == 0 and res.dead_letters.num_rows == 0
    assert not check_balance(spec, res)


@pytest.mark.parametrize(
    "result_bytes,pairs_only",
    [(None, False), (1, False), (None, True)],
    ids=["results fit", "results bound: one epoch per job", "rows fit two epochs, not four"],
)
def test_epochs_of_one_spark_job_commit_what_a_job_per_epoch_commits(
    store, spark, tmp_path, monkeypatch, result_bytes, pairs_only
):
    """A backlog computed several epochs per Spark job (state carried in the task), each job
    computing while the previous job's epochs are committed, commits, epoch by epoch, the same
    manifests as one job per epoch with nothing overlapping (one epoch per `process` call) — same
    chunks, watermarks, counts, bytes of every result partition, state file and id memory, and
    dead letters — and the results equal the reference's, epoch by epoch; the batched run needs
    fewer Spark jobs. When a job's results reach `kernel.JOB_RESULT_BYTES` the task stops: the
    epochs it computed are committed and the rest planned again (with a 1-byte bound, every job
    computes one of its epochs). A job's events are bounded per two consecutive epochs (the one
    computed and the one read ahead), not summed over the job: with WIRE_SINGLE_TASK_ROWS that
    holds any two epochs and the carried rows but not the whole backlog, one job computes it."""
    import random

    monkeypatch.setenv("WIRE_SINGLE_TASK_ROWS", "1000000")
    if result_bytes is not None:
        monkeypatch.setattr(kernel, "JOB_RESULT_BYTES", result_bytes)
    rng = random.Random(7)
    base = {**PIPE, "limits": {"max_chunks_per_epoch": 2}}
    per_job, batched = (pipeline_from_dict({**base, "name": n}) for n in ("perjob", "batched"))  # one stream
    produced = []
    for c in range(7):  # seven chunks per segment: several epochs of backlog
        for seg in ("s0", "s1"):
            recs = []
            for i in range(40):
                t = c * 20 + rng.randrange(0, 30)
                recs.append(
                    {
                        "ts": t,
                        "user": rng.choice("abcd"),
                        "event_id": f"{seg}-{c}-{i}",
                        "amount": rng.randrange(1, 9) * 0.5,
                    }
                )
            recs += [dict(r) for r in rng.sample(recs, 3)]  # repeated ids: duplicates
            recs.append(
                {"ts": max(0, c * 20 - 25), "user": "a", "event_id": f"{seg}-{c}-late", "amount": 1.0}
            )  # late for some windows
            produced += _produce(store, per_job, tmp_path, seg, recs, f"{seg}-{c}")
    streams.close_stream(store, per_job)

    jobs = []
    real = engine.run_epochs
    monkeypatch.setattr(engine, "run_epochs", lambda *a, **kw: jobs.append(len(a[2])) or real(*a, **kw))
    now = streams.now_ms()
    monkeypatch.setenv("WIRE_EPOCHS_PER_JOB", "1")
    a = engine.Outcome(manifest=None)
    while step := engine.process(store, per_job, spark, max_epochs=1, now=now).committed:
        a.committed += step
    if pairs_only:
        from wire_dagster.checkpoint import Checkpoints as _Cp

        ms = [_Cp(store, "perjob").load(e) for e in a.committed]
        totals = [0] + [m.totals.events_in for m in ms]  # cumulative
        events = [y - x for x, y in itertools.pairwise(totals)]
        carried = [engine._Carry.of(m).rows for m in ms[:-1]]  # what each next job starts from
        rows = max(x + y for x, y in itertools.pairwise(events)) + max(carried)
        assert sum(events) > rows  # summed over a job, the backlog would not fit one job
        monkeypatch.setenv("WIRE_SINGLE_TASK_ROWS", str(rows))
    monkeypatch.setenv("WIRE_EPOCHS_PER_JOB", "8" if pairs_only else "4")
    b = engine.process(store, batched, spark, max_epochs=100, now=now)
    n = len(a.committed)
    assert n >= 6 and b.committed == a.committed
    assert jobs[:n] == [1] * n
    if pairs_only:  # one job for the whole backlog: it never holds more than two epochs' events
        assert n <= 8 and jobs[n:] == [n]
    elif result_bytes is None:  # jobs of up to 4 planned epochs, each computed whole
        assert sum(jobs[n:]) == n and max(jobs[n:]) == 4 and len(jobs[n:]) < n
    else:  # up to 4 planned, one computed: a job per epoch
        assert len(jobs[n:]) == n and max(jobs[n:]) == 4

    from wire_dagster.checkpoint import Checkpoints

    ref = reference.RefState()
    by_pos = {(e["_seg"], e["_seq"]): [] for e in produced}
    for e in produced:
        by_pos[(e["_seg"], e["_seq"])].append(e)
    for epoch in a.committed:
        ma, mb = Checkpoints(store, "perjob").load(epoch), Checkpoints(store, "batched").load(epoch)
        assert (ma.watermark, ma.remap, ma.chunks, ma.changed) == (mb.watermark, mb.remap, mb.chunks, mb.changed)
        assert ma.counts == mb.counts and ma.totals == mb.totals and ma.totals.balanced()
        assert {w: {p: r.sha256 for p, r in ps.items()} for w, ps in ma.outputs.items()} == {
            w: {p: r.sha256 for p, r in ps.items()} for w, ps in mb.outputs.items()
        }
        assert {w: r.sha256 for w, r in ma.state.items()} == {w: r.sha256 for w, r in mb.state.items()}
        assert ma.ids is not None and mb.ids is not None and ma.ids.sha256 == mb.ids.sha256
        assert [r.sha256 for r in ma.dead_letters] == [r.sha256 for r in mb.dead_letters]
        evs = [
            e for seg, (lo, hi) in ma.chunks.items() for seq in range(lo, hi + 1) for e in by_pos.get((seg, seq), [])
        ]
        reference.run_epoch(per_job, ref, evs, ma.watermark)
    assert b.manifest is not None and b.manifest.watermark == INF
    for w in per_job.windows:
        got = results.read_results(store, batched, w.name).to_pylist()
        problems = diff_views(
            {(r["key"], r["window_start"], r["window_end"]): r for r in got}, ref.view[w.name], w.name
        )
        assert not problems, "\n".join(problems)
    assert b.manifest.totals.duplicate == ref.counts["duplicate"] and b.manifest.totals.late == {
        w.name: ref.window_counts[w.name]["late"] for w in per_job.windows
    }


def test_a_failed_commit_leaves_the_next_job_uncommitted_and_the_retry_commits_the_same(
    store, spark, tmp_path, monkeypatch
):
    """While a job's epochs are committed the next job computes; when a commit fails (here the
    second epoch's, as a rival's commit or a lost store would make it), `process` raises after the
    next job has ended, nothing past the failed epoch is committed, and the next call commits the
    rest: the same manifests as one epoch per call."""
    from wire_dagster.checkpoint import Checkpoints

    monkeypatch.setenv("WIRE_SINGLE_TASK_ROWS", "1000000")
    monkeypatch.setenv("WIRE_EPOCHS_PER_JOB", "1")  # a job per epoch: every commit overlaps the next job
    base = {**PIPE, "limits": {"max_chunks_per_epoch": 1}}
    failing, calm = (pipeline_from_dict({**base, "name": n}) for n in ("failing", "calm"))  # one stream
    for c in range(4):
        recs = [{"ts": c * 20 + i, "user": "ab"[i % 2], "event_id": f"{c}-{i}", "amount": 1.0} for i in range(10)]
        _produce(store, failing, tmp_path, "s0", recs, f"c{c}")
    streams.close_stream(store, failing)
    now = streams.now_ms()

    jobs: list[int] = []
    real_compute, real_commit = engine._compute, engine._commit_epoch
    monkeypatch.setattr(engine, "_compute", lambda *a: jobs.append(a[-1][0].epoch) or real_compute(*a))
    commits = []

    def commit(*a, **kw):
        commits.append(a[5].epoch)
        if len(commits) == 2:
            raise RuntimeError("commit refused")
        return real_commit(*a, **kw)

    monkeypatch.setattr(engine, "_commit_epoch", commit)
    with pytest.raises(RuntimeError, match="commit refused"):
        engine.process(store, failing, spark, max_epochs=100, now=now)
    cp = Checkpoints(store, "failing")
    assert cp.committed() == [1] and commits == [1, 2]
    assert jobs == [1, 2, 3]  # epoch 3's job was computing during the refused commit: it ran to its end, uncommitted

    monkeypatch.setattr(engine, "_commit_epoch", real_commit)
    retried = engine.process(store, failing, spark, max_epochs=100, now=now).committed
    seq = []
    while step := engine.process(store, calm, spark, max_epochs=1, now=now).committed:
        seq += step
    assert len(seq) >= 4 and [1, *retried] == seq
    for epoch in seq:
        ma, mb = Checkpoints(store, "failing").load(epoch), Checkpoints(store, "calm").load(epoch)
        assert (ma.watermark, ma.chunks, ma.counts) == (mb.watermark, mb.chunks, mb.counts)
        assert {w: {p: r.sha256 for p, r in ps.items()} for w, ps in ma.outputs.items()} == {
            w: {p: r.sha256 for p, r in ps.items()} for w, ps in mb.outputs.items()
        }
        assert {w: r.sha256 for w, r in ma.state.items()} == {w: r.sha256 for w, r in mb.state.items()}
        assert ma.ids is not None and mb.ids is not None and ma.ids.sha256 == mb.ids.sha256


def test_the_kernels_spark_types_are_made_without_asking_spark_again(spark, monkeypatch) -> None:
    """The type of packed tables (every job's `mapInArrow`/`applyInArrow`) is made locally and is
    what Spark parses of its DDL; a window's DDL is parsed by Spark once per process (Spark
    Connect asks its server for each parse)."""
    import uuid

    from pyspark.sql import types

    from wire_dagster.bucketkernel import PACKED_SCHEMA, pack, packed_type

    ddl = "epoch INT, kind STRING, w STRING, data BINARY, ref STRING"
    assert packed_type() == types._parse_datatype_string(ddl)
    assert pack({("out", "w"): pa.table({"x": [1]})}).schema == PACKED_SCHEMA

    parsed = []
    real = types._parse_datatype_string
    monkeypatch.setattr(types, "_parse_datatype_string", lambda s: parsed.append(s) or real(s))
    window = f"key STRING, start BIGINT, `end` BIGINT, n_{uuid.uuid4().hex} BIGINT"  # never parsed before
    first, again = kernel._ddl_to_arrow(window), kernel._ddl_to_arrow(window)
    assert first == again and first.names[:3] == ["key", "start", "end"] and parsed == [window]


def test_warming_the_workers_parses_no_spark_type(spark, monkeypatch) -> None:
    """`sparksession.warm_workers` runs one task per core with a type made locally: a DDL string
    would be parsed by Spark (on Spark Connect, a round trip to the server)."""
    from pyspark.sql import udf

    from wire_dagster.sparksession import warm_workers

    parsed = []
    # where a classic session's `mapInArrow` parses its type (PySpark's, not exported)
    real = udf._parse_datatype_string  # pyright: ignore[reportPrivateImportUsage]
    monkeypatch.setattr(udf, "_parse_datatype_string", lambda s: parsed.append(s) or real(s))
    warm_workers(spark)
    assert parsed == []
