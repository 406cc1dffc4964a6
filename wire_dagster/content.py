"""A window partition's content after an epoch: its committed rows with the epoch's changes
(updates and retractions) applied — the one merge every epoch that writes a partition uses
(engine.py, derived.py)."""

from __future__ import annotations

import pyarrow as pa

from .duck import duckdb_connection


def apply_changes(old: pa.Table | None, changes: pa.Table) -> pa.Table:
    """The new content of a partition: old rows not changed, plus updates; retractions removed;
    sorted by (key, window_start, window_end), null keys last.

    DuckDB over the Arrow tables (this thread's connection): a hash anti-join on the window
    identity and a sort (the partition's whole content is rewritten each time it changes)."""
    schema = changes.schema.remove(changes.schema.get_field_index("retract"))
    cols = ", ".join(f'"{c}"' for c in schema.names)
    con = duckdb_connection()
    con.register("ch", changes)
    try:
        sql = f"SELECT {cols} FROM ch WHERE NOT retract"
        if old is not None and old.num_rows:
            con.register("old", old)
            sql = f"""
                SELECT {cols} FROM old ANTI JOIN ch
                  ON old.key IS NOT DISTINCT FROM ch.key
                 AND old.window_start = ch.window_start AND old.window_end = ch.window_end
                UNION ALL {sql}"""
        # The rest of the columns too: a join has one row per matching pair in a window (its
        # rows share key and window), and the content's bytes must not depend on their order.
        rest = "".join(f', "{c}"' for c in schema.names if c not in ("key", "window_start", "window_end"))
        out = con.sql(f"{sql} ORDER BY key ASC NULLS LAST, window_start, window_end{rest}").to_arrow_table()
    finally:
        con.unregister("ch")
        if old is not None and old.num_rows:
            con.unregister("old")
    return out.cast(schema)
