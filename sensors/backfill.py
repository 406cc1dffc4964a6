"""`wire backfill`: recompute a range of partitions through the pipeline's Dagster job, in-process.

One run covers the whole range (the `dagster/asset_partition_range_start`/`_end` run tags, as
Dagster's single-run backfills launch it; one partition: an ordinary partitioned run), tagged
`wire/backfill` so the asset body replays the committed timeline once for every partition of the
range (`wire_dagster.backfill`), commits a new epoch only where the content changed, and reports
each partition with its own materialization and data version. What this returns is read back
from that run's materialization events, not computed beside it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable

import dagster as dg

from assets.keys import BACKFILL_PROGRESS, pipeline_tags, window_key
from assets.partitions import RANGE_END_TAG, RANGE_START_TAG, partition_key
from sensors import job_name
from sensors.runs import PipelineRuns, Signals, command_instance, quiet_libraries, run_error, say_on, verbose
from wire_dagster.devstack import ensure_dagster_home
from wire_dagster.spec import Pipeline
from wire_dagster.timeutil import iso


def backfill(
    spec: Pipeline,
    load_definitions: Callable[[], dg.Definitions],
    partitions: list[int],
    console=None,
    progress: Callable[[int, int], None] | None = None,
) -> dict:
    """Run the backfill of `partitions` (consecutive partition starts, ms) to its end.

    Returns {"run_id", "status" (SUCCESS|FAILURE), "error" (a failure's cause as one exception,
    `sensors.runs.run_error`, else None), "partitions": [{
    "partition", "partition_key", "result" (reproduced|changed), "epoch" (the new epoch, when
    changed), "changed_windows", "windows": {window: {"result", "epoch", "data_version"}}}]}.
    `progress(epochs replayed, epochs in total)` drives a display. Raises
    `sensors.runs.Interrupted` on SIGINT/SIGTERM. `load_definitions` builds the code location's
    Definitions (as for `sensors.tick.tick`).
    """
    with Signals() as signals, contextlib.ExitStack() as stack:
        quiet_libraries()
        ensure_dagster_home()
        defs = load_definitions()
        instance = stack.enter_context(command_instance())
        job = defs.resolve_job_def(job_name(spec))
        keys = [partition_key(spec, p) for p in partitions]
        tags = {**pipeline_tags(spec), "wire/backfill": uuid.uuid4().hex[:12]}
        single = None
        if len(keys) == 1:
            single = keys[0]
        else:
            tags.update({RANGE_START_TAG: keys[0], RANGE_END_TAG: keys[-1]})
        if console is not None and (verbose() or console.is_terminal):  # else a failure's stderr is one line
            span = f"[{iso(partitions[0])}, {iso(partitions[-1] + spec.partition)})"
            console.print(f"backfill of {spec.name}: {len(keys)} partitions {span} in one run")
        token = BACKFILL_PROGRESS.set(progress)
        try:
            # Waits for the pipeline's ticks and backfills, fails runs left by dead ones, stops on
            # SIGINT/SIGTERM (sensors.runs).
            with PipelineRuns(instance, spec.name, job, "wire backfill", signals, console) as runs:
                res = runs.execute(partition_key=single, tags=tags, what=f"the backfill of {spec.name}")
        finally:
            BACKFILL_PROGRESS.reset(token)

    error = None if res.success else run_error(res, say_on(console))
    mats: dict[tuple[str, str | None], dg.AssetMaterialization] = {}
    for ev in res.all_events:
        if ev.is_step_materialization:
            mat = ev.step_materialization_data.materialization
            mats[(mat.asset_key.to_user_string(), mat.partition)] = mat

    rows = []
    for p, pk in zip(partitions, keys, strict=True):
        windows = {}
        for w in spec.windows:
            mat = mats.get((window_key(spec, w.name).to_user_string(), pk))
            if mat is None:
                continue
            md, ep = mat.metadata.get("backfill"), mat.metadata.get("backfill_epoch")
            windows[w.name] = {
                "result": md.value if md is not None else "-",
                "epoch": ep.value if ep is not None else None,
                "data_version": (mat.tags or {}).get("dagster/data_version"),
            }
        if not windows:
            continue
        changed = sorted(w for w, v in windows.items() if v["result"] == "changed")
        epoch = max((windows[w]["epoch"] for w in changed), default=None)
        rows.append(
            {
                "partition": iso(p),
                "partition_key": pk,
                "result": "changed" if changed else "reproduced",
                "epoch": epoch,
                "changed_windows": changed,
                "windows": windows,
            }
        )
    return {"run_id": res.run_id, "status": "SUCCESS" if res.success else "FAILURE", "error": error, "partitions": rows}
