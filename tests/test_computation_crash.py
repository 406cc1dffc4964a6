"""Crash rows for computations (issue 24): `wire process` of a pipeline of computations (the
"user went quiet" alert and the timer zoo, whose code raises on some records), killed at every
fault point of an epoch's commit and by kill -9 at random moments, then restarted. Right after
the crash readers see whole epochs only; after the restart the committed outputs are byte for
byte those of an uninterrupted run — the same records with the same ids, none twice — and the
dead letters hold each failing record once.

    batch 1 ─ epoch 1 committed
    batch 2 ─ wire process ✗ killed at <point> ─ wire process ─▶ equal to the uninterrupted run
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from commit_scenario import (
    assert_committed_sound,
    assert_published,
    copied_bucket,
    kill_at_random_moments,
    module_cli_env,
    output_hashes,
    scratch_objects,
    subprocess_env,
    wait_for,
    wire,
    wire_exe,
)
from test_computations import COMMON, ZOO, _events
from wire_dagster import faults
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.objectstore import ObjectStore
from wire_dagster.results import read_dead_letters

EXAMPLES = Path(__file__).resolve().parent.parent / "pipelines" / "computations"
# Every crash point of an epoch's commit (faults.POINTS), not those of publishing, gc and rewinds.
POINTS = tuple(p for p in faults.POINTS if p not in ("during-publish", "during-gc", "during-rewind"))
QUICK = ("during-dead-letters",)  # `make test`; WIRE_CRASH_SEEDS > 1: all
ALL_POINTS = int(os.environ.get("WIRE_CRASH_SEEDS") or 1) > 1
PIPELINE = {
    "name": "comp",
    **COMMON,
    "computations": [
        {"name": "quiet", "code": "quiet:QuietAlert", "outputs": ["alerts"]},
        {"name": "zoo", "code": "zoo:TimerZoo", "outputs": ["zoo"]},
    ],
}


@pytest.fixture(scope="module")
def cli_env_module(s3_server, tmp_path_factory):
    return module_cli_env(s3_server, tmp_path_factory.mktemp("wire-home"))


@pytest.fixture(scope="module")
def template(s3_server, tmp_path_factory, spark_remote, cli_env_module):
    """A bucket holding epoch 1 committed and batch 2 produced, not processed; the committed
    outputs of an uninterrupted run of batch 2 (the expectation) and that run's seconds."""
    d = tmp_path_factory.mktemp("comp-crash")
    (d / "comp.yaml").write_text(yaml.safe_dump(PIPELINE))
    (d / "quiet.py").write_text((EXAMPLES / "quiet.py").read_text())
    (d / "zoo.py").write_text(ZOO)
    st = ObjectStore(replace(s3_server, bucket="tpl-" + uuid.uuid4().hex[:10]))
    st.ensure_bucket()
    env = subprocess_env(dict(cli_env_module, WIRE_S3_BUCKET=st.bucket), spark_remote, WIRE_PIPELINES=str(d))
    events = _events(random.Random(3), 1_200, users=5)
    for k, rows in enumerate((events[:500], events[500:])):
        f = d / f"b{k}.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        wire(["produce", "--stream", "clicks", "--file", f], env)
        if k == 0:
            wire(["process", "--pipeline", "comp"], env)
    wire(["close", "--stream", "clicks"], env)
    assert Checkpoints(st, "comp").committed() == [1]
    # the uninterrupted run, on a copy
    ok = copied_bucket(st, s3_server, "ok-")
    t0 = time.monotonic()
    wire(["process", "--pipeline", "comp", "--max-epochs", "5"], dict(env, WIRE_S3_BUCKET=ok.bucket))
    took = time.monotonic() - t0
    m = Checkpoints(ok, "comp").latest()
    assert m is not None and m.epoch == 2
    want = _outcome(ok, env)
    # `wire read` of an output: its records, as committed (id and fields as JSON text)
    p = wire(
        ["read", "--pipeline", "comp", "--window", "alerts", "--format", "jsonl"], dict(env, WIRE_S3_BUCKET=ok.bucket)
    )
    got = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    assert [(r["key"], r["id"], json.loads(r["record"])) for r in got] == [
        (r["key"], r["id"], r["record"]) for r in want["rows"]["alerts"]
    ]
    assert got and set(got[0]) == {"key", "window_start", "window_end", "id", "record"}
    return st, took, env, want


def _outcome(st: ObjectStore, env: dict) -> dict:
    """What must not depend on crashes: the committed output bytes and rows, and the dead letters."""
    from wire_dagster.computestage import read_output

    spec = _spec(env)
    m = Checkpoints(st, "comp").latest()
    assert m is not None
    rows = {w: read_output(st, spec, w) for w in ("alerts", "zoo")}
    letters = sorted(
        (d["reason"], d["segment"], d["chunk"], d["row"])
        for d in read_dead_letters(st, spec)
        if (d["reason"] or "").startswith("error:")
    )
    return {"hashes": output_hashes(m), "rows": rows, "letters": letters, "epoch": m.epoch}


