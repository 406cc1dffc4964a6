"""What a pipeline's `where` and `fields` make of a record does not depend on the chunk the
record was stored in (extract.py).

A field is typed per chunk by the kinds of its values (numbers win: a text value is null where
the chunk has numbers). A chunk whose records carry a field only as text made `amount > 10`
unbindable, and every record of that chunk a dead letter — those without `amount`, and those
`amount > 10 OR vip` keeps for `vip`, included — while the same records in a chunk with one number
more were filtered or kept. Checked against the records read as one chunk that has numbers: over
random splits of random records, each record's outcome (event, filtered, dead letter) and its
derived fields are the same in whatever chunk it lands.
"""

from __future__ import annotations

import json
import random

import pyarrow as pa
import pytest

from wire_dagster.events import ERR, FILTERED, ID, RAW, ROW, TIME
from wire_dagster.extract import pipeline_events
from wire_dagster.spec import field_column, pipeline_from_dict

#: Values a producer sends for `amount`, numbers among them: NaN, 2^64 and text that looks like one.
AMOUNTS = [12, 3, 10.5, -1, 2**64, "12", "x", "", "NaN", True, None, [1], {"a": 1}]


def _spec(where: str, fields: dict[str, str], summed: tuple[str, ...] = ()):
    aggs = {"n": "count", **{f"s_{f}": f"max({f})" for f in summed}}
    return pipeline_from_dict(
        {
            "name": "wc",
            "event": {"key": "k", "time": "t", "where": where},
            **({"fields": fields} if fields else {}),
            "partition": 1000,
            "start": "1970-01-01T00:00:00Z",
            "windows": [{"name": "w", "type": "tumbling", "size": 1000, "aggregates": aggs}],
        }
    )


def _record(rng: random.Random, i: int) -> dict:
    r: dict = {"t": i, "k": f"k{rng.randrange(3)}"}
    if rng.random() < 0.8:
        r["amount"] = rng.choice(AMOUNTS)
    if rng.random() < 0.3:
        r["vip"] = rng.random() < 0.5
    return r


def _chunk(recs: list[dict]) -> pa.Table:
    return pa.table(
        {
            TIME: pa.array([r["t"] for r in recs], pa.int64()),
            ID: pa.nulls(len(recs), pa.string()),
            ROW: pa.array([r["t"] for r in recs], pa.int64()),
            RAW: pa.array([json.dumps(r).encode() for r in recs], pa.large_binary()),
        }
    )


def ev_columns(spec) -> list[str]:
    from wire_dagster.events import chunk_schema

    return chunk_schema(spec).names


def _outcomes(spec, recs: list[dict]) -> dict[int, tuple]:
    """Per record (its time): event / filtered / dead letter, and its derived fields' values."""
    ev = pipeline_events(spec, _chunk(recs), 10_000).to_pylist()
    cols = [field_column(f) for f, _ in spec.fields if field_column(f) in ev_columns(spec)]
    out = {}
    for r in ev:
        err = r[ERR]
        kind = "event" if err is None else "filtered" if err == FILTERED else f"letter: {err}"
        out[r[TIME]] = (kind, *(r[c] for c in cols))
    return out


