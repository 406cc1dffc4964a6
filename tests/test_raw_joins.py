"""Raw inputs in dataflow stages (issue 23, DESIGN §4 "Dataflow forms"): a windowed join of two
raw streams, and a stage mixing a raw input with a derived one — expanded at load time
(wire_dagster/expand.py) into a generated pipeline `<stage>__<input>` per raw input (every
accepted record once, as its output `records`) and the stage over those.

    clicks ─▶ joined__clicks/records ─┐
                                      ├─▶ joined: tumble, slide (clicks ⋈ views on user)
    views  ─▶ joined__views/records ──┘
    clicks ─▶ mixed__clicks/records ──┐  (where amount > 0)
    clicks ─▶ minutes/per_10s ────────┴─▶ mixed: both (a window over both), spend (input:
                                             clicks), with_minute (clicks ⋈ minutes)

Random events with disorder, duplicate ids, late events within and past the allowed lateness,
produced in random batches with the stages run between them in random order, against a plain
Python reference over the accepted events: an event is accepted by a generated pipeline
unless it is filtered, malformed (before the pipeline's start), a repeat of an id earlier in
its epoch, late (`ts + lateness < W_prev` of the epoch that read it: W_prev from the events of
the chunks the earlier epochs read, the remap), or a repeat of an id accepted before (a
retried append repeats the record, its time too).
Conservation holds per generated pipeline. Then the CLI as users drive it: `wire tick` of the
stage ticks its generated pipelines first, a kill -9 of it at random moments loses and
duplicates nothing, `wire dlq --pipeline joined__clicks` lists the duplicates and late ones.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from commit_scenario import kill_at_random_moments, results_read
from conftest import run_wire
from wire_dagster import engine, results, streams
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.errors import WireInputError
from wire_dagster.spec import find_pipeline, load_all, load_pipelines, pipeline_from_dict, stream_spec
from wire_dagster.timeutil import INF, NEG_INF

SEEDS = int(os.environ.get("WIRE_RAW_JOIN_SEEDS", "1"))  # `make test-long`: more
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
OOO, L = 2_000, 5_000
COMMON = {
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
    "lateness": {"allowed": "5s"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-02T00:00:00Z",
}
CLICKS = {"name": "clicks", "stream": "clicks", "time": "ts", "id": "eid", "key": "user"}
VIEWS = {"name": "views", "stream": "views", "time": "ts", "id": "vid", "key": "user"}
SELECT = {"eid": "left.eid", "vid": "right.vid", "amount": "left.amount", "page": "right.page"}
JOINED = {
    "name": "joined",
    "inputs": [CLICKS, VIEWS],
    "windows": [
        {"name": "tumble", "type": "join", "left": "clicks", "right": "views",
         "window": {"type": "tumbling", "size": "10s"}, "select": SELECT},
        {"name": "slide", "type": "join", "left": "clicks", "right": "views",
         "window": {"type": "sliding", "size": "20s", "slide": "10s"}, "select": SELECT},
    ],
}  # fmt: skip
MINUTES = {  # a raw pipeline over the same clicks; lateness 1 h: it counts every distinct click
    "name": "minutes",
    "stream": "clicks",
    "event": {"time": "ts", "id": "eid", "key": "user"},
    "windows": [
        {"name": "per_10s", "type": "tumbling", "size": "10s", "aggregates": {"n": "count", "total": "sum(amount)"}}
    ],
}
MIXED = {
    "name": "mixed",
    "inputs": [
        {**CLICKS, "where": "amount > 0"},
        {"name": "minutes", "pipeline": "minutes", "output": "per_10s", "key": "key"},
    ],
    "windows": [
        {"name": "both", "type": "tumbling", "size": "30s", "aggregates": {"rows": "count"}},
        {"name": "spend", "type": "tumbling", "size": "30s", "input": "clicks",
         "aggregates": {"total": "sum(amount)", "n": "count"}},
        {"name": "with_minute", "type": "join", "left": "clicks", "right": "minutes",
         "window": {"type": "tumbling", "size": "10s"},
         "select": {"eid": "left.eid", "amount": "left.amount", "n": "right.n"}},
    ],
}  # fmt: skip


def _write(d: Path, *bodies: dict) -> None:
    for body in bodies:
        extra = {"lateness": {"allowed": "1h"}} if body["name"] == "minutes" else {}
        (d / f"{body['name']}.yaml").write_text(yaml.safe_dump({**COMMON, **body, **extra}))


def _events(rnd: random.Random, n: int, kind: str) -> list[dict]:
    """Rising time with disorder within the bound, some events far behind (late within the
    lateness or past it), and retried appends (the same record again, in its batch or later)."""
    out = []
    for i in range(n):
        t = T0 + i * 300 + rnd.randrange(-900, 900)
        if rnd.random() < 0.1:
            t -= rnd.choice([3_000, 6_000, 9_000, 25_000])
        user = f"u{rnd.randrange(4)}"
        if kind == "clicks":
            out.append({"ts": t, "eid": f"c{i}", "user": user, "amount": rnd.randrange(-5, 40)})
        else:
            out.append({"ts": t, "vid": f"v{i}", "user": user, "page": f"p{rnd.randrange(6)}"})
    for _ in range(max(2, n // 15)):  # a producer's retries: the same record again
        out.insert(rnd.randrange(len(out) // 2, len(out) + 1), dict(rnd.choice(out)))
    idf = "eid" if kind == "clicks" else "vid"
    # last, a few so old that they are late past the lateness whatever the epoch splits
    out += [{**out[0], idf: f"old{j}", "ts": T0 + 1_000 * j} for j in range(2)]
    return out


def _split(rnd: random.Random, events: list[dict], parts: int) -> list[list[dict]]:
    cuts = sorted(rnd.sample(range(1, len(events)), parts - 1))
    return [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True)]


def _accepted(store, name: str, batches: list[list[dict]], idf: str, where=None) -> tuple[list[dict], dict]:
    """The reference's accepted events of generated pipeline `name` (module doc) and its
    expected counts. Batch j is chunk j of the stream's one segment; epoch e read the chunks
    [remap[e-1], remap[e]); its W_prev is the largest event time of the chunks before, minus
    the disorder bound (checked against the manifest: the watermark is recomputed here)."""
    cp = Checkpoints(store, name)
    seen: set[str] = set()  # the ids accepted
    acc: list[dict] = []
    n = Counter()
    lo, top = 0, None
    for e in cp.committed():
        m = cp.load(e)
        hi = int(m.remap.get("0", lo))
        w_prev = NEG_INF if top is None else top - OOO
        if m.prev_watermark != w_prev:  # only after the stream closed (W = +inf), with nothing left to read
            assert m.prev_watermark >= INF and hi == lo, (name, e, m.prev_watermark, w_prev)
        in_epoch: set[str] = set()  # the ids of the epoch's records so far (late ones too)
        for rec in (r for b in batches[lo:hi] for r in b):
            n["in"] += 1
            if where is not None and not where(rec):
                n["filtered"] += 1
            elif rec["ts"] < T0:  # before the pipeline's start: out of its range
                n["malformed"] += 1
            elif rec[idf] in in_epoch:  # a repeat within the epoch: a duplicate, as in the window engine
                n["duplicate"] += 1
            elif rec["ts"] + L < w_prev:
                in_epoch.add(rec[idf])
                n["late"] += 1
            elif rec[idf] in seen:  # accepted in an earlier epoch (remembered: it is within lateness)
                in_epoch.add(rec[idf])
                n["duplicate"] += 1
            else:
                in_epoch.add(rec[idf])
                seen.add(rec[idf])
                acc.append(rec)
        top = max([top or NEG_INF] + [r["ts"] for b in batches[lo:hi] for r in b]) if hi > lo else top
        lo = hi
    assert lo == len(batches), (name, lo, len(batches))  # every chunk read
    return acc, dict(n)


def _conserved(store, name: str, want: dict, accepted: list[dict], idf: str) -> None:
    """events in = accepted + late + duplicate + malformed + filtered, each as the reference
    says; the output `records` holds every accepted record exactly once, unchanged."""
    m = Checkpoints(store, name).latest()
    assert m is not None
    t = m.totals
    got = {"in": t.events_in, "late": t.late["records"], "duplicate": t.duplicate, "filtered": t.filtered}
    got["malformed"] = t.malformed
    assert {k: v for k, v in got.items() if v} == want, name
    assert t.counted["records"] == len(accepted)
    assert t.events_in == t.counted["records"] + t.late["records"] + t.duplicate + t.malformed + t.filtered
    spec = find_pipeline(name, _DIR[0])
    rows = results.read_results(store, spec, "records").to_pylist()
    recs = sorted((json.loads(r["record"]) for r in rows), key=lambda r: r[idf])
    assert recs == sorted(accepted, key=lambda r: r[idf]), name
    assert all(r["window_start"] == json.loads(r["record"])["ts"] for r in rows)


_DIR: list[Path] = []


def _join_ref(left: list[dict], right: list[dict], size: int, slide: int, cols) -> list[tuple]:
    """Every pair with equal users in one window [s, s + size), s a multiple of the slide."""
    out = []
    for a in left:
        for b in right:
            if a["user"] != b["user"]:
                continue
            last = min(a["ts"], b["ts"]) // slide * slide  # the last window start holding both
            for s in range(last - size + slide, last + 1, slide):
                if s <= a["ts"] < s + size and s <= b["ts"] < s + size:
                    out.append((a["user"], s, s + size, *cols(a, b)))
    return sorted(out)


def _minutes_ref(clicks: list[dict]) -> list[dict]:
    """The raw pipeline `minutes` over every distinct click (lateness 1 h: none is late)."""
    seen, rows = set(), {}
    for c in clicks:
        if c["eid"] in seen or c["ts"] < T0:  # a repeat; before the start: malformed
            continue
        seen.add(c["eid"])
        ws = c["ts"] // 10_000 * 10_000
        r = rows.setdefault(
            (c["user"], ws), {"key": c["user"], "window_start": ws, "window_end": ws + 10_000, "n": 0, "total": 0}
        )
        r["n"] += 1
        r["total"] += c["amount"]
    return sorted(rows.values(), key=lambda r: (r["key"], r["window_start"]))


def _got(store, spec, window: str, cols: tuple[str, ...]) -> list[tuple]:
    return sorted(tuple(r[c] for c in cols) for r in results.read_results(store, spec, window).to_pylist())


@pytest.mark.parametrize("seed", range(SEEDS))
def test_joins_of_raw_streams_and_mixed_stages_equal_the_reference(
    store, spark, tmp_path: Path, seed: int, monkeypatch
) -> None:
    """Every Spark job's results here come to Wire through the store (handover.py: no room
    through Spark's driver), the pass-throughs' and the derived stages' alike; the rest of the
    suite runs with the default room."""
    monkeypatch.setenv("WIRE_DRIVER_RESULT_BYTES", "1")
    fetched = results_read(monkeypatch)
    rnd = random.Random(100 + seed)
    _write(tmp_path, JOINED, MINUTES, MIXED)
    _DIR[:] = [tmp_path]
    specs = {s.name: s for s in load_all(tmp_path)}
    # the expansion: a generated pipeline per raw input of a stage, the stages over them
    assert sorted(specs) == ["joined", "joined__clicks", "joined__views", "minutes", "mixed", "mixed__clicks"]
    assert {i.name: i.pipeline for i in specs["mixed"].derived} == {"clicks": "mixed__clicks", "minutes": "minutes"}
    clicks, views = _events(rnd, 180, "clicks"), _events(rnd, 120, "views")
    parts = rnd.randint(4, 7)
    batches = {"clicks": _split(rnd, clicks, parts), "views": _split(rnd, views, parts)}
    levels = {"clicks": stream_spec("clicks", "ts", "eid"), "views": stream_spec("views", "ts", "vid")}
    feeders = [specs[n] for n in ("joined__clicks", "joined__views", "mixed__clicks", "minutes")]
    for k in range(parts):
        for s in ("clicks", "views"):
            f = tmp_path / f"{s}{k}.jsonl"
            f.write_text("".join(json.dumps(r) + "\n" for r in batches[s][k]))
            streams.produce(store, levels[s], f)
        for spec in feeders + [specs["joined"], specs["mixed"]]:
            if rnd.random() < 0.6:  # epochs split at random: a stage between its feeders' epochs, or not
                engine.process(store, spec, spark, max_epochs=rnd.randint(1, 2))
    for s in ("clicks", "views"):
        streams.close_stream(store, s)
    for spec in feeders + [specs["joined"], specs["mixed"]]:
        while engine.process(store, spec, spark, max_epochs=20).committed:
            pass

    acc = {}
    for name, stream, idf, where in (
        ("joined__clicks", "clicks", "eid", None),
        ("joined__views", "views", "vid", None),
        ("mixed__clicks", "clicks", "eid", lambda r: r["amount"] > 0),
    ):
        acc[name], want = _accepted(store, name, batches[stream], idf, where)
        _conserved(store, name, want, acc[name], idf)
    n = _accepted(store, "joined__clicks", batches["clicks"], "eid")[1]
    assert n.get("late", 0) > 0 and n.get("duplicate", 0) > 0  # the cases happened
    # each stage's results came through the store, the window kernel's (`minutes`) too
    assert {k.split("/")[1] for k in fetched} == set(specs), fetched  # pipelines/<name>/...
    assert not [o.key for o in store.list("pipelines/") if "/results/" in o.key], "each read and deleted"

    # (a) clicks ⋈ views on user, tumbling and sliding
    cols = ("key", "window_start", "window_end", "eid", "vid", "amount", "page")

    def pair(a, b):
        return (a["eid"], b["vid"], a["amount"], b["page"])

    for window, size, slide in (("tumble", 10_000, 10_000), ("slide", 20_000, 10_000)):
        want = _join_ref(acc["joined__clicks"], acc["joined__views"], size, slide, pair)
        assert want and _got(store, specs["joined"], window, cols) == want, window

    # (b) a raw input beside a derived one: a window over both, one over the raw input, a join
    minutes = _minutes_ref([r for b in batches["clicks"] for r in b])
    got_minutes = results.read_results(store, specs["minutes"], "per_10s").to_pylist()
    assert [(r["key"], r["window_start"], r["n"], float(r["total"])) for r in got_minutes] == [
        (r["key"], r["window_start"], r["n"], float(r["total"])) for r in minutes
    ]
    mine = acc["mixed__clicks"]
    both: Counter = Counter()
    for t, user in [(c["ts"], c["user"]) for c in mine] + [(r["window_end"] - 1, r["key"]) for r in minutes]:
        both[(user, t // 30_000 * 30_000)] += 1
    want = sorted((u, s, s + 30_000, k) for (u, s), k in both.items())
    assert _got(store, specs["mixed"], "both", ("key", "window_start", "window_end", "rows")) == want
    spend: dict = {}
    for c in mine:
        x = spend.setdefault((c["user"], c["ts"] // 30_000 * 30_000), [0, 0])
        x[0], x[1] = x[0] + c["amount"], x[1] + 1
    want = sorted((u, s, s + 30_000, float(v[0]), v[1]) for (u, s), v in spend.items())
    got = [
        (*r[:3], float(r[3]), r[4])
        for r in _got(store, specs["mixed"], "spend", ("key", "window_start", "window_end", "total", "n"))
    ]
    assert got == want
    by_minute = {(r["key"], r["window_start"]): r["n"] for r in minutes}
    want = sorted(
        (c["user"], c["ts"] // 10_000 * 10_000, c["ts"] // 10_000 * 10_000 + 10_000, c["eid"], c["amount"],
         by_minute[(c["user"], c["ts"] // 10_000 * 10_000)])
        for c in mine
    )  # fmt: skip
    cols = ("key", "window_start", "window_end", "eid", "amount", "n")
    assert want and _got(store, specs["mixed"], "with_minute", cols) == want


# ---------------------------------------------------------------------------
# Errors: one line each


def _body(**change) -> dict:
    return {**COMMON, **JOINED, **change}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            _body(windows=[{**JOINED["windows"][0], "right": "nope"}]),
            "windows.tumble.right: no input named 'nope'; a join's sides are inputs of the pipeline",
        ),
        (
            _body(name="x" * 60),
            "the pipeline that reads this raw stream for stage '" + "x" * 60 + "' is named",
        ),
    ],
)
def test_a_bad_stage_with_raw_inputs_is_one_line(body: dict, says: str) -> None:
    with pytest.raises(WireInputError) as e:
        pipeline_from_dict(body)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_missing_upstream_and_a_generated_name_taken_are_one_line(tmp_path: Path) -> None:
    from wire_dagster.derived import check_graph, upstreams

    _write(tmp_path, {**MIXED, "inputs": [MIXED["inputs"][0], {**MIXED["inputs"][1], "pipeline": "gone"}]})
    spec = load_pipelines(tmp_path / "mixed.yaml")[-1]
    with pytest.raises(WireInputError, match=r"^inputs.minutes.pipeline: no pipeline named 'gone' in") as e:
        upstreams(spec)
    assert "\n" not in str(e.value)
    with pytest.raises(WireInputError, match=r"^pipeline 'mixed': inputs.minutes.pipeline names 'gone'"):
        check_graph(load_all(tmp_path))
    _write(tmp_path, MINUTES, {**MIXED, "inputs": [MIXED["inputs"][0], {**MIXED["inputs"][1], "output": "per_hour"}]})
    with pytest.raises(WireInputError, match=r"^inputs.minutes.output: pipeline 'minutes' has no window 'per_hour'"):
        upstreams(load_pipelines(tmp_path / "mixed.yaml")[-1])
    # a file declaring the generated pipeline's name
    _write(tmp_path, MIXED, {**MINUTES, "name": "mixed__clicks"})
    for load in (lambda: load_all(tmp_path), lambda: find_pipeline("mixed__clicks", tmp_path)):
        with pytest.raises(WireInputError) as e:
            load()
        msg = str(e.value)
        assert msg.startswith("pipeline 'mixed__clicks', generated by ") and "mixed.yaml" in msg
        assert "is also declared by" in msg and "\n" not in msg


def test_files_without_raw_inputs_in_a_stage_load_as_before(tmp_path: Path) -> None:
    """A pipeline of raw inputs only, no join, stays one pipeline on the raw engine; a join of
    derived inputs stays one stage; the expansion keeps the stage's own settings."""
    _write(tmp_path, MINUTES, JOINED)
    (m,) = load_pipelines(tmp_path / "minutes.yaml")
    assert m.name == "minutes" and not m.derived and not m.computations
    gen_c, gen_v, stage = load_pipelines(tmp_path / "joined.yaml")
    assert (gen_c.name, gen_v.name) == ("joined__clicks", "joined__views")
    assert gen_c.stream == "clicks" and gen_c.key_fields == ("user",) and gen_c.id_field == "eid"
    assert gen_c.allowed_lateness == L and gen_c.max_out_of_orderness == OOO and gen_c.partition == 60_000
    assert [c.code for c in gen_c.computations] == ["wire_dagster.passthrough:Records"]
    assert gen_c.source == stage.source == str(tmp_path / "joined.yaml")
    # `wire produce --pipeline joined` names what to produce to instead (one line)
    with pytest.raises(WireInputError, match=r"^--pipeline: 'joined' reads its raw streams through joined__clicks, "):
        stage.own_stream("produce to")
    assert gen_c.own_stream("produce to") == "clicks"
    assert [(i.name, i.pipeline, i.output, i.key_fields) for i in stage.inputs] == [
        ("clicks", "joined__clicks", "records", ("user",)),
        ("views", "joined__views", "records", ("user",)),
    ]


