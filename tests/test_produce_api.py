"""`wire_dagster.produce` (issue 27 item 1, DESIGN §4 Sources): records from Python — a list of
dicts, a pyarrow Table, a pandas DataFrame — through the path of `wire produce`. The same
records handed to the CLI as one JSON-lines file give the same committed results and dead
letters; a retry appends them again and the id memory counts each once; a container of another
kind, or nothing, is one line of bad input, before anything is written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
import yaml

import wire_dagster
from conftest import run_wire
from wire_dagster import engine, results, streams
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.errors import WireInputError
from wire_dagster.spec import load_pipeline

T0 = 1_767_225_600_000


def _pipeline(name: str) -> dict:
    return {
        "name": name,
        "stream": name,
        "event": {"key": "user", "time": "ts", "id": "eid"},
        "watermark": {"max_out_of_orderness": "1s", "idle_timeout": "1h"},
        "partition": "1m",
        "start": "2026-01-01T00:00:00Z",
        "windows": [
            {
                "name": "per_minute",
                "type": "tumbling",
                "size": "1m",
                "aggregates": {"n": "count", "total": "sum(amount)"},
            }
        ],
    }


def test_records_from_python_equal_the_clis(store, cli_env, spark, tmp_path: Path, monkeypatch) -> None:
    d = tmp_path / "pipelines"
    d.mkdir()
    for name in ("api", "cli"):
        (d / f"{name}.yaml").write_text(yaml.safe_dump(_pipeline(name)))
    monkeypatch.setenv("WIRE_PIPELINES", str(d))
    recs = [{"ts": T0 + i * 1_000, "eid": f"e{i}", "user": f"u{i % 3}", "amount": float(i)} for i in range(180)]
    recs[150]["amount"] = math.nan  # pandas' missing value: a Parquet null, no value
    bad = {"ts": "yesterday", "eid": "bad", "user": "u0", "amount": 1.0}

    listed = wire_dagster.produce("api", [*recs[:80], bad], segment="0")
    assert (listed.events, listed.malformed) == (80, 1)
    table = wire_dagster.produce("api", pa.Table.from_pylist(recs[80:140]), segment="0")
    frame = wire_dagster.produce("api", pd.DataFrame(recs[140:]), segment="1")
    assert (table.events, frame.events, frame.malformed) == (60, 40, 0)
    again = wire_dagster.produce("api", recs[:80], segment="0")  # a retry: the same ids again
    assert again.events == 80 and again.chunks == [listed.chunks[-1] + 2]

    # The CLI, the same records as one file per segment (the missing value as JSON's null).
    def null_for_nan(r: dict) -> dict:
        return {**r, "amount": None if math.isnan(r["amount"]) else r["amount"]}

    as_json = [null_for_nan(r) for r in recs]
    for seg, rows in (("0", [*as_json[:80], bad, *as_json[80:140]]), ("1", as_json[140:])):
        f = tmp_path / f"cli{seg}.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        args = ["produce", "--pipeline", "cli", "--file", str(f), "--segment", seg]
        run_wire(args, cli_env | {"WIRE_PIPELINES": str(d)}, check=True)

    out = {}
    for name in ("api", "cli"):
        spec = load_pipeline(d / f"{name}.yaml")
        streams.close_stream(store, name)
        engine.process(store, spec, spark, max_epochs=10)
        out[name] = results.read_results(store, spec, "per_minute").to_pylist()
        m = Checkpoints(store, name).latest()
        assert m is not None and m.totals.malformed == 1 and m.totals.counted["per_minute"] == 180
        assert m.totals.duplicate == (80 if name == "api" else 0)
        letters = [x["reason"] for x in results.read_dead_letters(store, spec) if x["reason"].startswith("malformed")]
        assert letters == ["malformed: non-numeric time field ts (want epoch ms or ISO-8601 with zone)"], letters
    assert out["api"] == out["cli"] and len(out["api"]) == 9
    assert sum(r["n"] for r in out["api"]) == 180


@pytest.mark.parametrize(
    ("records", "says"),
    [
        ({"ts": 1}, "records: expected a list of dicts"),
        ([], "records: the list is empty"),
        (pa.table({"ts": pa.array([], pa.int64())}), "records: the table has no rows"),
    ],
)
def test_bad_containers_are_one_line_and_write_nothing(store, records, says, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "api.yaml").write_text(yaml.safe_dump(_pipeline("api")))
    monkeypatch.setenv("WIRE_PIPELINES", str(tmp_path))
    with pytest.raises(WireInputError) as e:
        wire_dagster.produce("api", records, store=store)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert not list(store.list("streams/"))
    with pytest.raises(WireInputError, match="time field is unknown"):
        wire_dagster.produce("nobody", [{"ts": 1}], store=store)
