"""Event-time partitions (DESIGN §1 Partitions): the one rule that places a time in a partition,
and when a partition is ready and final.

A pipeline's partitions are `[p, p + size)` for `p = start + k * size`; the partition of an
instant `t` is `start + ((t - start) // size) * size`, and a window result `[s, e)` belongs to
the partition holding its last instant `e - 1`. A partition is *ready* once the watermark
`W >= p_end` and *final* once `W >= p_end + allowed_lateness`. Every module that places a time
or a result in a partition, or asks whether one is ready or final — the engine's commit, the
sensor's prediction, `wire status`, backfills — asks this module; none writes the rule again.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .spec import Pipeline
from .timeutil import INF, NEG_INF


def of(spec: Pipeline, t: int) -> int:
    """The start of the partition holding instant `t`."""
    return spec.start + ((t - spec.start) // spec.partition) * spec.partition


def of_window(spec: Pipeline, end: int) -> int:
    """The start of the partition holding a window result that ends at `end` (its `end - 1`)."""
    return of(spec, end - 1)


def starts(spec: Pipeline, ends: pa.Array) -> pa.Array:
    """`of_window` of every window end in `ends`, vectorised (Arrow)."""
    # pyarrow.compute generates its functions at import: pyright cannot see them.
    off = pc.subtract(pc.subtract(ends, 1), spec.start)  # pyright: ignore[reportAttributeAccessIssue]
    k = pc.floor(pc.divide(pc.cast(off, pa.float64()), spec.partition)).cast(pa.int64())  # pyright: ignore[reportAttributeAccessIssue]
    return pc.add(pc.multiply(k, spec.partition), spec.start)  # pyright: ignore[reportAttributeAccessIssue]


def ready(spec: Pipeline, w: int, p: int) -> bool:
    """Whether partition `p` is ready at watermark `w`: no on-time event can change it any more."""
    return w >= p + spec.partition


def final(spec: Pipeline, w: int, p: int) -> bool:
    """Whether partition `p` is final at watermark `w`: no event, late or not, can change it."""
    return w >= p + spec.partition + spec.allowed_lateness


def between(spec: Pipeline, lo: int, hi: int) -> list[int]:
    """The partitions, from the pipeline's start on, holding any instant of `[lo, hi]`."""
    return list(range(of(spec, max(lo, spec.start)), hi + 1, spec.partition))


def newest_ready(spec: Pipeline, w: int) -> int:
    """The newest partition that watermark `w` made ready, within [start, end); the first
    partition while none is ready."""
    last = spec.end - spec.partition if spec.end is not None else None
    if w <= NEG_INF or not ready(spec, w, spec.start):
        return spec.start
    if w >= INF:  # a closed stream: every partition is ready; any one of them is a valid key
        return last if last is not None else spec.start
    p = of(spec, w) - spec.partition
    return min(p, last) if last is not None else p


def became_ready(spec: Pipeline, w_lo: int, w_hi: int, hi_t: int, lo_t: int | None = None) -> list[int]:
    """Partitions whose end falls in `(w_lo, w_hi]`: the ones a watermark moving from `w_lo` to
    `w_hi` makes ready, bounded by the data read so far. None after the last window any read
    event can belong to (`hi_t`, the newest event time: an infinite watermark — a closed stream —
    makes ready only partitions up to the last event's windows) and, for a first finite
    watermark (`w_lo` = -inf), none before the earliest event still held (`lo_t`: the epoch's
    chunks and the open windows), never every partition since the pipeline's `start`."""
    if hi_t <= NEG_INF or w_hi <= w_lo:
        return []
    last = of(spec, min(hi_t + spec.max_extent, INF) - 1)
    if w_lo <= NEG_INF:
        if lo_t is None:
            return []
        first = of(spec, max(lo_t, spec.start))
    else:
        first = of(spec, max(w_lo, spec.start)) - spec.partition
    return [p for p in range(max(first, spec.start), last + 1, spec.partition) if w_lo < p + spec.partition <= w_hi]
