"""A derived stage's records it cannot read are dead letters, never silently dropped (DESIGN §1:
malformed input goes to the dead-letter output with a reason and its source position).

An upstream window's `sum(amount)` of amounts each within the value domain (|x| <= 2^53) can add
up past it; a downstream window aggregating `sum(total)` holds its inputs to that domain, so such
a row is malformed there. Random events with late data (upstream windows re-fire, a row crossing
the bound either way), produced and committed in random epoch splits, downstream epochs between
upstream ones: at the end

- the downstream's results equal the plain Python composition over the final upstream rows
  within the domain;
- its dead letters (what `wire dlq` lists) are exactly the final upstream rows past it, once
  each, with the reason naming the field and the upstream partition and row they come from;
  a letter of a row a late firing upstream replaced is gone;
- every epoch's counts balance, and each upstream partition's content is counted once however
  many epochs read it again (in = counted + malformed, summed over the partitions' versions).

A rewind replays to the same letters; a backfill changes nothing.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from reference import assert_same_rows
from test_derived_streams import COMMON, T0, _composition
from wire_dagster import engine, partitions, replay, results, streams
from wire_dagster.backfill import backfill
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.spec import load_pipeline, stream_spec

BOUND = 2**53  # aggregates' value domain (ingest.py)
UP = {
    "name": "up",
    "stream": "clicks",
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "lateness": {"allowed": "30s"},
    "windows": [
        {"name": "per_10s", "type": "tumbling", "size": "10s", "aggregates": {"n": "count", "total": "sum(amount)"}}
    ],
}
DOWN = {
    "name": "down",
    "inputs": [{"name": "sums", "pipeline": "up", "output": "per_10s", "key": "key"}],
    "lateness": {"allowed": "0s"},
    "windows": [
        {"name": "per_30s", "type": "tumbling", "size": "30s", "aggregates": {"rows": "count", "s": "sum(total)"}}
    ],
}


def _events(rnd: random.Random, n: int) -> list[dict]:
    """Small amounts and a fourth of ±2^52, three users; some events late within the lateness."""
    out = []
    for i in range(n):
        t = T0 + i * 300 + rnd.randrange(-500, 500)
        if rnd.random() < 0.1:
            t -= rnd.choice([4_000, 12_000, 20_000])
        big = rnd.random() < 0.25
        amount = rnd.choice([2**52, 2**52, -(2**52)]) if big else rnd.randrange(-5, 50)
        out.append({"ts": t, "eid": f"e{i}", "user": f"u{rnd.randrange(3)}", "amount": amount})
    return out


def _ident(r: dict) -> tuple:
    return (r["key"], r["window_start"], r["window_end"])


def _lettered(d: dict) -> tuple:
    rec = json.loads(d["record"])
    return (*_ident(rec), rec["total"])


@pytest.mark.parametrize("seed", [0])
def test_a_derived_stage_letters_what_it_cannot_read_once_each(
    store, spark, tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WIRE_DERIVED_BLOCK_FILES", "1")  # a Spark task per upstream file
    rnd = random.Random(seed)
    for body in (UP, DOWN):
        (tmp_path / f"{body['name']}.yaml").write_text(yaml.safe_dump({**body, **COMMON}))
    up, down = load_pipeline(tmp_path / "up.yaml"), load_pipeline(tmp_path / "down.yaml")
    events = _events(rnd, 400)
    seen: set[tuple] = set()  # every row (and its total) the downstream has lettered at some point
    i = 0
    while i < len(events):
        n = rnd.randint(30, 90)
        f = tmp_path / f"e{i}.jsonl"
        f.write_text("".join(json.dumps(e) + "\n" for e in events[i : i + n]))
        streams.produce(store, stream_spec("clicks", "ts", "eid", up), f)
        i += n
        engine.process(store, up, spark, max_epochs=rnd.randint(1, 2))
        if rnd.random() < 0.8:
            engine.process(store, down, spark)
            seen |= {_lettered(d) for d in results.read_dead_letters(store, down)}
    streams.close_stream(store, "clicks")
    while engine.process(store, up, spark, max_epochs=20).committed:
        pass
    while engine.process(store, down, spark).committed:
        pass

    final = results.read_results(store, up, "per_10s").to_pylist()
    bad = sorted(_ident(r) for r in final if abs(r["total"]) > BOUND)
    good = [r for r in final if abs(r["total"]) <= BOUND]
    assert bad and good
    want = _composition(up, down, good, ("n", "total"), keyed=True)
    assert_same_rows(down, {"per_30s": results.read_results(store, down, "per_30s").to_pylist()}, want)

    letters = results.read_dead_letters(store, down)
    assert sorted(_ident(json.loads(d["record"])) for d in letters) == bad  # each once
    ordered = {}  # upstream partition -> its rows in their committed order (key, window)
    for r in final:
        ordered.setdefault(partitions.of_window(up, r["window_end"]), []).append(r)
    for d in letters:
        rec = json.loads(d["record"])
        said = d["reason"].split()
        assert said[:2] == ["malformed:", "total:"] and float(said[2]) == rec["total"] and "2^53" in d["reason"], d
        assert (d["stream"], d["segment"]) == ("up.per_10s", "sums")
        rows = sorted(ordered[d["chunk"]], key=lambda r: (r["key"], r["window_start"]))
        assert _ident(rows[d["row"]]) == _ident(rec)
    m = Checkpoints(store, "down").latest()
    holding = {partitions.of_window(up, r["window_end"]) for r in final if abs(r["total"]) > BOUND}
    assert m is not None and len(m.letter_files()) == len(holding)  # a file per upstream partition with letters
    now = {_lettered(d) for d in letters}
    assert seen - now, "no late firing upstream replaced a lettered row: the test proves nothing"

    # Counts: each epoch balances; each upstream partition's content is counted once.
    cp = Checkpoints(store, "down")
    ms = [cp.load(n) for n in cp.committed()]
    assert ms[0].epoch == 1, "the test needs every epoch kept"
    versions = 0
    before: dict[str, str] = {}
    for m in ms:
        assert m.counts.balanced() and m.totals.balanced(), m.counts
        now = m.upstream["sums"]
        at = Checkpoints(store, "up").load(m.remap["sums"]).outputs["per_10s"]
        versions += sum(at[p].rows for p in now if before.get(p) != now[p])
        before = now
    last = ms[-1]
    assert last.totals.events_in == versions
    assert last.totals.malformed >= len(bad) and last.totals.counted["per_30s"] + last.totals.malformed == versions

    # A backfill recomputes the same content; a rewind replays to the same letters.
    parts = sorted({int(p) for ps in last.outputs.values() for p in ps})
    assert backfill(store, down, spark, parts) is None
    replay.rewind(store, down, 1)
    while engine.process(store, down, spark).committed:
        pass
    again = results.read_dead_letters(store, down)
    assert sorted(_ident(json.loads(d["record"])) for d in again) == bad
