"""Streams on the object store (DESIGN §1): segments of gapless, immutable chunks.

Layout under the bucket::

    streams/<stream>/segments/<segment>/index/<seq:012d>.json   # the claim: chunk metadata
    streams/<stream>/segments/<segment>/data/<uuid>.parquet     # valid events, normalized
    streams/<stream>/segments/<segment>/data/<uuid>.dlq.parquet # malformed records of the chunk
    streams/<stream>/segments/<segment>/_SEALED                 # last sequence of a sealed segment

A chunk exists once its index object exists: data and dead letters are written
first under unique keys, then the index is created with create-if-absent, so two
producers never overwrite each other (the loser retries on the next sequence)
and a crash leaves at most an unreferenced data file, never a half-chunk.
"""

from __future__ import annotations

import io
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .aggregates import MAX_EXACT, NOT_FINITE, OUT_OF_RANGE, out_of_domain
from .errors import ObjectExists, ObjectNotFound, WireInputError
from .objectstore import ObjectStore
from .parquetio import parquet_bytes
from .spec import Pipeline, check_name, field_column
from .timeutil import now_ms

#: Normalized chunk columns (besides one column per payload field the pipeline uses).
TIME, KEY, ID, ROW = "_t", "_key", "_id", "_row"
RAW_KEEP = 1024  # bytes of a malformed record kept in its dead letter


def stream_prefix(stream: str) -> str:
    return f"streams/{check_name(stream, 'stream')}/"


def segment_prefix(stream: str, segment: str) -> str:
    return f"{stream_prefix(stream)}segments/{check_name(segment, 'segment')}/"


def index_key(stream: str, segment: str, seq: int) -> str:
    return f"{segment_prefix(stream, segment)}index/{seq:012d}.json"


@dataclass(frozen=True)
class ChunkMeta:
    """One committed chunk: where its rows are and what the watermark needs to know."""

    stream: str
    segment: str
    seq: int
    data_key: str | None  # None when every record of the chunk was malformed
    dlq_key: str | None
    rows: int  # valid events
    malformed: int
    min_t: int | None
    max_t: int | None
    ingest_ms: int
    bytes: int

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> ChunkMeta:
        return cls(**d)


@dataclass(frozen=True)
class ProduceReport:
    stream: str
    segment: str
    chunks: list[int]
    events: int
    malformed: int


def chunk_schema(spec: Pipeline) -> pa.Schema:
    fields = [
        pa.field(TIME, pa.int64(), nullable=False),
        pa.field(KEY, pa.string()),
        pa.field(ID, pa.string()),
        pa.field(ROW, pa.int64(), nullable=False),
    ]
    fields += [pa.field(field_column(f), pa.float64()) for f in spec.numeric_fields]
    fields += [pa.field(field_column(f), pa.string()) for f in spec.distinct_fields if f not in spec.numeric_fields]
    fields += [pa.field(field_column(f), pa.int64()) for f in spec.gap_fields]
    # A field used both numerically and distinct is stored once, as a number.
    seen: set[str] = set()
    return pa.schema([f for f in fields if not (f.name in seen or seen.add(f.name))])


DLQ_SCHEMA = pa.schema([("row", pa.int64()), ("reason", pa.string()), ("record", pa.string())])


# ---------------------------------------------------------------------------
# Parsing and validation: vectorised in DuckDB, one SQL pass per input block (a typed Parquet block
# none of whose rows can fail a check: Arrow casts instead, `_all_valid`).