def _fresh(template, s3_server) -> tuple[ObjectStore, dict, dict]:
    st0, _, env, want = template
    st = copied_bucket(st0, s3_server, "t-")
    return st, dict(env, WIRE_S3_BUCKET=st.bucket), want


def _spec(env: dict):
    from wire_dagster.spec import load_pipeline

    return load_pipeline(Path(env["WIRE_PIPELINES"]) / "comp.yaml")


def _assert_equal_to_uninterrupted(st: ObjectStore, env: dict, want: dict) -> None:
    got = _outcome(st, env)
    assert got == want
    ids = [r["id"] for rows in got["rows"].values() for r in rows]
    assert len(ids) == len(set(ids)) and len(ids) > 50  # none twice
    assert [r for r, *_ in got["letters"] if "boom" in r] == [
        "error: ValueError: boom at 1007",
        "error: ValueError: boom at 7",
    ]
    assert_published(st, _spec(env))


@pytest.mark.parametrize("point", POINTS if ALL_POINTS else QUICK)
def test_a_computation_run_killed_at_a_commit_step_then_restarted(template, s3_server, point: str) -> None:
    st, env, want = _fresh(template, s3_server)
    p = wire(["process", "--pipeline", "comp", "--max-epochs", "5"], dict(env, WIRE_FAULT=point), expect_rc=None)
    assert p.returncode == 86, (point, p.returncode, p.stderr[-2000:])
    committed = Checkpoints(st, "comp").committed()
    assert committed == ([1, 2] if point == "after-marker" else [1]), committed  # a whole epoch, or none
    assert_committed_sound(st, _spec(env))
    wire(["process", "--pipeline", "comp", "--max-epochs", "5"], env)
    _assert_equal_to_uninterrupted(st, env, want)


def test_a_computation_run_killed_at_random_moments_then_restarted(template, s3_server) -> None:
    """kill -9 of the real CLI's process group, three times at random moments of its run, then a
    run to completion."""
    st, env, want = _fresh(template, s3_server)
    rnd = random.Random(int(os.environ.get("WIRE_SEED", "11")))
    # The moments are drawn in the life of an uninterrupted run of the same work (the template's,
    # a run as warm as these: runs share the server's Spark session), not scaled from start-up.
    took = template[1]

    def whole_epochs() -> None:
        assert_committed_sound(st, _spec(env))
        assert Checkpoints(st, "comp").committed() in ([1], [1, 2])

    run = ["process", "--pipeline", "comp", "--max-epochs", "5"]
    assert kill_at_random_moments(run, env, rnd, 3, (0.1 * took, 0.9 * took), whole_epochs) >= 1
    wire(run, env)
    _assert_equal_to_uninterrupted(st, env, want)


def test_a_run_killed_while_its_results_wait_in_the_store_then_restarted(template, s3_server, tmp_path: Path) -> None:
    """A job's results beyond the driver's room come through the store (handover.Handover;
    with WIRE_DRIVER_RESULT_BYTES=1, all of them). kill -9 of the real CLI's process group once
    its task has written them and before it reads them: nothing is committed; the restart
    commits what an uninterrupted run commits, through the store again, and deletes its own
    handed-over objects; the killed run's, left in a staging that never commits, garbage
    collection deletes."""
    st, env, want = _fresh(template, s3_server)
    env = dict(env, WIRE_DRIVER_RESULT_BYTES="1")
    spec = _spec(env)
    held = tmp_path / "after-spark.paused"
    run = [wire_exe(), "process", "--pipeline", "comp", "--max-epochs", "5"]
    log = tmp_path / "held.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            run,
            env=dict(env, WIRE_PAUSE="after-spark", WIRE_PAUSE_DIR=str(tmp_path)),
            start_new_session=True,
            stdout=out,
            stderr=out,
        )
    try:
        wait_for(held.exists, 300, proc, "the run held after its Spark job")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    left = scratch_objects(st, "comp", "results")
    assert left, log.read_text()[-2000:]
    assert Checkpoints(st, "comp").committed() == [1]
    assert_committed_sound(st, spec)
    wire(["process", "--pipeline", "comp", "--max-epochs", "5"], env)
    _assert_equal_to_uninterrupted(st, env, want)
    assert scratch_objects(st, "comp", "results") == left, (
        "the restart's own read and deleted, the killed run's untouched"
    )
    wire(["gc", "--pipeline", "comp", "--grace", "0"], env)
    assert scratch_objects(st, "comp", "results") == []
    _assert_equal_to_uninterrupted(st, env, want)


