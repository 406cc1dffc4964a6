"""User computations (issue 24, DESIGN §4 "Computation API", §6): MillWheel's per-key code with
state and event-time timers, exactly once.

The expectation is a reference executor written here, apart from Wire's (`reference`): one key
at a time, all of the key's events at once in (event time, position) order, each timer fired
right before the first record later than it (ties by tag), everything fired at the end. Wire
runs the same classes epoch by epoch — random epoch splits, random disorder within the bound,
the per-key executor alone (`run_bucket`) and the whole stage on Spark with its two-phase
commits — and must produce the same records, with the same ids:

    events   ──●──●─●────●──●───●──────▶ t        reference: all at once, in t order
    epochs   |  W1   |   W2    |  W3 ... |        Wire: a record waits until W passes it,
                                                  a timer fires once W passes it
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from wire_dagster import computestage, engine, replay, streams
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.computation import Timer, load_class
from wire_dagster.computestage import CARRIED_SCHEMA, RECORD_SCHEMA, Loaded, run_bucket
from wire_dagster.errors import WireInputError
from wire_dagster.spec import ComputationSpec, load_pipeline, pipeline_from_dict, stream_spec
from wire_dagster.timeutil import INF, NEG_INF

SEEDS = int(os.environ.get("WIRE_COMPUTE_SEEDS", "1"))  # `make test-long`: e.g. 10
EXAMPLES = Path(__file__).resolve().parent.parent / "pipelines" / "computations"
T0 = 1_767_225_600_000  # 2026-01-01
OOO = 2_000  # max out-of-orderness of the tests' pipelines

# A random "timer zoo": each record says what to do (set, reset, clear a timer at a random
# time, a timer behind the record, produce, raise); timers produce, chain new timers, and
# sometimes raise.
ZOO = """
from wire_dagster.computation import Computation


class TimerZoo(Computation):
    def process_record(self, ctx, record):
        ctx.state["n"] = ctx.state.get("n", 0) + 1
        op, tag, d = record["op"], record["tag"], record["d"]
        if op == "set":
            ctx.set_timer(tag, ctx.time + d)
        elif op == "behind":  # a timer already due: it fires before the next later record
            ctx.set_timer(tag, ctx.time - d)
        elif op == "clear":
            ctx.clear_timer(tag)
        elif op == "emit":
            ctx.produce({"n": ctx.state["n"], "v": record["v"]}, "zoo")
            ctx.produce({"echo": record["v"]}, "zoo", time=ctx.time + 1)
        if record["v"] % 1000 == 7:
            ctx.produce({"never": True}, "zoo")  # rolled back with the state: the call raises
            raise ValueError(f"boom at {record['v']}")
        if ctx.is_late:
            ctx.produce({"late": record["v"], "n": ctx.state["n"]}, "zoo")

    def process_timer(self, ctx, timer):
        ctx.state["fired"] = ctx.state.get("fired", 0) + 1
        ctx.produce({"tag": timer.tag, "t": timer.time, "fired": ctx.state["fired"], "n": ctx.state.get("n")}, "zoo")
        if ctx.state["fired"] % 3 == 0:
            ctx.set_timer("chain", timer.time + 700)
        if timer.tag == "c" and ctx.state["fired"] % 5 == 0:
            raise RuntimeError("timer c fails every fifth firing")
"""


def _modules(d: Path) -> Path:
    """The example modules and the zoo, beside the tests' pipeline files."""
    d.mkdir(parents=True, exist_ok=True)
    for f in ("quiet.py", "spike.py"):
        shutil.copy(EXAMPLES / f, d / f)
    (d / "zoo.py").write_text(ZOO)
    return d


COMPS = (
    ComputationSpec(name="quiet", input="clicks", code="quiet:QuietAlert", outputs=("alerts",)),
    ComputationSpec(name="spikes", input="clicks", code="spike:SpikeDetector", outputs=("spikes",)),
    ComputationSpec(name="zoo", input="clicks", code="zoo:TimerZoo", outputs=("zoo",)),
)


def _loaded(d: Path) -> Loaded:
    classes = tuple(load_class(c.code, str(d), c.code) for c in COMPS)
    return Loaded(COMPS, classes, str(d))


