"""Mergeable partial aggregates, shared by the Spark kernel and the reference.

Every aggregate is kept as exact partials so a window's result can be updated
across epochs (late events) without rereading its events:

=================  =========================================================
count              ``n``: events in the window
sum(f), avg(f)     ``s``: exact decimal(38, 9) sum of non-null values, ``nn``: their count
min(f), max(f)     ``m``: the extreme non-null value (null if none)
count_distinct(f)  ``set``: the distinct non-null values (as strings)
=================  =========================================================

Sums are decimals so that their value does not depend on the order Spark adds
them in: re-running an epoch commits byte-identical results.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from .spec import Aggregate, WindowSpec, field_column

SCALE = 9
QUANTUM = Decimal(1).scaleb(-SCALE)


def partial_columns(a: Aggregate) -> list[tuple[str, str]]:
    """(column, Spark DDL type) of the partials of one aggregate."""
    p = f"p_{a.name}"
    if a.func == "count":
        return [(f"{p}_n", "BIGINT")]
    if a.func in ("sum", "avg"):
        return [(f"{p}_s", f"DECIMAL(38,{SCALE})"), (f"{p}_nn", "BIGINT")]
    if a.func in ("min", "max"):
        return [(f"{p}_m", "DOUBLE")]
    return [(f"{p}_set", "ARRAY<STRING>")]


def state_ddl(w: WindowSpec) -> str:
    cols = ["key STRING", "start BIGINT", "`end` BIGINT"]
    cols += [f"{c} {t}" for a in w.aggregates for c, t in partial_columns(a)]
    return ", ".join(cols)


def output_ddl(w: WindowSpec) -> str:
    types = {"count": "BIGINT", "count_distinct": "BIGINT"}
    cols = ["key STRING", "window_start BIGINT", "window_end BIGINT"]
    cols += [f"{a.name} {types.get(a.func, 'DOUBLE')}" for a in w.aggregates]
    return ", ".join(cols)


def source_column(a: Aggregate) -> str | None:
    return field_column(a.field) if a.field else None


# ---- pure-Python versions, used by the reference ---------------------------


def to_decimal(x: float) -> Decimal:
    """A double as Spark casts it to decimal(38, 9): its shortest repr, rounded half-up."""
    return Decimal(repr(float(x))).quantize(QUANTUM, rounding=ROUND_HALF_UP)


def py_empty(w: WindowSpec) -> dict:
    st: dict = {}
    for a in w.aggregates:
        p = f"p_{a.name}"
        if a.func == "count":
            st[f"{p}_n"] = 0
        elif a.func in ("sum", "avg"):
            st[f"{p}_s"], st[f"{p}_nn"] = Decimal(0), 0
        elif a.func in ("min", "max"):
            st[f"{p}_m"] = None
        else:
            st[f"{p}_set"] = set()
    return st


def py_add(w: WindowSpec, st: dict, ev: dict) -> None:
    """Fold one event (a dict of chunk columns) into partials."""
    for a in w.aggregates:
        p = f"p_{a.name}"
        v = ev.get(source_column(a)) if a.field else None
        if a.func == "count":
            st[f"{p}_n"] += 1
        elif v is None:
            continue
        elif a.func in ("sum", "avg"):
            st[f"{p}_s"] += to_decimal(v)
            st[f"{p}_nn"] += 1
        elif a.func == "min":
            st[f"{p}_m"] = v if st[f"{p}_m"] is None else min(st[f"{p}_m"], v)
        elif a.func == "max":
            st[f"{p}_m"] = v if st[f"{p}_m"] is None else max(st[f"{p}_m"], v)
        else:
            st[f"{p}_set"].add(distinct_repr(v))


def distinct_repr(v: object) -> str:
    if isinstance(v, float):
        return repr(v) if not v.is_integer() else repr(v)
    return str(v)


def py_merge(w: WindowSpec, a_st: dict, b_st: dict) -> dict:
    out = py_empty(w)
    for a in w.aggregates:
        p = f"p_{a.name}"
        if a.func == "count":
            out[f"{p}_n"] = a_st[f"{p}_n"] + b_st[f"{p}_n"]
        elif a.func in ("sum", "avg"):
            out[f"{p}_s"] = a_st[f"{p}_s"] + b_st[f"{p}_s"]
            out[f"{p}_nn"] = a_st[f"{p}_nn"] + b_st[f"{p}_nn"]
        elif a.func in ("min", "max"):
            vals = [x for x in (a_st[f"{p}_m"], b_st[f"{p}_m"]) if x is not None]
            out[f"{p}_m"] = (min if a.func == "min" else max)(vals) if vals else None
        else:
            out[f"{p}_set"] = set(a_st[f"{p}_set"]) | set(b_st[f"{p}_set"])
    return out


def py_finalize(w: WindowSpec, st: dict) -> dict:
    out = {}
    for a in w.aggregates:
        p = f"p_{a.name}"
        if a.func == "count":
            out[a.name] = st[f"{p}_n"]
        elif a.func == "sum":
            out[a.name] = float(st[f"{p}_s"]) if st[f"{p}_nn"] else None
        elif a.func == "avg":
            out[a.name] = float(st[f"{p}_s"] / st[f"{p}_nn"]) if st[f"{p}_nn"] else None
        elif a.func in ("min", "max"):
            out[a.name] = st[f"{p}_m"]
        else:
            out[a.name] = len(st[f"{p}_set"])
    return out
