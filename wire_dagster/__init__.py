"""Wire: bounded-stream, event-time processing on Dagster and Spark — the core (DESIGN §5).

`wire_dagster.produce(name, records, segment="0")` hands records to a stream from Python
(sources.py); everything else is imported from its module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .arrowmemory import use_jemalloc

use_jemalloc()  # before any large column: arrowmemory.py

if TYPE_CHECKING:
    from .streams import ProduceReport


def produce(name: str, records: object, segment: str = "0", **kw) -> ProduceReport:
    """Append records (a list of dicts, a pyarrow Table or a pandas DataFrame) to a pipeline's
    stream or a stream by name: see `wire_dagster.sources.produce`."""
    from .sources import produce as _produce

    return _produce(name, records, segment, **kw)
