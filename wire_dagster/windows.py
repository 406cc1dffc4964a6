"""Window assigners (DESIGN §1): pure assignment, session merging as a separate step.

All times are int ms; a window is `[start, end)`. Tumbling and sliding windows
are aligned to the Unix epoch plus `offset` (Beam's `FixedWindows.assign`:
`start = t - (t - offset) % slide`). A session event at t opens `[t, t + gap)`;
sessions of one key that overlap or touch merge (two events exactly `gap`
apart are one session, as in Spark's `session_window` and Flink).
"""

from __future__ import annotations

from collections.abc import Iterable

from .spec import WindowSpec

Window = tuple[int, int]


def assign(spec: WindowSpec, t: int, gap: int | None = None) -> list[Window]:
    """The windows an event at `t` belongs to, oldest first. Sessions: the one-event window."""
    if spec.type == "session":
        g = gap if gap is not None and gap > 0 else spec.gap
        return [(t, t + g)]
    last = t - (t - spec.offset) % spec.slide
    return [(s, s + spec.size) for s in range(last - spec.size + spec.slide, last + 1, spec.slide)]


def merge(windows: Iterable[Window]) -> list[tuple[Window, list[int]]]:
    """Merge overlapping or touching windows: [(merged, indexes of the inputs)] sorted by start.

    A sweep over windows sorted by (start, end): a window joins the current group
    when its start <= the group's end.
    """
    order = sorted(enumerate(windows), key=lambda iw: (iw[1][0], iw[1][1], iw[0]))
    out: list[tuple[Window, list[int]]] = []
    for i, (s, e) in order:
        if out and s <= out[-1][0][1]:
            (gs, ge), members = out[-1]
            out[-1] = ((gs, max(ge, e)), members + [i])
        else:
            out.append(((s, e), [i]))
    return out