# ---------------------------------------------------------------------------
# The reference executor


class _RefCtx:
    def __init__(self, name, key, outputs, state, timers):
        self.key, self.state, self.watermark, self.is_late = key, state, None, False
        self.time, self.origin, self.produced = 0, "", []
        self._name, self._outputs, self._timers = name, outputs, timers

    def set_timer(self, tag, time):
        self._timers[tag] = (time, "t:" + hashlib.sha256(f"{self.origin}\x00{tag}\x00{time}".encode()).hexdigest()[:20])

    def clear_timer(self, tag):
        self._timers.pop(tag, None)

    def produce(self, record, output, time=None):
        assert output in self._outputs
        rid = f"{self._name}|{self.origin}|{len(self.produced)}"
        self.produced.append(
            (output, self.key, self.time if time is None else time, rid, json.loads(json.dumps(record)))
        )


def reference(cls, spec: ComputationSpec, events: list[dict]) -> tuple[list[tuple], list[tuple]]:
    """(produced, failures) of `cls` over `events` ({t, key, pos: (seg, seq, row), rec, late}),
    all at once per key: produced as (output, key, time, id, json record), failures as
    (computation, reason, position or timer)."""
    produced: list[tuple] = []
    failures: list[tuple] = []
    by_key: dict = {}
    for e in events:
        by_key.setdefault(e["key"], []).append(e)
    for key in sorted(by_key, key=lambda k: (k is not None, k or "")):
        _RefKey(cls(), spec, key, produced, failures).run(by_key[key])
    return produced, failures


class _RefKey:
    """One key of the reference: its events in (time, position) order, timers interleaved."""

    def __init__(self, comp, spec: ComputationSpec, key, produced: list, failures: list):
        self.comp, self.spec, self.key = comp, spec, key
        self.state: dict = {}
        self.timers: dict = {}
        self.produced, self.failures = produced, failures

    def call(self, fn, arg, t: int, origin: str, what, late: bool = False) -> None:
        saved, saved_timers = copy.deepcopy(self.state), dict(self.timers)
        ctx = _RefCtx(self.spec.name, self.key, self.spec.outputs, self.state, self.timers)
        ctx.time, ctx.origin, ctx.is_late = t, origin, late
        try:
            fn(ctx, arg)
            json.dumps(ctx.state)
            self.state = ctx.state
        except Exception as exc:
            self.state = saved
            self.timers.clear()
            self.timers.update(saved_timers)
            self.failures.append((self.spec.name, f"error: {type(exc).__name__}: {exc}", what))
            return
        self.produced.extend((o, k, tm, i, json.dumps(r, sort_keys=True)) for o, k, tm, i, r in ctx.produced)

    def fire(self, limit: int) -> None:
        while True:
            due = sorted((t, tag) for tag, (t, _) in self.timers.items() if t < limit)
            if not due:
                return
            t, tag = due[0]
            _, origin = self.timers.pop(tag)
            self.call(self.comp.process_timer, Timer(tag, t), t, origin, ("timer", tag, t))

    def run(self, events: list[dict]) -> None:
        for e in sorted(events, key=lambda e: (e["t"], e["pos"])):
            self.fire(e["t"])
            seg, seq, row = e["pos"]
            self.call(
                self.comp.process_record, dict(e["rec"]), e["t"], f"r:{seg}/{seq}/{row}", e["pos"], e.get("late", False)
            )
        self.fire(INF)


# ---------------------------------------------------------------------------
# Events