# ---------------------------------------------------------------------------
# The CLI: `wire tick` of the stage, killed at random moments, then run to the end


def _tick(env: dict, pipeline: str) -> str:
    p = run_wire(["tick", "--pipeline", pipeline], env, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p.stdout


def test_wire_tick_of_a_join_of_raw_streams_killed_then_rerun(store, cli_env, spark_remote, tmp_path: Path) -> None:
    """`wire produce` both streams, `wire tick --pipeline joined` (its generated pipelines
    first), more events with retries and late ones, the streams closed; then kill -9 of the real
    `wire tick` at random moments (2 by default, WIRE_RAW_JOIN_KILLS) and a rerun: the results
    equal the reference, each accepted record once in `records`, the dead letters name the
    duplicates and the late ones."""
    pdir = tmp_path / "pipelines"
    pdir.mkdir()
    _write(pdir, JOINED)
    _DIR[:] = [pdir]
    env = dict(cli_env, WIRE_PIPELINES=str(pdir), DAGSTER_HOME=str(tmp_path / "dagster-home"))
    env.pop("WIRE_SPARK_REMOTE", None)
    if spark_remote:
        env["WIRE_SPARK_REMOTE"] = spark_remote
    else:
        env["WIRE_SPARK_MASTER"] = "local[2]"
    rnd = random.Random(int(os.environ.get("WIRE_SEED", "3")))
    clicks, views = _events(rnd, 60, "clicks"), _events(rnd, 40, "views")
    batches = {"clicks": _split(rnd, clicks, 2), "views": _split(rnd, views, 2)}

    def produce(k: int) -> None:
        for s in ("clicks", "views"):
            f = tmp_path / f"{s}{k}.jsonl"
            f.write_text("".join(json.dumps(r) + "\n" for r in batches[s][k]))
            run_wire(["produce", "--stream", s, "--file", str(f)], env, check=True)

    produce(0)
    t0 = time.monotonic()
    out = _tick(env, "joined")
    took = time.monotonic() - t0  # a tick of the three pipelines' runs, the first: the slowest
    for name in ("joined__clicks", "joined__views"):  # ticked first, by the stage's tick
        assert f"run {name}" in out, out
    produce(1)
    for s in ("clicks", "views"):
        run_wire(["close", "--stream", s], env, check=True)

    # The moments are drawn within the life of that tick, which did the same work on batch 0 (a
    # span scaled from `wire status` instead let both ticks end before their moment in a CI run).
    kills = int(os.environ.get("WIRE_RAW_JOIN_KILLS", "2"))
    assert kill_at_random_moments(["tick", "--pipeline", "joined"], env, rnd, kills, (0.1 * took, 0.6 * took)) >= 1
    for _ in range(4):  # until in sync: the sensors request nothing more
        if "sensor requested no run" in _tick(env, "joined"):
            break
    else:
        raise AssertionError("wire tick --pipeline joined still requests runs after 4 ticks")

    specs = {s.name: s for s in load_all(pdir)}
    acc = {}
    for name, stream, idf in (("joined__clicks", "clicks", "eid"), ("joined__views", "views", "vid")):
        acc[name], want = _accepted(store, name, batches[stream], idf)
        _conserved(store, name, want, acc[name], idf)
        p = run_wire(["dlq", "--pipeline", name, "--format", "jsonl"], env, check=True)
        reasons = Counter(json.loads(ln)["reason"].split(":")[0] for ln in p.stdout.splitlines() if ln.strip())
        assert dict(reasons) == {k: want[k] for k in ("late", "duplicate", "malformed") if want.get(k)}, name
    want = _join_ref(acc["joined__clicks"], acc["joined__views"], 10_000, 10_000, lambda a, b: (a["eid"], b["vid"]))
    p = run_wire(["read", "--pipeline", "joined", "--window", "tumble", "--format", "jsonl"], env, check=True)
    got = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]
    assert len(got) == len({(r["window_start"], r["eid"], r["vid"]) for r in got})  # no row twice
    got_rows = _got(store, specs["joined"], "tumble", ("key", "window_start", "window_end", "eid", "vid"))
    assert want and got_rows == want


