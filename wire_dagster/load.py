"""Loading a window's committed rows for other code: Dagster's IO manager, notebooks, scripts.

What `wire read` shows, for some event-time partitions of one window: the rows the latest
committed manifest names (`results.read_results`, retractions applied, sorted by key and
window start), with `window_start`/`window_end` as UTC timestamps (ms). A partition holds the
results whose window ends in it (`partitions.of_window`); `[start, end)` selects the partitions
whose start falls in it. The pipeline's spec is the one its latest commit was made with (the
manifest's `config`), so the columns are those of the committed content.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from .checkpoint import Checkpoints
from .errors import WireInputError
from .objectstore import ObjectStore
from .results import read_results
from .spec import Pipeline, check_name


def committed_partitions(
    store: ObjectStore, pipeline: str, window: str, spans: Sequence[tuple[int, int]] | None = None
) -> tuple[Pipeline, list[int]]:
    """The committed spec and the starts (ms) of the window's partitions holding committed results,
    ascending: all of them, or those starting in one of `spans` (`[start, end)` in ms each).

    Raises WireInputError before the pipeline's first commit (nothing to load) or for a window the
    committed spec does not have."""
    m = Checkpoints(store, check_name(pipeline, "pipeline")).latest()
    if m is None:
        raise WireInputError(f"pipeline {pipeline!r} has no committed epoch yet: nothing to load")
    spec = Pipeline.model_validate(m.config)
    if window not in {w.name for w in spec.windows}:
        raise WireInputError(
            f"pipeline {pipeline!r} has no window {window!r}; it has: " + ", ".join(w.name for w in spec.windows)
        )
    starts = sorted(int(p) for p in m.outputs.get(window, {}))
    if spans is not None:
        starts = [p for p in starts if any(lo <= p < hi for lo, hi in spans)]
    return spec, starts


def with_timestamps(t: pa.Table) -> pa.Table:
    """`window_start` and `window_end` (epoch ms) as UTC timestamps, as `wire read` prints them."""
    for c in ("window_start", "window_end"):
        i = t.schema.get_field_index(c)
        t = t.set_column(i, c, pc.cast(t[c], pa.timestamp("ms", tz="UTC")))
    return t


def read_window(
    store: ObjectStore,
    pipeline: str,
    window: str,
    start: int | None = None,
    end: int | None = None,
    *,
    spans: Sequence[tuple[int, int]] | None = None,
) -> pa.Table:
    """The committed rows of `window` of `pipeline` in the partitions starting in `[start, end)`
    (epoch ms; either bound may be None: unbounded), or in any of `spans`, or (neither given) in
    every partition: `key`, `window_start`, `window_end` (UTC timestamps), one column per aggregate.
    A partition with no committed row contributes none; no row at all is an empty table with
    the window's columns."""
    if spans is None and (start is not None or end is not None):
        spans = [(start if start is not None else -(2**63), end if end is not None else 2**63 - 1)]
    spec, every = committed_partitions(store, pipeline, window)
    parts = every if spans is None else [p for p in every if any(lo <= p < hi for lo, hi in spans)]
    # Every committed partition: read_results' own path (no per-partition filter to evaluate).
    return with_timestamps(read_results(store, spec, window, None if len(parts) == len(every) else parts))
