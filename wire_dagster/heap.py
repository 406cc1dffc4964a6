"""A process's start-up objects kept out of the way of Python's cyclic garbage collector.

A `wire` command, a `wire shell`, a Dagster code server or run worker imports Dagster, pyarrow,
PySpark's client and the definitions before its real work: 140,000 objects the collector tracks
(370,000 in a shell with its Spark session). They live as long as the process, yet every full
collection walks them all: 0.17-0.22 s a collection, measured in a `wire tick` of NEXMark q8
(five full collections, 0.86 s, in a cold tick; one in a warm shell's tick). `gc.freeze()` moves
them to the permanent generation, which collections skip (the standard library's advice for
long-lived processes); what the process makes afterwards is collected as before.
"""

from __future__ import annotations

import atexit
import gc


def settle(collect: bool = False) -> None:
    """Leave what the process holds now to the permanent generation. `collect` first frees what
    is garbage already (a full collection, ~0.1-0.2 s): for a process that lives on, so nothing
    unreachable is kept for good. Without it the few cycles made so far stay (3 objects after
    importing the definitions). Called again, it settles what came since."""
    if collect:
        gc.collect()
    if not gc.get_freeze_count():
        # Back to the collector at exit, so the interpreter's last collection frees them: a frozen
        # DuckDB object outliving it makes nanobind print "leaked instances" on stderr.
        atexit.register(gc.unfreeze)
    gc.freeze()
