"""Mergeable partial aggregates, shared by the Spark kernel and the reference.

Every aggregate is kept as exact partials so a window's result can be updated
across epochs (late events) without rereading its events:

=================  =========================================================
count              ``n``: events in the window
sum(f), avg(f)     ``s``: exact decimal(38, 9) sum of non-null values, ``nn``: their count
min(f), max(f)     ``m``: the extreme non-null value (null if none)
count_distinct(f)  ``set``: the distinct non-null values (as strings)
arg_max(f, by)     ``b``: the largest non-null ``by``, ``v``: ``f`` (as text) of an event with
arg_min(f, by)     it, the smallest on ties (nulls last); arg_min alike with the smallest ``by``
first(f), last(f)  ``t``: the earliest (latest) event time of a non-null ``f``, ``o``: that
                   event's source position (segment, chunk, row; the first (last) on ties),
                   ``v``: its ``f`` (as text)
approx_count_dis-  ``sk``: a serialized HLL sketch of the non-null values (as text), null if none
tinct(f)           (sketches.py: parameters, error bounds, determinism)
approx_quantile    ``sk``: a serialized t-digest of the non-null numbers, null if none
(f, q)
=================  =========================================================

The value aggregates (arg_max, arg_min, first, last) return their field's value as text, as
keys are: a field is text in the events unless another aggregate of the pipeline reads it as a
number (then its text is the number's, e.g. ``12.5``).

Sums are decimals so that their value does not depend on the order Spark adds
them in: re-running an epoch commits byte-identical results.

The value domain (what an aggregate reads, checked at produce and again by the kernel):

- a number (the field of ``sum``, ``avg``, ``min``, ``max``) is a finite double of
  magnitude at most 2^53 (``MAX_EXACT``): there a double holds every integer exactly,
  and a window's sum stays within decimal(38, 9) (±10^29) for up to 10^13 events.
  NaN and ±Infinity (``NOT_FINITE``), larger magnitudes, and integers beyond ±2^53
  — which a double would silently round (``OUT_OF_RANGE``) — are malformed: the
  record goes to the dead letters with a reason naming the field and the value,
  e.g. ``malformed: amount: NaN is not a finite number``;
- -0.0 is the zero it equals, stored as 0.0 (so min/max never depend on which zero
  came first); subnormals and digits past the 9th decimal place are kept as the
  double they are (min, max) and rounded half-up to 9 decimal places in sums
  (`to_decimal`), so 5e-324 adds 0 to a sum;
- null, or a field that is absent (pandas writes its missing values, NaN in a float
  column, as Parquet nulls), is no value: not counted by sum, avg, min or max, as in
  SQL; ``count`` counts the event;
- a per-event session gap is an integer in [1, 2^53] ms (0, negative or null: the
  window's gap), so that an event time plus its gap never overflows.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Decimal

import pyarrow as pa

from .spec import SKETCH_FUNCS, VALUE_FUNCS, Aggregate, WindowSpec, field_column

SCALE = 9
QUANTUM = Decimal(1).scaleb(-SCALE)
#: The largest magnitude of a number an aggregate reads, and of a per-event gap (see above).
MAX_EXACT = 2**53
NOT_FINITE = "is not a finite number"
OUT_OF_RANGE = f"is out of range (magnitude above 2^53 = {MAX_EXACT})"


def number_text(x: float | int) -> str:
    """A number as a JSON writer spells it (NaN, Infinity, -Infinity, else Python's repr)."""
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    return repr(x)


def out_of_domain(values: pa.Array | pa.ChunkedArray) -> pa.ChunkedArray:
    """Per value of an integer or floating-point column: whether it is outside the domain
    (NaN, ±Infinity, magnitude above MAX_EXACT); null where the value is null."""
    import pyarrow.compute as pc

    values = values if isinstance(values, pa.ChunkedArray) else pa.chunked_array([values])
    if pa.types.is_unsigned_integer(values.type):
        return pc.greater(values, pa.scalar(MAX_EXACT, values.type))  # pyright: ignore[reportAttributeAccessIssue]  generated at import
    wide = values.cast(pa.float64() if pa.types.is_floating(values.type) else pa.int64())
    beyond = pc.or_(pc.greater(wide, pa.scalar(MAX_EXACT, wide.type)), pc.less(wide, pa.scalar(-MAX_EXACT, wide.type)))  # pyright: ignore[reportAttributeAccessIssue]  generated at import
    return pc.or_(pc.invert(pc.is_finite(wide)), beyond) if pa.types.is_floating(wide.type) else beyond  # pyright: ignore[reportAttributeAccessIssue]  generated at import


def domain_reason(field: str, x: float | int) -> str:
    """Why value `x` of `field` is outside the domain, e.g. `amount: NaN is not a finite number`."""
    finite = not isinstance(x, float) or math.isfinite(x)
    return f"{field}: {number_text(x)} {OUT_OF_RANGE if finite else NOT_FINITE}"


def partial_columns(a: Aggregate) -> list[tuple[str, str]]:
    """(column, Spark DDL type) of the partials of one aggregate."""
    p = f"p_{a.name}"
    if a.func == "count":
        return [(f"{p}_n", "BIGINT")]
    if a.func in ("sum", "avg"):
        return [(f"{p}_s", f"DECIMAL(38,{SCALE})"), (f"{p}_nn", "BIGINT")]
    if a.func in ("min", "max"):
        return [(f"{p}_m", "DOUBLE")]
    if a.func in ("arg_max", "arg_min"):
        return [(f"{p}_b", "DOUBLE"), (f"{p}_v", "STRING")]
    if a.func in ("first", "last"):
        return [(f"{p}_t", "BIGINT"), (f"{p}_o", "STRING"), (f"{p}_v", "STRING")]
    if a.func in SKETCH_FUNCS:
        return [(f"{p}_sk", "BINARY")]
    return [(f"{p}_set", "ARRAY<STRING>")]


#: Each aggregate's result type (Spark DDL): counts are integers, value aggregates text, the rest doubles.
OUTPUT_TYPES = {
    "count": "BIGINT",
    "count_distinct": "BIGINT",
    "approx_count_distinct": "BIGINT",
    **dict.fromkeys(VALUE_FUNCS, "STRING"),
}


def position_text(seg: str, seq: int, row: int) -> str:
    """A source position as text that sorts as (segment, chunk, row) do: first and last break
    ties of event time by it (\x01 sorts before every character a segment name has)."""
    return f"{seg}\x01{seq:012d}\x01{row:012d}"


def state_ddl(w: WindowSpec) -> str:
    cols = ["key STRING", "start BIGINT", "`end` BIGINT"]
    cols += [f"{c} {t}" for a in w.aggregates for c, t in partial_columns(a)]
    return ", ".join(cols)


def output_ddl(w: WindowSpec) -> str:
    cols = ["key STRING", "window_start BIGINT", "window_end BIGINT"]
    cols += [f"{a.name} {OUTPUT_TYPES.get(a.func, 'DOUBLE')}" for a in w.aggregates]
    return ", ".join(cols)


def source_column(a: Aggregate) -> str | None:
    return field_column(a.field) if a.field else None


# ---- pure-Python versions, used by the reference ---------------------------
# The sketch aggregates are kept exact here (``exact``: the distinct texts, or every number), so
# that the reference is independent of the sketches: tests compare the kernel's estimates with
# these exact values within the sketches' error bounds (exactly where a sketch is exact).


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
        elif a.func in VALUE_FUNCS:
            st[f"{p}_best"] = None  # (ordering key, value) of the event chosen so far
        elif a.func == "approx_quantile":
            st[f"{p}_exact"] = []
        elif a.func == "approx_count_distinct":
            st[f"{p}_exact"] = set()
        else:
            st[f"{p}_set"] = set()
    return st


def _value_text(v: object) -> str | None:
    return None if v is None else distinct_repr(v)


def _candidate(a: Aggregate, ev: dict) -> tuple | None:
    """The ordering key and value with which event `ev` competes in value aggregate `a`: the
    smallest key wins (ties cannot remain: positions differ)."""
    v = _value_text(ev.get(source_column(a)))
    if a.func in ("arg_max", "arg_min"):
        b = ev.get(field_column(a.by)) if a.by else None
        if b is None:
            return None
        # the extreme `by`, then the smallest value (nulls last)
        return ((-b if a.func == "arg_max" else b), v is None, v or ""), v
    if v is None:
        return None
    pos = position_text(ev.get("_seg", ""), ev.get("_seq", 0), ev.get("_row", 0))
    t = ev["_t"]
    return ((t, pos) if a.func == "first" else (-t, _desc(pos))), v


def _desc(text: str) -> tuple:
    """An ordering key under which `text` sorts descending."""
    return tuple(-ord(c) for c in text) + (1,)


def _better(x: tuple | None, y: tuple | None) -> tuple | None:
    if x is None:
        return y
    if y is None:
        return x
    return x if x[0] <= y[0] else y


def py_add(w: WindowSpec, st: dict, ev: dict) -> None:
    """Fold one event (a dict of chunk columns) into partials."""
    for a in w.aggregates:
        p = f"p_{a.name}"
        v = ev.get(source_column(a)) if a.field else None
        if a.func in VALUE_FUNCS:
            continue  # below
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
        elif a.func == "approx_quantile":
            st[f"{p}_exact"].append(float(v) + 0.0)
        elif a.func == "approx_count_distinct":
            st[f"{p}_exact"].add(distinct_repr(v))
        else:
            st[f"{p}_set"].add(distinct_repr(v))
    for a in w.aggregates:  # value aggregates: an event competes even where its field is null (arg_*)
        if a.func in VALUE_FUNCS:
            st[f"p_{a.name}_best"] = _better(st[f"p_{a.name}_best"], _candidate(a, ev))


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
        elif a.func in VALUE_FUNCS:
            out[f"{p}_best"] = _better(a_st[f"{p}_best"], b_st[f"{p}_best"])
        elif a.func == "approx_quantile":
            out[f"{p}_exact"] = a_st[f"{p}_exact"] + b_st[f"{p}_exact"]
        elif a.func == "approx_count_distinct":
            out[f"{p}_exact"] = set(a_st[f"{p}_exact"]) | set(b_st[f"{p}_exact"])
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
        elif a.func in VALUE_FUNCS:
            best = st[f"{p}_best"]
            out[a.name] = None if best is None else best[1]
        elif a.func == "approx_quantile":
            out[a.name] = exact_quantile(st[f"{p}_exact"], a.q or 0.0)
        elif a.func == "approx_count_distinct":
            out[a.name] = len(st[f"{p}_exact"])
        else:
            out[a.name] = len(st[f"{p}_set"])
    return out


def exact_quantile(values: list[float], q: float) -> float | None:
    """The q-quantile as DataSketches' t-digest defines it over the exact data (what the sketch
    returns while each of its centroids is one value, sketches.TDIGEST_EXACT_N): the
    (floor(q * n) + 1)-th smallest, capped at the n-th (the smallest for q = 0, the largest for 1)."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, math.floor(q * len(s)))]
