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
