"""Event-time partitions (wire_dagster/partitions.py): the one rule, checked against its definition
(DESIGN §1) by brute force, not against the code's formula: the partitions of a pipeline are
`[p, p + size)` with `p ≡ start (mod size)`; a window result belongs to the one holding `end - 1`;
a partition is ready once `W >= p_end`, final once `W >= p_end + allowed_lateness`."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from wire_dagster import partitions
from wire_dagster.spec import Pipeline
from wire_dagster.timeutil import INF, NEG_INF


def grid(size: int, start: int = 0, lateness: int = 0, end: int | None = None) -> Pipeline:
    """The fields of a pipeline the rule reads (no validation: `start` need not be aligned here)."""
    return Pipeline.model_construct(start=start, partition=size, allowed_lateness=lateness, end=end)


def brute_holding(spec: Pipeline, t: int) -> int:
    """The partition start p ≡ start (mod size) with p <= t < p + size, by search."""
    hits = [p for p in range(t - spec.partition + 1, t + 1) if (p - spec.start) % spec.partition == 0]
    assert len(hits) == 1
    return hits[0]


def test_partition_of_holds_end_minus_one():
    # a window [0, 60) belongs to the partition holding 59
    assert partitions.of_window(grid(60), 60) == 0
    assert partitions.of_window(grid(60), 61) == 60
    assert partitions.of_window(grid(60), 0) == -60
    assert partitions.of_window(grid(60, start=30), 60) == 30


sizes = st.integers(1, 500)
times = st.integers(-(10**13), 10**13)


@settings(deadline=None)  # a loaded machine; the cases are pure arithmetic
@given(sizes, st.integers(-1000, 1000), times)
def test_of_is_the_partition_holding_t(size, k, t):
    spec = grid(size, start=k * size)
    assert partitions.of(spec, t) == brute_holding(spec, t)
    assert partitions.of_window(spec, t + 1) == brute_holding(spec, t)


@settings(deadline=None)  # a loaded machine; the cases are pure arithmetic
@given(sizes, st.integers(-1000, 1000), st.lists(st.integers(-(2**52), 2**52), max_size=50))
def test_arrow_starts_match_of_window(size, k, ends):
    spec = grid(size, start=k * size)
    # and the ends at partition boundaries, where a floor by float division would be off by one
    ends = ends + [e // size * size + d for e in ends for d in (0, 1)]
    got = partitions.starts(spec, pa.array(ends, pa.int64())).to_pylist()
    assert got == [brute_holding(spec, e - 1) for e in ends]


@settings(deadline=None)  # a loaded machine; the cases are pure arithmetic
@given(sizes, st.integers(-5, 5), st.integers(0, 300), st.integers(-2000, 2000), st.integers(-2000, 2000))
def test_ready_and_final_at_the_boundaries(size, k, lateness, p_index, w):
    spec = grid(size, start=k * size, lateness=lateness)
    p = spec.start + p_index * size
    assert partitions.ready(spec, w, p) == (w >= p + size)
    assert partitions.final(spec, w, p) == (w >= p + size + lateness)
    assert not partitions.final(spec, w, p) or partitions.ready(spec, w, p)


@settings(deadline=None)  # a loaded machine; the cases are pure arithmetic
@given(sizes, st.integers(-5, 5), st.integers(-3000, 3000), st.integers(0, 3000))
def test_between_is_every_partition_from_start_meeting_the_range(size, k, lo, span):
    spec = grid(size, start=k * size)
    hi = lo + span
    want = [
        p
        for p in range(spec.start - 2 * size, hi + 2 * size, size)
        if p >= spec.start and p <= hi and p + size > lo  # [p, p + size) meets [lo, hi]
    ]
    assert partitions.between(spec, lo, hi) == want


@settings(deadline=None)  # a loaded machine; the cases are pure arithmetic
@given(sizes, st.integers(-5, 5), st.one_of(st.integers(-3000, 3000), st.sampled_from([NEG_INF, INF])), st.booleans())
def test_newest_ready_is_the_last_ready_partition_within_the_range(size, k, w, bounded):
    spec = grid(size, start=k * size, end=k * size + 7 * size if bounded else None)
    last = spec.end - size if spec.end is not None else None
    candidates = range(spec.start, (last if last is not None else max(spec.start, w)) + 1, size)
    ready = [p for p in candidates if partitions.ready(spec, w, p)] if w < INF else []
    if w >= INF:
        want = last if last is not None else spec.start
    else:
        want = max(ready, default=spec.start)
    assert partitions.newest_ready(spec, w) == want