# ---------------------------------------------------------------------------
# The pass-through's vectorised delivery equals the per-record one


def test_the_vectorised_pass_through_equals_delivery_record_by_record(tmp_path: Path) -> None:
    """passthrough.bucket (DuckDB over the bucket, no per-record call) against computestage's
    per-record delivery (run_key, screen) of the same class: the same produced rows, carried
    state, dead letters and counters, epoch after epoch (the state carried by each path), over
    random records with disorder, repeats (in and across epochs), late ones, filtered and
    malformed ones, null keys and ids, two segments; the pass-through on one DuckDB thread (a
    job of many tasks) and on two (the only task of a job: kernel.task_threads). Each record's
    text is canonical, as computestage.read_records reads it for the pass-through
    (tests/test_passthrough_speed.py)."""
    from dataclasses import replace

    import pyarrow as pa

    from wire_dagster.computestage import CARRIED_SCHEMA, RECORD_SCHEMA, load, run_bucket
    from wire_dagster.passthrough import Records

    class RecordByRecord(Records):
        bucket = None  # pyright: ignore[reportAssignmentType]  computestage then delivers record by record

    _write(tmp_path, JOINED)
    fast = load(load_pipelines(tmp_path / "joined.yaml")[0])
    slow = replace(fast, classes=(RecordByRecord,))

    def norm(out: dict) -> dict:
        got = {}
        for (kind, _), t in out.items():
            rows = t.to_pylist()
            if kind == "carried":  # the same JSON values (an id memory's text may differ in form)
                rows = [dict(x, data=json.loads(x["data"])) for x in rows]
            got[kind] = sorted(rows, key=lambda x: json.dumps(x, sort_keys=True, default=str))
        return got

    totals: Counter = Counter()
    for seed in range(8):
        rnd = random.Random(seed)
        carried = {k: CARRIED_SCHEMA.empty_table() for k in ("fast", "fast2", "slow")}
        w, top, i = NEG_INF, None, 0
        for epoch in range(6):
            rows = []
            for r in range(rnd.randint(0, 60)):
                i += 1
                t = T0 + i * 300 + rnd.randrange(-2_000, 2_000)
                t -= rnd.choice([4_000, 9_000, 30_000]) if rnd.random() < 0.15 else 0
                err = "filtered" if rnd.random() < 0.05 else "malformed: bad" if rnd.random() < 0.03 else None
                eid = None if rnd.random() < 0.05 else f"e{rnd.randrange(i)}" if rnd.random() < 0.1 else f"e{i}"
                user = rnd.choice(["u1", "u2", None])
                rec = {"ts": t, "eid": eid, "user": user, "x": rnd.random(), "z": {"a": [1, "é"]}}
                rows.append(
                    {"_t": t, "_key": user, "_id": None if err else eid, "_row": r, "_err": err,
                     "_src": "text" if err and err != "filtered" else None, "_seg": rnd.choice(["0", "1"]),
                     "_seq": epoch, "_json": None if err else json.dumps(rec, sort_keys=True)}
                )  # fmt: skip
                top = max(top or t, t)
            events = pa.Table.from_pylist(rows, RECORD_SCHEMA)
            w_new = INF if epoch == 5 else max(w, top - OOO if top is not None else NEG_INF)
            out = {
                "fast": run_bucket(fast, fast.instances(), events, carried["fast"], w, w_new),
                # as the only task of a job runs it: DuckDB on two threads
                "fast2": run_bucket(fast, fast.instances(), events, carried["fast2"], w, w_new, threads=2),
                "slow": run_bucket(slow, slow.instances(), events, carried["slow"], w, w_new),
            }
            assert norm(out["fast"]) == norm(out["fast2"]) == norm(out["slow"]), (seed, epoch)
            carried = {k: v[("carried", "")] for k, v in out.items()}
            for s in out["fast"][("stats", "")].to_pylist():
                totals.update({k: s[k] for k in ("delivered", "buffered", "duplicate", "dropped_late")})
            w = w_new
    assert all(totals[k] > 0 for k in ("delivered", "buffered", "duplicate", "dropped_late")), totals


