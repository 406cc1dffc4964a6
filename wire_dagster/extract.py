"""What a pipeline reads of a shared stream (DESIGN §6 Inputs): its events, from the records.

A stream holds each record once, whole (events.py's RECORDS chunks); every pipeline that reads
it makes its own events from them where it reads (on the executors, chunk by chunk):

1. derived fields (`fields:`) and the filter (`where:`), SQL expressions over the record,
   vectorised by DuckDB (`_prepare`); a record the filter is not true for is *filtered*: no
   event, no dead letter, counted apart so that the counts still balance;
2. the pipeline's checks and columns — its key (one field or several), id, time range, and the
   value domain of the fields its windows aggregate — by the same SQL that validated records
   at produce before streams were shared (ingest.py): the same values and reasons, whichever the
   record's format. A record that fails one is a dead letter of this pipeline only
   (`malformed: <reason>`), with its text; the other pipelines that read it are not affected.

The result has the pipeline's event columns (`events.chunk_schema`) plus ERR (the reason a
record makes no event: null for an event, FILTERED, or the dead letter's reason) and SRC (the
record's text, for a dead letter), one row per stored record, in the chunk's order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa

from .duck import duckdb_connection
from .events import ERR, FILTERED, ID, RAW, REC, RECORDS, ROW, SRC, TIME, chunk_schema
from .ingest import json_path, normalize_lines, normalize_table
from .recordtypes import BOOL, TEXT, arrow_kind
from .spec import Pipeline
from .sqlexpr import expression_columns

_KEEP = "__wire_keep"


def read_schema(spec: Pipeline) -> pa.Schema:
    """The columns a pipeline's events are read with: its event columns, ERR and SRC."""
    return chunk_schema(spec).append(pa.field(ERR, pa.string())).append(pa.field(SRC, pa.string()))


def payload_of(chunk: pa.Table) -> pa.Table | pa.LargeBinaryArray:
    """A RECORDS chunk's records as given: their JSON lines, or their Parquet columns."""
    if RAW in chunk.column_names:
        return chunk[RAW].combine_chunks().cast(pa.large_binary())
    rec = chunk[REC].combine_chunks()
    names = [f.name for f in rec.type]
    return pa.Table.from_arrays(rec.flatten(), names=names)


def pipeline_events(spec: Pipeline, chunk: pa.Table, ingest_ms: int) -> pa.Table:
    """The records of a RECORDS chunk as `spec`'s events (`read_schema`): see the module doc."""
    n = chunk.num_rows
    payload = payload_of(chunk)
    keep = np.ones(n, dtype=bool)
    failed: str | None = None
    if spec.fields or spec.where:
        payload, keep, failed = _prepare(spec, payload)
    kept = np.flatnonzero(keep)
    parts = []
    if failed is not None:  # an expression that cannot be evaluated on this chunk's records
        parts.append(_set_aside(spec, chunk, kept, failed, None))
    elif len(kept):
        sub = payload.take(pa.array(kept))
        good, dlq = (
            normalize_table(spec, sub, ingest_ms)
            if isinstance(sub, pa.Table)
            else normalize_lines(spec, sub, ingest_ms)
        )
        rows = chunk[ROW].combine_chunks()
        at = kept[good[ROW].to_numpy()]
        good = good.set_column(good.schema.get_field_index(ROW), ROW, rows.take(pa.array(at)))
        good = good.append_column(ERR, pa.nulls(good.num_rows, pa.string()))
        parts.append(good.append_column(SRC, pa.nulls(good.num_rows, pa.string())))
        if dlq.num_rows:
            bad_at = kept[dlq["row"].to_numpy()]
            parts.append(_set_aside(spec, chunk, bad_at, dlq["reason"], dlq["record"]))
    gone = np.flatnonzero(~keep)
    if len(gone):
        parts.append(_set_aside(spec, chunk, gone, FILTERED, None))
    schema = read_schema(spec)
    if not parts:
        return schema.empty_table()
    out = pa.concat_tables([p.select(schema.names).cast(schema) for p in parts])
    return out.sort_by(ROW) if len(parts) > 1 else out


def _set_aside(spec: Pipeline, chunk: pa.Table, at: np.ndarray, why, record) -> pa.Table:
    """Rows of records `at` that make no event: their time, id and position, and `why`."""
    schema = chunk_schema(spec)
    idx = pa.array(at, pa.int64())
    cols = {
        name: (chunk[name].take(idx) if name in (TIME, ID, ROW) else pa.nulls(len(at), schema.field(name).type))
        for name in schema.names
    }
    cols[ERR] = pa.array([why] * len(at), pa.string()) if isinstance(why, str) else why
    cols[SRC] = pa.nulls(len(at), pa.string()) if record is None else record
    return pa.table(cols)


