"""Shared streams (DESIGN §6, issue 23 item 1): a stream holds each record once; every pipeline
that reads it extracts its own key (one field or several), filter and derived fields, and has
its own dead letters. One `wire produce --stream` serves three pipelines; each one's committed
results equal a plain-Python evaluation of its own reading of the records (tests/reference.py's
batch windows), and its counts balance."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from conftest import run_wire
from reference import assert_same_rows, batch
from wire_dagster import engine, results
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.errors import WireInputError
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import field_column, load_pipeline, pipeline_from_dict
from wire_dagster.streams import read_stream

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
STREAM = "market"
COMMON = {
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
    "lateness": {"allowed": "5s"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-02T00:00:00Z",
}
PIPELINES = {
    # the classic form: one key field
    "by_auction": {
        "stream": STREAM,
        "event": {"key": "auction", "time": "date_time", "id": "bid_id"},
        "windows": [
            {"name": "w", "type": "tumbling", "size": "10s", "aggregates": {"n": "count", "top": "max(price)"}}
        ],
    },
    # the dataflow form: a filter, and a key some records do not carry
    "big_bidders": {
        "inputs": [
            {
                "name": "bids",
                "stream": STREAM,
                "time": "date_time",
                "id": "bid_id",
                "key": "bidder",
                "where": "price > 100",
            }
        ],
        "windows": [
            {"name": "w", "type": "tumbling", "size": "10s", "aggregates": {"n": "count", "spent": "sum(price)"}}
        ],
    },
    # a composite key and derived fields, one of them redefining a field the records have (both
    # computed from the record as it came: usd from the original price)
    "by_channel": {
        "stream": STREAM,
        "event": {"key": ["auction", "channel"], "time": "date_time", "id": "bid_id"},
        "fields": {"usd": "price * 0.908", "price": "price * 2"},
        "windows": [
            {
                "name": "w",
                "type": "session",
                "gap": "3s",
                "aggregates": {"n": "count", "usd": "sum(usd)", "top": "max(price)"},
            },
        ],
    },
}


def _records(seed: int, n: int) -> list[dict]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        r = {
            "date_time": T0 + rnd.randrange(0, 120_000),
            "bid_id": f"b{i}",
            "auction": rnd.randrange(1000, 1012),
            "bidder": rnd.randrange(1, 30),
            "price": round(rnd.uniform(1, 300), 2),
            "channel": rnd.choice(["web", "app", "api"]),
        }
        if i % 97 == 5:
            del r["bidder"]  # big_bidders' key: missing -> its dead letter when price > 100, filtered else
            r["price"] = 500.0
        if i % 89 == 7:
            r["price"] = "n/a"  # not a number: by_auction's dead letter; filtered by big_bidders; no usd
        out.append(r)
    return sorted(out, key=lambda r: r["date_time"])  # in order: nothing late, the batch is the reference


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _expected(name: str, recs: list[dict]) -> tuple[list[dict], int, int]:
    """(events as the reference takes them, malformed, filtered) of pipeline `name`, in plain Python."""
    ev, malformed, filtered = [], 0, 0
    for r in recs:
        if name == "by_auction":
            if not _is_num(r["price"]):
                malformed += 1
                continue
            ev.append({"_t": r["date_time"], "_key": str(r["auction"]), field_column("price"): float(r["price"])})
        elif name == "big_bidders":
            if not (_is_num(r["price"]) and r["price"] > 100):
                filtered += 1
            elif "bidder" not in r:
                malformed += 1
            else:
                ev.append({"_t": r["date_time"], "_key": str(r["bidder"]), field_column("price"): float(r["price"])})
        else:
            usd = r["price"] * 0.908 if _is_num(r["price"]) else None
            doubled = r["price"] * 2.0 if _is_num(r["price"]) else None
            key = json.dumps([str(r["auction"]), r["channel"]], separators=(",", ":"))
            ev.append({"_t": r["date_time"], "_key": key, field_column("usd"): usd, field_column("price"): doubled})
    return ev, malformed, filtered


@pytest.fixture
def pipelines_dir(tmp_path: Path) -> Path:
    d = tmp_path / "pipelines"
    d.mkdir()
    for name, body in PIPELINES.items():
        (d / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **body, **COMMON}))
    return d


def test_one_produce_serves_three_pipelines(
    store: ObjectStore, cli_env: dict[str, str], spark, pipelines_dir: Path, tmp_path: Path
) -> None:
    recs = _records(7, 2_400)
    f = tmp_path / "market.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    env = {**cli_env, "WIRE_PIPELINES": str(pipelines_dir)}
    p = run_wire(["produce", "--stream", STREAM, "--file", str(f), "--chunk-rows", "500"], env, check=True)
    assert "appended 2400 events in 5 chunks to market/0" in p.stdout, p.stdout
    run_wire(["close", "--stream", STREAM], env, check=True)
    # Produced once: five chunk objects in the stream, nothing stored per pipeline.
    data = [o.key for o in store.list(f"streams/{STREAM}/") if "/data/" in o.key]
    assert len(data) == 5 and len(read_stream(store, STREAM, {})["0"].chunks) == 5
    assert {o.key.split("/")[0] for o in store.list("")} == {"streams"}
    for name in PIPELINES:
        spec = load_pipeline(pipelines_dir / f"{name}.yaml")
        engine.process(store, spec, spark, max_epochs=20)
        events, malformed, filtered = _expected(name, recs)
        assert events, name
        [w] = spec.windows
        want = {w.name: [r for _, r in sorted(batch(spec, w, events).items())]}
        got = {w.name: results.read_results(store, spec, w.name).to_pylist()}
        assert_same_rows(spec, got, want)
        m = Checkpoints(store, spec.name).latest()
        assert m is not None and m.watermark > T0 + 200_000  # closed: every window fired
        t = m.totals
        assert (t.events_in, t.malformed, t.filtered, t.duplicate) == (len(recs), malformed, filtered, 0), name
        assert t.balanced() and t.counted["w"] == len(events) and t.late["w"] == 0, name
        letters = [d for d in results.read_dead_letters(store, spec) if d["reason"].startswith("malformed")]
        assert len(letters) == malformed, name
        for d in letters:  # the record's own text, with the reason this pipeline refused it
            rec = json.loads(d["record"])
            assert rec["bid_id"].startswith("b") and d["segment"] == "0", d
            if name == "big_bidders":
                assert d["reason"] == "malformed: missing key field bidder" and "bidder" not in rec
            else:
                assert d["reason"] == "malformed: field price has wrong type (want a number)" and rec["price"] == "n/a"


def test_a_reader_with_another_time_or_id_is_refused(
    store: ObjectStore, cli_env: dict[str, str], spark, pipelines_dir: Path, tmp_path: Path
) -> None:
    f = tmp_path / "one.jsonl"
    f.write_text(json.dumps(_records(1, 1)[0]) + "\n")
    env = {**cli_env, "WIRE_PIPELINES": str(pipelines_dir)}
    run_wire(["produce", "--stream", STREAM, "--file", str(f)], env, check=True)
    other = {"name": "other", **PIPELINES["by_auction"], **COMMON}
    other["event"] = {"key": "auction", "time": "ts", "id": "bid_id"}
    spec = pipeline_from_dict(other)
    with pytest.raises(WireInputError) as e:
        engine.process(store, spec, spark)
    msg = str(e.value)
    assert "'ts'" in msg and "'date_time'" in msg and "\n" not in msg
    (pipelines_dir / "other.yaml").write_text(yaml.safe_dump(other))
    p = run_wire(["produce", "--pipeline", "other", "--file", str(f)], env)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "'date_time'" in p.stderr, p.stderr
    assert Checkpoints(store, "other").latest() is None


def test_produce_to_a_stream_nobody_declared_is_refused(cli_env: dict[str, str], tmp_path: Path) -> None:
    f = tmp_path / "one.jsonl"
    f.write_text('{"ts": 1}\n')
    p = run_wire(["produce", "--stream", "nobody", "--file", str(f)], {**cli_env, "WIRE_PIPELINES": str(tmp_path)})
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "time field is unknown" in p.stderr, p.stderr
    p = run_wire(["produce", "--file", str(f)], cli_env)
    assert p.returncode == 2 and "--pipeline P" in p.stderr, p.stderr


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"event": {"key": [], "time": "date_time"}}, "event.key: an empty list"),
        ({"event": {"key": ["a", "a"], "time": "date_time"}}, "listed twice"),
        ({"event": {"key": "a", "time": "date_time", "where": "price >"}}, "event.where: 'price >' does not parse"),
        ({"event": {"key": "a", "time": "date_time", "where": "(SELECT 1)"}}, "event.where"),
        ({"fields": {"usd": "price * * 2"}}, "fields.usd: 'price * * 2' does not parse"),
        ({"fields": {"a.b": "1"}}, "fields: bad field name 'a.b'"),
        ({"event": {"key": "a", "time": "date_time", "colour": "red"}}, "event: unknown key(s) ['colour']"),
    ],
)
def test_mistakes_in_keys_filters_and_fields_are_one_line(change: dict, says: str) -> None:
    body = {"name": "x", **PIPELINES["by_auction"], **COMMON, **change}
    with pytest.raises(WireInputError) as e:
        pipeline_from_dict(body)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_inputs_form_reads_like_stream_and_event() -> None:
    a = pipeline_from_dict({"name": "x", **PIPELINES["big_bidders"], **COMMON})
    b = pipeline_from_dict(
        {
            "name": "x",
            "stream": STREAM,
            "event": {"key": "bidder", "time": "date_time", "id": "bid_id", "where": "price > 100"},
            "windows": PIPELINES["big_bidders"]["windows"],
            **COMMON,
        }
    )
    assert a == b and a.fingerprint() == b.fingerprint()
    with pytest.raises(WireInputError, match="not both"):
        pipeline_from_dict({"name": "x", **PIPELINES["big_bidders"], "stream": STREAM, **COMMON})
    two = {"name": "x", **PIPELINES["big_bidders"], **COMMON}
    two["inputs"] = two["inputs"] * 2
    with pytest.raises(WireInputError, match="two inputs are named 'bids'"):
        pipeline_from_dict(two)