def _events(rnd: random.Random, n: int, users: int = 4, late: int = 0) -> list[dict]:
    """Clicks in arrival order: rising time with disorder within the bound (never late), bursts
    for the spike detector, quiet gaps for the alert, and zoo operations; `late` events far
    behind, placed late in the arrival order."""
    out = []
    t = T0 + 3_600_000
    for i in range(n):
        t += rnd.choice([50, 200, 900, 3_000]) if rnd.random() > 0.02 else rnd.choice([700_000, 2_000_000])
        user = f"u{rnd.randrange(users)}"
        op = rnd.choice(["set", "set", "clear", "emit", "behind", "none"])
        out.append(
            {
                "ts": t + 50 * rnd.randrange(0, OOO // 100),  # on a 50 ms grid: timers tie with records
                "event_id": f"e{i}",
                "user_id": user,
                "op": op,
                "tag": rnd.choice("abc"),
                "d": rnd.choice([50, 500, 5_000, 120_000]),
                "v": i,
            }
        )
    for j in range(late):  # arrival order: in the second half; time: before every other event
        at = rnd.randrange(n // 2, n)
        row = {**out[at], "ts": T0 + 3_540_000 - j, "event_id": f"late{j}", "user_id": "late-user", "v": 100_000 + j}
        out.insert(at + 1, row)
    return out


# ---------------------------------------------------------------------------
# The per-key executor alone, epoch by epoch (no Spark): random splits and disorder


def _table(rows: list[dict], seq: int) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "_t": r["ts"],
                "_key": r["user_id"],
                "_id": r["event_id"],
                "_row": i,
                "_err": None,
                "_src": None,
                "_seg": "0",
                "_seq": seq,
                "_json": json.dumps(r),
            }
            for i, r in enumerate(rows)
        ],
        RECORD_SCHEMA,
    )


def _simulate(loaded: Loaded, events: list[dict], rnd: random.Random) -> tuple[list[tuple], list[dict], list[bool]]:
    """Wire's epochs over `events` in arrival order, split at random: W = max t - OOO, then +inf."""
    comps = loaded.instances()
    carried = CARRIED_SCHEMA.empty_table()
    produced, dead, late_seen = [], [], []
    w, max_t, i, seq = NEG_INF, NEG_INF, 0, 0
    while True:
        n = rnd.randint(0, 40) if i < len(events) else 0
        chunk = events[i : i + n]
        i += n
        if chunk:
            max_t = max(max_t, *(e["ts"] for e in chunk))
        w_new = max(w, max_t - OOO) if i < len(events) else INF
        late_seen += [e["ts"] < w for e in chunk]
        out = run_bucket(loaded, comps, _table(chunk, seq), carried, w, w_new)
        seq += 1
        carried = out[("carried", "")]
        produced += [
            (r["output"], r["key"], r["window_start"], r["id"], r["record"]) for r in out[("produced", "")].to_pylist()
        ]
        dead += out[("dead", "")].to_pylist()
        w = w_new
        if w == INF:
            assert carried.num_rows == 0 or all(not json.loads(d)["timers"] for d in carried["data"].to_pylist())
            return produced, dead, late_seen


def _with_positions(events: list[dict], rnd_splits: list[int]) -> list[dict]:
    """The reference's view of the events, with the positions `_simulate` gives them."""
    out, i, seq = [], 0, 0
    for n in rnd_splits:
        for row, r in enumerate(events[i : i + n]):
            out.append({"t": r["ts"], "key": r["user_id"], "pos": ("0", seq, row), "rec": r})
        i += n
        seq += 1
    return out


def _splits(seed: int, events: list[dict]) -> list[int]:
    """The chunk sizes `_simulate(seed)` draws (the same random sequence, replayed)."""
    rnd = random.Random(seed)
    sizes, i = [], 0
    while True:
        n = rnd.randint(0, 40) if i < len(events) else 0
        sizes.append(n)
        i += n
        if i >= len(events) and n == 0:
            return sizes


def _sorted(rows):
    return sorted(rows, key=lambda r: (r[0], str(r[1]), r[2], r[3]))


@pytest.mark.parametrize("seed", range(20 * SEEDS))
def test_the_executor_equals_the_reference_under_random_epoch_splits(tmp_path: Path, seed: int) -> None:
    loaded = _loaded(_modules(tmp_path))
    events = _events(random.Random(seed), 400)
    produced, dead, late_seen = _simulate(loaded, events, random.Random(1000 + seed))
    assert not any(late_seen)  # disorder within the bound: nothing arrives behind W
    positioned = _with_positions(events, _splits(1000 + seed, events))
    want, failures = [], []
    for spec, cls in zip(loaded.specs, loaded.classes, strict=True):
        p, f = reference(cls, spec, positioned)
        want += [(o, k, t, i, r) for o, k, t, i, r in p]
        failures += f
    assert _sorted(produced) == _sorted(want)
    assert {c for c, *_ in want} >= {"alerts", "zoo"}  # the examples did something
    assert len({r[3] for r in produced}) == len(produced)  # ids are unique
    # every failure is one dead letter, with its reason and the computation's name
    got_dead = sorted((d["window"], d["reason"]) for d in dead)
    assert got_dead == sorted((c, reason) for c, reason, _ in failures)
    assert any("boom at" in r for _, r in got_dead) or len(events) < 1000


