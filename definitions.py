"""The Dagster code location: Definitions built from the pipeline files.

`WIRE_PIPELINES` (default `pipelines/` beside this file) names the directory of
pipeline YAML files, and `WIRE_USER_ASSETS` the modules of your own assets to
add beside them; they are the only things read from the environment at import
time, because they decide what the code location contains. Endpoints and
secrets are resolved when resources initialise.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from pathlib import Path

import dagster as dg

from assets import build_assets, build_stream_specs
from assets.keys import asset_keys, pipeline_tags
from resources import default_resources
from sensors import build_schedule, build_sensor, job_name
from wire_dagster.derived import check_graph
from wire_dagster.errors import WireInputError
from wire_dagster.heap import settle
from wire_dagster.spec import Pipeline, load_all


def pipelines_directory() -> Path:
    env = os.environ.get("WIRE_PIPELINES")
    return Path(env) if env else Path(__file__).resolve().parent / "pipelines"


def build_definitions(directory: Path | None = None, pipelines: list[Pipeline] | None = None) -> dg.Definitions:
    """The definitions of `pipelines`, else of the pipeline files in `directory` (or the one file
    it names: `wire tick --pipeline ./x.yaml`), else of WIRE_PIPELINES. Two files declaring one
    pipeline name are refused with a WireInputError naming both (not Dagster's duplicate asset key)."""
    source = directory or pipelines_directory()
    specs = pipelines if pipelines is not None else load_all(source)
    if pipelines is None and source.is_dir():
        check_graph(specs)  # derived inputs name pipelines and windows of this location; no cycle
    # One asset per raw stream, however many pipelines read it: upstream of their windows.
    assets: list = list(build_stream_specs(specs))
    jobs, sensors, schedules = [], [], []
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


def user_modules() -> list[str]:
    """The importable module names `WIRE_USER_ASSETS` lists, comma-separated (none if unset)."""
    return [m.strip() for m in os.environ.get("WIRE_USER_ASSETS", "").split(",") if m.strip()]


def with_user_assets(defs: dg.Definitions, modules: list[str] | None = None) -> dg.Definitions:
    """`defs` merged with the definitions of your own modules (default: WIRE_USER_ASSETS), as
    `dagster dev -m` would load each: its module-level `dg.Definitions` if it has one, else every
    asset, asset check, job, sensor and schedule defined at its top level. Their assets may read a
    window's committed rows as an input (`assets.wire_window`, the `wire_io_manager` IO manager)."""
    found = []
    names = user_modules() if modules is None else modules
    root = str(Path(__file__).resolve().parent)
    if names and root not in sys.path:  # as under dagster dev: modules beside this file (examples/) import
        sys.path.append(root)
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            raise WireInputError(f"WIRE_USER_ASSETS: cannot import {name!r}: {e}") from e
        own = [v for v in vars(module).values() if isinstance(v, dg.Definitions)]
        if own:
            found += own
            continue
        with warnings.catch_warnings():  # Dagster marks this loader "preview"; its behaviour is dagster dev -m's
            warnings.simplefilter("ignore", dg.PreviewWarning)
            found.append(dg.load_definitions_from_module(module))
    return dg.Definitions.merge(defs, *found) if found else defs


defs = with_user_assets(build_definitions())
# What a code server, a run worker or a `wire` command has imported and built so far lives as long
# as the process: out of the garbage collector's walks from here on (wire_dagster/heap.py).
settle()
