"""Records as typed columns: the one rule for a field whose values have several JSON types.

A stream's JSON lines, a computation's records and a raw input's records passed through a
generated pipeline carry each field with whatever JSON type a record gives it. Where Wire reads
such a field as a column — `where` and `fields` over a chunk's JSON lines (extract.py), a join's
columns and a computation's output read downstream (derived.py) — it takes one type for it, by
one rule over the kinds of value it holds (`field_type`):

- a number where any value is one: int64 where every number is an integer within int64, else
  double (NaN, ±Infinity and 2^64 are numbers); a value of another kind is then null;
- a boolean where every value is one;
- else text (a value that is no string as its JSON text);
- no type (null) where no value is there.

So `price > 100` compares numbers whenever the records carry numbers, whatever a few of them
carry. Records read in parts (a file, a task, an earlier epoch) are typed as if read at once
(`typed_as_one`, `FieldTypes`).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

#: The kinds of JSON value the rule tells apart.
INT, DOUBLE, BOOL, TEXT, OTHER = "int", "double", "bool", "text", "other"


def field_type(kinds: set[str]) -> str | None:
    """The rule (module doc): a field's type ("int64", "double", "bool", "text"; None: no value)
    from the kinds of its values (INT, DOUBLE, BOOL, TEXT, OTHER; nulls are none)."""
    if kinds & {INT, DOUBLE}:
        return "double" if DOUBLE in kinds else "int64"
    if not kinds:
        return None
    return "bool" if kinds == {BOOL} else "text"


def python_kind(v) -> str | None:
    """The kind of a value as `json.loads` gives it (None for null)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return BOOL
    if isinstance(v, int):
        return INT if -(2**63) <= v < 2**63 else DOUBLE
    if isinstance(v, float):
        return DOUBLE
    return TEXT if isinstance(v, str) else OTHER


def arrow_kind(typ: pa.DataType) -> str | None:
    """The kind of an Arrow column's values (None for the null type)."""
    if pa.types.is_null(typ):
        return None
    if pa.types.is_signed_integer(typ):
        return INT
    if pa.types.is_integer(typ) or pa.types.is_floating(typ):
        return DOUBLE  # an unsigned integer may not fit int64
    if pa.types.is_boolean(typ):
        return BOOL
    return TEXT if pa.types.is_string(typ) or pa.types.is_large_string(typ) else OTHER


#: DuckDB's `json_type` names as kinds (UBIGINT: an integer past int64).
DUCKDB_KINDS = {"BIGINT": INT, "UBIGINT": DOUBLE, "DOUBLE": DOUBLE, "BOOLEAN": BOOL, "VARCHAR": TEXT}


def _arrow(name: str) -> pa.DataType:
    return {"int64": pa.int64(), "double": pa.float64(), "bool": pa.bool_(), "text": pa.string()}[name]


def record_fields(texts: pa.ChunkedArray) -> pa.Table:
    """JSON objects (one record's text each) as columns of their JSON types: Arrow's JSON reader
    where every field has one type (ISO-8601 text staying text, where the reader would make it a
    timestamp), else each field by the rule (`json_column`)."""
    import io
    import json

    import pyarrow.json as pj

    if not len(texts):
        return pa.table({})
    one = texts.combine_chunks().cast(pa.large_string())
    whole = pa.LargeListArray.from_arrays(pa.array([0, len(one)], pa.int64()), one)  # one list of every text
    lines = pc.binary_join(whole, pa.scalar("\n", pa.large_string()))  # pyright: ignore[reportAttributeAccessIssue]
    data = io.BytesIO(lines[0].as_buffer())
    try:
        fields = pj.read_json(data)
        stamps = [f for f in fields.schema if pa.types.is_timestamp(f.type) or pa.types.is_date(f.type)]
        if stamps:  # read again with those fields as text
            data.seek(0)
            explicit = pa.schema([pa.field(f.name, pa.string()) for f in stamps])
            opts = pj.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="infer")
            fields = pj.read_json(data, parse_options=opts)
    except pa.ArrowInvalid:  # a field of several JSON types, or NaN: column by column, in Python
        recs = [json.loads(x) for x in texts.to_pylist()]
        names = list(dict.fromkeys(k for r in recs for k in r))
        fields = pa.table({k: json_column([r.get(k) for r in recs]) for k in names})
    return fields