def test_late_records_are_delivered_in_the_epoch_they_arrive_and_flagged(tmp_path: Path) -> None:
    """A record behind W_prev is delivered (not dropped, not a dead letter) in the epoch it
    arrives, in (time, position) order with that epoch's records, with ctx.is_late."""
    loaded = _loaded(_modules(tmp_path))
    zoo_only = Loaded(loaded.specs[2:], loaded.classes[2:], loaded.directory)
    comps = zoo_only.instances()
    base = {"user_id": "u", "op": "none", "tag": "a", "d": 1}

    def epoch(rows, carried, w_prev, w_new, seq):
        out = run_bucket(zoo_only, comps, _table(rows, seq), carried, w_prev, w_new)
        return out[("carried", "")], [json.loads(r) for r in out[("produced", "")]["record"].to_pylist()]

    #   epoch 1: W -inf -> T0+10s     records at 1 s and 12 s (12 s waits: it is past W)
    #   epoch 2: W 10s -> 20s         records at 15 s, and 3 s: late (behind W = 10 s)
    rows1 = [{**base, "ts": T0 + 1_000, "event_id": "a", "v": 1}, {**base, "ts": T0 + 12_000, "event_id": "b", "v": 2}]
    carried, got = epoch(rows1, CARRIED_SCHEMA.empty_table(), NEG_INF, T0 + 10_000, 0)
    assert got == []  # the 1 s record was delivered (n = 1), not late; 12 s is buffered
    assert json.loads(carried["data"][0].as_py())["buffer"][0][0] == T0 + 12_000
    rows2 = [{**base, "ts": T0 + 15_000, "event_id": "c", "v": 3}, {**base, "ts": T0 + 3_000, "event_id": "d", "v": 4}]
    carried, got = epoch(rows2, carried, T0 + 10_000, T0 + 20_000, 1)
    # delivered in time order: 3 s (late, the second record of the key: n = 2), then 12 s, 15 s
    assert got == [{"late": 4, "n": 2}]
    assert json.loads(carried["data"][0].as_py())["state"]["n"] == 4


# ---------------------------------------------------------------------------
# The stage on Spark, with its commits


COMMON = {
    "stream": "clicks",
    "event": {"key": "user_id", "time": "ts", "id": "event_id"},
    "watermark": {"max_out_of_orderness": f"{OOO}ms", "idle_timeout": "1h"},
    "partition": "5m",
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-03T00:00:00Z",
}


def _pipeline(d: Path, comps=COMPS, name: str = "users") -> Path:
    body = {
        "name": name,
        **COMMON,
        "computations": [{"name": c.name, "input": c.input, "code": c.code, "outputs": list(c.outputs)} for c in comps],
    }
    f = d / f"{name}.yaml"
    f.write_text(yaml.safe_dump(body))
    return f


def _positions(store, spec) -> dict[str, tuple[str, int, int]]:
    """event id -> its source position (segment, chunk, row) as stored."""
    from wire_dagster.extract import read_chunk

    out = {}
    for seg, view in streams.read_stream(store, spec.stream, {}).items():
        for meta in view.chunks:
            t = read_chunk(store, spec, meta)
            for i, r in zip(t["_id"].to_pylist(), t["_row"].to_pylist(), strict=True):
                out[i] = (seg, meta.seq, r)
    return out


def _committed(store, spec) -> list[tuple]:
    rows = []
    for w in spec.windows:
        for r in computestage.read_output(store, spec, w.name):
            rows.append((w.name, r["key"], r["window_start"], r["id"], json.dumps(r["record"], sort_keys=True)))
    return _sorted(rows)


