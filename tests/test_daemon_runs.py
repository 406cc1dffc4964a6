"""The daemon's sensor runs under `dagster dev`: a failed run never blocks its pipeline, and the
runs of `wire tick` are never run again by the daemon (issues 21 and 25).

The stack is the shared one (tests/dagster_stack.py, fixture `dagster_stack`). Each test brings
in a pipeline of its own with its sensor stopped, produces a closed stream, then:

1. A run that fails is retried by the sensor: one chunk's data object is taken away before the
   sensor starts, so the first run fails in its Spark job (an asset failure, which Dagster's run
   retries leave alone: `retry_on_asset_or_op_failure: false`). The sensor plans the same epochs
   again; under the run key of the failed run the daemon would skip them forever (it launches a
   run key once). Once the object is back, a new run (the same key with `#2`) commits every
   epoch: results exact, one SUCCESS run.

2. `wire tick` (a subprocess on the stack's DAGSTER_HOME) commits and reports the whole stream;
   then the sensor starts: its evaluations (from no cursor of its own) ask for the same run keys,
   and the daemon launches none of them, since `wire tick`'s runs carry the sensor's name.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from commit_scenario import wire_exe
from dagster_stack import ACTIVE, PIPELINE, make_events
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.procgroup import wait_until
from wire_dagster.timeutil import INF

pytestmark = pytest.mark.slow

RUN_BOUND = 240.0  # a sensor run of these small pipelines, from the sensor's start to its commit


def pipeline(name: str) -> dict:
    d = json.loads(json.dumps(PIPELINE))
    d.update(name=name, stream=name)
    d["limits"] = {**d.get("limits", {}), "chunk_rows": 20}
    d["dagster"] = {**d.get("dagster", {}), "sensor_running": False}
    return d


def closed_stream(st, spec, tmp_path) -> int:
    from wire_dagster.streams import close_stream, produce

    f = tmp_path / f"{spec.name}.jsonl"
    events = make_events()
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    rep = produce(st.store, spec, f, segment="0")
    assert rep.events == len(events) and rep.malformed == 0 and len(rep.chunks) >= 2, rep
    close_stream(st.store, spec)
    return len(events)


def done(st, spec) -> bool:
    """Every chunk committed (a closed stream: W = +inf) and no run of the pipeline in flight."""
    m = Checkpoints(st.store, spec.name).latest()
    runs = st.runs({"wire/pipeline": spec.name})
    return m is not None and m.watermark >= INF and not any(r["status"] in ACTIVE for r in runs)


def test_a_failed_sensor_run_is_retried_once_the_cause_is_gone(dagster_stack, tmp_path) -> None:
    from sensors import sensor_name
    from wire_dagster.streams import read_stream

    st = dagster_stack
    spec = st.add_pipeline(pipeline("retry"))
    events = closed_stream(st, spec, tmp_path)
    chunk = read_stream(st.store, spec.stream, {})["0"].chunks[0]
    assert chunk.data_key is not None
    body = st.store.get(chunk.data_key)
    st.store.delete(chunk.data_key)
    tags = {"wire/pipeline": spec.name}
    try:
        st.set_sensor(sensor_name(spec), True)
        failed = wait_until(
            lambda: [r for r in st.runs(tags) if r["status"] == "FAILURE"],
            RUN_BOUND,
            "the sensor's first run fails without its chunk",
            st.alive,
            every=1.0,
        )
        key = failed[0]["tags"]["dagster/run_key"]
        assert Checkpoints(st.store, spec.name).latest() is None  # nothing committed
        st.store.put(chunk.data_key, body)
        wait_until(lambda: done(st, spec), RUN_BOUND, "a retried run commits every epoch", st.alive, every=1.0)
    finally:
        st.set_sensor(sensor_name(spec), False)
    runs = st.runs(tags)
    ok = [r for r in runs if r["status"] == "SUCCESS"]
    assert ok and all(r["status"] in ("SUCCESS", "FAILURE") for r in runs), runs
    retried = [r for r in ok if r["tags"]["dagster/run_key"].startswith(key + "#")]
    assert retried, ([r["tags"]["dagster/run_key"] for r in runs], key)
    m = Checkpoints(st.store, spec.name).latest()
    assert m is not None and m.totals.balanced() and m.totals.events_in == events, m and m.totals


def test_the_daemon_never_repeats_the_runs_of_wire_tick(dagster_stack, tmp_path) -> None:
    from sensors import sensor_name

    st = dagster_stack
    spec = st.add_pipeline(pipeline("tickfirst"))
    closed_stream(st, spec, tmp_path)
    env = {
        **os.environ,
        **st.s3_env,
        "DAGSTER_HOME": str(st.home),
        "WIRE_PIPELINES": str(st.tmp / "pipelines"),
    }
    for _ in range(10):  # ticks until the sensor asks for nothing more
        p = subprocess.run(
            [wire_exe(), "tick", "--pipeline", spec.name], env=env, capture_output=True, text=True, timeout=600
        )
        assert p.returncode == 0, p.stderr[-3000:]
        if p.stdout.strip() == "sensor requested no run":
            break
    else:
        raise AssertionError("wire tick still requests runs after 10 ticks")
    tags = {"wire/pipeline": spec.name}
    before = {r["runId"] for r in st.runs(tags)}
    assert before and all(r["status"] == "SUCCESS" for r in st.runs(tags))
    sensor = sensor_name(spec)

    def evaluations() -> int:
        d = st.gql(
            """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) { __typename
                 ... on Sensor { sensorState { ticks(limit: 20) { status runIds skipReason } } } } }""",
            {"s": st._selector(sensor)},
        )["sensorOrError"]
        return len([t for t in d["sensorState"]["ticks"] if t["status"] in ("SUCCESS", "SKIPPED")])

    try:
        st.set_sensor(sensor, True)
        t0 = time.monotonic()
        wait_until(lambda: evaluations() >= 2, RUN_BOUND, "two evaluations of the sensor", st.alive, every=1.0)
        took = time.monotonic() - t0
    finally:
        st.set_sensor(sensor, False)
    after = st.runs(tags)
    assert {r["runId"] for r in after} == before, (
        f"the daemon launched runs of keys wire tick ran, within {took:.0f} s: "
        f"{[r['tags'].get('dagster/run_key') for r in after if r['runId'] not in before]}"
    )