def json_column(vals: list) -> pa.Array:
    """One field's JSON values (as `json.loads` gives them) as one column, by the rule."""
    import json

    typ = field_type({k for k in map(python_kind, vals) if k is not None})
    if typ is None:
        return pa.nulls(len(vals))
    if typ in ("int64", "double"):
        number = [python_kind(v) in (INT, DOUBLE) for v in vals]
        cast = int if typ == "int64" else float
        return pa.array([cast(v) if n else None for v, n in zip(vals, number, strict=True)], _arrow(typ))
    if typ == "bool":
        return pa.array(vals, pa.bool_())
    return pa.array([v if v is None or isinstance(v, str) else json.dumps(v) for v in vals], pa.string())


def typed_as_one(parts: list[pa.Table]) -> pa.Table:
    """Tables of records whose fields were typed part by part (a file, a task: `record_fields`)
    as one table, each field typed as if the records were read at once (the rule over every
    part's kinds; a part's values of another kind than the type's are null, or text). So a file
    whose `amount`s are all text joins with files of numbers, never an error on every retry."""
    if len(parts) == 1:
        return parts[0]
    kinds: dict[str, set[pa.DataType]] = {}
    for t in parts:
        for f in t.schema:
            if not pa.types.is_null(f.type):
                kinds.setdefault(f.name, set()).add(f.type)
    target = {}
    for name, types in kinds.items():
        if len(types) > 1:
            typ = field_type({k for k in map(arrow_kind, types) if k is not None})
            target[name] = _arrow(typ or "text")
    if target:
        parts = [_cast_fields(t, target) for t in parts]
    return pa.concat_tables(parts, promote_options="permissive")


def _cast_fields(t: pa.Table, target: dict[str, pa.DataType]) -> pa.Table:
    import json

    for name, typ in target.items():
        if name not in t.column_names or t.schema.field(name).type == typ:
            continue
        col = t[name].combine_chunks()
        kind = arrow_kind(col.type)
        if typ in (pa.int64(), pa.float64()):
            new = col.cast(typ) if kind in (INT, DOUBLE, None) else pa.nulls(len(col), typ)
        elif kind in (TEXT, None):
            new = col.cast(typ)
        elif kind == BOOL:
            new = pc.if_else(col, "true", "false")  # pyright: ignore[reportAttributeAccessIssue]
        else:  # a list or an object (a number never: numbers win): its JSON text
            new = pa.array([None if v is None else json.dumps(v) for v in col.to_pylist()], pa.string())
        t = t.set_column(t.schema.get_field_index(name), name, new)
    return t


#: Per input, the record fields read as numbers ("int64" or "double") so far: what a join's
#: tasks and epochs share, so that every one reads them as numbers (derived.py).
FieldTypes = dict[str, dict[str, str]]


def numeric_fields(records: dict[str, list[pa.Table]], skip: tuple[str, ...] = ()) -> FieldTypes:
    """The fields each input's parts hold as numbers (not those named in `skip`)."""
    kinds: dict[str, dict[str, set[str]]] = {}
    for name, parts in records.items():
        for t in parts:
            for f in t.schema:
                kind = arrow_kind(f.type)
                if kind in (INT, DOUBLE) and f.name not in skip:
                    kinds.setdefault(name, {}).setdefault(f.name, set()).add(kind)
    return {name: {f: field_type(k) or "double" for f, k in fields.items()} for name, fields in kinds.items()}


def numbers_table(found: FieldTypes) -> pa.Table:
    """`found` as a table (input, field, type), as a Spark task hands it back."""
    rows = [(i, f, typ) for i, fields in sorted(found.items()) for f, typ in sorted(fields.items())]
    return pa.table({c: [r[n] for r in rows] for n, c in enumerate(("input", "field", "type"))})


def merge_numbers(known: FieldTypes, more: pa.Table | FieldTypes) -> FieldTypes:
    """`known` and the numeric fields of `more` (a `numbers_table`, or FieldTypes), by the rule:
    int64 and double give double."""
    if not isinstance(more, dict):
        table, more = more, {}
        for i, f, typ in zip(*(table[c].to_pylist() for c in ("input", "field", "type")), strict=True):
            more.setdefault(i, {})[f] = typ
    out = {i: dict(fs) for i, fs in known.items()}
    for i, fields in more.items():
        mine = out.setdefault(i, {})
        for f, typ in fields.items():
            kinds = {INT if t == "int64" else DOUBLE for t in (typ, mine.get(f)) if t}
            mine[f] = field_type(kinds) or typ
    return out


def empty_of(types: dict[str, str]) -> pa.Table:
    """No rows, with columns of `types` (a FieldTypes entry): a part that gives its types to
    `typed_as_one`."""
    return pa.schema([(f, _arrow(t)) for f, t in types.items()]).empty_table()
