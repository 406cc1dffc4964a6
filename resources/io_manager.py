"""The IO manager of Wire's window assets: a window's committed rows as a downstream asset's input.

Wire's window assets are written by Wire's commit protocol, never by an IO manager: their runs
yield `MaterializeResult`s without a value (and range runs log `AssetMaterialization`s), and
Dagster does not call `handle_output` for a result without a value. This IO manager only loads:
the rows the latest committed manifest names for the partitions the input maps to
(`wire_dagster.load.read_window`, what `wire read` shows), as a pyarrow Table, or a pandas, Polars
or Spark DataFrame when the input is annotated so:

    @dg.asset(partitions_def=counts.partitions_def, ins={"counts": dg.AssetIn(key=counts.key)})
    def mine(counts: pa.Table): ...

One partition, a range of them (a `TimeWindowPartitionMapping`, a single-run backfill), or, for
an unpartitioned downstream asset, every committed partition.
"""

# No `from __future__ import annotations`: Dagster reads WireIOManager's field annotation
# (`dg.ResourceDependency[...]`) as an object when the class is created.

from datetime import datetime
from typing import Any, Protocol

import dagster as dg
import pyarrow as pa

from wire_dagster.load import read_window
from wire_dagster.objectstore import ObjectStore

#: The resource key Wire's window assets name as their IO manager (`default_resources`).
IO_MANAGER_KEY = "wire_io_manager"


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def partition_spans(context: dg.InputContext) -> list[tuple[int, int]] | None:
    """The `[start, end)` spans (epoch ms) of the upstream partitions an input loads, merged where
    contiguous; None when the upstream asset is not partitioned (everything committed)."""
    if not context.has_asset_partitions:
        return None
    pdef = context.asset_partitions_def
    if not isinstance(pdef, dg.TimeWindowPartitionsDefinition):
        raise dg.DagsterInvariantViolationError(
            f"{context.asset_key.to_user_string()}: a Wire window is partitioned by event time; "
            f"got {type(pdef).__name__}"
        )
    keys = sorted(context.asset_partition_keys)  # the format sorts chronologically (zero-padded, UTC)
    if not keys:
        return []
    first, last = pdef.time_window_for_partition_key(keys[0]), pdef.time_window_for_partition_key(keys[-1])
    size = _ms(first.end) - _ms(first.start)  # Wire's partitions are fixed-size UTC intervals
    if (_ms(last.end) - _ms(first.start)) // size == len(keys):  # one contiguous range (the usual case)
        return [(_ms(first.start), _ms(last.end))]
    spans: list[tuple[int, int]] = []
    for k in keys:
        tw = pdef.time_window_for_partition_key(k)
        lo, hi = _ms(tw.start), _ms(tw.end)
        if spans and spans[-1][1] == lo:
            spans[-1] = (spans[-1][0], hi)
        else:
            spans.append((lo, hi))
    return spans


def _as(table: pa.Table, typ: Any, what: str) -> Any:
    """`table` as the type a downstream input is annotated with (unannotated: the Table)."""
    if typ is None or typ is Any or typ is object or typ is pa.Table:
        return table
    module, name = getattr(typ, "__module__", ""), getattr(typ, "__name__", "")
    if name == "DataFrame" and module.startswith("pandas"):
        return table.to_pandas()
    if name == "DataFrame" and module.startswith("polars"):
        import polars  # optional for users: imported only when an input asks for it

        return polars.from_arrow(table)
    if name == "DataFrame" and module.startswith("pyspark"):
        # The run's Spark session (WIRE_SPARK_REMOTE / WIRE_SPARK_MASTER, as the window assets
        # resolve it); the rows go from Arrow to Spark without pandas. A window's committed result
        # is bounded by its keys and windows, not by the events.
        from wire_dagster.sparksession import get_spark

        return get_spark(app="wire-dagster").createDataFrame(table)
    raise dg.DagsterInvariantViolationError(
        f"{what}: the Wire IO manager loads a pyarrow.Table, a pandas.DataFrame, a polars.DataFrame "
        f"or a pyspark.sql.DataFrame, not {module}.{name}"
    )


class StoreProvider(Protocol):
    """What the IO manager needs of its store resource (`ObjectStoreResource`, which this module
    does not import: `resources/__init__.py` imports this module)."""

    def get_store(self) -> ObjectStore: ...


class WireIOManager(dg.ConfigurableIOManager):
    """Loads a Wire window's committed rows (the latest commit's content of the partitions an input
    maps to) as a pyarrow Table, or a pandas / Polars / Spark DataFrame when the input is annotated so.
    Writes nothing: Wire's window assets are committed by their own runs."""

    store: dg.ResourceDependency[StoreProvider]  # the object store the pipelines commit to (wire_store)

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if obj is None:
            return
        raise dg.DagsterInvariantViolationError(
            f"{context.asset_key.to_user_string() if context.has_asset_key else context.name}: the Wire IO manager "
            "only loads window results (Wire's runs commit them); give this output another IO manager"
        )

    def load_input(self, context: dg.InputContext) -> Any:
        key = context.asset_key
        if len(key.path) != 2:
            raise dg.DagsterInvariantViolationError(
                f"{key.to_user_string()}: not a Wire window (its asset key is [pipeline, window])"
            )
        pipeline, window = key.path
        spans = partition_spans(context)
        table = read_window(self.store.get_store(), pipeline, window, spans=spans)
        # A context built by hand (dg.build_input_context) may carry no log and no type.
        try:
            n = "all" if spans is None else len(context.asset_partition_keys)
            context.log.info(f"loaded {table.num_rows} committed rows of {key.to_user_string()} ({n} partitions)")
        except dg.DagsterInvariantViolationError:
            pass
        try:
            typ = context.dagster_type.typing_type
        except dg.DagsterInvariantViolationError:
            typ = None
        return _as(table, typ, key.to_user_string())