def _referenced(spec: Pipeline) -> list[str]:
    """The record fields the pipeline's expressions name (not its own derived fields)."""
    derived = {f for f, _ in spec.fields}
    refs: list[str] = []
    for f, expr in spec.fields:
        refs += expression_columns(expr, f"fields.{f}")
    if spec.where:
        refs += [c for c in expression_columns(spec.where, "where") if c not in derived]
    return list(dict.fromkeys(refs))


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _prepare(
    spec: Pipeline, payload: pa.Table | pa.LargeBinaryArray
) -> tuple[pa.Table | pa.LargeBinaryArray, np.ndarray, str | None]:
    """The records with the pipeline's derived fields set (a JSON line gains them as keys, a
    Parquet row as columns), whether its `where` is true for each (NULL and errors: not), and,
    for an expression DuckDB cannot bind to this chunk's field types, the reason every record of
    the chunk becomes a dead letter (`malformed: fields.x: ...`)."""
    import duckdb

    refs = _referenced(spec)
    con = duckdb_connection()
    typed = isinstance(payload, pa.Table)
    name = "wire_records"
    if typed:
        missing = [r for r in refs if "." not in r and r not in payload.column_names]
        con.register(name, payload)
        nulls = ", ".join(f"NULL AS {_q(r)}" for r in missing) or "NULL AS __wire_none"
        drop = [*missing, "__wire_none"] if not missing else missing
        # a column held as text or booleans may be read as numbers (`_renumbered`), as a JSON field
        kinds = {r: arrow_kind(payload.schema.field(r).type) for r in refs if r in payload.column_names}
        types: dict[str, str | None] = {r: {TEXT: "text", BOOL: "bool"}.get(k or "") for r, k in kinds.items()}
    else:
        con.register(name, pa.table({"raw": payload}))
        types = {r: _json_type(con, name, r) for r in refs}
        drop = refs
    derived = ", ".join(f"try({expr}) AS {_q(f)}" for f, expr in spec.fields)
    where = f"coalesce(try(CAST(({spec.where}) AS BOOLEAN)), FALSE)" if spec.where else "TRUE"
    if typed:
        replaced = [f for f, _ in spec.fields if f in payload.column_names]
        excl = f" EXCLUDE ({', '.join(_q(c) for c in replaced)})" if replaced else ""

        def statement(reading: dict[str, str | None]) -> str:  # of the columns' kinds
            numbers = [r for r, t in reading.items() if t == "double"]  # read as numbers: null
            rep = f" REPLACE ({', '.join(f'CAST(NULL AS DOUBLE) AS {_q(r)}' for r in numbers)})" if numbers else ""
            return f"""
            WITH b AS (SELECT *{rep}, {nulls} FROM {name}),
                 d AS (SELECT *{excl}{", " + derived if derived else ""} FROM b)
            SELECT * EXCLUDE ({", ".join(_q(c) for c in drop)}), {where} AS {_KEEP} FROM d"""

    else:
        patch = (
            "json_merge_patch(__j, json_object(" + ", ".join(f"'{f}', {_q(f)}" for f, _ in spec.fields) + "))"
            if spec.fields
            else "__j"
        )
        # a field that redefines one the record has replaces it, as for Parquet rows above
        replaced = [f for f, _ in spec.fields if f in refs]
        excl = f" EXCLUDE ({', '.join(_q(c) for c in replaced)})" if replaced else ""

        def statement(reading: dict[str, str | None]) -> str:  # of the fields' types
            return f"""
            WITH b AS ({_json_base(name, reading)}),
                 d AS (SELECT *{excl}{", " + derived if derived else ""} FROM b)
            SELECT encode({patch}) AS raw, {where} AS {_KEEP} FROM d"""

    as_numbers: tuple[str, ...] = ()
    try:
        try:
            rel = con.sql(statement(types))
        except duckdb.Error:
            if not (again := _renumbered(con, statement, types)):
                raise
            rel, as_numbers = again
        out = rel.to_arrow_table()
    except duckdb.Error as e:  # the expressions do not bind to this chunk's field types
        first = str(e).splitlines()[0]
        exprs = "; ".join(
            [f"fields.{f}: {x}" for f, x in spec.fields] + ([f"where: {spec.where}"] if spec.where else [])
        )
        return payload, np.ones(_len(payload), dtype=bool), f"malformed: cannot evaluate {exprs} ({first})"
    finally:
        con.unregister(name)
    keep = out[_KEEP].to_numpy(zero_copy_only=False).astype(bool)
    if typed:
        out = out.drop_columns([_KEEP])
        for c in as_numbers:  # the record keeps its values: only the expressions read them as null
            if c in out.column_names and c not in replaced:
                out = out.set_column(out.column_names.index(c), c, payload[c])
        return out, keep, None
    return out["raw"].combine_chunks().cast(pa.large_binary()), keep, None


