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
    return out.cast(_kept_types(schema, old, out))


def _kept_types(schema: pa.Schema, old: pa.Table | None, out: pa.Table) -> pa.Schema:
    """The content's types: the changes' (a window's are its output schema), except where a
    join's column changed type between epochs (its columns keep their inputs' types, which one
    epoch's records decide): then the type both fit (int64 and double: double; null and any: that
    one), else DuckDB's for their union (text). The committed rows are never cast to a type that
    cannot hold them (3.5 to int64, a value to null)."""
    if old is None or not old.num_rows:
        return schema
    fields = []
    for f in schema:
        before = old.schema.field(f.name) if f.name in old.schema.names else None
        if before is None or before.type == f.type:
            fields.append(f)
            continue
        try:
            fields.append(pa.unify_schemas([pa.schema([before]), pa.schema([f])], promote_options="permissive")[0])
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            fields.append(out.schema.field(f.name))
    return pa.schema(fields)
