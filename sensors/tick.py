"""`wire tick`: one real evaluation of a pipeline's Dagster sensor, then each requested run executed
in-process, through the same job and assets the daemon launches.

Ticks and backfills of a pipeline take turns, runs left behind by a dead `wire tick` are failed
and their slots freed first, SIGINT/SIGTERM stop a tick within seconds, and a failed run is one
line naming its cause (`sensors.runs`)."""

import contextlib
from collections.abc import Callable

import dagster as dg

from assets.keys import RUN_KEY_TAG
from sensors import BY_TICK, job_name, request_partitions, save_cursor, sensor_name
from sensors.runs import (
    PipelineRuns,
    Signals,
    command_instance,
    quiet_libraries,
    quiet_sensor_log,
    run_error,
    say_on,
    verbose,
)
from wire_dagster.devstack import ensure_dagster_home
from wire_dagster.spec import Pipeline


def tick(
    spec: Pipeline,
    load_definitions: Callable[[], dg.Definitions],
    console=None,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict]:
    """The runs launched (run_key, partition, status SUCCESS|FAILURE, run_id; a failure also
    `error`: its cause as one exception, `sensors.runs.run_error`); requests whose run key already
    ran successfully are skipped, as the daemon skips them, and are not returned. The first failed
    run ends the tick. `progress(requests handled, requests)` is called before the first run and
    after each request. Raises `sensors.runs.Interrupted` on SIGINT/SIGTERM. `load_definitions`
    builds the code location's Definitions (the CLI passes `definitions.build_definitions` of the
    pipeline's file: this layer never imports the one above it)."""
    from resources import default_resources
    from wire_dagster.sparksession import preload_client

    with Signals() as signals, contextlib.ExitStack() as stack:
        quiet_libraries()
        preload_client()  # imported while the sensor reads the stream and Dagster creates the run
        ensure_dagster_home()
        defs = load_definitions()
        instance = stack.enter_context(command_instance())
        sensor_def = defs.resolve_sensor_def(sensor_name(spec))
        job = defs.resolve_job_def(job_name(spec))
        # Progress lines only where a person watches (a terminal) or asked (-v): a failing
        # tick's stderr is its one error line.
        chatty = console if console is not None and (verbose() or console.is_terminal) else None
        done: list[dict] = []
        with PipelineRuns(instance, spec.name, job, "wire tick", signals, console) as runs:
            # Evaluated once the pipeline is ours: a tick that waited for another sees its commits.
            signals.doing = "while evaluating the sensor (no run started)"
            with dg.build_sensor_context(instance=instance, resources=default_resources(), definitions=defs) as ctx:
                quiet_sensor_log(ctx)
                token = BY_TICK.set(True)
                try:
                    result = sensor_def(ctx)
                finally:
                    BY_TICK.reset(token)
            runs.check()
            assert isinstance(result, dg.SensorResult)  # build_sensor's sensors return one
            for event in result.asset_events or []:  # a landing adoption's observation, as the daemon records it
                instance.report_runless_asset_event(event)
            reqs = list(result.run_requests or [])
            if progress is not None:
                progress(0, len(reqs))
            for i, rr in enumerate(reqs, start=1):
                assert rr.run_key is not None  # run_requests keys every request
                existing = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: rr.run_key}), limit=1)
                if existing and existing[0].is_success:
                    # As the daemon does: a run key that already ran launches nothing.
                    if chatty is not None:
                        ran = existing[0].run_id
                        chatty.print(f"skipped {rr.run_key} (partition {request_partitions(rr)}): already ran as {ran}")
                    if progress is not None:
                        progress(i, len(reqs))
                    continue
                if chatty is not None:
                    chatty.print(f"running {rr.run_key} (partition {request_partitions(rr)})")
                res = runs.execute(
                    partition_key=rr.partition_key, tags={**rr.tags, RUN_KEY_TAG: rr.run_key}, what=rr.run_key
                )
                row: dict[str, object] = {
                    "run_key": rr.run_key,
                    "partition": request_partitions(rr),
                    "status": "SUCCESS" if res.success else "FAILURE",
                    "run_id": res.run_id,
                }
                if progress is not None:
                    progress(i, len(reqs))
                done.append(row)
                if not res.success:
                    row["error"] = run_error(res, say_on(console))
                    break  # the next runs would start from the same last commit
            if result.cursor is not None and all(r["status"] == "SUCCESS" for r in done):
                save_cursor(spec, instance, result.cursor)  # else the next evaluation asks again
    return done
