"""Several inputs (DESIGN §6, issue 23 item 2): a pipeline reads two streams, each with its own
time, id, key fields and filter; its windows aggregate the records of both (a union); its
watermark is the minimum over the inputs — an input with no segment yet holds it back, a closed
one counts +inf — and the remap names every input's segments (`<input>.<segment>`), so a rewind
replays the same epochs. Results equal the plain-Python batch of the union."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from conftest import run_wire
from reference import assert_same_rows, batch
from wire_dagster import engine, replay, results, streams
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.errors import WireInputError
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import field_column, load_pipeline, pipeline_from_dict, stream_spec
from wire_dagster.timeutil import INF, NEG_INF

T0 = 1_767_225_600_000
UNION = {
    "name": "all_clicks",
    "inputs": [
        {"name": "web", "stream": "web", "time": "ts", "id": "eid", "key": "user"},
        {"name": "app", "stream": "app", "time": "at", "id": "event", "key": "uid", "where": "amount >= 0"},
    ],
    "watermark": {"max_out_of_orderness": "1s", "idle_timeout": "1h"},
    "lateness": {"allowed": "2s"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-02T00:00:00Z",
    "windows": [
        {"name": "per_10s", "type": "tumbling", "size": "10s", "aggregates": {"n": "count", "total": "sum(amount)"}},
        {"name": "sessions", "type": "session", "gap": "4s", "aggregates": {"n": "count", "top": "max(amount)"}},
    ],
}


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_union_of_two_streams_waits_for_both_and_counts_each_once(
    store: ObjectStore, cli_env: dict[str, str], spark, tmp_path: Path
) -> None:
    d = tmp_path / "pipelines"
    d.mkdir()
    (d / "all_clicks.yaml").write_text(yaml.safe_dump(UNION))
    spec = load_pipeline(d / "all_clicks.yaml")
    rnd = random.Random(3)
    # The same ids in both streams (e0, e1, ...): an id is its stream's, so none is a duplicate
    # of the other stream's; a repeated id within a stream is.
    web = [{"ts": T0 + rnd.randrange(60_000), "eid": f"e{i}", "user": f"u{i % 7}", "amount": i % 5} for i in range(300)]
    web.append(dict(web[10]))  # a duplicate within web
    app = [
        {"at": T0 + rnd.randrange(60_000), "event": f"e{i}", "uid": f"u{i % 9}", "amount": (i % 4) - 1}
        for i in range(200)
    ]
    env = {**cli_env, "WIRE_PIPELINES": str(d)}
    run_wire(["produce", "--stream", "web", "--file", str(_write(tmp_path / "w.jsonl", web))], env, check=True)
    run_wire(["close", "--stream", "web"], env, check=True)
    # app has no segment yet: W waits for it, whatever web's is (+inf, closed).
    engine.process(store, spec, spark, max_epochs=5)
    m = Checkpoints(store, spec.name).latest()
    assert m is not None and m.watermark == NEG_INF and m.decisions == {"app.": "waiting", "web.0": "sealed"}
    assert all(not ps for ps in m.outputs.values()) and m.remap == {"web.0": 1}
    # app arrives in two segments; closed, the union's W is +inf and every window fired.
    app_spec = stream_spec("app", "at", "event")
    streams.produce(store, app_spec, _write(tmp_path / "a0.jsonl", app[:120]), segment="0")
    streams.produce(store, app_spec, _write(tmp_path / "a1.jsonl", app[120:]), segment="1", chunk_rows=30)
    streams.close_stream(store, "app")
    engine.process(store, spec, spark, max_epochs=20)
    m = Checkpoints(store, spec.name).latest()
    assert m is not None and m.watermark == INF
    assert m.remap == {"app.0": 1, "app.1": 3, "web.0": 1}
    t = m.totals
    kept = [a for a in app if a["amount"] >= 0]
    assert (t.events_in, t.duplicate, t.filtered, t.malformed) == (len(web) + len(app), 1, len(app) - len(kept), 0)
    assert t.balanced() and t.late == {"per_10s": 0, "sessions": 0}
    events = [{"_t": e["ts"], "_key": e["user"], field_column("amount"): float(e["amount"])} for e in web[:-1]]
    events += [{"_t": a["at"], "_key": a["uid"], field_column("amount"): float(a["amount"])} for a in kept]
    want = {w.name: [r for _, r in sorted(batch(spec, w, events).items())] for w in spec.windows}
    got = {w.name: results.read_results(store, spec, w.name).to_pylist() for w in spec.windows}
    assert_same_rows(spec, got, want)
    # A rewind replays the recorded epochs, input by input: the same content again.
    first = min(Checkpoints(store, spec.name).committed())
    replay.rewind(store, spec, first)
    engine.process(store, spec, spark, max_epochs=20)
    again = {w.name: results.read_results(store, spec, w.name).to_pylist() for w in spec.windows}
    assert again == got


def test_mistakes_in_inputs_are_one_line() -> None:
    two = json.loads(json.dumps(UNION))
    two["inputs"][1]["name"] = "web"
    with pytest.raises(WireInputError, match="two inputs are named 'web'"):
        pipeline_from_dict(two)
    # a raw input beside a derived one is a stage now (its raw input read through a generated
    # pipeline, expand.py); what it cannot have yet is UNION's session window
    derived = json.loads(json.dumps(UNION))
    derived["inputs"][1] = {"name": "m", "pipeline": "clicks", "output": "per_minute", "key": "key"}
    with pytest.raises(WireInputError, match="a session window over a derived stream is not built yet"):
        pipeline_from_dict(derived)


@pytest.mark.parametrize("idless", ["first", "second"])
def test_an_input_without_ids_has_no_duplicates_in_a_union(store: ObjectStore, spark, tmp_path: Path, idless) -> None:
    """A union of a stream that declares an id and one that does not (either order): the events
    with no id are never duplicates of one another (they used to be: their null ids were one id,
    or, with the id-less input first, nothing was de-duplicated at all); a repeated id of the
    other stream still is. Counts balance; results equal the batch of the union."""
    with_ids = {"name": "web", "stream": "web", "time": "ts", "id": "eid", "key": "user"}
    without = {"name": "app", "stream": "app", "time": "at", "key": "uid"}
    body = {
        **UNION,
        "name": f"ids_{idless}",
        "inputs": [without, with_ids] if idless == "first" else [with_ids, without],
    }
    spec = pipeline_from_dict(body)
    web = [{"ts": T0 + 1_000 * i, "eid": f"e{i}", "user": "u1", "amount": 1} for i in range(20)]
    web.append(dict(web[3]))  # a duplicate id within web
    app = [{"at": T0 + 500, "uid": "u1", "amount": 2} for _ in range(15)]  # alike, and no ids
    streams.produce(store, stream_spec("web", "ts", "eid"), _write(tmp_path / "w.jsonl", web))
    streams.produce(store, stream_spec("app", "at", None), _write(tmp_path / "a.jsonl", app))
    streams.close_stream(store, "web")
    streams.close_stream(store, "app")
    engine.process(store, spec, spark, max_epochs=20)
    m = Checkpoints(store, spec.name).latest()
    assert m is not None and m.watermark == INF
    t = m.totals
    assert (t.events_in, t.duplicate) == (len(web) + len(app), 1) and t.balanced()
    assert t.counted == {"per_10s": len(web) - 1 + len(app), "sessions": len(web) - 1 + len(app)}
    events = [{"_t": e["ts"], "_key": e["user"], field_column("amount"): 1.0} for e in web[:-1]]
    events += [{"_t": a["at"], "_key": a["uid"], field_column("amount"): 2.0} for a in app]
    want = {w.name: [r for _, r in sorted(batch(spec, w, events).items())] for w in spec.windows}
    got = {w.name: results.read_results(store, spec, w.name).to_pylist() for w in spec.windows}
    assert_same_rows(spec, got, want)
