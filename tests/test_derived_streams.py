"""Derived streams (DESIGN §6, issue 23 item 3): a window's committed output is a stream other
pipelines read. Random two-stage graphs (a window feeding windows keyed and unkeyed) over random
events with disorder and late data within and past the allowed lateness, produced and committed
in random epoch splits: every downstream result equals the reference composition — the plain
Python batch of the downstream windows over the *final* upstream results (event time
window_end - 1) — however the late firings upstream interleaved with the downstream's epochs.
Rewinding the downstream replays the same upstream epochs to the same content."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import yaml

from reference import assert_same_rows, batch
from wire_dagster import engine, partitions, replay, results, streams
from wire_dagster.backfill import backfill
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.errors import WireInputError
from wire_dagster.spec import field_column, load_pipeline, stream_spec

SEEDS = int(os.environ.get("WIRE_DERIVED_SEEDS", "1"))  # `make test-long`: 4
T0 = 1_767_225_600_000
COMMON = {
    "watermark": {"max_out_of_orderness": "1s", "idle_timeout": "1h"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-02T00:00:00Z",
}
UP = {
    "name": "up",
    "stream": "clicks",
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "lateness": {"allowed": "6s"},
    "windows": [
        {
            "name": "per_10s",
            "type": "tumbling",
            "size": "10s",
            "aggregates": {"n": "count", "total": "sum(amount)", "top": "max(amount)"},
        },
        {"name": "per_20s_5s", "type": "sliding", "size": "20s", "slide": "5s", "aggregates": {"n": "count"}},
    ],
}
DOWN = {
    "name": "down",
    "inputs": [{"name": "counts", "pipeline": "up", "output": "per_10s", "key": "key"}],
    "lateness": {"allowed": "0s"},
    "windows": [
        {
            "name": "per_30s",
            "type": "tumbling",
            "size": "30s",
            "aggregates": {"peak": "max(n)", "sum_total": "sum(total)", "windows": "count", "best": "arg_max(top, n)"},
        },
    ],
}
# the hot windows of every 20 s, sliding by 10 s, over every key (no key: one group)
GLOBAL = {
    "name": "hottest",
    "inputs": [{"name": "slides", "pipeline": "up", "output": "per_20s_5s", "where": "n >= 2"}],
    "lateness": {"allowed": "0s"},
    "windows": [
        {
            "name": "hot",
            "type": "sliding",
            "size": "20s",
            "slide": "10s",
            "aggregates": {"most": "max(n)", "rows": "count", "who": "arg_max(key, n)", "last_key": "last(key)"},
        },
    ],
}


# a windowed join of the two upstream windows: each 10 s row with the sliding rows of its key
# that end in the same 10 s, where the sliding count is the larger
JOIN = {
    "name": "pairs",
    "inputs": [
        {"name": "ten", "pipeline": "up", "output": "per_10s", "key": "key"},
        {"name": "slides", "pipeline": "up", "output": "per_20s_5s", "key": "key"},
    ],
    "lateness": {"allowed": "0s"},
    "windows": [
        {
            "name": "bigger",
            "type": "join",
            "left": "ten",
            "right": "slides",
            "window": {"type": "tumbling", "size": "10s"},
            "where": "right.n > left.n",
            "select": {"n10": "left.n", "n20": "right.n", "end20": "right.window_end"},
        },
        {  # the same pairs within sliding windows of 20 s every 10 s: a pair can meet in two
            "name": "bigger_sliding",
            "type": "join",
            "left": "ten",
            "right": "slides",
            "window": {"type": "sliding", "size": "20s", "slide": "10s"},
            "where": "right.n > left.n",
            "select": {"n10": "left.n", "n20": "right.n", "end20": "right.window_end"},
        },
    ],
}


def _files(d: Path) -> dict:
    for body in (UP, DOWN, GLOBAL, JOIN):
        (d / f"{body['name']}.yaml").write_text(yaml.safe_dump({**body, **COMMON}))
    return {name: load_pipeline(d / f"{name}.yaml") for name in ("up", "down", "hottest", "pairs")}


def _join_reference(ten: list[dict], slides: list[dict], size: int = 10_000, slide: int = 10_000) -> list[tuple]:
    """Nested loops over every window start: pairs with equal keys whose event times
    (window_end - 1) both lie in [start, start + size)."""
    times = [r["window_end"] - 1 for r in ten + slides]
    out = []
    for start in range(min(times) // slide * slide - size, max(times) + 1, slide):
        for a in ten:
            for b in slides:
                inside = all(start <= r["window_end"] - 1 < start + size for r in (a, b))
                if inside and a["key"] == b["key"] and b["n"] > a["n"]:
                    out.append((a["key"], start, start + size, a["n"], b["n"], b["window_end"]))
    return sorted(out)


def _events(rnd: random.Random, n: int) -> list[dict]:
    """In rounds of rising time, with disorder within the bound and some events far behind
    (late within the 6 s lateness, or past it)."""
    out = []
    for i in range(n):
        t = T0 + i * 400 + rnd.randrange(-900, 900)
        if rnd.random() < 0.08:
            t -= rnd.choice([3_000, 8_000, 25_000])
        out.append({"ts": t, "eid": f"e{i}", "user": f"u{rnd.randrange(5)}", "amount": rnd.randrange(-5, 50)})
    # and, last, a few so old that they are late past the lateness whatever the epoch splits
    out += [{"ts": T0 + 1_000 * j, "eid": f"old{j}", "user": "u0", "amount": 1} for j in range(3)]
    return out


def _composition(up, spec, up_rows: list[dict], numeric: tuple[str, ...], keyed: bool, where=None) -> dict:
    """The reference: the downstream windows over the final upstream rows, in plain Python; a
    row's source position is its place in its upstream partition (rows sorted by key and window),
    which breaks ties of event time for first and last."""
    evs = []
    by_part: dict[int, list[dict]] = {}
    for r in up_rows:
        by_part.setdefault(partitions.of_window(up, r["window_end"]), []).append(r)
    for p, rows in by_part.items():
        for i, r in enumerate(sorted(rows, key=lambda r: (r["key"], r["window_start"], r["window_end"]))):
            r["_pos"] = (str(p), i)
    for r in up_rows:
        if where is not None and not where(r):
            continue
        ev = {"_t": r["window_end"] - 1, "_key": r["key"] if keyed else None}
        ev["_seg"], ev["_seq"], ev["_row"] = f"in.{r['_pos'][0]}", 0, r["_pos"][1]
        for f in numeric:
            ev[field_column(f)] = None if r[f] is None else float(r[f])
        ev[field_column("key")] = r["key"]
        ev[field_column("top")] = None if r.get("top") is None else repr(float(r["top"]))
        evs.append(ev)

    def order(kv):
        return (str(kv[0][0]), kv[0][1:])

    return {w.name: [x for _, x in sorted(batch(spec, w, evs).items(), key=order)] for w in spec.windows}


@pytest.mark.parametrize("seed", range(SEEDS))
def test_two_stage_graphs_equal_the_composition_of_final_upstream_results(
    store, spark, tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rnd = random.Random(seed)
    # The recomputation split into Spark tasks by event time, one upstream file each (even
    # seeds), or the default (odd seeds: one task for up to 8 files).
    if seed % 2 == 0:
        monkeypatch.setenv("WIRE_DERIVED_BLOCK_FILES", "1")
    specs = _files(tmp_path)
    up, down, hottest, pairs = specs["up"], specs["down"], specs["hottest"], specs["pairs"]
    events = _events(rnd, 260)
    level = stream_spec("clicks", "ts", "eid", up)
    i = 0
    while i < len(events):
        n = rnd.randint(20, 70)
        f = tmp_path / f"e{i}.jsonl"
        f.write_text("".join(json.dumps(e) + "\n" for e in events[i : i + n]))
        streams.produce(store, level, f)
        i += n
        engine.process(store, up, spark, max_epochs=rnd.randint(1, 3))
        for spec in (down, hottest, pairs):
            if rnd.random() < 0.7:  # a downstream epoch between upstream ones, or not
                engine.process(store, spec, spark)
    streams.close_stream(store, "clicks")
    while engine.process(store, up, spark, max_epochs=20).committed:
        pass
    for spec in (down, hottest, pairs):
        engine.process(store, spec, spark)
        assert not engine.process(store, spec, spark).committed  # in sync: nothing more to do
    m_up = Checkpoints(store, "up").latest()
    assert m_up is not None and m_up.totals.late["per_10s"] > 0  # late data past lateness happened
    ten = results.read_results(store, up, "per_10s").to_pylist()
    slides = results.read_results(store, up, "per_20s_5s").to_pylist()
    want = _composition(up, down, ten, ("n", "total"), keyed=True)
    assert_same_rows(down, {"per_30s": results.read_results(store, down, "per_30s").to_pylist()}, want)
    want = _composition(up, hottest, slides, ("n",), keyed=False, where=lambda r: r["n"] >= 2)
    got = results.read_results(store, hottest, "hot").to_pylist()
    assert_same_rows(hottest, {"hot": got}, want)
    assert got and all(r["key"] is None for r in got)
    cols = ("key", "window_start", "window_end", "n10", "n20", "end20")
    joined = sorted(tuple(r[c] for c in cols) for r in results.read_results(store, pairs, "bigger").to_pylist())
    assert joined and joined == _join_reference(ten, slides)
    joined = sorted(tuple(r[c] for c in cols) for r in results.read_results(store, pairs, "bigger_sliding").to_pylist())
    assert joined and joined == _join_reference(ten, slides, size=20_000, slide=10_000)
    assert len({r[:3] for r in joined}) > len({r[0] for r in joined})  # rows of overlapping windows
    # A backfill recomputes every partition from the upstream content each stage read: the same
    # bytes, so nothing is committed (Dagster's data versions stay the same).
    for spec in (down, hottest, pairs):
        m = Checkpoints(store, spec.name).latest()
        assert m is not None
        parts = sorted({int(p) for ps in m.outputs.values() for p in ps})
        assert parts and backfill(store, spec, spark, parts) is None, spec.name
    # The downstream's remap is the upstream epoch it read; a rewind replays them to the same data.
    m = Checkpoints(store, "down").latest()
    assert m is not None and m.remap == {"counts": m_up.epoch} and m.watermark == m_up.watermark
    before = {w.name: results.read_results(store, down, w.name).to_pylist() for w in down.windows}
    replay.rewind(store, down, min(Checkpoints(store, "down").committed()))
    while engine.process(store, down, spark).committed:
        pass
    assert {w.name: results.read_results(store, down, w.name).to_pylist() for w in down.windows} == before


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"pipeline": "nobody"}, "inputs.counts.pipeline: no pipeline named 'nobody'"),
        ({"output": "per_hour"}, "inputs.counts.output: pipeline 'up' has no window 'per_hour'"),
    ],
)
def test_a_derived_input_naming_what_does_not_exist_is_one_line(tmp_path: Path, change: dict, says: str) -> None:
    _files(tmp_path)
    body = {**DOWN, **COMMON, "inputs": [{**DOWN["inputs"][0], **change}]}
    (tmp_path / "down.yaml").write_text(yaml.safe_dump(body))
    spec = load_pipeline(tmp_path / "down.yaml")
    with pytest.raises(WireInputError) as e:
        engine.process(None, spec, None)  # pyright: ignore[reportArgumentType]  refused before the store is used
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_cycle_and_unbuilt_forms_are_refused(tmp_path: Path) -> None:
    from wire_dagster.derived import upstreams
    from wire_dagster.spec import pipeline_from_dict

    a = {**DOWN, **COMMON, "name": "a", "inputs": [{"name": "x", "pipeline": "b", "output": "per_30s"}]}
    b = {**DOWN, **COMMON, "name": "b", "inputs": [{"name": "x", "pipeline": "a", "output": "per_30s"}]}
    for body in (a, b):
        (tmp_path / f"{body['name']}.yaml").write_text(yaml.safe_dump(body))
    with pytest.raises(WireInputError, match=r"cycle: a -> b -> a|cycle: b -> a -> b"):
        upstreams(load_pipeline(tmp_path / "a.yaml"))
    # The code location's check walks the same graph, over its specs (definitions.py).
    from wire_dagster.derived import check_graph

    with pytest.raises(WireInputError, match=r"^pipelines form a cycle: (a -> b -> a|b -> a -> b); a dataflow"):
        check_graph([load_pipeline(tmp_path / "a.yaml"), load_pipeline(tmp_path / "b.yaml")])
    # a raw input beside a derived one is built: read through a generated pipeline (expand.py,
    # tests/test_raw_joins.py), the stage's input rewritten as a derived input of it
    mixed = {**DOWN, **COMMON, "inputs": [*DOWN["inputs"], {"name": "raw", "stream": "s", "time": "ts"}]}
    assert {i.name: i.pipeline for i in pipeline_from_dict(mixed).derived} == {"counts": "up", "raw": "down__raw"}
    session = {
        **DOWN,
        **COMMON,
        "windows": [{"name": "s", "type": "session", "gap": "5s", "aggregates": {"n": "count"}}],
    }
    with pytest.raises(WireInputError, match="session window over a derived stream"):
        pipeline_from_dict(session)


def test_blocks_tile_time_and_count_each_file_once(tmp_path: Path) -> None:
    """derived._blocks: the blocks tile the time axis; every file is owned by exactly one block,
    which reads it; a block reads every file holding records of a window ending in it."""
    from wire_dagster.derived import _blocks, upstreams
    from wire_dagster.timeutil import INF, NEG_INF

    specs = _files(tmp_path)
    spec = specs["down"]
    ups = upstreams(spec)
    files = [("counts", T0 + k * 60_000, f"f{k}") for k in range(7)]
    size = max(w.size for w in spec.windows)
    for per in (1, 2, 3, 7, 8):
        blocks = _blocks(spec, ups, files, per)
        assert blocks[0].lo == NEG_INF and blocks[-1].hi == INF
        assert all(a.hi == b.lo for a, b in zip(blocks, blocks[1:], strict=False))
        assert len(blocks) == -(-len(files) // per)
        owners = [b for f in files for b in blocks if f[2] in b.owns]
        assert len(owners) == len(files)
        for b in blocks:
            assert set(b.owns) <= {f[2] for f in b.reads} and len(b.owns) <= per
            # a window ending at e in [lo, hi) has records in [e - size, e): the files overlapping it
            for f in files:
                lo = b.lo if b.lo > NEG_INF else files[0][1]
                needed = f[1] < b.hi and f[1] + 60_000 > lo - size
                assert needed == (f in b.reads), (per, b.lo, f)