def _produce_in_epochs(store, spec, tmp_path: Path, events: list[dict], rnd: random.Random, spark) -> None:
    level = stream_spec("clicks", "ts", "event_id", spec)
    i = 0
    while i < len(events):
        n = rnd.randint(40, 160)
        f = tmp_path / f"e{i}.jsonl"
        f.write_text("".join(json.dumps(e) + "\n" for e in events[i : i + n]))
        streams.produce(store, level, f)
        i += n
        computestage.process(store, spec, spark, max_epochs=rnd.randint(1, 3), single_task=rnd.random() < 0.5)
    streams.close_stream(store, "clicks")
    while engine.process(store, spec, spark, max_epochs=20).committed:
        pass


@pytest.mark.parametrize("seed", range(SEEDS))
def test_the_stage_on_spark_equals_the_reference_and_replays_exactly(store, spark, tmp_path: Path, seed: int) -> None:
    rnd = random.Random(seed)
    spec = load_pipeline(_pipeline(_modules(tmp_path)))
    events = _events(rnd, 400, late=3)
    _produce_in_epochs(store, spec, tmp_path, events, rnd, spark)
    pos = _positions(store, spec)
    m = Checkpoints(store, spec.name).latest()
    assert m is not None and m.watermark == INF
    # the reference: the on-time events all at once; the late ones are delivered where they
    # arrived, so they are compared apart: each one was delivered once, flagged late
    late_ids = {e["event_id"] for e in events if e["event_id"].startswith("late")}
    on_time = [
        {"t": e["ts"], "key": e["user_id"], "pos": pos[e["event_id"]], "rec": e}
        for e in events
        if e["event_id"] not in late_ids
    ]
    got = _committed(store, spec)
    late_rows = [r for r in got if '"late":' in r[4]]
    assert sorted(json.loads(r[4])["late"] for r in late_rows) == sorted(100_000 + j for j in range(3))
    for spec_c, cls in zip(COMPS[:2], _loaded(tmp_path).classes[:2], strict=True):
        # quiet and spikes ignore lateness: a late click only moves state the reference does not
        # see, so compare the keys no late event touched
        touched = {e["user_id"] for e in events if e["event_id"] in late_ids}
        want, _ = reference(cls, spec_c, on_time)
        want = [w for w in want if w[1] not in touched]
        mine = [r for r in got if r[0] == spec_c.outputs[0] and r[1] not in touched]
        assert _sorted(mine) == _sorted(want), spec_c.name
    assert any(r[0] == "alerts" for r in got)
    # conservation: every record read is accounted once, per computation
    totals = m.totals
    for c in COMPS:
        assert totals.events_in == totals.counted[c.name] + totals.malformed + totals.filtered
    assert len({r[3] for r in got}) == len(got)  # no duplicate id
    # a backfill replays the timeline with the same code: the same bytes, nothing committed
    from wire_dagster.backfill import backfill, committed_partitions

    parts = committed_partitions(m)
    assert parts and backfill(store, spec, spark, parts) is None
    # a rewind to epoch 1 replays the same epochs: the same records, the same ids
    replay.rewind(store, spec, 1)
    while engine.process(store, spec, spark, max_epochs=5).committed:
        pass
    assert _committed(store, spec) == got
    # changed code: a backfill commits what the new code produces, the records it no longer
    # produces gone (here: the zoo no longer echoes)
    (tmp_path / "zoo.py").write_text(
        ZOO.replace('ctx.produce({"echo": record["v"]}, "zoo", time=ctx.time + 1)', "pass")
    )
    spec = load_pipeline(tmp_path / "users.yaml")
    m2 = backfill(store, spec, spark, committed_partitions(Checkpoints(store, spec.name).latest()))
    assert m2 is not None and m2.kind == "backfill" and "zoo" in m2.changed
    after = _committed(store, spec)

    # (the ids of a call's later records move up: each id is its index in the call)
    def no_id(rows):
        return sorted((o, str(k), t, r) for o, k, t, _, r in rows)

    assert no_id(r for r in got if '"echo"' not in r[4]) == no_id(after) and len(after) < len(got)


