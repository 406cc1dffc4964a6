"""Dagster's view of a pipeline's event-time partitions (DESIGN §1 Partitions): the time-window
partitions definition, partition keys, and the partitions a run covers. Where a time or a
result falls is `wire_dagster.partitions`' rule; this module only names it in Dagster's terms."""

from datetime import UTC, datetime

import dagster as dg

from wire_dagster.errors import WireInputError
from wire_dagster.spec import Pipeline
from wire_dagster.timeutil import format_duration

PARTITION_FMT = "%Y-%m-%d-%H:%M"


def partition_cron(spec: Pipeline) -> str:
    """The cron schedule whose ticks are the partition boundaries."""
    p = spec.partition
    minute, hour, day = 60_000, 3_600_000, 86_400_000
    if p % minute == 0 and p < hour and hour % p == 0:
        k = p // minute
        return "* * * * *" if k == 1 else f"*/{k} * * * *"
    if p % hour == 0 and p < day and day % p == 0:
        k = p // hour
        return "0 * * * *" if k == 1 else f"0 */{k} * * *"
    if p == day:
        return "0 0 * * *"
    raise WireInputError(
        f"partition: {format_duration(p)} cannot be a Dagster time partition; use whole minutes dividing an hour, "
        "whole hours dividing a day, or 1d"
    )


def partitions_def(spec: Pipeline) -> dg.TimeWindowPartitionsDefinition:
    start = datetime.fromtimestamp(spec.start / 1000, tz=UTC)
    if spec.end is not None:  # a bounded event-time range: exactly its partitions
        end = datetime.fromtimestamp(spec.end / 1000, tz=UTC)
        return dg.TimeWindowPartitionsDefinition(
            start=start, end=end, fmt=PARTITION_FMT, cron_schedule=partition_cron(spec), timezone="UTC"
        )
    # Event times may run ahead of the wall clock by up to limits.max_future.
    end_offset = -(-spec.max_future // spec.partition) + 1
    return dg.TimeWindowPartitionsDefinition(
        start=start, fmt=PARTITION_FMT, cron_schedule=partition_cron(spec), timezone="UTC", end_offset=end_offset
    )


def partition_key(spec: Pipeline, start_ms: int) -> str:
    return datetime.fromtimestamp(start_ms / 1000, tz=UTC).strftime(PARTITION_FMT)


#: Dagster's run tags for a range of partitions in one run (single-run backfills, sensor runs of an epoch).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def run_partitions(spec: Pipeline, context: dg.AssetExecutionContext) -> list[int]:
    """The event-time partitions (start, ms) a run covers: one, or every one of its range."""
    tw = context.partition_time_window
    parts = list(range(_ms(tw.start), _ms(tw.end), spec.partition))
    keys = list(context.partition_keys)
    if [partition_key(spec, p) for p in parts] != keys:
        raise WireInputError(
            f"run partitions {keys[:3]}... do not match the pipeline's {format_duration(spec.partition)} partitions"
        )
    return parts