@pytest.mark.parametrize(
    ("where", "fields", "summed"),
    [
        ("amount > 10 OR vip", {}, ()),
        ("double > 20 OR vip", {"double": "amount * 2"}, ("double",)),  # aggregated: a column
        ("big OR vip", {"big": "amount > 10"}, ()),
    ],
)
def test_a_records_outcome_does_not_depend_on_its_chunk(where: str, fields: dict[str, str], summed) -> None:
    spec = _spec(where, fields, summed)
    rng = random.Random(7)
    splits = 0
    for trial in range(25):
        recs = [_record(rng, trial * 1000 + i) for i in range(rng.randrange(4, 24))]
        recs.append({"t": trial * 1000 + 999, "k": "k0", "amount": 1})  # the whole has a number
        whole = _outcomes(spec, recs)
        assert not any("cannot evaluate" in k for k, *_ in whole.values()), whole
        cut = sorted(rng.sample(range(1, len(recs)), min(3, len(recs) - 1)))
        parts = [recs[a:b] for a, b in zip([0, *cut], [*cut, len(recs)], strict=True)]
        got: dict[int, tuple] = {}
        for part in parts:
            got.update(_outcomes(spec, part))
            if not any(
                isinstance(r.get("amount"), (int, float)) and not isinstance(r.get("amount"), bool) for r in part
            ):
                splits += 1  # a chunk with no number for `amount`: the case at stake
        assert got == whole, (where, recs)
    assert splits >= 10, splits  # the case at stake came up


def test_an_expression_wrong_for_any_type_is_still_a_dead_letter() -> None:
    """Reading a text field as a number binds only where that is what the expression needs: one
    that binds with no typing (a function that does not exist) letters every record, as before."""
    spec = _spec("no_such_function(amount) > 1", {})
    out = _outcomes(spec, [{"t": 1, "k": "a", "amount": "x"}, {"t": 2, "k": "a"}])
    assert all(
        k.startswith("letter: malformed: cannot evaluate where: no_such_function(amount) > 1") for k, *_ in out.values()
    ), out


def _parquet_chunk(recs: list[dict], amount: pa.DataType) -> pa.Table:
    """The records as a Parquet chunk's rows (`REC`), `amount` a column of type `amount`."""
    from wire_dagster.events import REC

    cols = {
        "t": pa.array([r["t"] for r in recs], pa.int64()),
        "k": pa.array([r["k"] for r in recs], pa.string()),
        "amount": pa.array([r.get("amount") for r in recs], amount),
        "vip": pa.array([r.get("vip") for r in recs], pa.bool_()),
    }
    return pa.table(
        {
            TIME: cols["t"],
            ID: pa.nulls(len(recs), pa.string()),
            ROW: cols["t"],
            REC: pa.StructArray.from_arrays(list(cols.values()), names=list(cols)),
        }
    )


@pytest.mark.parametrize(
    ("amounts", "typ"),
    [(["12", "x", None, "", "3.5", None], pa.string()), ([None] * 6, pa.string()), ([True, False] * 3, pa.bool_())],
    ids=["text", "only-missing", "booleans"],
)
def test_a_parquet_column_of_text_letters_no_record(amounts: list, typ: pa.DataType) -> None:
    """A Parquet chunk whose `amount` is a text column (or one of only missing values, as pandas
    writes an object column of None; or booleans) cannot bind `amount > 10`: every record of the
    chunk was a dead letter ("cannot evaluate"). Now each record gets what its JSON line gets
    (text is null as a number): kept for `vip`, else filtered; its derived fields null; and the
    record keeps its own `amount` as written (only the expressions read it as null)."""
    from wire_dagster.extract import _prepare, payload_of

    spec = _spec("big OR vip", {"big": "amount > 10", "double": "amount * 2"}, ("double",))
    recs = [{"t": i, "k": "k0", "amount": a, "vip": i % 3 == 0} for i, a in enumerate(amounts)]
    chunk = _parquet_chunk(recs, typ)
    ev = pipeline_events(spec, chunk, 10_000).to_pylist()
    got = {r[TIME]: ("event" if r[ERR] is None else r[ERR], r[field_column("double")]) for r in ev}
    assert got == {r["t"]: ("event" if r["vip"] else FILTERED, None) for r in recs}, got
    assert got == _outcomes(spec, recs)  # its JSON line's outcome
    prepared, keep, failed = _prepare(spec, payload_of(chunk))
    assert failed is None and list(keep) == [r["vip"] for r in recs]
    assert isinstance(prepared, pa.Table) and prepared["amount"].to_pylist() == amounts
