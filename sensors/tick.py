"""`wire tick`: one real evaluation of a pipeline's Dagster sensor, then each requested
run executed in-process, through the same job and assets the daemon launches."""

import os
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from sensors import job_name, request_partitions, sensor_name
from wire_dagster.devstack import ensure_dagster_home
from wire_dagster.spec import Pipeline


def tick(spec: Pipeline, pipelines: Path, console=None, progress: Callable[[int, int], None] | None = None) -> list[dict]:
    """The runs launched (run_key, partition, status SUCCESS|FAILURE, run_id); requests whose run key
    already ran successfully are skipped, as the daemon skips them, and are not returned.
    `progress(requests handled, requests)` is called before the first run and after each request."""
    from definitions import build_definitions
    from resources import default_resources
    from wire_dagster.sparksession import preload_client

    preload_client()  # imported while the sensor reads the stream and Dagster creates the run
    ensure_dagster_home()
    defs = build_definitions(pipelines)
    instance = dg.DagsterInstance.get()
    sensor_def = defs.resolve_sensor_def(sensor_name(spec))
    key = f"wire/tick-cursor/{spec.name}"
    cursor = instance.run_storage.get_cursor_values({key}).get(key)
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=default_resources(), definitions=defs) as ctx:
        result = sensor_def(ctx)
    reqs = list(result.run_requests or [])
    job = defs.resolve_job_def(job_name(spec))
    done = []
    if progress is not None:
        progress(0, len(reqs))
    for i, rr in enumerate(reqs, start=1):
        existing = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/run_key": rr.run_key}), limit=1)
        if existing and existing[0].is_success:
            # As the daemon does: a run key that already ran launches nothing.
            if console is not None:
                console.print(f"skipped {rr.run_key} (partition {request_partitions(rr)}): already ran as {existing[0].run_id}")
            if progress is not None:
                progress(i, len(reqs))
            continue
        if console is not None:
            console.print(f"running {rr.run_key} (partition {request_partitions(rr)})")
        res = job.execute_in_process(
            instance=instance,
            partition_key=rr.partition_key,
            tags={**rr.tags, "dagster/run_key": rr.run_key, "wire/launched-by": "wire tick"},
            raise_on_error=False,
            run_config={"loggers": {"console": {"config": {"log_level": os.environ.get("WIRE_TICK_LOG_LEVEL", "WARNING")}}}},
        )
        status = "SUCCESS" if res.success else "FAILURE"
        if not res.success and console is not None:
            for ev in res.all_events:
                if ev.is_failure and ev.event_specific_data is not None:
                    err = getattr(ev.event_specific_data, "error", None)
                    if err is not None:
                        console.print(f"  {err.cls_name}: {err.message.strip().splitlines()[0]}")
        done.append({"run_key": rr.run_key, "partition": request_partitions(rr), "status": status, "run_id": res.run_id})
        if progress is not None:
            progress(i, len(reqs))
    if result.cursor is not None:
        instance.run_storage.set_cursor_values({key: result.cursor})
    return done
