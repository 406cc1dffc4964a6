"""Recovery (DESIGN §3): an object-store outage in the middle of a run, rewind and replay,
self-correction of the published output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from commit_scenario import (
    P_STEP,
    T0,
    assert_all,
    assert_published,
    assert_results,
    batch_lines,
    batch_malformed,
    expect,
    hand_epoch,
    make_batches,
    produce_batch,
    published,
    read_all,
    subprocess_env,
    tuned,
    wait_for,
    wanted_published,
    wire,
    wire_exe,
    write_pipeline,
)
from wire_dagster import engine, results
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.embedded import EmbeddedS3
from wire_dagster.manifest import sha256
from wire_dagster.objectstore import ObjectStore
from wire_dagster.status import pipeline_status
from wire_dagster.timeutil import iso


@pytest.fixture
def fast_spark(spark):
    """The session's Spark tuned for tiny epochs while the test runs (commit_scenario.tuned)."""
    with tuned(spark) as s:
        yield s


def test_outage_during_spark_phase_fails_cleanly_then_recovers(tmp_path: Path, cli_env, spark_remote) -> None:
    """A second embedded S3 server (so the session's server is not disturbed); `wire process`
    is held right before its Spark phase, the server is stopped, the run goes on: Spark's
    executors cannot read the chunks. The run must fail with exit 1 and one line on stderr
    naming the object store, commit nothing, and write no dead letter for the I/O error.
    With the server back, the next run commits results equal to the reference."""
    srv = EmbeddedS3(tmp_path / "s3-outage")
    cfg = srv.start()
    proc = None
    try:
        store = ObjectStore(cfg)
        spec, yml = write_pipeline(tmp_path, "outage")
        (batch,) = make_batches(11, 1)
        split = produce_batch(store, spec, tmp_path, batch, 0)
        pause = tmp_path / "pause"
        pause.mkdir()
        env = subprocess_env(
            cli_env, spark_remote, WIRE_PAUSE="before-spark", WIRE_PAUSE_DIR=str(pause), **cfg.export_env()
        )
        proc = subprocess.Popen(
            [wire_exe(), "process", "--pipeline", str(yml)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        wait_for(lambda: (pause / "before-spark.paused").exists(), 600, proc, "run reached its Spark phase")
        srv.stop()
        (pause / "before-spark.go").touch()
        _, err = proc.communicate(timeout=600)
        lines = [x for x in err.splitlines() if x.strip()]
        assert proc.returncode == 1, err[-3000:]
        assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
        assert (
            lines[0].startswith("error: ObjectStoreError:") and "object store" in lines[0] and cfg.endpoint in lines[0]
        ), lines[0]

        cfg2 = srv.start()
        store = ObjectStore(cfg2)
        cp = Checkpoints(store, spec.name)
        assert cp.epochs() == [] and cp.latest() is None  # nothing prepared, nothing committed
        reasons = {d["reason"] for d in results.read_dead_letters(store, spec)}
        assert (
            all(r.startswith("malformed: ") for r in reasons) and len(reasons) == 1
        )  # the one bad line, no I/O letter
        env2 = subprocess_env(cli_env, spark_remote, **cfg2.export_env())
        out = wire(["process", "--pipeline", yml], env2)
        assert "committed epochs 1..1" in out.stdout
        exp = expect(store, spec, [split], batch_lines(batch), batch_malformed(batch))
        assert_all(store, spec, exp)
        assert {d["reason"] for d in results.read_dead_letters(store, spec)} <= {"duplicate", "late"} | reasons
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        srv.stop()


def test_rewind_restores_epoch_and_replays_to_the_same_results(
    store: ObjectStore, fast_spark, cli_env, tmp_path: Path
) -> None:
    """Three epochs; `wire rewind --epoch 1`: the results and W are epoch 1's again (and
    `wire status` says so); processing again replays epochs 2 and 3 with the same chunks
    and commits the same results. W right after the rewind is W_1 and never regresses after.

        epoch   1    2    3    4 (rewind→1)   5 (=2)   6 (=3)
        W       W1   W2   W3   W1             W2       W3
    """
    spec, yml = write_pipeline(tmp_path, "rew")
    cp = Checkpoints(store, spec.name)
    batches = make_batches(21, 3)
    splits = []
    for k, b in enumerate(batches):
        splits.append(produce_batch(store, spec, tmp_path, b, k))
        assert engine.process(store, spec, fast_spark).committed == [k + 1]
    lines, bad = sum(map(batch_lines, batches)), sum(map(batch_malformed, batches))
    exp = expect(store, spec, splits, lines, bad)
    assert_all(store, spec, exp)
    w1, w2, w3 = exp.watermarks
    assert w1 < w2 < w3
    before = read_all(store, spec)
    chunks = [cp.load(n).chunks for n in (1, 2, 3)]

    assert wire(["rewind", "--pipeline", yml, "--epoch", "9"], cli_env, expect_rc=2).stderr.count("\n") == 1
    wire(["rewind", "--pipeline", yml, "--epoch", "1"], cli_env)
    st = json.loads(wire(["status", "--pipeline", yml, "--json"], cli_env).stdout)
    assert (st["epoch"], st["watermark_ms"], st["watermark"]) == (4, w1, iso(w1))
    assert_results(store, spec, expect(store, spec, splits[:1], batch_lines(batches[0]), batch_malformed(batches[0])))
    assert_published(store, spec)

    assert engine.process(store, spec, fast_spark, max_epochs=10).committed == [5, 6]
    ms = [cp.load(n) for n in (4, 5, 6)]
    assert [m.watermark for m in ms] == [w1, w2, w3]
    assert [m.chunks for m in ms[1:]] == chunks[1:]
    assert read_all(store, spec) == before
    assert_all(store, spec, exp)
    st = pipeline_status(store, spec)
    assert (st["epoch"], st["watermark_ms"]) == (6, w3)
    assert engine.process(store, spec, fast_spark).committed == []  # nothing left to replay or read

    # Garbage collection keeps the timeline: after epochs 1-4 are deleted, a backfill still
    # replays 1, 5, 6 (the rewind cut 2 and 3) and reproduces every partition: nothing committed.
    from wire_dagster.backfill import backfill, committed_partitions

    steps = cp.timeline(6)
    assert [st.epoch for st in steps] == [1, 5, 6] and [st.watermark for st in steps] == [w1, w2, w3]
    assert cp.gc(keep=2, grace_s=0)["epochs"] == 4 and cp.committed() == [5, 6]
    assert cp.timeline(6) == steps
    assert backfill(store, spec, fast_spark, committed_partitions(cp.latest())) is None
    assert cp.committed() == [5, 6] and read_all(store, spec) == before


def test_backfill_replays_the_timeline_through_the_engines_jobs(
    store: ObjectStore, fast_spark, tmp_path: Path, monkeypatch
) -> None:
    """A backfill computes the recorded epochs through `engine.compute`, grouped into Spark jobs
    by the engine's own rule (`reclock.job_length`): three small epochs are one job, or three
    with WIRE_EPOCHS_PER_JOB=1, or three key-bucket jobs with WIRE_SINGLE_TASK_ROWS=0. Every
    grouping rebuilds each partition's committed content exactly."""
    from wire_dagster.backfill import committed_partitions, recompute

    spec, _ = write_pipeline(tmp_path, "bfj")
    cp = Checkpoints(store, spec.name)
    for k, b in enumerate(make_batches(23, 3)):
        produce_batch(store, spec, tmp_path, b, k)
        assert engine.process(store, spec, fast_spark).committed == [k + 1]
    latest = cp.latest()
    assert latest is not None
    parts = committed_partitions(latest)
    committed = {
        w.name: {p: results.read_file(store, latest.outputs[w.name].get(str(p))) for p in parts} for w in spec.windows
    }
    real = engine.compute
    one_each = [[1], [2], [3]]
    for env, jobs_want in [
        ({}, [[1, 2, 3]]),
        ({"WIRE_EPOCHS_PER_JOB": "1"}, one_each),
        ({"WIRE_SINGLE_TASK_ROWS": "0"}, one_each),
    ]:
        jobs: list[list[int]] = []

        def spy(*a, jobs=jobs):
            jobs.append([a[-1] + i for i in range(len(a[-2]))])  # (..., epochs, first_epoch)
            return real(*a)

        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            m.setattr(engine, "compute", spy)
            got = recompute(store, spec, fast_spark, parts)
        assert jobs == jobs_want, env
        for w in spec.windows:
            for p in parts:
                have, want = got[w.name][p], committed[w.name][p]
                if want is None or want.num_rows == 0:
                    assert have is None or have.num_rows == 0, (env, w.name, p)
                else:
                    assert have is not None and have.equals(want), (env, w.name, p)


def test_self_correction_restores_published_output(store: ObjectStore, tmp_path: Path) -> None:
    """The committed manifest is the desired content of output/: a deleted file, an altered
    one (different size, then same size) and a hand-made stray file are found by the next
    engine.process, even with nothing new to read, reported in Outcome.repaired and fixed."""
    spec, _ = write_pipeline(tmp_path, "fix")
    cp = Checkpoints(store, spec.name)
    m1 = hand_epoch(cp, spec, 1, "run-1", {T0: [("a", T0, 1)], T0 + P_STEP: [("a", T0 + P_STEP, 2)]})
    m2 = hand_epoch(cp, spec, 2, "run-2", {T0 + 2 * P_STEP: [("b", T0 + 2 * P_STEP, 3)]}, carry=m1)
    cp.publish(m2)
    want = wanted_published(store, spec, m2)
    assert published(store, spec) == want and len(want) == 3
    gone, altered, same_size = sorted(want)
    store.delete(gone)
    store.put(altered, b"PAR1 not what the manifest says")
    stray = f"{cp.root}output/tumble/hand-made.parquet"
    store.put(stray, b"PAR1")

    out = engine.process(store, spec, None)  # nothing to read: no Spark needed
    assert out.committed == [] and out.manifest == m2
    assert sorted(out.repaired) == sorted([gone, altered, stray])
    assert published(store, spec) == want
    for k, digest in want.items():
        assert sha256(store.get(k)) == digest

    data = store.get(same_size)
    store.put(same_size, data[:-9] + bytes(b ^ 0xFF for b in data[-9:-4]) + data[-4:])
    assert engine.process(store, spec, None).repaired == [same_size]
    assert published(store, spec) == want
    assert engine.process(store, spec, None).repaired == []
