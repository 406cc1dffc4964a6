"""Named fault points for crash tests: `WIRE_FAULT=<point>` makes the process exit
abruptly (os._exit, no cleanup, no flush) when it reaches that point.

`WIRE_FAULT=<point>:<n>` fires on the n-th time the point is reached (1-based),
so "mid-staging" can land between two staged files.
"""

from __future__ import annotations

import os

POINTS = (
    "before-staging",
    "mid-staging",
    "after-staging",
    "during-state-snapshot",
    "during-dead-letters",
    "after-manifest",
    "before-marker",
    "after-marker",
    "during-publish",
    "during-gc",
    "during-rewind",
)

_hits: dict[str, int] = {}


def fault(point: str) -> None:
    """Exit with status 86 here if WIRE_FAULT names this point (tests only)."""
    spec = os.environ.get("WIRE_FAULT")
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] >= int(nth or 1):
        os._exit(86)
