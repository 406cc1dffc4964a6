"""Arrow's memory pool in every process Wire runs in: jemalloc, where pyarrow's default is
mimalloc. Wire's columns are large and short-lived (an epoch's record texts, copied by a filter,
a sort, a Parquet encoding), so the pool mostly hands out fresh pages; on the 2-core VMs Wire is
measured on, mimalloc did that ~5x slower. Measured on the AMD EPYC VM, 1 M NEXMark events:

    q7's bids pass-through, its one task run in one process    mimalloc 1.87-1.89 s   jemalloc 1.36-1.40 s
    NEXMark q7, `--graph`, warm: its three runs (one tick)     mimalloc 7.7 s         jemalloc 6.3 s
    ... `wire produce` of the 920,000 bids                     mimalloc 1.2 s         jemalloc 0.7 s
    a filter of 920,000 texts (140 MB) in 20 chunks            mimalloc 0.32-0.53 s   jemalloc 0.08 s

The package's import switches the pool (`wire_dagster/__init__.py`): the CLI, Dagster's code
server and run workers, and Spark's Python workers, which import pyarrow before they unpickle a
task's function, all import Wire before their first large column. A user's own
ARROW_DEFAULT_MEMORY_POOL wins, and a pyarrow built without jemalloc keeps its default.
"""

from __future__ import annotations

import os

#: pyarrow's own variable: when set, the pool it names is the user's choice and stays.
ENV = "ARROW_DEFAULT_MEMORY_POOL"


def use_jemalloc() -> None:
    """Make jemalloc the process's default Arrow pool, unless ENV names one or there is none."""
    if os.environ.get(ENV, "").strip():
        return
    import pyarrow as pa

    try:
        pool = pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without it
        return
    pa.set_memory_pool(pool)