def _len(payload: pa.Table | pa.LargeBinaryArray) -> int:
    return payload.num_rows if isinstance(payload, pa.Table) else len(payload)


def _json_type(con, table: str, field: str) -> str | None:
    """The type of field `field` of the chunk's JSON lines, by the kinds of its values
    (recordtypes.field_type: numbers win, "int64" where every number is an integer within int64,
    else "double", a value of another kind then null; "bool" where all are booleans; else
    "text"); None where no record has a value. So `price > 100` compares numbers whenever the
    records carry numbers, whatever else a few of them carry."""
    from .recordtypes import DUCKDB_KINDS, OTHER, field_type

    path = json_path(field).replace("'", "''")
    kinds = {
        DUCKDB_KINDS.get(k, OTHER)
        for (k,) in con.sql(f"SELECT DISTINCT json_type(decode(raw), '{path}') FROM {table}").fetchall()
        if k not in (None, "NULL")
    }
    return field_type(kinds)


def _json_base(table: str, types: dict[str, str | None]) -> str:
    """The records (`__j`) with each referenced field as a column of its type (`_json_typed`)."""
    views = ["decode(raw) AS __j", *(f"{_json_typed(r, t)} AS {_q(r)}" for r, t in types.items())]
    return f"SELECT {', '.join(views)} FROM (SELECT * FROM {table})"


def _renumbered(con, statement: Callable[[dict[str, str | None]], str], types: dict[str, str | None]):
    """`statement` (of the fields' types) bound with fields this chunk holds only as text (or only
    as booleans) read as numbers instead, when that is what makes it bind, and those fields (None:
    nothing binds). A Parquet chunk's text or boolean column (`arrow_kind`) is read so too (`_prepare`:
    its values null as numbers, as a JSON field's text values are among numbers). Where the records
    of a chunk carry a field only as text, `amount > 10` cannot compare it, yet in any chunk that
    also has numbers those values are null (the numbers-win rule). Read so, each record gets what
    it gets in any other chunk: a chunk of one text `amount` among a live tick's few records no
    longer makes every record of it a dead letter, those without `amount` (or `amount > 10 OR
    vip`'s vips) included. The smallest such set of fields is taken, fewest first. The price: a
    stream that never carries a number there gets its records filtered (`amount > 10` is null),
    not dead letters saying the expression cannot be evaluated."""
    from itertools import combinations

    import duckdb

    texts = [r for r, t in types.items() if t in ("text", "bool")]
    for n in range(1, min(len(texts), 4) + 1):
        for fields in combinations(texts, n):
            try:
                return con.sql(statement({**types, **dict.fromkeys(fields, "double")})), fields
            except duckdb.Error:
                continue
    return None


def _json_typed(field: str, typ: str | None) -> str:
    """Field `field` of a JSON line as SQL of type `typ` (`_json_type`); an untyped NULL for None."""
    path = json_path(field).replace("'", "''")
    text = f"json_extract_string(decode(raw), '{path}')"
    if typ is None:
        return "NULL"
    if typ in ("int64", "double"):
        sqltype = "BIGINT" if typ == "int64" else "DOUBLE"
        number = f"json_type(decode(raw), '{path}') IN ('BIGINT', 'UBIGINT', 'DOUBLE')"
        return f"CASE WHEN {number} THEN TRY_CAST({text} AS {sqltype}) END"
    if typ == "bool":
        return f"TRY_CAST({text} AS BOOLEAN)"
    return text


def read_chunk(store, spec: Pipeline, meta) -> pa.Table:
    """The events `spec` makes of one chunk (`streams.ChunkMeta`), read on this machine: its event
    columns, without the records that make none (for tools and tests; runs read on executors)."""
    import io

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    schema = chunk_schema(spec)
    if meta.data_key is None:
        return schema.empty_table()
    t = pq.read_table(io.BytesIO(store.get(meta.data_key)))
    if meta.format != RECORDS:
        return t.select(schema.names).cast(schema)
    ev = pipeline_events(spec, t, meta.ingest_ms)
    return ev.filter(pc.is_null(ev[ERR])).select(schema.names)  # pyright: ignore[reportAttributeAccessIssue]  generated at import