def test_the_lineage_is_stream_then_records_then_the_stage(tmp_path: Path) -> None:
    """In the Dagster code location the generated pipelines are pipelines like any other: their
    `records` assets read the raw streams, the stage's windows read those (and `minutes`)."""
    import dagster as dg

    from definitions import build_definitions

    _write(tmp_path, JOINED, MINUTES, MIXED)
    defs = build_definitions(tmp_path)
    graph = defs.resolve_asset_graph()

    def parents(*key: str) -> set[str]:
        return {"/".join(k.path) for k in graph.get(dg.AssetKey(list(key))).parent_keys}

    assert parents("joined__clicks", "records") == {"streams/clicks"}
    assert parents("joined__views", "records") == {"streams/views"}
    assert parents("joined", "tumble") == {"joined__clicks/records", "joined__views/records"}
    assert parents("mixed", "with_minute") == {"mixed__clicks/records", "minutes/per_10s"}
    from sensors import sensor_name

    specs = {s.name: s for s in load_all(tmp_path)}
    for spec in specs.values():  # every pipeline, the generated ones too, has its own sensor
        assert defs.resolve_sensor_def(sensor_name(spec)).name == sensor_name(spec)


def test_a_stages_derived_fields_are_applied_once(store, spark, tmp_path: Path) -> None:
    """`fields:` of a stage with raw inputs are set where the raw records are read (the generated
    pipeline, whose filter may name them) and reach the stage's windows and joins as record
    fields: a field that redefines a record's own (`amount: amount * 2`) is applied once, and a
    filter over a derived field keeps what it should."""
    body = {
        **JOINED,
        "inputs": [{**CLICKS, "where": "big"}, VIEWS],
        "fields": {"amount": "amount * 2", "big": "amount >= 10"},
        "windows": [JOINED["windows"][0]],
    }
    _write(tmp_path, body)
    specs = {s.name: s for s in load_all(tmp_path)}
    clicks = [{"ts": T0 + 1_000 * i, "eid": f"c{i}", "user": "u", "amount": 5 * i} for i in range(5)]
    views = [{"ts": T0 + 500, "vid": "v0", "user": "u", "page": "p"}]
    for s, idf, rows in (("clicks", "eid", clicks), ("views", "vid", views)):
        f = tmp_path / f"{s}.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        streams.produce(store, stream_spec(s, "ts", idf), f)
        streams.close_stream(store, s)
    for name in ("joined__clicks", "joined__views", "joined"):
        while engine.process(store, specs[name], spark, max_epochs=20).committed:
            pass
    got = _got(store, specs["joined"], "tumble", ("eid", "amount"))
    # big: the original amount (5 i) >= 10, so i >= 2; amount doubled once
    assert got == [(f"c{i}", 10 * i) for i in range(2, 5)], got