def _split_lines(data: bytes) -> pa.LargeBinaryArray:
    """Split JSONL bytes into one binary value per line, zero-copy (numpy finds the newlines)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
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


def _json_path(field: str) -> str:
    return "$." + ".".join('"' + part.replace('"', '') + '"' for part in field.split("."))


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
    for role, f in (("key", spec.key_field), ("id", spec.id_field)):
        out_col = KEY if role == "key" else ID
        if not f:
            cols.append(f"CAST(NULL AS VARCHAR) AS {out_col}")
            continue
        i = col(f)
        checks += [
            (f"y{i} IS NULL OR y{i} = 'NULL'", _sql_str(f"missing {role} field {f}")),
            (
                f"y{i} NOT IN ('VARCHAR', 'BIGINT', 'UBIGINT')",
                _sql_str(f"{role} field {f} has wrong type (want string or integer)"),
            ),
        ]
        cols.append(f"v{i} AS {out_col}")

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
            WHEN {yt} IN ('BIGINT', 'UBIGINT') THEN {num(tf, 'BIGINT')}
            WHEN {yt} = 'DOUBLE' AND {num(tf, 'DOUBLE')} = floor({num(tf, 'DOUBLE')})
                 AND abs({num(tf, 'DOUBLE')}) < 9.0e15 THEN CAST({num(tf, 'DOUBLE')} AS BIGINT)
            {f"WHEN {yt} = 'VARCHAR' THEN epoch_ms(TRY_CAST({vt} AS TIMESTAMPTZ))" if iso_time else ""}
        END AS t FROM c2
    )"""
    if typed is not None:
        return _typed_sql(typed, fields, max_bytes, tail, cols, reason)
    paths = "[" + ", ".join(_sql_str(_json_path(f)) for f in fields) + "]"
    typed_vals = ", ".join(f"json_type(x[{i}]) AS y{i}, json_extract_string(x[{i}], '$') AS v{i}" for i in range(1, len(fields) + 1))
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
    used = [spec.time_field, spec.key_field, spec.id_field, *spec.numeric_fields, *spec.distinct_fields, *spec.gap_fields]
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
    row_json = "CAST(to_json(struct_pack(" + ", ".join(f'{_q(n)} := c{k}' for k, n in enumerate(names)) + ")) AS VARCHAR)"
    vals = []
    for i, f in enumerate(fields, start=1):
        if f not in names:  # absent from the row: SQL NULL, as json_extract gives for a missing key
            vals.append(f"CAST(NULL AS VARCHAR) AS y{i}, CAST(NULL AS VARCHAR) AS v{i}")
            continue
        k = names.index(f)
        kind = _json_kind(schema.field(f).type)
        # The value's text in the row's JSON line (a double's: `NaN`, `1e300`, not DuckDB's `nan`, `1e+300`).
        text = {"VARCHAR": f"c{k}", "DOUBLE": f"CAST(to_json(c{k}) AS VARCHAR)"}.get(kind, f"CAST(c{k} AS VARCHAR)")
        vals.append(f"CASE WHEN c{k} IS NULL THEN 'NULL' ELSE '{kind}' END AS y{i}, {text} AS v{i}")
    # The row's JSON is longer than max_bytes only if this bound is; only then is the JSON measured.
    fixed, strings = _json_bound(schema)
    bound = [str(fixed)] + [f"coalesce({_ESCAPED} * strlen(c{k}) + {_QUOTES}, {_NULL_TEXT})" for k in strings]
    cs = ", ".join(f"c{k}" for k in range(len(names)))
    return f"""
    WITH c2 AS (
        SELECT line_no, {cs},
               CASE WHEN {" + ".join(bound)} > {max_bytes} THEN strlen({row_json}) > {max_bytes} ELSE FALSE END AS oversize,
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


def _time_hi(spec: Pipeline, ingest_ms: int) -> int:
    """The latest event time an event ingested at `ingest_ms` may have."""
    return ingest_ms + spec.max_future if spec.end is None else min(ingest_ms + spec.max_future, spec.end - 1)


def _validate(spec: Pipeline, name: str, rows: pa.Table, ingest_ms: int, typed: pa.Schema | None = None) -> tuple[pa.Table, pa.Table]:
    """`_normalize_sql` over `rows` (registered as `name`, with a `line_no` column appended) ->
    (valid events, dead letters)."""
    con = duckdb_connection()
    con.register(name, rows.append_column("line_no", pa.array(np.arange(rows.num_rows, dtype=np.int64))))
    try:
        out = con.sql(_normalize_sql(spec, spec.max_record_bytes, spec.start, _time_hi(spec, ingest_ms), typed=typed)).to_arrow_table()
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
    import pyarrow.compute as pc

    names = table.schema.names
    if any(f not in names for f in (spec.time_field, spec.key_field, spec.id_field) if f):
        return None
    bound, strings = _json_bound(table.schema)
    for c in (table.column(k) for k in strings):  # each column at its longest row
        longest = pc.max(pc.binary_length(c)).as_py()
        bound += max(_ESCAPED * (longest or 0) + _QUOTES, _NULL_TEXT if c.null_count else 0)
    if bound > spec.max_record_bytes:
        return None
    t = table.column(spec.time_field)
    if not _is_int(t.type) or t.null_count:
        return None
    lo_hi = pc.min_max(t)
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
        if not (_is_int(c.type) or pa.types.is_float64(c.type)) or pc.any(out_of_domain(c)).as_py():
            return None
        cols[field_column(f)] = pc.add(c.cast(pa.float64(), safe=False), 0.0)  # -0.0 + 0.0 is 0.0, as in the SQL
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
            and (c.null_count == len(c) or (pc.min(c).as_py() > 0 and pc.max(c).as_py() <= MAX_EXACT))
        ):
            return None
        cols.setdefault(field_column(f), pa.nulls(table.num_rows, pa.int64()) if c is None else c.cast(pa.int64()))
    schema = chunk_schema(spec)
    return pa.table({n: cols[n] for n in schema.names}).cast(schema)


def _split_valid(spec: Pipeline, out: pa.Table) -> tuple[pa.Table, pa.Table]:
    import pyarrow.compute as pc

    bad_mask = pc.is_valid(out["reason"])
    bad = out.filter(bad_mask)
    good = out.filter(pc.invert(bad_mask))
    schema = chunk_schema(spec)
    good = good.rename_columns({"line_no": ROW} if False else [ROW if c == "line_no" else c for c in good.column_names])
    good = good.select(schema.names).cast(schema)
    dlq = pa.table(
        {
            "row": bad["line_no"],
            "reason": pc.binary_join_element_wise(pa.scalar("malformed: "), bad["reason"], ""),
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


@dataclass(frozen=True)
class InputFile:
    """A validated input file: its record count and its records `[lo, hi)` as JSON lines (and,
    for Parquet, as a table)."""

    rows: int
    lines: Callable[[int, int], pa.LargeBinaryArray]
    table: Callable[[int, int], pa.Table] | None = None

    def normalize(self, spec: Pipeline, lo: int, hi: int, ingest_ms: int) -> tuple[pa.Table, pa.Table]:
        """Records `[lo, hi)` -> (valid events, dead letters) with `_row`/`row` relative to `lo`."""
        if self.table is not None:
            return normalize_table(spec, self.table(lo, hi), ingest_ms)
        return normalize_lines(spec, self.lines(lo, hi), ingest_ms)


def read_input(path: Path) -> pa.LargeBinaryArray:
    """Every record of a JSONL or Parquet file as one JSON line each (see `open_input`)."""
    inp = open_input(path)
    return inp.lines(0, inp.rows)


def open_input(path: Path) -> InputFile:
    """Open JSONL or Parquet input; a missing/unreadable/empty/corrupt file is bad input (exit 2),
    raised here, before anything is written. Parquet rows become JSON lines one chunk at a time."""
    if not path.exists():
        raise WireInputError(f"--file: no such file {str(path)!r}")
    if not path.is_file():
        raise WireInputError(f"--file: {str(path)!r} is not a file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise WireInputError(f"--file: cannot read {str(path)!r}: {e.strerror or e.__class__.__name__}") from None
    if not data.strip(b"\xef\xbb\xbf \t\r\n"):
        raise WireInputError(f"--file: {str(path)!r} is empty; nothing to append")
    if path.suffix.lower() == ".parquet" or data[:4] == b"PAR1":
        try:
            table = pq.ParquetFile(io.BytesIO(data)).read()
        except Exception as e:  # pyarrow raises several kinds for a corrupt file
            raise WireInputError(f"--file: {str(path)!r} is not a readable Parquet file ({e.__class__.__name__})") from None
        if table.num_rows == 0:
            raise WireInputError(f"--file: {str(path)!r} has no rows; nothing to append")
        return InputFile(table.num_rows, lambda lo, hi: parquet_to_lines(table.slice(lo, hi - lo)), lambda lo, hi: table.slice(lo, hi - lo))
    lines = _split_lines(data)
    del data
    return InputFile(len(lines), lambda lo, hi: lines.slice(lo, hi - lo))


# ---------------------------------------------------------------------------
# Appending


def _write_parquet(store: ObjectStore, key: str, table: pa.Table) -> int:
    data = parquet_bytes(table, distinct=(ID,))
    store.put(key, data)
    return len(data)


def last_seq(store: ObjectStore, stream: str, segment: str) -> int:
    """The highest claimed sequence of a segment, -1 if none (lists only the segment's index)."""
    last = -1
    for info in store.list(segment_prefix(stream, segment) + "index/"):
        last = max(last, int(info.key.rsplit("/", 1)[1].split(".")[0]))
    return last


def sealed_seq(store: ObjectStore, stream: str, segment: str) -> int | None:
    try:
        return int(json.loads(store.get(segment_prefix(stream, segment) + "_SEALED"))["last_seq"])
    except ObjectNotFound:
        return None


def append_chunk(store: ObjectStore, spec: Pipeline, segment: str, good: pa.Table, dlq: pa.Table, seq_hint: int | None = None,
                 check_sealed: bool = True) -> ChunkMeta:
    """Write the chunk's files, then claim the next free sequence with create-if-absent (from
    `seq_hint`, the sequence after this producer's last chunk, else after the segment's last).

    A segment sealed before the claim is an error either way (checked after it); `check_sealed`
    also checks before anything is written. A producer's later chunks skip that first check:
    its previous chunk was checked after its claim, a moment before."""
    import pyarrow.compute as pc

    seg_prefix = segment_prefix(spec.stream, segment)
    if check_sealed and sealed_seq(store, spec.stream, segment) is not None:
        raise WireInputError(f"--segment: segment {segment!r} of stream {spec.stream!r} is sealed; use another segment")
    uid = uuid.uuid4().hex
    data_key = dlq_key = None
    size = 0
    if good.num_rows:
        data_key = f"{seg_prefix}data/{uid}.parquet"
        size += _write_parquet(store, data_key, good)
    if dlq.num_rows:
        dlq_key = f"{seg_prefix}data/{uid}.dlq.parquet"
        size += _write_parquet(store, dlq_key, dlq)
    mm = pc.min_max(good[TIME]) if good.num_rows else None
    seq = seq_hint if seq_hint is not None else last_seq(store, spec.stream, segment) + 1
    while True:
        meta = ChunkMeta(
            stream=spec.stream,
            segment=segment,
            seq=seq,
            data_key=data_key,
            dlq_key=dlq_key,
            rows=good.num_rows,
            malformed=dlq.num_rows,
            min_t=mm["min"].as_py() if mm else None,
            max_t=mm["max"].as_py() if mm else None,
            ingest_ms=now_ms(),
            bytes=size,
        )
        try:
            store.create_if_absent(index_key(spec.stream, segment, seq), json.dumps(meta.to_json()).encode())
        except ObjectExists:
            seq += 1  # a concurrent producer took this sequence: take the next one
            continue
        sealed = sealed_seq(store, spec.stream, segment)
        if sealed is not None and seq > sealed:
            raise WireInputError(f"--segment: segment {segment!r} was sealed during the append; chunk {seq} is ignored")
        return meta


def produce(
    store: ObjectStore,
    spec: Pipeline,
    path: Path,
    segment: str = "0",
    chunk_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ProduceReport:
    """Append the events of a JSONL or Parquet file to the pipeline's stream as chunks.

    Malformed records become dead letters of the chunk that holds their input
    range; bad input files (missing, unreadable, empty) raise WireInputError
    before anything is written.
    """
    check_name(segment, "--segment")
    return _append_input(store, spec, open_input(Path(path)), segment, chunk_rows, progress)


def produce_files(
    store: ObjectStore,
    spec: Pipeline,
    files: list[tuple[Path, str]],
    chunk_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[ProduceReport]:
    """`produce` for several (file, segment) pairs in one call, one report per pair in their order.

    Every file is opened, and so checked, before anything is written: one bad file appends
    nothing (the files are held in memory together). The segments are appended side by side,
    one thread each (each waits mostly on the store); the files of one segment in their order.
    """
    for _, seg in files:
        check_name(seg, "--segment")
    inputs = [open_input(Path(p)) for p, _ in files]
    total = sum(i.rows for i in inputs)
    done = [0] * len(files)
    lock = threading.Lock()

    def file_progress(i: int) -> Callable[[int, int], None]:
        def cb(rows: int, _total: int) -> None:
            with lock:
                done[i] = rows
                if progress:
                    progress(sum(done), total)

        return cb

    by_segment: dict[str, list[int]] = {}
    for i, (_, seg) in enumerate(files):
        by_segment.setdefault(seg, []).append(i)

    def one_segment(seg: str) -> list[tuple[int, ProduceReport]]:
        return [(i, _append_input(store, spec, inputs[i], seg, chunk_rows, file_progress(i))) for i in by_segment[seg]]

    reports: list[ProduceReport | None] = [None] * len(files)
    with ThreadPoolExecutor(max_workers=len(by_segment)) as pool:
        for done_pairs in pool.map(one_segment, by_segment):
            for i, rep in done_pairs:
                reports[i] = rep
    return [r for r in reports if r is not None]


def _append_input(
    store: ObjectStore, spec: Pipeline, inp: InputFile, segment: str, chunk_rows: int | None,
    progress: Callable[[int, int], None] | None,
) -> ProduceReport:
    ingest = now_ms()  # one upper time bound for the whole file
    n = chunk_rows or spec.chunk_rows
    metas: list[ChunkMeta] = []

    def done(meta: ChunkMeta) -> None:
        metas.append(meta)
        if progress:
            progress(min(len(metas) * n, inp.rows), inp.rows)

    # One chunk of input at a time: memory is the file plus two chunks, whatever the file's length.
    # While a chunk is written and claimed (in order, by one uploader thread), the next one is
    # validated; the sequence after the previous claim is tried first (no listing per chunk).
    with ThreadPoolExecutor(max_workers=1) as uploader:
        in_flight = None
        for lo in range(0, inp.rows, n):
            good, dlq = inp.normalize(spec, lo, min(lo + n, inp.rows), ingest)  # rows relative to the chunk
            if in_flight is not None:
                done(in_flight.result())
            hint = metas[-1].seq + 1 if metas else None
            in_flight = uploader.submit(append_chunk, store, spec, segment, good, dlq, hint, check_sealed=not metas)
        if in_flight is not None:
            done(in_flight.result())
    return ProduceReport(spec.stream, segment, [m.seq for m in metas], sum(m.rows for m in metas), sum(m.malformed for m in metas))


def close_stream(store: ObjectStore, spec: Pipeline) -> dict[str, int]:
    """Seal every segment: no more chunks. Idempotent: a sealed segment keeps its seal."""
    out = {}
    for seg in list_segments(store, spec.stream):
        last = last_seq(store, spec.stream, seg)
        try:
            store.create_if_absent(segment_prefix(spec.stream, seg) + "_SEALED", json.dumps({"last_seq": last}).encode())
            out[seg] = last
        except ObjectExists:
            out[seg] = sealed_seq(store, spec.stream, seg)  # type: ignore[assignment]
    return out


# ---------------------------------------------------------------------------
# Reading


def list_segments(store: ObjectStore, stream: str) -> list[str]:
    prefix = stream_prefix(stream) + "segments/"
    return sorted(p[len(prefix) :].rstrip("/") for p in store.list_prefixes(prefix))


@dataclass(frozen=True)
class SegmentView:
    """What a reader sees of a segment beyond an offset: its new chunks and its seal."""

    segment: str
    chunks: list[ChunkMeta]
    sealed_at: int | None  # last sequence if sealed


#: Chunk index objects read in this process, by (endpoint, bucket, key, ETag): a claimed chunk's
#: index never changes, and the listing's ETag names its content, so a reader of the stream (the
#: sensor, then the run in one `wire tick`; a backlog's jobs) reads each one once.
_INDEX_CACHE: OrderedDict[tuple[str, str, str, str], ChunkMeta] = OrderedDict()
_INDEX_CACHE_MAX = 100_000
_INDEX_LOCK = threading.Lock()
INDEX_READ_THREADS = 8  # index objects fetched side by side (each a small GET)


def _index_entries(store: ObjectStore, infos: list) -> list[ChunkMeta]:
    """The chunks of index objects `infos` (listing entries), from the cache or the store."""
    where = (store.cfg.endpoint, store.bucket)
    with _INDEX_LOCK:
        hits = {i.key: _INDEX_CACHE.get((*where, i.key, i.etag)) for i in infos if i.etag}
    missing = [i for i in infos if hits.get(i.key) is None]
    if missing:
        def read(info) -> ChunkMeta:
            return ChunkMeta.from_json(json.loads(store.get(info.key)))

        with ThreadPoolExecutor(max_workers=min(INDEX_READ_THREADS, len(missing))) as pool:
            fetched = dict(zip((i.key for i in missing), pool.map(read, missing)))
        with _INDEX_LOCK:
            for i in missing:
                if i.etag:
                    _INDEX_CACHE[(*where, i.key, i.etag)] = fetched[i.key]
            while len(_INDEX_CACHE) > _INDEX_CACHE_MAX:
                _INDEX_CACHE.popitem(last=False)
        hits.update(fetched)
    return [hits[i.key] for i in infos]


def read_stream(store: ObjectStore, stream: str, offsets: dict[str, int]) -> dict[str, SegmentView]:
    """New chunks of every segment after the offset vector (next sequence to read).

    Lists only each segment's index after its offset (start-after), never the bucket.
    Stops at the first gap so the offset vector stays gapless. Index objects already read
    by this process are not read again (`_INDEX_CACHE`); the others are read side by side.
    """
    views = {}
    for seg in list_segments(store, stream):
        start = offsets.get(seg, 0)
        after = index_key(stream, seg, start - 1) if start > 0 else None
        sealed = sealed_seq(store, stream, seg)
        taken = []
        expect = start
        for info in store.list(segment_prefix(stream, seg) + "index/", start_after=after):
            seq = int(info.key.rsplit("/", 1)[1].split(".")[0])
            if seq != expect or (sealed is not None and seq > sealed):
                break
            taken.append(info)
            expect += 1
        views[seg] = SegmentView(seg, _index_entries(store, taken), sealed)
    return views


def views_from(views: dict[str, SegmentView], offsets: dict[str, int]) -> dict[str, SegmentView]:
    """One reading of the stream (`read_stream`) seen from later offsets: each segment's chunks
    from its new offset on, its seal as read — what `read_stream` at those offsets returns if
    nothing was appended since, without listing the store again."""
    return {seg: SegmentView(seg, [c for c in v.chunks if c.seq >= offsets.get(seg, 0)], v.sealed_at) for seg, v in views.items()}


def iter_dead_letters(store: ObjectStore, stream: str) -> Iterator[dict]:
    """Malformed records of every chunk, with their source position."""
    for seg, view in read_stream(store, stream, {}).items():
        for c in view.chunks:
            if not c.dlq_key:
                continue
            t = pq.read_table(io.BytesIO(store.get(c.dlq_key)))
            for r in t.to_pylist():
                yield {
                    "reason": r["reason"],
                    "record": r["record"],
                    "stream": stream,
                    "segment": seg,
                    "chunk": c.seq,
                    "row": r["row"],
                }
