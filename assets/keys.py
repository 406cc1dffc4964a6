"""The names a pipeline has in Dagster: its asset keys and the run tags Wire reads and writes."""

from collections.abc import Callable
from contextvars import ContextVar

import dagster as dg

from wire_dagster.spec import Pipeline


def window_key(spec: Pipeline, window: str) -> dg.AssetKey:
    return dg.AssetKey([spec.name, window])


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

#: Display only: `wire backfill` sets a callback (epochs replayed, epochs in total) around its
#: in-process run to drive its progress bar; runs launched by the daemon leave it unset.
BACKFILL_PROGRESS: ContextVar[Callable[[int, int], None] | None] = ContextVar("wire_backfill_progress", default=None)


def is_backfill(tags) -> bool:
    return any(tags.get(t) for t in BACKFILL_TAGS)
