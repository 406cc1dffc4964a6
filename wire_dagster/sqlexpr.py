"""SQL expressions of pipeline files (`where`, `fields`): parsed by DuckDB's own parser.

A pipeline file's filter and derived fields are SQL expressions over a record's fields, run
vectorised by DuckDB where the pipeline reads its stream (extract.py). They are parsed when the
file loads (`json_serialize_sql`, DuckDB's parser exposed as a function), so an expression that
does not parse is refused with one line, and the record fields it names are known before any
record is read.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache

from .errors import WireInputError

#: Clauses an expression may not hold: it is evaluated per record, alone.
_NOT_PER_RECORD = ("SUBQUERY", "WINDOW_AGGREGATE", "AGGREGATE", "STAR", "COLUMNS")


@lru_cache(maxsize=256)
def expression_columns(expr: str, where: str) -> tuple[str, ...]:
    """The record fields `expr` names (dotted for nested ones), in order of first use; a one-line
    `WireInputError` naming `where` for an expression that does not parse, or that is not one
    expression of a record (a query, an aggregate, `*`)."""
    import duckdb

    if not isinstance(expr, str) or not expr.strip():
        raise WireInputError(f"{where}: expected a SQL expression, e.g. amount > 0")
    con = duckdb.connect()
    try:
        text = con.execute("SELECT json_serialize_sql(?)", ["SELECT (" + expr + ") AS _v"]).fetchone()
    finally:
        con.close()
    tree: dict = json.loads(text[0]) if text else {"error": True}
    stmts: list = tree.get("statements") or []
    node = stmts[0].get("node", {}) if len(stmts) == 1 else {}
    select = node.get("select_list") or []
    if tree.get("error") or len(select) != 1 or node.get("from_table", {}).get("type") != "EMPTY":
        msg = str(tree.get("error_message") or "not a single expression").splitlines()[0]
        raise WireInputError(f"{where}: {expr!r} does not parse as a SQL expression ({msg})")
    found: list[str] = []

    def walk(x: object) -> None:
        if isinstance(x, dict):
            cls = x.get("class")
            if cls in _NOT_PER_RECORD or x.get("type") in _NOT_PER_RECORD or "subquery" in x:
                raise WireInputError(
                    f"{where}: {expr!r} must be an expression of one record (no query, aggregate or *)"
                )
            if cls == "COLUMN_REF":
                name = ".".join(x.get("column_names") or [])
                if name and name not in found:
                    found.append(name)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(select[0])
    return tuple(found)


_SIDE = re.compile(r'(?<![\w"])(left|right)\.')


def quote_sides(expr: str) -> str:
    """A join's condition with its `left.x` / `right.y` as the SQL it runs as (`"left".x`: LEFT
    and RIGHT are SQL keywords, so the join's two sides are aliases quoted as names)."""
    return _SIDE.sub(r'"\1".', expr)
