"""Window assigners (wire_dagster/windows.py): assignment is pure arithmetic, merging a separate sweep.

Checked against the definitions (DESIGN §1), not against the code's formula:
a tumbling/sliding window is any `[s, s + size)` with `s ≡ offset (mod slide)`
that holds t; session windows of one key that overlap or touch are one.
"""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from wire_dagster.spec import pipeline_from_dict
from wire_dagster.windows import assign, merge


def window(wtype: str, **kw):
    w = {"name": "w", "type": wtype, "aggregates": {"n": "count"}, **kw}
    return pipeline_from_dict(
        {
            "name": "p",
            "event": {"time": "t"},
            "partition": kw.get("size", 1) * 1000,
            "start": "1970-01-01T00:00:00Z",
            "windows": [w],
        }
    ).windows[0]


def brute_windows(size: int, slide: int, offset: int, t: int) -> list[tuple[int, int]]:
    """Every aligned window holding t, by scanning all candidate starts around t."""
    return [
        (s, s + size) for s in range(t - size - slide, t + slide + 1) if (s - offset) % slide == 0 and s <= t < s + size
    ]


# ---------------------------------------------------------------------------
# Tumbling


def test_tumbling_aligned_to_epoch():
    w = window("tumbling", size=10)
    #  -20      -10       0        10       20
    #   |--------|--------|--------|--------|
    #                     ^t=0     ^t=10
    assert assign(w, 0) == [(0, 10)]
    assert assign(w, 9) == [(0, 10)]
    assert assign(w, 10) == [(10, 20)]


def test_tumbling_negative_times_floor_not_truncate():
    w = window("tumbling", size=10)
    #  -20      -10       0
    #   |--------|--------|
    #         ^-11 ^-10  ^-1
    assert assign(w, -1) == [(-10, 0)]
    assert assign(w, -10) == [(-10, 0)]
    assert assign(w, -11) == [(-20, -10)]


def test_tumbling_with_offset():
    w = window("tumbling", size=10, offset=3)
    #  -7        3        13
    #   |--------|--------|
    #          ^2 ^3
    assert assign(w, 2) == [(-7, 3)]
    assert assign(w, 3) == [(3, 13)]
    assert assign(w, 12) == [(3, 13)]
    assert assign(w, -7) == [(-7, 3)]
    assert assign(w, -8) == [(-17, -7)]


# ---------------------------------------------------------------------------
# Sliding


def test_sliding_with_offset_oldest_first():
    w = window("sliding", size=10, slide=5, offset=2)
    #   -3    2    7    12   17
    #    |---------|              [-3, 7)
    #         |---------|         [2, 12)
    #              |---------|    [7, 17)
    #            ^6 ^7
    assert assign(w, 6) == [(-3, 7), (2, 12)]
    assert assign(w, 7) == [(2, 12), (7, 17)]
    assert assign(w, 2) == [(-3, 7), (2, 12)]
    assert assign(w, 1) == [(-8, 2), (-3, 7)]


def test_sliding_negative_times():
    w = window("sliding", size=6, slide=2)
    #  -8  -6  -4  -2   0
    #   |-----------|        [-8, -2)  no: -1 is not in it
    #       |-----------|    [-6, 0)
    #           |-----------|[-4, 2)
    #               |------- [-2, 4)
    #                 ^-1
    assert assign(w, -1) == [(-6, 0), (-4, 2), (-2, 4)]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    slide=st.integers(1, 12),
    mult=st.integers(1, 5),
    off=st.integers(0, 11),
    t=st.integers(-10_000, 10_000),
)
def test_fixed_windows_equal_brute_force(slide, mult, off, t):
    size = slide * mult
    offset = off % slide
    w = (
        window("sliding", size=size, slide=slide, offset=offset)
        if mult > 1
        else window("tumbling", size=size, offset=offset)
    )
    got = assign(w, t)
    assert got == brute_windows(size, slide, offset, t)
    assert len(got) == size // slide
    assert all(s <= t < e for s, e in got)


# ---------------------------------------------------------------------------
# Sessions: one-event windows, merged when they overlap or touch


def test_session_assign_one_event_window_and_gap_field():
    w = window("session", gap=10, gap_field="g")
    assert assign(w, 5) == [(5, 15)]
    assert assign(w, 5, gap=30) == [(5, 35)]
    # a missing or non-positive per-event gap falls back to the window's gap
    assert assign(w, 5, gap=None) == [(5, 15)]
    assert assign(w, 5, gap=0) == [(5, 15)]
    assert assign(w, -5, gap=-3) == [(-5, 5)]


def test_events_exactly_gap_apart_are_one_session():
    w = window("session", gap=10)
    #  0         10        20        30   31
    #  [---------)                          t=0
    #            [---------)                t=10   touches: one session
    #                                [------ t=31  11 after the last end: a new session
    wins = [assign(w, t)[0] for t in (0, 10, 31)]
    assert merge(wins) == [((0, 20), [0, 1]), ((31, 41), [2])]


def test_one_ms_more_than_gap_is_two_sessions():
    w = window("session", gap=10)
    wins = [assign(w, t)[0] for t in (0, 11)]
    assert merge(wins) == [((0, 10), [0]), ((11, 21), [1])]


def test_per_event_gap_bridges_sessions():
    w = window("session", gap=5, gap_field="g")
    #  0    5         15   20
    #  [----)                       t=0  (default gap 5)
    #                 [----)        t=15
    #  with a per-event gap of 15 at t=0:
    #  [--------------)             touches [15, 20): one session [0, 20)
    assert [b for b, _ in merge([assign(w, 0)[0], assign(w, 15)[0]])] == [(0, 5), (15, 20)]
    assert merge([assign(w, 0, gap=15)[0], assign(w, 15)[0]]) == [((0, 20), [0, 1])]


def test_merge_unsorted_nested_and_indexes():
    wins = [(30, 40), (0, 10), (2, 5), (9, 12), (50, 51), (40, 41)]
    # (0,10) ⊃ (2,5); (9,12) overlaps; (30,40) touches (40,41); (50,51) alone
    assert merge(wins) == [((0, 12), [1, 2, 3]), ((30, 41), [0, 5]), ((50, 51), [4])]
    assert merge([]) == []


def brute_merge(wins: list[tuple[int, int]]) -> set[frozenset[int]]:
    """Groups of indexes: the connected components of 'overlap or touch' (union-find)."""
    parent = list(range(len(wins)))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    for i, (a, b) in enumerate(wins):
        for j, (c, d) in enumerate(wins):
            if a <= d and c <= b:
                parent[find(i)] = find(j)
    groups: dict[int, set[int]] = {}
    for i in range(len(wins)):
        groups.setdefault(find(i), set()).add(i)
    return {frozenset(g) for g in groups.values()}


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(1, 15)), max_size=12))
def test_merge_equals_connected_components(raw):
    wins = [(s, s + g) for s, g in raw]
    out = merge(wins)
    assert {frozenset(idx) for _, idx in out} == brute_merge(wins)
    for (ms, me), idx in out:
        assert ms == min(wins[i][0] for i in idx) and me == max(wins[i][1] for i in idx)
    # sorted by start, and merged windows neither overlap nor touch
    bounds = [b for b, _ in out]
    assert all(a[1] < b[0] for a, b in pairwise(bounds))
