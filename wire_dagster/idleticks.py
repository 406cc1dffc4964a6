"""Which pipelines' last `wire tick` had nothing to compute: a hint for the next tick.

A `wire tick` on a local session starts its Spark JVM before it knows whether its sensor will
request a run (`sparksession.start_ahead`). A tick that finds work gains 2-3 s by it; one that
finds none loses ~0.8 s and ~2 CPU-s to the JVM it then kills (the EPYC VM: an idle tick 1.3 →
2.1 s). So a tick starts its JVM ahead unless the last tick of every pipeline it ticks found
nothing: a cron tick of a quiet stream pays nothing, and the first tick that finds work after a
quiet spell starts its JVM when its run needs it, as every tick did before.

A marker per pipeline under the Dagster home (`wire-idle/<pipeline>`, where the ticks' run
history is): there while the pipeline's last tick requested no run. Only a hint: a wrong one
costs time, never a result, so failing to read or write it is ignored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

from .devstack import dagster_home


def _marker(name: str) -> Path:
    return dagster_home() / "wire-idle" / name


def all_idle(names: Iterable[str]) -> bool:
    """Whether the last tick of each of these pipelines requested no run (False if one never ticked)."""
    names = list(names)
    return bool(names) and all(_marker(n).exists() for n in names)


def remember(name: str, idle: bool) -> None:
    """What the pipeline's tick just found: nothing to run (`idle`), or runs."""
    m = _marker(name)
    with contextlib.suppress(OSError):
        if idle:
            m.parent.mkdir(parents=True, exist_ok=True)
            m.touch()
        else:
            m.unlink(missing_ok=True)
