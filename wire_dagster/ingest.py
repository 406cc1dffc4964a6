"""Input parsing and validation (DESIGN §1 Streams, §4 Errors): JSON lines or Parquet records in,
(valid events in the chunk schema, dead letters) out — every record either becomes an event or a
dead letter naming the first check it fails, the same for both input formats.

Vectorised in DuckDB, one SQL pass per input block (a typed Parquet block none of whose rows can
fail a check: Arrow casts instead, `_all_valid`). A missing, unreadable, empty or corrupt input
file is bad input (exit 2), raised before anything is written.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .aggregates import MAX_EXACT, NOT_FINITE, OUT_OF_RANGE, out_of_domain
from .bigarrow import is_text, value_bytes
from .duck import duckdb_connection
from .errors import WireInputError
from .events import DLQ_SCHEMA, ID, KEY, ROW, TIME, chunk_schema
from .spec import Pipeline, field_column

RAW_KEEP = 1024  # bytes of a malformed record kept in its dead letter


BOM = b"\xef\xbb\xbf"
_BLANK = BOM + b" \t\r\n"  # the bytes of a file that holds no record


def _split_lines(data: bytes) -> pa.LargeBinaryArray:
    """Split JSONL bytes into one binary value per line, zero-copy (numpy finds the newlines)."""
    return _lines_of(data[3:] if data.startswith(BOM) else data)


def _lines_of(data: bytes) -> pa.LargeBinaryArray:
    """The lines of `data` (no byte-order mark: a file's is dropped by its reader): split at each
    newline, a trailing carriage return dropped from each, a last line with no newline kept."""
    if not data:
        return pa.array([], pa.large_binary())
    buf = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(buf == 10)
    ends = np.append(nl, len(buf)) if (len(nl) == 0 or nl[-1] != len(buf) - 1) else nl
    starts = np.concatenate([[0], ends[:-1] + 1])
    # strip a trailing \r (CRLF files)
    cr = (ends > starts) & (buf[np.maximum(ends - 1, 0)] == 13)
    stops = ends - cr.astype(np.int64)
    # Build (offsets, data) with only line bytes: gather via a boolean mask is O(n) vectorised.
    keep = np.ones(len(buf), dtype=bool)
    keep[nl] = False
    keep[(stops[cr])] = False
    body = buf[keep]
    del keep
    lengths = (stops - starts).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(body)]
    )


def json_path(field: str) -> str:
    return "$." + ".".join('"' + part.replace('"', "") + '"' for part in field.split("."))


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _normalize_sql(spec: Pipeline, max_bytes: int, lo: int, hi: int, typed: pa.Schema | None = None) -> str:
    """SQL over `lines(line_no, raw)`: one row per input line with either the normalized
    columns or a `reason` (the first check it fails). Every check is a vectorised expression.

    Each line's JSON is parsed once: `json_extract` with the list of every field path the
    pipeline uses gives the fields' JSON values (SQL NULL when absent, JSON `null` when null);
    the checks then look only at those small values, `y<i>` its JSON type, `v<i>` its text.
    Numbers and gaps are held to the value domain of `aggregates` (finite, magnitude at most
    2^53, integers exactly), with reasons that name the field and the value's text.

    `typed` (a Parquet table's schema that `typed_columns` accepts): the SQL runs over
    `src(line_no, c0, c1, ...)` — the table's columns by position — instead, and `y<i>`/`v<i>`
    come from the typed columns: the JSON type and text its value would have in the row's JSON
    line, so every check, reason and value is the one the JSON-lines path gives, without
    writing and parsing JSON (the row's JSON is made only for its dead letter or its size).
    """
    fields: list[str] = []

    def col(f: str) -> int:
        if f not in fields:
            fields.append(f)
        return fields.index(f) + 1  # DuckDB lists are 1-based

    def num(f: str, sqltype: str) -> str:
        """Field `f`'s value as a number: TRY_CAST of its text, or, from a typed integer or double
        column, of the column itself (the same value: DuckDB's text of a number casts back to it)."""
        if typed is not None and f in typed.names and _json_kind(typed.field(f).type) in ("BIGINT", "DOUBLE"):
            return f"TRY_CAST(c{typed.names.index(f)} AS {sqltype})"
        return f"TRY_CAST(v{col(f)} AS {sqltype})"

    tf = spec.time_field
    ti = col(tf)
    yt, vt = f"y{ti}", f"v{ti}"
    record_checks = [
        ("oversize", f"'record larger than {max_bytes} bytes'"),
        ("s IS NULL", "'invalid UTF-8'"),
        ("trim(s) = ''", "'empty line'"),
        ("j IS NULL", "'unparsable JSON'"),
        ("NOT regexp_matches(j, '^\\s*\\{')", "'not a JSON object'"),
    ]
    if typed is not None:
        # A row is always a JSON object, and its JSON always parses (DuckDB's reader accepts the
        # NaN and Infinity its writer puts for such doubles): only its size can be wrong.
        record_checks = record_checks[:1]
    # Typed input whose time column is not a string column: its JSON type is never VARCHAR, so
    # the checks and the parse of ISO-8601 text cannot apply, and the time's text is not made.
    iso_time = typed is None or (tf in typed.names and _json_kind(typed.field(tf).type) == "VARCHAR")
    iso_checks = [
        (
            f"{yt} = 'VARCHAR' AND NOT regexp_matches({vt}, '^\\d{{4}}-\\d{{2}}-\\d{{2}}[T ]')",
            _sql_str(f"non-numeric time field {tf} (want epoch ms or ISO-8601 with zone)"),
        ),
        (
            f"{yt} = 'VARCHAR' AND NOT regexp_matches({vt}, '(Z|z|[+-]\\d{{2}}(:?\\d{{2}})?)$')",
            _sql_str(f"naive time in {tf} (ISO-8601 needs a zone, e.g. Z)"),
        ),
    ]
    checks: list[tuple[str, str]] = [
        *record_checks,
        (f"{yt} IS NULL", _sql_str(f"missing time field {tf}")),
        (f"{yt} = 'NULL'", _sql_str(f"null time field {tf}")),
        (
            f"{yt} NOT IN ('BIGINT', 'UBIGINT', 'DOUBLE', 'VARCHAR')",
            _sql_str(f"time field {tf} has wrong type (want epoch ms or ISO-8601)"),
        ),
        *(iso_checks if iso_time else []),
        ("t IS NULL", _sql_str(f"unparsable time in {tf}")),
        (f"t < {lo} OR t > {hi}", _sql_str(f"time out of range in {tf}")),
    ]
    cols = []
    for role, fs in (("key", spec.key_fields), ("id", (spec.id_field,) if spec.id_field else ())):
        out_col = KEY if role == "key" else ID
        if not fs:
            cols.append(f"CAST(NULL AS VARCHAR) AS {out_col}")
            continue
        for f in fs:
            i = col(f)
            checks += [
                (f"y{i} IS NULL OR y{i} = 'NULL'", _sql_str(f"missing {role} field {f}")),
                (
                    f"y{i} NOT IN ('VARCHAR', 'BIGINT', 'UBIGINT')",
                    _sql_str(f"{role} field {f} has wrong type (want string or integer)"),
                ),
            ]
        # A composite key is the JSON array of its fields' texts: `["1007","web"]`.
        value = f"v{col(fs[0])}" if len(fs) == 1 else "to_json([" + ", ".join(f"v{col(f)}" for f in fs) + "])"
        cols.append(f"CAST({value} AS VARCHAR) AS {out_col}")

    def beyond(f: str, i: int) -> str:
        """Integer field `f` (JSON type y<i>) is beyond ±MAX_EXACT (exactly: as HUGEINT, not as a double)."""
        within = f"{num(f, 'HUGEINT')} BETWEEN {-MAX_EXACT} AND {MAX_EXACT}"
        return f"y{i} IN ('BIGINT', 'UBIGINT') AND NOT coalesce({within}, FALSE)"

    def shown(f: str, i: int, why: str) -> str:
        """The reason `<field>: <its value's text> <why>` (aggregates.domain_reason's words)."""
        return f"{_sql_str(f + ': ')} || v{i} || {_sql_str(' ' + why)}"

    done: set[str] = set()
    for f in spec.numeric_fields:
        i = col(f)
        x = num(f, "DOUBLE")
        # The value domain of `aggregates`: finite, |x| <= 2^53 (integers exactly); -0.0 is stored as 0.0.
        checks += [
            (
                f"y{i} NOT IN ('BIGINT', 'UBIGINT', 'DOUBLE', 'NULL')",
                _sql_str(f"field {f} has wrong type (want a number)"),
            ),
            (f"y{i} = 'DOUBLE' AND NOT isfinite({x})", shown(f, i, NOT_FINITE)),
            (f"(y{i} = 'DOUBLE' AND abs({x}) > {MAX_EXACT}) OR ({beyond(f, i)})", shown(f, i, OUT_OF_RANGE)),
        ]
        cols.append(f"{x} + 0.0 AS {field_column(f)}")
        done.add(f)
    for f in spec.distinct_fields:
        if f in done:
            continue
        i = col(f)
        checks.append((f"y{i} IN ('OBJECT', 'ARRAY')", _sql_str(f"field {f} has wrong type (want a scalar)")))
        cols.append(f"v{i} AS {field_column(f)}")
    for f in spec.gap_fields:
        i = col(f)
        checks.append(
            (
                (
                    f"y{i} IS NOT NULL AND y{i} <> 'NULL' AND "
                    f"(y{i} NOT IN ('BIGINT', 'UBIGINT') OR {num(f, 'BIGINT')} <= 0)"
                ),
                _sql_str(f"gap field {f} must be a positive integer (ms)"),
            )
        )
        checks.append((beyond(f, i), shown(f, i, OUT_OF_RANGE)))
        cols.append(f"{num(f, 'BIGINT')} AS {field_column(f)}")
    reason = "CASE " + " ".join(f"WHEN {c} THEN {r}" for c, r in checks) + " END"
    tail = f"""
        SELECT *, CASE
            WHEN {yt} IN ('BIGINT', 'UBIGINT') THEN {num(tf, "BIGINT")}
            WHEN {yt} = 'DOUBLE' AND {num(tf, "DOUBLE")} = floor({num(tf, "DOUBLE")})
                 AND abs({num(tf, "DOUBLE")}) < 9.0e15 THEN CAST({num(tf, "DOUBLE")} AS BIGINT)
            {f"WHEN {yt} = 'VARCHAR' THEN epoch_ms(TRY_CAST({vt} AS TIMESTAMPTZ))" if iso_time else ""}
        END AS t FROM c2
    )"""
    if typed is not None:
        return _typed_sql(typed, fields, max_bytes, tail, cols, reason)
    paths = "[" + ", ".join(_sql_str(json_path(f)) for f in fields) + "]"
    typed_vals = ", ".join(
        f"json_type(x[{i}]) AS y{i}, json_extract_string(x[{i}], '$') AS v{i}" for i in range(1, len(fields) + 1)
    )
    return f"""
    WITH a AS (
        SELECT line_no, raw, octet_length(raw) > {max_bytes} AS oversize,
               CASE WHEN octet_length(raw) > {max_bytes} THEN NULL ELSE try(decode(raw)) END AS s
        FROM lines
    ), b AS (
        SELECT *, CASE WHEN json_valid(s) THEN s END AS j FROM a
    ), c AS (
        SELECT *, json_extract(j, {paths}) AS x FROM b
    ), c2 AS (
        SELECT * EXCLUDE (x), {typed_vals} FROM c
    ), d AS ({tail}, e AS (
        SELECT line_no, t AS {TIME}, {", ".join(cols)}, {reason} AS reason, s, raw FROM d
    )
    SELECT * EXCLUDE (s, raw),
           CASE WHEN reason IS NOT NULL THEN substr(s, 1, {RAW_KEEP}) END AS record,
           CASE WHEN reason IS NOT NULL AND s IS NULL THEN raw END AS raw_bad
    FROM e
    """


def _is_int(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def _is_str(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _json_kind(t: pa.DataType) -> str | None:
    """The JSON type (DuckDB's `json_type`) a non-null value of Arrow type `t` has in the row's
    JSON; None for the types the typed path leaves to the JSON-lines path."""
    if _is_int(t):
        return "BIGINT"  # (json_type says UBIGINT for non-negative ones: no check tells them apart)
    if pa.types.is_float64(t):
        return "DOUBLE"
    if _is_str(t):
        return "VARCHAR"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_null(t):
        return "NULL"
    return None


def typed_columns(spec: Pipeline, schema: pa.Schema) -> bool:
    """Whether a Parquet table's rows can be validated from their typed columns (the result is
    then the one of the JSON-lines path): flat columns of integer, float64, string, boolean or
    null type, names that DuckDB (case-insensitive) and a JSON object (unique) both keep apart,
    top-level fields only, and no float64 column holding a count_distinct field (its text in a
    JSON line is not DuckDB's text of the double)."""
    names = schema.names
    if len({n.lower() for n in names}) != len(names) or any(_json_kind(f.type) is None for f in schema):
        return False
    used = [
        spec.time_field,
        *spec.key_fields,
        spec.id_field,
        *spec.numeric_fields,
        *spec.distinct_fields,
        *spec.gap_fields,
    ]
    if any(f and "." in f for f in used):
        return False
    return not any(f in names and pa.types.is_float64(schema.field(f).type) for f in spec.distinct_fields)


_ESCAPED, _QUOTES, _NULL_TEXT, _SCALAR_TEXT = 6, 2, 4, 32  # most bytes per string byte, quotes, `null`, other values


def _json_bound(schema: pa.Schema) -> tuple[int, list[int]]:
    """A bound on a row's JSON length: `fixed` bytes plus, for each string column k listed,
    _ESCAPED bytes per byte of its value + _QUOTES (_NULL_TEXT when null) — every name quoted,
    every string with every byte escaped, every other value at most _SCALAR_TEXT."""
    strings = [k for k, f in enumerate(schema) if _is_str(f.type)]
    fixed = 2 + sum(len(json.dumps(n)) + 2 for n in schema.names) + _SCALAR_TEXT * (len(schema) - len(strings))
    return fixed, strings


def _typed_sql(schema: pa.Schema, fields: list[str], max_bytes: int, tail: str, cols: list[str], reason: str) -> str:
    """The typed head and tail of `_normalize_sql` over `src(line_no, c0, c1, ...)`."""
    names = schema.names
    row_json = (
        "CAST(to_json(struct_pack(" + ", ".join(f"{_q(n)} := c{k}" for k, n in enumerate(names)) + ")) AS VARCHAR)"
    )
    vals = []
    for i, f in enumerate(fields, start=1):
        if f not in names:  # absent from the row: SQL NULL, as json_extract gives for a missing key
            vals.append(f"CAST(NULL AS VARCHAR) AS y{i}, CAST(NULL AS VARCHAR) AS v{i}")
            continue
        k = names.index(f)
        kind = _json_kind(schema.field(f).type)
        # The value's text in the row's JSON line (a double's: `NaN`, `1e300`, not DuckDB's `nan`, `1e+300`).
        text = {"VARCHAR": f"c{k}", "DOUBLE": f"CAST(to_json(c{k}) AS VARCHAR)"}.get(
            kind or "", f"CAST(c{k} AS VARCHAR)"
        )
        vals.append(f"CASE WHEN c{k} IS NULL THEN 'NULL' ELSE '{kind}' END AS y{i}, {text} AS v{i}")
    # The row's JSON is longer than max_bytes only if this bound is; only then is the JSON measured.
    fixed, strings = _json_bound(schema)
    bound = [str(fixed)] + [f"coalesce({_ESCAPED} * strlen(c{k}) + {_QUOTES}, {_NULL_TEXT})" for k in strings]
    cs = ", ".join(f"c{k}" for k in range(len(names)))
    return f"""
    WITH c2 AS (
        SELECT line_no, {cs},
               CASE WHEN {" + ".join(bound)} > {max_bytes} THEN strlen({row_json}) > {max_bytes}
                    ELSE FALSE END AS oversize,
               {", ".join(vals)}
        FROM src
    ), d AS ({tail}, e AS (
        SELECT line_no, t AS {TIME}, {", ".join(cols)}, {reason} AS reason, {cs} FROM d
    )
    SELECT * EXCLUDE ({cs}),
           CASE WHEN reason IS NOT NULL THEN substr({row_json}, 1, {RAW_KEEP}) END AS record,
           CAST(NULL AS BLOB) AS raw_bad
    FROM e
    """


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _time_hi(spec: Pipeline, ingest_ms: int) -> int:
    """The latest event time an event ingested at `ingest_ms` may have."""
    return ingest_ms + spec.max_future if spec.end is None else min(ingest_ms + spec.max_future, spec.end - 1)


def _validate(
    spec: Pipeline, name: str, rows: pa.Table, ingest_ms: int, typed: pa.Schema | None = None
) -> tuple[pa.Table, pa.Table]:
    """`_normalize_sql` over `rows` (registered as `name`, with a `line_no` column appended) ->
    (valid events, dead letters)."""
    con = duckdb_connection()
    con.register(name, rows.append_column("line_no", pa.array(np.arange(rows.num_rows, dtype=np.int64))))
    try:
        out = con.sql(
            _normalize_sql(spec, spec.max_record_bytes, spec.start, _time_hi(spec, ingest_ms), typed=typed)
        ).to_arrow_table()
    finally:
        con.unregister(name)
    # DuckDB keeps insertion order (preserve_insertion_order, on by default) without the cost of
    # an ORDER BY (40% of this query); should it ever not, sort here, still vectorised.
    line_no = out["line_no"].to_numpy()
    if len(line_no) > 1 and not bool(np.all(line_no[1:] > line_no[:-1])):
        out = out.take(np.argsort(line_no, kind="stable"))
    return _split_valid(spec, out)


def normalize_lines(spec: Pipeline, lines: pa.LargeBinaryArray, ingest_ms: int) -> tuple[pa.Table, pa.Table]:
    """Lines -> (valid events in chunk schema with `_row` = line number, dead letters)."""
    return _validate(spec, "lines", pa.table({"raw": lines}), ingest_ms)


def normalize_table(spec: Pipeline, table: pa.Table, ingest_ms: int) -> tuple[pa.Table, pa.Table]:
    """A Parquet table's rows -> (valid events, dead letters), as `normalize_lines` would give for
    the rows as JSON lines: from the typed columns where `typed_columns` allows, else through JSON."""
    valid_utf8 = True
    for c in table.columns:
        if _is_str(c.type):
            try:
                c.validate(full=True)
            except pa.ArrowInvalid:
                valid_utf8 = False
    if not (valid_utf8 and typed_columns(spec, table.schema)):
        return normalize_lines(spec, parquet_to_lines(table), ingest_ms)
    valid = _all_valid(spec, table, ingest_ms)
    if valid is not None:
        return valid, DLQ_SCHEMA.empty_table()
    src = table.rename_columns([f"c{k}" for k in range(table.num_columns)])
    return _validate(spec, "src", src, ingest_ms, typed=table.schema)


def _all_valid(spec: Pipeline, table: pa.Table, ingest_ms: int) -> pa.Table | None:
    """The events of a typed table (`typed_columns`) in which no row can fail a check of
    `_normalize_sql`, by Arrow casts of its columns; None where one might, or where a value's
    text would need SQL: then the SQL decides, row by row, with its reasons.

    Decided per column, over its nulls, its range and its longest string: an integer time
    without nulls within [start, hi]; a key and an id of integers or strings without nulls;
    numbers of integers or doubles within the value domain (`aggregates.out_of_domain`: no
    NaN, ±Infinity or magnitude above 2^53); counted-distinct values of integers or strings;
    gaps of signed integers in [1, 2^53]; no row's JSON possibly over max_record_bytes (the
    SQL's bound, at each column's longest). The values are the SQL's: an integer's decimal
    text, a number as a double (-0.0 as 0.0). A chunk of 50,000 bids: ~2 instead of ~14 ms."""

    names = table.schema.names
    if len(spec.key_fields) > 1 or any(f not in names for f in (spec.time_field, spec.key_field, spec.id_field) if f):
        return None  # a composite key's text is made by the SQL
    bound, strings = _json_bound(table.schema)
    for c in (table.column(k) for k in strings):  # each column at its longest row
        longest = pc.max(pc.binary_length(c)).as_py()  # pyright: ignore[reportAttributeAccessIssue]  generated at import
        bound += max(_ESCAPED * (longest or 0) + _QUOTES, _NULL_TEXT if c.null_count else 0)
    if bound > spec.max_record_bytes:
        return None
    t = table.column(spec.time_field)
    if not _is_int(t.type) or t.null_count:
        return None
    lo_hi = pc.min_max(t)  # pyright: ignore[reportAttributeAccessIssue]  generated at import
    if table.num_rows and (lo_hi["min"].as_py() < spec.start or lo_hi["max"].as_py() > _time_hi(spec, ingest_ms)):
        return None
    cols = {TIME: t.cast(pa.int64())}
    for out_col, f in ((KEY, spec.key_field), (ID, spec.id_field)):
        if not f:
            cols[out_col] = pa.nulls(table.num_rows, pa.string())
            continue
        c = table.column(f)
        if c.null_count or not (_is_int(c.type) or _is_str(c.type)):
            return None
        cols[out_col] = c.cast(pa.string())
    cols[ROW] = pa.array(np.arange(table.num_rows, dtype=np.int64))

    def column(f: str) -> pa.ChunkedArray | None:
        """Field f's column; None where the row has no value for it (absent, or of null type)."""
        return None if f not in names or pa.types.is_null(table.schema.field(f).type) else table.column(f)

    for f in spec.numeric_fields:
        c = column(f)
        if c is None:
            cols[field_column(f)] = pa.nulls(table.num_rows, pa.float64())
            continue
        if not (_is_int(c.type) or pa.types.is_float64(c.type)) or pc.any(out_of_domain(c)).as_py():  # pyright: ignore[reportAttributeAccessIssue]  generated at import
            return None
        cols[field_column(f)] = pc.add(c.cast(pa.float64(), safe=False), 0.0)  # -0.0 + 0.0 is 0.0, as in the SQL  # pyright: ignore[reportAttributeAccessIssue]  generated at import
    for f in spec.distinct_fields:
        if field_column(f) in cols:
            continue
        c = column(f)
        if c is not None and not (_is_int(c.type) or _is_str(c.type)):
            return None
        cols[field_column(f)] = pa.nulls(table.num_rows, pa.string()) if c is None else c.cast(pa.string())
    for f in spec.gap_fields:
        c = column(f)
        if c is not None and not (
            pa.types.is_signed_integer(c.type)
            and (c.null_count == len(c) or (pc.min(c).as_py() > 0 and pc.max(c).as_py() <= MAX_EXACT))  # pyright: ignore[reportAttributeAccessIssue]  generated at import
        ):
            return None
        cols.setdefault(field_column(f), pa.nulls(table.num_rows, pa.int64()) if c is None else c.cast(pa.int64()))
    schema = chunk_schema(spec)
    return pa.table({n: cols[n] for n in schema.names}).cast(schema)


def _split_valid(spec: Pipeline, out: pa.Table) -> tuple[pa.Table, pa.Table]:

    bad_mask = pc.is_valid(out["reason"])  # pyright: ignore[reportAttributeAccessIssue]  generated at import
    bad = out.filter(bad_mask)
    good = out.filter(pc.invert(bad_mask))  # pyright: ignore[reportAttributeAccessIssue]  generated at import
    schema = chunk_schema(spec)
    good = good.rename_columns([ROW if c == "line_no" else c for c in good.column_names])
    good = good.select(schema.names).cast(schema)
    dlq = pa.table(
        {
            "row": bad["line_no"],
            "reason": pc.binary_join_element_wise(pa.scalar("malformed: "), bad["reason"], ""),  # pyright: ignore[reportAttributeAccessIssue]  generated at import
            "record": _record_text(bad["record"], bad["raw_bad"]),
        },
        schema=DLQ_SCHEMA,
    )
    return good, dlq


def _record_text(record: pa.ChunkedArray, raw_bad: pa.ChunkedArray) -> pa.Array:
    """The dead letter's copy of its record: the line as text; for a line that is not valid
    UTF-8 or is oversized (never decoded by SQL), its first RAW_KEEP bytes decoded with
    U+FFFD for bad bytes, so the event stays readable. Runs over dead letters only."""
    texts = record.to_pylist()
    for i, raw in enumerate(raw_bad.to_pylist()):
        if texts[i] is None and raw is not None:
            texts[i] = raw[:RAW_KEEP].decode("utf-8", "replace")
    return pa.array(texts, pa.string())


def parquet_to_lines(table: pa.Table) -> pa.LargeBinaryArray:
    """Rows of a Parquet table as JSON lines (DuckDB's to_json), so one validator serves both formats."""
    con = duckdb_connection()
    con.register("rows_in", table)
    try:
        res = con.sql("SELECT CAST(to_json(rows_in) AS BLOB) AS raw FROM rows_in").to_arrow_table()
    finally:
        con.unregister("rows_in")
    return res["raw"].combine_chunks().cast(pa.large_binary())


def _nothing() -> None:
    """The `close` of input that holds no file."""


@dataclass(frozen=True)
class InputFile:
    """A validated input file: its record count and its records `[lo, hi)` as JSON lines (and,
    for Parquet, as a table). A file's records are read from it range by range, not held;
    `close` (or leaving a `with` block) releases the file it may hold open."""

    rows: int
    lines: Callable[[int, int], pa.LargeBinaryArray]
    table: Callable[[int, int], pa.Table] | None = None
    close: Callable[[], None] = _nothing

    def __enter__(self) -> InputFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def end_within(self, lo: int, hi: int, max_bytes: int, guess: int | None = None) -> int:
        """The end of the records from `lo` on, at most `hi`, whose bytes stay within `max_bytes`
        (at least one record): a JSON line's text, a Parquet row's Arrow values (`row_bytes`).
        Reads ranges from `lo` that grow: `guess` records first (the last chunk's), else as many as
        the first PROBE_ROWS' bytes say fit, twice as many each time all of them fit."""

        def sizes(top: int) -> np.ndarray:
            return row_bytes(self.table(lo, top)) if self.table is not None else value_bytes(self.lines(lo, top))

        if guess is None:
            probe = sizes(min(hi, lo + PROBE_ROWS))
            guess = int(max_bytes / max(1.0, float(probe.mean())) * 1.25) + 1
        top = min(hi, lo + max(1, guess))
        while True:
            fit = int(np.searchsorted(np.cumsum(sizes(top)), max_bytes, side="right"))
            if fit < top - lo or top == hi:
                return lo + max(1, fit)
            top = min(hi, lo + 2 * (top - lo))

    def normalize(self, spec: Pipeline, lo: int, hi: int, ingest_ms: int) -> tuple[pa.Table, pa.Table]:
        """Records `[lo, hi)` -> (valid events, dead letters) with `_row`/`row` relative to `lo`."""
        if self.table is not None:
            return normalize_table(spec, self.table(lo, hi), ingest_ms)
        return normalize_lines(spec, self.lines(lo, hi), ingest_ms)


def row_bytes(table: pa.Table) -> np.ndarray:
    """About the bytes each row of `table` holds in Arrow: its string and binary values' own, and
    an even share of each other column's."""
    sizes = np.zeros(table.num_rows, np.int64)
    for col in table.columns:
        if is_text(col.type):
            sizes += value_bytes(col)
        elif table.num_rows:
            sizes += -(-col.nbytes // table.num_rows)
    return sizes


def read_input(path: Path) -> pa.LargeBinaryArray:
    """Every record of a JSONL or Parquet file as one JSON line each (see `open_input`)."""
    with open_input(path) as inp:
        return inp.lines(0, inp.rows)


PROBE_ROWS = 64  # records whose bytes size the first read of `InputFile.end_within`
LINE_STRIDE = 4096  # a JSON-lines file's index keeps the byte offset of every LINE_STRIDE-th line
_BLOCK = 8 << 20  # bytes read at a time by a pass over a whole file
_BATCH = 65_536  # Parquet rows decoded at a time
# A Parquet file read as a stream of 1 MiB, not pre-buffered: pyarrow's default (pre_buffer) holds
# the column chunks of the row groups read so far; 10 M rows' check peaked at 291 MB, this at 177.
_STREAMED = {"pre_buffer": False, "buffer_size": 1 << 20}


def _named(path: Path) -> str:
    return repr(str(path))


def _stamp(path: Path) -> tuple[int, int]:
    """What tells a file changed: its size and modification time."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _changed(path: Path) -> WireInputError:
    return WireInputError(f"--file: {_named(path)} changed while it was produced; produce a file that does not change")


def open_input(path: Path) -> InputFile:
    """Open JSONL or Parquet input; a missing/unreadable/empty/corrupt file is bad input (exit 2),
    raised here, before anything is written: one pass over the file checks it and keeps nothing
    of it but its row count and (JSON lines) an index of line offsets, so memory stays flat in
    the file's size. Its records are then read range by range as they are appended."""
    if not path.exists():
        raise WireInputError(f"--file: no such file {_named(path)}")
    if not path.is_file():
        raise WireInputError(f"--file: {_named(path)} is not a file")
    try:
        stamp = _stamp(path)
        with path.open("rb") as f:
            head = f.read(4)
            f.seek(0)
            blank = all(not block.strip(_BLANK) for block in iter(lambda: f.read(_BLOCK), b""))
    except OSError as e:
        raise WireInputError(f"--file: cannot read {_named(path)}: {e.strerror or e.__class__.__name__}") from None
    if blank:
        raise WireInputError(f"--file: {_named(path)} is empty; nothing to append")
    if path.suffix.lower() == ".parquet" or head == b"PAR1":
        return _ParquetInput(path, stamp).input()
    return _JsonLinesInput(path, stamp).input()


class _JsonLinesInput:
    """A JSON-lines file read by line ranges: one pass counts its lines (as `_split_lines` splits
    them) and keeps the byte offset of every LINE_STRIDE-th; `lines(lo, hi)` reads the bytes
    from the indexed line at or before `lo` to the one at or after `hi` and splits only those.
    The last range read is kept: a chunk's lines are asked for three times (its bytes, within a
    range its bytes read; its checks; its records)."""

    def __init__(self, path: Path, stamp: tuple[int, int]) -> None:
        self.path, self.stamp = path, stamp
        self.rows, self.offsets = self._index()
        self.last: tuple[int, int, pa.LargeBinaryArray] | None = None
        self.lock = threading.Lock()

    def _index(self) -> tuple[int, list[int]]:
        """(number of lines, byte offsets of lines 0, K, 2K, ...) in one pass of _BLOCK bytes at a time."""
        size = self.stamp[0]
        try:
            with self.path.open("rb") as f:
                base = len(BOM) if f.read(len(BOM)) == BOM else 0
                f.seek(base)
                offsets, newlines, pos, last = [base], 0, base, b""
                while block := f.read(_BLOCK):
                    nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                    # Line i >= 1 starts after the file's i-th newline; keep those with i % K == 0.
                    first = (-(newlines + 1)) % LINE_STRIDE
                    offsets += (nl[first::LINE_STRIDE] + pos + 1).tolist()
                    newlines, pos, last = newlines + len(nl), pos + len(block), block[-1:]
        except OSError as e:
            raise WireInputError(
                f"--file: cannot read {_named(self.path)}: {e.strerror or e.__class__.__name__}"
            ) from None
        if pos != size:
            raise _changed(self.path)
        rows = newlines + (1 if pos > base and last != b"\n" else 0)
        return rows, offsets[: -(-rows // LINE_STRIDE)]  # (a newline ending the file starts no line)

    def lines(self, lo: int, hi: int) -> pa.LargeBinaryArray:
        with self.lock:
            if self.last is not None and self.last[0] <= lo <= hi <= self.last[1]:  # `end_within` read it
                return self.last[2].slice(lo - self.last[0], hi - lo)
            if hi <= lo:
                return pa.array([], pa.large_binary())
            a, b = lo // LINE_STRIDE, -(-hi // LINE_STRIDE)
            start = self.offsets[a]
            end = self.offsets[b] if b < len(self.offsets) else self.stamp[0]
            try:
                if _stamp(self.path) != self.stamp:
                    raise _changed(self.path)
                with self.path.open("rb") as f:
                    f.seek(start)
                    data = f.read(end - start)
            except OSError:
                raise _changed(self.path) from None
            out = _lines_of(data).slice(lo - a * LINE_STRIDE, hi - lo)
            self.last = (lo, hi, out)
            return out

    def close(self) -> None:
        self.last = None

    def input(self) -> InputFile:
        return InputFile(self.rows, self.lines, close=self.close)


class _ParquetInput:
    """A Parquet file read forward in batches of _BATCH rows: opening reads its footer and decodes
    every row group once, a batch at a time, keeping nothing (a corrupt file is bad input before
    anything is written); `table(lo, hi)` reads on from the last range (or from the row group
    holding `lo`), holding the batches that overlap it. The file is open while rows are read
    and closed after the last row, or by `close`."""

    def __init__(self, path: Path, stamp: tuple[int, int]) -> None:
        self.path, self.stamp = path, stamp
        try:
            with pq.ParquetFile(path, **_STREAMED) as pf:
                self.metadata, self.schema = pf.metadata, pf.schema_arrow
                decoded = sum(batch.num_rows for batch in pf.iter_batches(batch_size=_BATCH))
        except Exception as e:  # pyarrow raises several kinds for a corrupt file
            raise WireInputError(
                f"--file: {_named(path)} is not a readable Parquet file ({e.__class__.__name__})"
            ) from None
        if decoded != self.metadata.num_rows:
            raise WireInputError(f"--file: {_named(path)} is not a readable Parquet file (row count)")
        if decoded == 0:
            raise WireInputError(f"--file: {_named(path)} has no rows; nothing to append")
        self.rows = decoded
        groups = [self.metadata.row_group(g).num_rows for g in range(self.metadata.num_row_groups)]
        self.group_starts = np.concatenate([[0], np.cumsum(groups)]).astype(np.int64)
        self.file: pq.ParquetFile | None = None
        self.batches: Iterator[pa.RecordBatch] = iter(())
        self.held: list[pa.RecordBatch] = []  # the batches read that end after held_lo
        self.held_lo = self.pos = 0  # rows [held_lo, pos) are held
        self.last: tuple[int, int, pa.Table] | None = None
        self.lock = threading.Lock()

    def _seek(self, lo: int) -> None:
        """Read on from the start of the row group that holds row `lo`."""
        self.close()
        g = int(np.searchsorted(self.group_starts, lo, side="right")) - 1
        try:
            if _stamp(self.path) != self.stamp:
                raise _changed(self.path)
            self.file = pq.ParquetFile(self.path, metadata=self.metadata, **_STREAMED)
        except OSError:
            raise _changed(self.path) from None
        groups = list(range(g, self.metadata.num_row_groups))
        self.batches = self.file.iter_batches(batch_size=_BATCH, row_groups=groups)
        self.held_lo = self.pos = int(self.group_starts[g])

    def table(self, lo: int, hi: int) -> pa.Table:
        with self.lock:
            if self.last is not None and self.last[0] <= lo <= hi <= self.last[1]:  # `end_within` read it
                return self.last[2].slice(lo - self.last[0], hi - lo)
            if hi <= lo:
                return self.schema.empty_table()
            if not self.held_lo <= lo <= self.pos or (hi > self.pos and self.file is None):
                self._seek(lo)  # not a read on from the last range
            while self.held and self.held_lo + self.held[0].num_rows <= lo:  # rows before lo: done with
                self.held_lo += self.held.pop(0).num_rows
            try:
                while self.pos < hi:
                    batch = next(self.batches)
                    self.held.append(batch)
                    self.pos += batch.num_rows
            except (StopIteration, OSError, pa.ArrowException):
                raise _changed(self.path) from None
            if self.pos >= self.rows:
                self._close_file()
            out = pa.Table.from_batches(self.held, schema=self.held[0].schema).slice(lo - self.held_lo, hi - lo)
            self.last = (lo, hi, out)
            return out

    def lines(self, lo: int, hi: int) -> pa.LargeBinaryArray:
        return parquet_to_lines(self.table(lo, hi))

    def _close_file(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file, self.batches = None, iter(())

    def close(self) -> None:
        self._close_file()
        self.held, self.last = [], None
        self.held_lo = self.pos = 0

    def input(self) -> InputFile:
        return InputFile(self.rows, self.lines, self.table, self.close)


def records_input(records: object) -> InputFile:
    """Records in memory as checked input, as a file of them would be (`open_input`): a pyarrow
    Table or a pandas DataFrame as Parquet rows (pandas' missing values are Parquet nulls), a list
    of dicts as JSON lines (a value JSON has no type for, e.g. a datetime, as its text). Nothing
    else, and no record at all, is bad input."""
    table: pa.Table | None = None
    if isinstance(records, pa.Table):
        table = records
    elif type(records).__module__.startswith("pandas") and hasattr(records, "to_dict"):
        table = pa.Table.from_pandas(records, preserve_index=False)
    if table is not None:
        if table.num_rows == 0:
            raise WireInputError("records: the table has no rows; nothing to append")
        t: pa.Table = table
        return InputFile(
            t.num_rows, lambda lo, hi: parquet_to_lines(t.slice(lo, hi - lo)), lambda lo, hi: t.slice(lo, hi - lo)
        )
    if not isinstance(records, (list, tuple)):
        raise WireInputError(
            f"records: expected a list of dicts, a pyarrow Table or a pandas DataFrame, not {type(records).__name__}"
        )
    if not records:
        raise WireInputError("records: the list is empty; nothing to append")
    lines = []
    for r in records:
        try:  # NaN and Infinity are written as JSON writers do, then refused where a number is read
            lines.append(json.dumps(r, default=str).encode() if isinstance(r, dict) else b"\x00not a record")
        except (TypeError, ValueError):
            lines.append(b"\x00not a record")
    arr = pa.array(lines, pa.large_binary())
    return InputFile(len(arr), lambda lo, hi: arr.slice(lo, hi - lo))
