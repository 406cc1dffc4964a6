"""The Dagster code location: Definitions built from the pipeline files.

`WIRE_PIPELINES` (default `pipelines/` beside this file) names the directory of
pipeline YAML files; it is the only thing read from the environment at import
time, because it decides what the code location contains. Endpoints and
secrets are resolved when resources initialise.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from assets import build_assets
from assets.keys import asset_keys, pipeline_tags
from resources import default_resources
from sensors import build_schedule, build_sensor, job_name
from wire_dagster.spec import Pipeline, load_all


def pipelines_directory() -> Path:
    env = os.environ.get("WIRE_PIPELINES")
    return Path(env) if env else Path(__file__).resolve().parent / "pipelines"


def build_definitions(directory: Path | None = None, pipelines: list[Pipeline] | None = None) -> dg.Definitions:
    """The definitions of `pipelines`, else of the pipeline files in `directory` (or the one file
    it names: `wire tick --pipeline ./x.yaml`), else of WIRE_PIPELINES. Two files declaring one
    pipeline name are refused with a WireInputError naming both (not Dagster's duplicate asset key)."""
    specs = pipelines if pipelines is not None else load_all(directory or pipelines_directory())
    assets, jobs, sensors, schedules = [], [], [], []
    for spec in specs:
        assets.append(build_assets(spec))
        job = dg.define_asset_job(
            job_name(spec),
            selection=dg.AssetSelection.assets(*asset_keys(spec)),
            tags=pipeline_tags(spec),
            description=f"Commit pending epochs of {spec.name} and report a partition",
        )
        jobs.append(job)
        sensors.append(build_sensor(spec, job))
        schedules.append(build_schedule(spec, job))
    # A run is one step (the pipeline's multi-asset): executing it in the run's own process saves
    # the multiprocess executor's extra Python process (and its imports) per run.
    return dg.Definitions(
        assets=assets,
        jobs=jobs,
        sensors=sensors,
        schedules=schedules,
        resources=default_resources(),
        executor=dg.in_process_executor,
    )


defs = build_definitions()
