"""The names a pipeline has in Dagster: its asset keys and the run tags Wire reads and writes."""

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from wire_dagster.spec import Pipeline, WindowSpec, find_pipeline, pipelines_dir

from .partitions import partitions_def as pipeline_partitions


def window_key(spec: Pipeline, window: str) -> dg.AssetKey:
    return dg.AssetKey([spec.name, window])


@dataclass(frozen=True)
class WireWindow:
    """A Wire window as a downstream asset sees it: `key` for `dg.AssetIn`/`deps`, and the
    pipeline's event-time `partitions_def` (give it to an asset to get one partition of yours
    per partition of the window)."""

    spec: Pipeline
    window: WindowSpec

    @property
    def key(self) -> dg.AssetKey:
        return window_key(self.spec, self.window.name)

    @property
    def partitions_def(self) -> dg.TimeWindowPartitionsDefinition:
        return pipeline_partitions(self.spec)


def wire_window(pipeline: str | Pipeline, window: str) -> WireWindow:
    """The window `window` of `pipeline`: a Pipeline, a YAML path, or a pipeline name looked up in
    WIRE_PIPELINES (default: the project's `pipelines/`, as the code location does). Its asset
    loads through Wire's IO manager (`wire_io_manager`): see README, "Using a window in your own asset"."""
    if isinstance(pipeline, Pipeline):
        spec = pipeline
    else:
        spec = find_pipeline(pipeline, pipelines_dir(str(Path(__file__).resolve().parent.parent / "pipelines")))
    return WireWindow(spec, spec.window(window))


def dead_letter_key(spec: Pipeline) -> dg.AssetKey:
    return dg.AssetKey([spec.name, "dead_letters"])


def asset_keys(spec: Pipeline) -> list[dg.AssetKey]:
    return [window_key(spec, w.name) for w in spec.windows] + [dead_letter_key(spec)]


def pipeline_tags(spec: Pipeline) -> dict[str, str]:
    return {"wire/pipeline": spec.name}


#: Dagster's run key tag, and its sensor name tag (the daemon matches a sensor's run keys by both).
RUN_KEY_TAG = "dagster/run_key"
SENSOR_NAME_TAG = "dagster/sensor_name"

#: Run tags that make a run a backfill: Dagster's own (UI / GraphQL backfills) and `wire backfill`'s.
BACKFILL_TAGS = ("dagster/backfill", "wire/backfill")
#: Why the sensor requested a run: its requests' reasons (planner.Request.reason), comma-separated.
REASON_TAG = "wire/reason"
#: The reason of a run that only carries an epoch making no partition ready (planner.py).
PROGRESS = "progress"

#: Display only: `wire backfill` sets a callback (epochs replayed, epochs in total) around its
#: in-process run to drive its progress bar; runs launched by the daemon leave it unset.
BACKFILL_PROGRESS: ContextVar[Callable[[int, int], None] | None] = ContextVar("wire_backfill_progress", default=None)


def is_backfill(tags) -> bool:
    return any(tags.get(t) for t in BACKFILL_TAGS)
