"""Your own assets over the `clicks` pipeline's windows (pipelines/clicks.yaml), in Wire's code
location: `WIRE_USER_ASSETS=examples.clicks_assets wire dev`.

Each input is a window's committed rows, loaded by Wire's IO manager: `key`, `window_start`,
`window_end` (UTC timestamps) and the window's aggregates, for the partitions the input maps to.
"""

import dagster as dg
import pandas as pd
import pyarrow as pa

from assets import wire_window

per_minute = wire_window("clicks", "clicks_per_minute")  # .key, .partitions_def
sessions = wire_window("clicks", "sessions")

#: `eager()` over every partition, not only the latest one: a partition of the window that is
#: materialized with a new data_version (its first content, or a late event that changed it)
#: runs that partition of the asset again, once; a run that reproduces a partition's content
#: (same data_version, e.g. `wire backfill`) runs nothing.
ON_WINDOW_CHANGE = (
    dg.AutomationCondition.eager()
    .without(dg.AutomationCondition.in_latest_time_window())
    .replace(
        "any_deps_updated",
        dg.AutomationCondition.any_deps_match(dg.AutomationCondition.data_version_changed()).with_label(
            "any_deps_data_version_changed"
        ),
    )
)


@dg.asset(
    key_prefix="clicks_example",
    partitions_def=per_minute.partitions_def,  # one partition per partition of the window
    ins={"counts": dg.AssetIn(key=per_minute.key)},
    automation_condition=ON_WINDOW_CHANGE,
    group_name="clicks_example",
)
def user_totals(counts: pa.Table) -> pa.Table:
    """Per user: clicks and amount in the partition's minutes."""
    return counts.group_by("key").aggregate([("events", "sum"), ("total", "sum")]).sort_by("key")


@dg.asset(
    key_prefix="clicks_example",
    partitions_def=per_minute.partitions_def,
    # This partition and the two before it: the input is the range's rows, in one table.
    ins={"counts": dg.AssetIn(key=per_minute.key, partition_mapping=dg.TimeWindowPartitionMapping(start_offset=-2))},
    group_name="clicks_example",
)
def busiest_minute_15m(counts: pa.Table) -> pa.Table:
    """The minutes of the last 15 minutes (three partitions) with the most clicks, all users."""
    per = counts.group_by("window_start").aggregate([("events", "sum")])
    return per.sort_by([("events_sum", "descending"), ("window_start", "ascending")]).slice(0, 3)


@dg.asset(key_prefix="clicks_example", ins={"sessions": dg.AssetIn(key=sessions.key)}, group_name="clicks_example")
def long_sessions(sessions: pd.DataFrame) -> pd.DataFrame:
    """Every committed session of at least 10 clicks (unpartitioned: every partition), as pandas."""
    return sessions.loc[sessions["events"] >= 10].reset_index(drop=True)


#: Evaluates ON_WINDOW_CHANGE every 10 s, launching runs (not backfills); Dagster's default
#: automation sensor would do it too, once turned on in the UI.
automation = dg.AutomationConditionSensorDefinition(
    "clicks_example_automation",
    target=dg.AssetSelection.assets(user_totals),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=10,
    emit_backfills=False,  # runs, not backfills
)