def test_user_errors_become_dead_letters_and_the_rest_goes_on(store, spark, tmp_path: Path) -> None:
    """One record in a thousand raises: each is one dead letter `error: ValueError: ...` with its
    position and the computation's name; the key's state is as before it; the rest is processed."""
    spec = load_pipeline(_pipeline(_modules(tmp_path), comps=COMPS[2:], name="zoo"))
    rnd = random.Random(7)
    events = _events(rnd, 3_000, users=6)
    events.insert(100, {"event_id": "bad", "user_id": "u1"})  # malformed: no time (refused at produce)
    level = stream_spec("clicks", "ts", "event_id", spec)
    f = tmp_path / "all.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    streams.produce(store, level, f)
    streams.close_stream(store, "clicks")
    computestage.process(store, spec, spark, max_epochs=5, single_task=False)  # by key bucket
    m = Checkpoints(store, spec.name).latest()
    assert m is not None and m.watermark == INF
    from wire_dagster.results import read_dead_letters

    letters = [d for d in read_dead_letters(store, spec) if (d["reason"] or "").startswith("error:")]
    boom = sorted(json.loads(d["record"])["v"] for d in letters if "boom" in d["reason"])
    assert boom == [v for v in range(3_000) if v % 1000 == 7]
    assert all(d["window"] == "zoo" for d in letters)
    assert all(
        d["reason"] == f"error: ValueError: boom at {json.loads(d['record'])['v']}"
        for d in letters
        if "boom" in d["reason"]
    )
    pos = _positions(store, spec)
    for d in letters:
        if "boom" in d["reason"]:
            assert (d["segment"], d["chunk"], d["row"]) == pos[json.loads(d["record"])["event_id"]]
    # the reference agrees on everything produced and on every failure
    on_time = [{"t": e["ts"], "key": e["user_id"], "pos": pos[e["event_id"]], "rec": e} for e in events if "ts" in e]
    want, failures = reference(_loaded(tmp_path).classes[2], COMPS[2], on_time)
    assert _committed(store, spec) == _sorted([(o, k, t, i, r) for o, k, t, i, r in want])
    assert len(letters) == len(failures)
    c = m.totals
    assert c.events_in == len(events) - 1
    assert any(d["reason"].startswith("malformed") for d in read_dead_letters(store, spec))
    assert c.events_in == c.counted["zoo"] + c.malformed + c.filtered
    stats = m.computed["zoo"]
    assert stats["buffered"] == 0 and stats["output_watermark"] == INF


# ---------------------------------------------------------------------------
# One-line errors


def test_code_that_cannot_be_loaded_fails_the_run_in_one_line(tmp_path: Path) -> None:
    _modules(tmp_path)
    (tmp_path / "broken.py").write_text("raise ImportError('no numpy here')\n")
    (tmp_path / "half.py").write_text("class Half:\n    pass\n")
    for code, says in (
        ("nowhere:Thing", "cannot import module 'nowhere'"),
        ("broken:Thing", "cannot import module 'broken' (ImportError: no numpy here)"),
        ("quiet:Nobody", "module 'quiet' has no class 'Nobody'"),
        ("half:Half", "class 'Half' has no method process_record or process_timer"),
    ):
        comp = ComputationSpec(name="c", input="clicks", code=code, outputs=("o",))
        f = _pipeline(tmp_path, comps=(comp,), name="bad")
        spec = load_pipeline(f)
        with pytest.raises(WireInputError) as e:
            engine.process(None, spec, None)  # pyright: ignore[reportArgumentType]  refused before the store is used
        text = str(e.value)
        assert says in text and str(f) in text and repr(code) in text and "\n" not in text


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"windows": [{"name": "w", "type": "tumbling", "size": "1m", "aggregates": {"n": "count"}}]}, "not built yet"),
        ({"computations": [{"name": "c", "code": "quiet", "outputs": ["o"]}]}, "is not module:Class"),
        ({"computations": [{"name": "c", "code": "q:Q", "outputs": []}]}, "computations.c.outputs"),
        ({"computations": [{"name": "c", "input": "x", "code": "q:Q", "outputs": ["o"]}]}, "no input named 'x'"),
        (
            {
                "computations": [
                    {"name": "c", "code": "q:Q", "outputs": ["o"]},
                    {"name": "d", "code": "q:Q", "outputs": ["o"]},
                ]
            },
            "produced by two computations",
        ),
    ],
)
def test_a_bad_computations_section_is_one_line(change: dict, says: str) -> None:
    body = {"name": "p", **COMMON, "computations": [{"name": "c", "code": "q:Q", "outputs": ["o"]}], **change}
    with pytest.raises(WireInputError) as e:
        pipeline_from_dict(body)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_the_examples_load() -> None:
    from wire_dagster.spec import load_all

    specs = {s.name: s for s in load_all(EXAMPLES)}
    assert set(specs) == {"quiet_users", "click_spikes"}
    assert [w.type for w in specs["quiet_users"].windows] == ["output"]
    plain = pipeline_from_dict(
        {
            "name": "p",
            **COMMON,
            "windows": [{"name": "w", "type": "tumbling", "size": "1m", "aggregates": {"n": "count"}}],
        }
    )
    assert "computations" not in json.dumps(plain.model_dump(exclude={"computations"}))
    assert plain.computations == ()


