"""Named fault points for crash tests: `WIRE_FAULT=<point>` makes the process exit
abruptly (os._exit, no cleanup, no flush) when it reaches that point.

`WIRE_FAULT=<point>:<n>` fires on the n-th time the point is reached (1-based),
so "mid-staging" can land between two staged files.

`WIRE_PAUSE=<point>[:<n>]` with `WIRE_PAUSE_DIR=<dir>` holds the process at a
point instead (fault points, plus the pause-only points in PAUSE_ONLY): it
creates `<dir>/<point>.paused` (holding its pid) and waits until the test creates
`<dir>/<point>.go` (at most WIRE_PAUSE_TIMEOUT seconds, default 120), so a test
can stop the object store, or let a rival commit, while a run is at a known step.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

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
#: Steps a test can hold a run at, but that are not crash points of the matrix.
PAUSE_ONLY = ("before-spark", "after-spark")

_hits: dict[str, int] = {}
_pause_hits: dict[str, int] = {}


def _nth(spec: str, point: str, hits: dict[str, int]) -> bool:
    name, _, nth = spec.partition(":")
    if name != point:
        return False
    hits[point] = hits.get(point, 0) + 1
    return hits[point] == int(nth or 1)


def pause(point: str) -> None:
    """Wait here for the test's go-ahead if WIRE_PAUSE names this point (tests only)."""
    spec = os.environ.get("WIRE_PAUSE")
    if not spec or not _nth(spec, point, _pause_hits):
        return
    d = Path(os.environ.get("WIRE_PAUSE_DIR") or ".")
    go = d / f"{point}.go"
    (d / f"{point}.paused").write_text(str(os.getpid()))
    deadline = time.monotonic() + float(os.environ.get("WIRE_PAUSE_TIMEOUT") or 120)
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def fault(point: str) -> None:
    """Exit with status 86 here if WIRE_FAULT names this point (tests only)."""
    pause(point)
    spec = os.environ.get("WIRE_FAULT")
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    _hits[point] = _hits.get(point, 0) + 1
    if _hits[point] >= int(nth or 1):
        os._exit(86)
