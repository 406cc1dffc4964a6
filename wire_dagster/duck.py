"""DuckDB for Wire's vectorised SQL over Arrow tables (input validation in ingest.py, the engine's
partition merges): one connection per thread, opened once and kept for the thread's life.
"""

from __future__ import annotations

import threading

_LOCAL = threading.local()


def duckdb_connection():
    """This thread's DuckDB connection (opened once: a connection costs ~11–13 ms, a chunk ~20 ms
    of work, a partition merge a few ms). Callers register their tables and unregister them after."""
    con = getattr(_LOCAL, "con", None)
    if con is None:
        import duckdb

        con = _LOCAL.con = duckdb.connect(config={"threads": 2})
        con.execute("SET TimeZone = 'UTC'")
    return con