# ---------------------------------------------------------------------------
# Through Dagster: the sensor plans the epochs, the assets commit them


def test_wire_tick_runs_a_computation_through_the_sensor_and_assets(cli_env, spark_remote, tmp_path: Path) -> None:
    """`wire tick`: the pipeline's sensor plans the epochs, its Dagster assets commit them (on the
    session's Spark Connect server when there is one: the computation's module reaches its Python
    workers by value)."""
    from commit_scenario import subprocess_env
    from conftest import run_wire

    d = _modules(tmp_path / "p")
    spec = load_pipeline(_pipeline(d, comps=COMPS[:1], name="quiet"))
    env = subprocess_env(cli_env, spark_remote, WIRE_PIPELINES=str(d))
    events = _events(random.Random(5), 300, users=3)
    f = tmp_path / "clicks.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    run_wire(["produce", "--pipeline", "quiet", "--file", str(f)], env, check=True)
    run_wire(["close", "--pipeline", "quiet"], env, check=True)
    p = run_wire(["tick", "--pipeline", "quiet"], env, check=True)
    p = run_wire(["read", "--pipeline", "quiet", "--window", "alerts", "--format", "jsonl"], env, check=True)
    got = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    # the quiet alerts of the reference (positions do not matter to it: one per quiet spell)
    positioned = [{"t": e["ts"], "key": e["user_id"], "pos": ("0", 0, i), "rec": e} for i, e in enumerate(events)]
    want, _ = reference(_loaded(d).classes[0], COMPS[0], positioned)
    assert sorted((r["key"], json.loads(r["record"])["quiet_since"]) for r in got) == sorted(
        (k, json.loads(r)["quiet_since"]) for _, k, _, _, r in want
    )
    assert len(got) >= 3
    # the other commands take a pipeline of computations as they take one of windows
    status = json.loads(run_wire(["status", "--pipeline", "quiet", "--json"], env, check=True).stdout)
    assert "inf" in json.dumps(status).lower()
    run_wire(["dlq", "--pipeline", "quiet"], env, check=True)
    del spec


