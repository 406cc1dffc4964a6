"""The pass-through's records without a JSON parse per record (issue 26, q7): what makes it fast
must not change a byte of what it commits.

- `computestage.json_rows` builds each row's JSON text column by column (Arrow) and must equal
  `json.dumps(row, sort_keys=..., default=_json_value)` — the definition — for every column type,
  including the ones it hands to Python (nested, decimals, timestamps) and texts json escapes;
- `computestage._as_records` with `canonical` (what the pass-through reads: `vectorised`) gives
  each record's text as `ctx.produce` stores it, `json.dumps(json.loads(text), sort_keys=True)` of
  the text it gives otherwise, for Parquet rows and JSON lines alike, malformed ones left out;
- `derived.passed_records` (the stage reading the pass-through's output) gives the lines and
  field columns that its former per-record Python gave.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from wire_dagster.computestage import _as_records, _json_value, json_rows
from wire_dagster.events import ID, RAW, REC, ROW, TIME
from wire_dagster.spec import load_pipelines

TEXTS = ["a", 'q"uote', "back\\slash", "é", "tab\t", "nl\n", "\x7f", "\x00", "\u2028", "😀", "", "plain ~ text", None]
FLOATS = [0.1, -0.0, 1e16, 1e-7, 3.0, 1 / 3, float("nan"), float("inf"), -float("inf"), 2.5e300, None]


def _table(rnd: random.Random, n: int) -> pa.Table:
    return pa.table(
        {
            "b": pa.array([rnd.choice([None, rnd.randrange(-(2**63), 2**63)]) for _ in range(n)], pa.int64()),
            "a": pa.array([rnd.choice(TEXTS) for _ in range(n)], pa.string()),
            "f": pa.array([rnd.choice(FLOATS) for _ in range(n)], pa.float64()),
            "f32": pa.array([rnd.choice([0.1, 1.5, None]) for _ in range(n)], pa.float32()),
            "ok": pa.array([rnd.choice([True, False, None]) for _ in range(n)], pa.bool_()),
            "nothing": pa.nulls(n),
            "é key": pa.array([rnd.choice(["x", None]) for _ in range(n)], pa.large_string()),
            "u8": pa.array([rnd.randrange(256) for _ in range(n)], pa.uint8()),
            "cat": pa.array([rnd.choice(TEXTS) for _ in range(n)], pa.string()).dictionary_encode(),
        }
    )


@pytest.mark.parametrize("sort_keys", [False, True])
def test_json_rows_equal_json_dumps_of_each_row(sort_keys: bool) -> None:
    rnd = random.Random(26)
    t = _table(rnd, 400)
    want = [json.dumps(r, sort_keys=sort_keys, default=_json_value) for r in t.to_pylist()]
    assert json_rows(t, sort_keys).to_pylist() == want
    # types it does not build itself go row by row through the definition: still equal
    n = t.num_rows
    more = t.append_column("d", pa.array([Decimal("1.25")] * n, pa.decimal128(5, 2)))
    more = more.append_column("ts", pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC)] * n, pa.timestamp("ms", "UTC")))
    more = more.append_column("nest", pa.array([{"z": 1, "y": ["1", "é"]}] * n))
    want = [json.dumps(r, sort_keys=sort_keys, default=_json_value) for r in more.to_pylist()]
    assert json_rows(more, sort_keys).to_pylist() == want
    assert json_rows(pa.table({"x": pa.array([], pa.int64())}), sort_keys).to_pylist() == []
    assert json_rows(pa.table({"x": [1]}).drop_columns(["x"]), sort_keys).to_pylist() == ["{}"]


def _reader(tmp_path: Path):
    body = {
        "name": "p",
        "stream": "s",
        "event": {"time": "ts", "id": "eid", "key": "user"},
        "partition": "1m",
        "start": "2026-01-01T00:00:00Z",
        "windows": [{"name": "w", "type": "tumbling", "size": "10s", "aggregates": {"n": "count"}}],
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(body))
    return load_pipelines(tmp_path / "p.yaml")[0]


def test_canonical_record_texts_are_what_ctx_produce_stores(tmp_path: Path) -> None:
    """A Parquet chunk and a JSON-lines chunk of the same records (one malformed: no time)."""
    reader = _reader(tmp_path)
    rnd = random.Random(7)
    base = _table(rnd, 300).drop_columns(["nothing", "cat", "f32"])  # JSON lines would type them otherwise
    t0 = 1_767_225_600_000
    ts = [None if i == 17 else t0 + rnd.randrange(100_000) for i in range(base.num_rows)]
    recs = base.append_column("ts", pa.array(ts, pa.int64()))
    recs = recs.append_column("eid", pa.array([f"e{i}" for i in range(base.num_rows)]))
    recs = recs.append_column("user", pa.array([rnd.choice(["u1", "u2"]) for _ in range(base.num_rows)]))
    head = {
        TIME: pa.array([t or 0 for t in ts], pa.int64()),
        ID: recs["eid"],
        ROW: pa.array(range(base.num_rows), pa.int64()),
    }
    rec = pa.StructArray.from_arrays([c.combine_chunks() for c in recs.columns], fields=list(recs.schema))
    lines = [json.dumps({k: v for k, v in r.items() if v is not None}) for r in recs.to_pylist()]
    lines[17] = '{"ts": no JSON'  # malformed in both ways: no time (Parquet), no JSON (lines)
    chunks = {
        "parquet": pa.table({**head, REC: rec}),
        "lines": pa.table({**head, RAW: pa.array([x.encode() for x in lines], pa.large_binary())}),
    }
    for kind, chunk in chunks.items():
        plain = _as_records(reader, chunk, t0 + 10**9, "0", 3)
        canon = _as_records(reader, chunk, t0 + 10**9, "0", 3, canonical=True)
        assert plain.drop_columns(["_json"]).equals(canon.drop_columns(["_json"])), kind
        texts = plain["_json"].to_pylist()
        assert sum(x is None for x in texts) == 1, kind  # the malformed record has no text
        want = [None if x is None else json.dumps(json.loads(x), sort_keys=True) for x in texts]
        assert canon["_json"].to_pylist() == want, kind
        assert want != texts, kind  # the plain texts were not canonical: the comparison can fail


def test_passed_records_lines_and_fields_as_record_by_record() -> None:
    from wire_dagster.derived import passed_records

    texts = ['{"a": 1, "id": "x"}', "{}", '{"a": 2, "id": "\\u00e9", "when": "2026-01-01T00:00:00Z"}']
    rows = pa.table({"window_end": pa.array([5, 8, 13], pa.int64()), "record": pa.array(texts)})
    fields, chunk = passed_records(rows)
    assert chunk[RAW].to_pylist() == [
        b'{"window_time":4,"a": 1, "id": "x"}',
        b'{"window_time":7}',
        b'{"window_time":12,"a": 2, "id": "\\u00e9", "when": "2026-01-01T00:00:00Z"}',
    ]
    assert chunk[ROW].to_pylist() == [0, 1, 2] and chunk[TIME].to_pylist() == [4, 7, 12]
    assert fields.to_pylist() == [
        {"a": 1, "id": "x", "when": None, "window_time": 4},
        {"a": None, "id": None, "when": None, "window_time": 7},
        {"a": 2, "id": "é", "when": "2026-01-01T00:00:00Z", "window_time": 12},
    ]