# ---------------------------------------------------------------------------
# A computation over a derived stream (the clicks per user per minute of a counting pipeline):
# the stage's epoch 2 syncs to the upstream's later commits; killed at a commit step, restarted,
# it commits what an uninterrupted run commits (its memory of the rows not yet final included).

DERIVED_UP = {
    "name": "counts",
    **COMMON,
    "lateness": {"allowed": "30s"},
    "windows": [{"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"clicks": "count"}}],
}
DERIVED = {
    "name": "dcomp",
    "inputs": [{"name": "minutes", "pipeline": "counts", "output": "per_minute", "key": "key"}],
    "partition": COMMON["partition"],
    "start": COMMON["start"],
    "end": COMMON["end"],
    "computations": [
        {"name": "echo", "code": "echo:Echo", "outputs": ["echoes"]},
        {"name": "spikes", "code": "spike:CountSpikeDetector", "outputs": ["spikes"]},
    ],
}


@pytest.fixture(scope="module")
def derived_template(s3_server, tmp_path_factory, spark_remote, cli_env_module):
    """A bucket where the stage committed epoch 1 and the upstream committed more since; and the
    stage's committed outputs after an uninterrupted run (the expectation)."""
    from test_computations import ECHO, _minute_events

    d = tmp_path_factory.mktemp("derived-crash")
    for body in (DERIVED_UP, DERIVED):
        (d / f"{body['name']}.yaml").write_text(yaml.safe_dump(body))
    (d / "spike.py").write_text((EXAMPLES / "spike.py").read_text())
    (d / "echo.py").write_text(ECHO)
    st = ObjectStore(replace(s3_server, bucket="dtpl-" + uuid.uuid4().hex[:10]))
    st.ensure_bucket()
    env = subprocess_env(dict(cli_env_module, WIRE_S3_BUCKET=st.bucket), spark_remote, WIRE_PIPELINES=str(d))
    events = _minute_events(random.Random(8), 30, 4, late=6)
    half = len(events) // 2
    for k, rows in enumerate((events[:half], events[half:])):
        f = d / f"b{k}.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        wire(["produce", "--stream", "clicks", "--file", f], env)
        if k == 1:
            wire(["close", "--stream", "clicks"], env)
        wire(["process", "--pipeline", "counts", "--max-epochs", "5"], env)
        if k == 0:
            wire(["process", "--pipeline", "dcomp"], env)
    assert Checkpoints(st, "dcomp").committed() == [1]
    ok = copied_bucket(st, s3_server, "dok-")
    wire(["process", "--pipeline", "dcomp", "--max-epochs", "5"], dict(env, WIRE_S3_BUCKET=ok.bucket))
    want = _derived_outcome(ok, env)
    assert want["epoch"] == 2 and want["rows"]["echoes"] and want["rows"]["spikes"]
    return st, env, want


def _derived_outcome(st: ObjectStore, env: dict) -> dict:
    from wire_dagster.computestage import read_output
    from wire_dagster.spec import load_pipeline

    spec = load_pipeline(Path(env["WIRE_PIPELINES"]) / "dcomp.yaml")
    m = Checkpoints(st, "dcomp").latest()
    assert m is not None
    rows = {w: read_output(st, spec, w) for w in ("echoes", "spikes")}
    return {"hashes": output_hashes(m), "rows": rows, "epoch": m.epoch, "state": m.state["_computations"].sha256}


# (no dead letter in its epoch: the dead letters' fault point is not reached)
@pytest.mark.parametrize(
    "point", [p for p in POINTS if p != "during-dead-letters"] if ALL_POINTS else ["during-state-snapshot"]
)
def test_a_computation_over_a_derived_stream_killed_at_a_commit_step_then_restarted(
    derived_template, s3_server, point: str
) -> None:
    from wire_dagster.spec import load_pipeline

    st0, env0, want = derived_template
    st = copied_bucket(st0, s3_server, "d-")
    env = dict(env0, WIRE_S3_BUCKET=st.bucket)
    spec = load_pipeline(Path(env["WIRE_PIPELINES"]) / "dcomp.yaml")
    p = wire(["process", "--pipeline", "dcomp", "--max-epochs", "5"], dict(env, WIRE_FAULT=point), expect_rc=None)
    assert p.returncode == 86, (point, p.returncode, p.stderr[-2000:])
    assert Checkpoints(st, "dcomp").committed() == ([1, 2] if point == "after-marker" else [1])
    assert_committed_sound(st, spec)
    wire(["process", "--pipeline", "dcomp", "--max-epochs", "5"], env)
    got = _derived_outcome(st, env)
    assert got == want
    ids = [r["id"] for rows in got["rows"].values() for r in rows]
    assert len(ids) == len(set(ids))
    assert_published(st, spec)