def test_a_computation_output_is_a_dagster_asset_with_its_counters_per_partition(
    store, spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline's job in process: each output is a partitioned asset downstream of the
    stream's, and a partition's materialization holds the computation's counters there."""
    import dagster as dg

    from assets.partitions import partition_key
    from definitions import build_definitions
    from sensors import job_name

    d = _modules(tmp_path / "p")
    monkeypatch.setenv("WIRE_PIPELINES", str(d))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster-home"))
    (tmp_path / "dagster-home").mkdir()
    spec = load_pipeline(_pipeline(d, comps=COMPS[::2], name="two"))  # quiet and the zoo
    events = _events(random.Random(9), 1_500, users=3)
    f = tmp_path / "all.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    streams.produce(store, stream_spec("clicks", "ts", "event_id", spec), f)
    streams.close_stream(store, "clicks")
    defs = build_definitions(pipelines=[spec])
    graph = defs.resolve_asset_graph()
    alerts, zoo = dg.AssetKey(["two", "alerts"]), dg.AssetKey(["two", "zoo"])
    assert {alerts, zoo} <= set(graph.get_all_asset_keys())
    assert dg.AssetKey(["stream", "clicks"]) in graph.get(zoo).parent_keys or any(
        "clicks" in k.to_user_string() for k in graph.get(zoo).parent_keys
    )
    instance = dg.DagsterInstance.ephemeral()
    p0 = spec.start + ((events[0]["ts"] - spec.start) // spec.partition) * spec.partition
    res = defs.resolve_job_def(job_name(spec)).execute_in_process(
        instance=instance, partition_key=partition_key(spec, p0)
    )
    assert res.success
    recs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=zoo), limit=10).records
    md: dict = {k: v.value for k, v in recs[0].event_log_entry.asset_materialization.metadata.items()}  # pyright: ignore[reportOptionalMemberAccess]
    # the counters of partition p0 against the records' own times
    in_p0 = [e for e in events if p0 <= e["ts"] < p0 + spec.partition]
    assert md["computation/records_in"] == len(in_p0) > 0
    rows = [r for r in computestage.read_output(store, spec, "zoo") if p0 <= r["window_start"] < p0 + spec.partition]
    assert md["computation/produced"] == len(rows) == md["rows"] > 0
    from wire_dagster.results import read_dead_letters

    failed = [json.loads(x["record"]) for x in read_dead_letters(store, spec) if x["window"] == "zoo"]
    failed_at = [r.get("ts", r.get("time")) for r in failed]  # a record's time, or a timer's
    assert md["computation/errors"] == sum(1 for t in failed_at if p0 <= t < p0 + spec.partition) > 0
    assert md["computation/timers_fired"] > 0
    assert md["computation/computation"] == "zoo" and "computation/state_keys" in md


def test_a_computation_output_is_a_derived_stream_for_windows_downstream(store, spark, tmp_path: Path) -> None:
    """The quiet alerts feed a window of another pipeline (a derived stream): its rows equal
    the window computed in plain Python over the committed alerts (their fields as columns,
    event time = the alert's), and its watermark is the computation's output watermark."""
    d = _modules(tmp_path / "p")
    up = load_pipeline(_pipeline(d, comps=COMPS[:1], name="users"))
    down_body = {
        "name": "hourly",
        "inputs": [{"name": "alerts", "pipeline": "users", "output": "alerts", "key": "key"}],
        "partition": "1h",
        "start": COMMON["start"],
        "end": COMMON["end"],
        "windows": [
            {
                "name": "per_hour",
                "type": "tumbling",
                "size": "1h",
                "aggregates": {"n": "count", "latest": "max(quiet_since)"},
            }
        ],
    }
    (d / "hourly.yaml").write_text(yaml.safe_dump(down_body))
    down = load_pipeline(d / "hourly.yaml")
    events = _events(random.Random(4), 600, users=4)
    rnd = random.Random(4)
    level = stream_spec("clicks", "ts", "event_id", up)
    for i in range(0, len(events), 200):  # the downstream runs between the upstream's epochs
        f = tmp_path / f"e{i}.jsonl"
        f.write_text("".join(json.dumps(e) + "\n" for e in events[i : i + 200]))
        streams.produce(store, level, f)
        computestage.process(store, up, spark, max_epochs=3, single_task=rnd.random() < 0.5)
        engine.process(store, down, spark)
    streams.close_stream(store, "clicks")
    while engine.process(store, up, spark, max_epochs=5).committed:
        pass
    engine.process(store, down, spark)
    m_up, m_down = Checkpoints(store, "users").latest(), Checkpoints(store, "hourly").latest()
    assert m_up is not None and m_down is not None
    assert m_down.watermark == computestage.output_watermark(m_up) == INF
    alerts = computestage.read_output(store, up, "alerts")
    want: dict = {}
    for a in alerts:
        hour = a["window_start"] - a["window_start"] % 3_600_000
        n, latest = want.get((a["key"], hour), (0, None))
        q = float(a["record"]["quiet_since"])
        want[(a["key"], hour)] = (n + 1, q if latest is None else max(latest, q))
    from wire_dagster.results import read_results

    got = {
        (r["key"], r["window_start"]): (r["n"], r["latest"]) for r in read_results(store, down, "per_hour").to_pylist()
    }
    assert got == want and len(got) >= 3
