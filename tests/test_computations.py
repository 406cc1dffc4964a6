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
from functools import partial
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from wire_dagster import computestage, engine, replay, streams
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.computation import Timer, load_class
from wire_dagster.computestage import CARRIED_SCHEMA, RECORD_SCHEMA, Loaded, run_bucket
from wire_dagster.deliveries import Sync
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
            origin = e.get("origin") or f"r:{seg}/{seq}/{row}"  # a derived row names its own
            self.call(self.comp.process_record, dict(e["rec"]), e["t"], origin, e["pos"], e.get("late", False))
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


def _carried_of(carried: pa.Table, comp: str) -> dict:
    """The one key's carried state of computation `comp` (beside it: the id memory of delivery)."""
    (data,) = [d for c, d in zip(carried["comp"].to_pylist(), carried["data"].to_pylist(), strict=True) if c == comp]
    return json.loads(data)


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
    assert _carried_of(carried, "zoo")["buffer"][0][0] == T0 + 12_000
    rows2 = [{**base, "ts": T0 + 15_000, "event_id": "c", "v": 3}, {**base, "ts": T0 + 3_000, "event_id": "d", "v": 4}]
    carried, got = epoch(rows2, carried, T0 + 10_000, T0 + 20_000, 1)
    # delivered in time order: 3 s (late, the second record of the key: n = 2), then 12 s, 15 s
    assert got == [{"late": 4, "n": 2}]
    assert _carried_of(carried, "zoo")["state"]["n"] == 4


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


@pytest.mark.parametrize("bound", ["rows", "bytes"])
def test_an_epoch_of_computations_reads_at_most_its_budget(store, spark, tmp_path: Path, monkeypatch, bound) -> None:
    """A stage of computations holds every record of an epoch, and a Spark job hands Wire what
    they all produced at once (NEXMark q7's pass-through of 9.2 M bids in one epoch ran a 4 GB
    driver out of heap; each table of the results is one packed value of at most 2 GB, and big
    records make a row bound loose): its epochs, and its jobs, read at most
    WIRE_COMPUTATION_EPOCH_ROWS input rows and WIRE_COMPUTATION_EPOCH_BYTES stored bytes, whole
    chunks. The records are those of one epoch reading everything."""
    from wire_dagster import reclock

    rnd = random.Random(11)
    mods = _modules(tmp_path / "m")
    events = _events(rnd, 300)
    f = tmp_path / "all.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    budgeted = load_pipeline(_pipeline(mods, name="budgeted"))
    streams.produce(store, stream_spec("clicks", "ts", "event_id", budgeted), f, chunk_rows=25)  # 12 chunks
    streams.close_stream(store, "clicks")
    chunks = {c.seq: c for v in streams.read_inputs(store, budgeted, {}).values() for c in v.chunks}
    assert len(chunks) == 12
    if bound == "rows":
        var, budget, size = "WIRE_COMPUTATION_EPOCH_ROWS", 60, lambda c: c.rows  # 25 + 25; a third: 75
    else:  # two chunks' bytes and half a third's
        var, budget, size = (
            "WIRE_COMPUTATION_EPOCH_BYTES",
            chunks[0].bytes + chunks[1].bytes + chunks[2].bytes // 2,
            lambda c: c.bytes,
        )

    monkeypatch.setenv(var, str(budget))
    job = reclock.plan_job(store, budgeted, reclock.from_manifest(None), 0, None, 20, None)
    assert [len(p.chunks) for p in job] == [2]  # one epoch a job: a second would pass the budget
    while engine.process(store, budgeted, spark, max_epochs=20, keep_epochs=50).committed:
        pass
    cp = Checkpoints(store, "budgeted")
    read = [
        sum(size(chunks[q]) for a, b in cp.load(n).chunks.values() for q in range(a, b + 1)) for n in cp.committed()
    ]
    assert sum(read) == sum(size(c) for c in chunks.values()) and max(read) <= budget, read
    assert len([r for r in read if r]) == 6 and sum(cp.load(n).counts.events_in for n in cp.committed()) == 300

    monkeypatch.delenv(var)  # the defaults (1,000,000 rows, 32 MB): one epoch for all
    whole = load_pipeline(_pipeline(mods, name="whole"))
    while engine.process(store, whole, spark, max_epochs=20).committed:
        pass
    last = Checkpoints(store, "whole").latest()
    assert last is not None and last.counts.events_in == 300
    assert _committed(store, budgeted) == _committed(store, whole) and _committed(store, whole)


def test_a_jobs_results_beyond_the_drivers_room_come_through_the_store(
    store, spark, tmp_path: Path, monkeypatch
) -> None:
    """Spark's driver holds a job's results whole, in a heap of fixed size (the embedded server's
    2 GB stopped its SparkContext on one task's 450 MB): a job of computations hands its tables
    over through Spark up to WIRE_DRIVER_RESULT_BYTES, each one beyond through the object store.
    With no room at all, every table of every epoch comes through the store, in one task and by
    key bucket alike; the committed records are those of a run through Spark alone, and no
    handed-over object is left once read."""
    from commit_scenario import results_read, scratch_objects

    rnd = random.Random(5)
    mods = _modules(tmp_path / "m")
    events = _events(rnd, 300)
    f = tmp_path / "all.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    specs = {n: load_pipeline(_pipeline(mods, name=n)) for n in ("via_spark", "one_task", "bucketed")}
    streams.produce(store, stream_spec("clicks", "ts", "event_id", specs["via_spark"]), f, chunk_rows=50)
    streams.close_stream(store, "clicks")
    fetched = results_read(monkeypatch)
    monkeypatch.setenv("WIRE_COMPUTATION_EPOCH_ROWS", "120")  # three epochs of 150, 100 and 50 records
    got = {}
    for name, spec in specs.items():
        monkeypatch.setenv("WIRE_DRIVER_RESULT_BYTES", "1" if name != "via_spark" else "134217728")
        del fetched[:]
        while computestage.process(store, spec, spark, max_epochs=5, single_task=name != "bucketed").committed:
            pass
        cp = Checkpoints(store, name)
        assert sum(cp.load(n).counts.events_in for n in cp.committed()) == 300
        got[name] = _committed(store, spec)
        # per epoch at least its produced records, its state and its counters
        epochs = len([n for n in cp.committed() if cp.load(n).counts.events_in])
        assert (len(fetched) >= 3 * epochs) if name != "via_spark" else not fetched, (name, fetched)
        assert all(k.startswith(f"pipelines/{name}/staging/") for k in fetched), fetched
        assert scratch_objects(store, name, "results") == []
    assert got["one_task"] == got["via_spark"] == got["bucketed"] and got["via_spark"]


def test_a_single_task_stages_its_output_partitions_as_the_driver_would(
    store, spark, tmp_path: Path, monkeypatch
) -> None:
    """A job of one task stages its epochs' output partitions itself and hands back their file
    references, never the produced records; each epoch of the job merges into the files the
    epoch before it staged. Every epoch's manifest names output files with the content (sha256)
    of a run by key bucket, where the driver stages the records it gathers."""
    rnd = random.Random(8)
    mods = _modules(tmp_path / "m")
    events = sorted(_events(rnd, 300), key=lambda e: e["ts"])
    f = tmp_path / "all.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    specs = {}
    for name in ("one_task", "bucketed"):
        body = yaml.safe_load(_pipeline(mods, name=name).read_text())
        body["limits"] = {"max_chunks_per_epoch": 2}  # three epochs of two chunks of 50 records
        (mods / f"{name}.yaml").write_text(yaml.safe_dump(body))
        specs[name] = load_pipeline(mods / f"{name}.yaml")
    streams.produce(store, stream_spec("clicks", "ts", "event_id", specs["one_task"]), f, chunk_rows=50)
    streams.close_stream(store, "clicks")
    jobs: list[list[computestage.EpochOut]] = []
    compute = computestage.compute

    def watched(*a, **kw):
        jobs.append(compute(*a, **kw))
        return jobs[-1]

    monkeypatch.setattr(computestage, "compute", watched)
    for name, spec in specs.items():
        monkeypatch.setenv("WIRE_EPOCHS_PER_JOB", "8" if name == "one_task" else "1")  # by key bucket: one each
        while computestage.process(store, spec, spark, max_epochs=5, single_task=name == "one_task").committed:
            pass
    one_task, bucketed = ([r for j in jobs for r in j if (r.staged is not None) == s] for s in (True, False))
    assert len(jobs) >= 4 and [len(j) for j in jobs][0] == 3, [len(j) for j in jobs]  # one job of 3 epochs first
    assert all(r.produced.num_rows == 0 for r in one_task) and sum(len(r.staged or []) for r in one_task) > 3
    assert all(r.produced.num_rows for r in bucketed if r.n["events_in"])

    def files(name: str) -> list[dict[str, dict[str, tuple[str, int]]]]:
        cp = Checkpoints(store, name)
        ms = [cp.load(n) for n in cp.committed()]
        return [{w: {p: (r.sha256, r.rows) for p, r in ps.items()} for w, ps in m.outputs.items()} for m in ms]

    got = files("one_task")
    assert got == files("bucketed") and len(got) >= 3 and got[-1]
    # an epoch after the first rewrote a partition an earlier epoch of the same job had staged
    assert any(p in a[w] and a[w][p] != b[w][p] for a, b in zip(got, got[1:], strict=False) for w in b for p in b[w]), (
        got
    )
    assert _committed(store, specs["one_task"]) == _committed(store, specs["bucketed"])


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
    from wire_dagster.derived import check_graph
    from wire_dagster.spec import load_all

    specs = {s.name: s for s in load_all(EXAMPLES)}
    assert set(specs) == {"quiet_users", "user_clicks", "click_spikes"}
    check_graph(list(specs.values()))  # the spike detector reads user_clicks' window
    assert [w.type for w in specs["quiet_users"].windows] == ["output"]
    assert [(i.pipeline, i.output) for i in specs["click_spikes"].derived] == [("user_clicks", "per_minute")]
    plain = pipeline_from_dict(
        {
            "name": "p",
            **COMMON,
            "windows": [{"name": "w", "type": "tumbling", "size": "1m", "aggregates": {"n": "count"}}],
        }
    )
    assert "computations" not in json.dumps(plain.model_dump(exclude={"computations"}))
    assert plain.computations == ()


def test_the_examples_load_as_a_code_location() -> None:
    """The examples' directory as Dagster definitions: the spike detector's output is an asset
    downstream of the window it reads."""
    import dagster as dg

    from definitions import build_definitions

    graph = build_definitions(EXAMPLES).resolve_asset_graph()
    spikes = graph.get(dg.AssetKey(["click_spikes", "spikes"]))
    assert dg.AssetKey(["user_clicks", "per_minute"]) in spikes.parent_keys


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
    assert m_down.watermark == m_up.output_watermark() == INF
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


AMOUNTS = '''
from wire_dagster.computation import Computation


class Amounts(Computation):
    """Each click's amount and tag as the click carries them: a number, or now and then text."""

    def process_record(self, ctx, record):
        ctx.produce({"amount": record["amount"], "tag": record["tag"]}, "amounts")
'''


def test_a_field_of_numbers_and_text_downstream_costs_only_its_text_values(store, spark, tmp_path: Path) -> None:
    """A computation's records whose `amount` is a number in most and text in a few (`"12"`)
    feed a window downstream (derived.record_columns): the text values are null there (the rule
    of a stream's JSON lines: numbers win), every other field and record is as produced, so the
    window equals a Python reference over the numbers (count: every record; sum and max: the
    numbers) instead of losing every field of every record to one value."""
    d = tmp_path / "p"
    d.mkdir()
    (d / "amounts.py").write_text(AMOUNTS)
    comp = ComputationSpec(name="amounts", input="clicks", code="amounts:Amounts", outputs=("amounts",))
    up = load_pipeline(_pipeline(d, comps=(comp,), name="payers"))
    (d / "totals.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "totals",
                "inputs": [{"name": "amounts", "pipeline": "payers", "output": "amounts", "key": "tag"}],
                "partition": "1h",
                "start": COMMON["start"],
                "end": COMMON["end"],
                "windows": [
                    {"name": "per_hour", "type": "tumbling", "size": "1h",
                     "aggregates": {"n": "count", "total": "sum(amount)", "top": "max(amount)"}},
                ],
            }
        )
    )  # fmt: skip
    down = load_pipeline(d / "totals.yaml")
    rnd = random.Random(7)
    events = _events(rnd, 300, users=3)
    for i, e in enumerate(events):
        e["amount"] = f"{i % 50}" if i % 37 == 5 else (i % 50) + (0.5 if i % 3 else 0)  # text now and then
    f = tmp_path / "clicks.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    streams.produce(store, stream_spec("clicks", "ts", "event_id", up), f)
    streams.close_stream(store, "clicks")
    while computestage.process(store, up, spark, max_epochs=5).committed:
        pass
    engine.process(store, down, spark)
    want: dict = {}
    for e in events:
        hour = e["ts"] - e["ts"] % 3_600_000
        n, total, top = want.get((e["tag"], hour), (0, 0.0, None))
        x = e["amount"] if not isinstance(e["amount"], str) else None
        want[(e["tag"], hour)] = (n + 1, total + (x or 0), top if x is None else max(top or x, x))
    from wire_dagster.results import read_results

    rows = read_results(store, down, "per_hour").to_pylist()
    got = {(r["key"], r["window_start"]): (r["n"], float(r["total"]), r["top"]) for r in rows}
    assert got == want and sum(n for n, _, _ in got.values()) == len(events)
    assert any(isinstance(e["amount"], str) for e in events)


# ---------------------------------------------------------------------------
# A computation over a derived stream (a window's rows), and derived fields in the record

ECHO = '''
from wire_dagster.computation import Computation


class Echo(Computation):
    """Produces what it is given: the record as delivered, and whether it was late."""

    def process_record(self, ctx, record):
        ctx.produce({"seen": record, "late": ctx.is_late}, "echoes")
'''

ECHO_SPEC = ComputationSpec(name="echo", input="minutes", code="echo:Echo", outputs=("echoes",))


def _upstream_rows(rows: list[dict], partition: int) -> pa.Table:
    """Rows of an upstream window's partition file as the executors read them (RECORD_SCHEMA):
    time window_end - 1, key the row's key, position (input, upstream partition, row)."""
    return pa.Table.from_pylist(
        [
            {
                "_t": r["window_end"] - 1,
                "_key": r["key"],
                "_id": None,
                "_row": i,
                "_err": None,
                "_src": None,
                "_seg": "minutes",
                "_seq": partition,
                "_json": json.dumps(r),
            }
            for i, r in enumerate(rows)
        ],
        RECORD_SCHEMA,
    )


def test_a_derived_row_is_delivered_when_it_appears_again_when_it_changes_and_retracted_when_gone(
    tmp_path: Path,
) -> None:
    """The transcript of one upstream partition (p0: 1 m windows, allowed lateness 30 s upstream)
    as the stage syncs to it epoch by epoch; Echo shows what the computation is given.

        upstream W   -inf → 60s      → 75s            → 100s          → 105s                → 200s
        p0 holds     A(u)=3, V(v)=1   A=4 (late fire)  A=4, S[70,80)=1 A=4, S2[70,85)=2 (S   (not read)
                                                                       merged away)
        delivered    A, V             A* (update)      S (A unchanged) S (retracted), S2     nothing
        memory       A (90 > 60)      A                S (A final: 90  S2                    (S2 final)
                                                       <= 100)
    """
    d = _modules(tmp_path)
    (d / "echo.py").write_text(ECHO)
    loaded = Loaded((ECHO_SPEC,), (load_class(ECHO_SPEC.code, str(d), "echo"),), str(d))
    sync_of = partial(Sync, lateness={"minutes": 30_000}, partitioning={"minutes": (T0, 300_000)})

    def row(key, start, end, n):
        return {"key": key, "window_start": T0 + start * 1000, "window_end": T0 + end * 1000, "clicks": n}

    a3, a4, v1 = row("u", 0, 60, 3), row("u", 0, 60, 4), row("v", 0, 60, 1)
    s1, s2 = row("u", 70, 80, 1), row("u", 70, 85, 2)
    script = [  # (rows of p0 as the upstream holds them, or None: p0 unchanged, not read; new W)
        ([a3, v1], 60),
        ([a4, v1], 75),
        ([a4, v1, s1], 100),
        ([a4, v1, s2], 105),
        (None, 200),
    ]

    def run() -> list[list[tuple]]:
        comps = loaded.instances()
        carried, w, seen = CARRIED_SCHEMA.empty_table(), NEG_INF, []
        for rows, w_new in script:
            w_new = T0 + w_new * 1000
            sync = sync_of(read={"minutes": (T0,) if rows is not None else ()})
            out = run_bucket(loaded, comps, _upstream_rows(rows or [], T0), carried, w, w_new, sync)
            carried, w = out[("carried", "")], w_new
            got = [(r["key"], r["id"], json.loads(r["record"])) for r in out[("produced", "")].to_pylist()]
            seen.append(got)
            n = out[("n", "")].to_pylist()[0]
            assert n["events_in"] == len(got)  # what the epoch delivered: its records in
        assert carried.num_rows == 0  # every row final: nothing remembered
        return seen

    seen = run()

    def said(epoch: int) -> list[tuple]:
        return [
            (k, r["seen"]["clicks"], r["seen"]["window_end"], r["seen"]["_update"], r["late"])
            for k, _, r in seen[epoch]
        ]

    end60, end80, end85 = T0 + 60_000, T0 + 80_000, T0 + 85_000
    assert said(0) == [("u", 3, end60, False, False), ("v", 1, end60, False, False)]
    assert said(1) == [("u", 4, end60, True, True)]  # the late firing: the row again, updated, late
    assert said(2) == [("u", 1, end80, False, False)]  # A unchanged is not delivered again
    assert said(3) == [("u", 1, end80, True, True), ("u", 2, end85, False, True)]
    assert seen[3][0][2]["seen"]["_retract"] is True and "_retract" not in seen[3][1][2]["seen"]
    assert seen[4] == []
    assert {k for k in seen[0][0][2]["seen"]} == {"key", "window_start", "window_end", "clicks", "_update"}
    ids = [i for epoch in seen for _, i, _ in epoch]
    assert len(set(ids)) == len(ids)
    assert run() == seen  # the same deliveries and ids on a replay


def test_a_final_derived_row_is_never_read_again_not_even_a_dead_letter(tmp_path: Path) -> None:
    """A partition of the upstream is read again each time a window fires into it; its rows
    final before (no lateness upstream: once fired) are not delivered, counted or made dead
    letters again: the malformed row of minute 0 (its time outside this pipeline's range, say)
    is one dead letter, and minute 0's row is delivered once."""
    d = _modules(tmp_path)
    (d / "echo.py").write_text(ECHO)
    loaded = Loaded((ECHO_SPEC,), (load_class(ECHO_SPEC.code, str(d), "echo"),), str(d))
    sync = Sync({"minutes": (T0,)}, {"minutes": 0}, {"minutes": (T0, 300_000)})
    rows = [
        {"key": "u", "window_start": T0 + m * 60_000, "window_end": T0 + (m + 1) * 60_000, "clicks": 1}
        for m in range(3)
    ]
    comps, carried, w, dead, got = loaded.instances(), CARRIED_SCHEMA.empty_table(), NEG_INF, [], []
    for fired in (1, 2, 3):  # minute by minute, p0 holds one more row (and the malformed one)
        t = _upstream_rows(rows[:fired] + [{**rows[0], "key": "bad"}], T0)
        t = t.set_column(t.schema.get_field_index("_err"), "_err", pa.array([None] * fired + ["malformed: x"]))
        out = run_bucket(loaded, comps, t, carried, w, T0 + fired * 60_000, sync)
        carried, w = out[("carried", "")], T0 + fired * 60_000
        got += [json.loads(r)["seen"]["window_start"] for r in out[("produced", "")]["record"].to_pylist()]
        dead += out[("dead", "")]["reason"].to_pylist()
        n = out[("n", "")].to_pylist()[0]
        assert n["events_in"] == (2 if fired == 1 else 1) and n["malformed"] == (fired == 1)
    assert got == [r["window_start"] for r in rows] and dead == ["malformed: x"]


OOO_D = OOO  # the upstream's bound of disorder (COMMON's)


def _minute_events(rnd: random.Random, minutes: int, users: int, late: int) -> list[dict]:
    """Clicks in arrival order for per-minute counts: each user 0-3 clicks a minute, sometimes a
    burst (the spike detector's spikes), disorder within the bound; `late` clicks arrive up to
    25 s behind the watermark (within the upstream's 30 s of allowed lateness: late firings)."""
    rows = []
    for m in range(minutes):
        for u in range(users):
            n = rnd.choice([0, 1, 1, 2, 3]) if m < 5 or rnd.random() > 0.12 else rnd.randint(12, 20)
            for _ in range(n):
                rows.append({"ts": T0 + 3_600_000 + m * 60_000 + rnd.randrange(60_000), "user_id": f"u{u}"})
    keyed = []
    for i, r in enumerate(rows):
        r["event_id"] = f"e{i}"
        r["amount"] = rnd.randrange(100)
        keyed.append((r["ts"] + rnd.randrange(OOO_D), i, r))
    for i in rnd.sample(range(len(rows)), late):
        keyed[i] = (rows[i]["ts"] + OOO_D + rnd.randrange(5_000, 25_000), i, rows[i])
    return [r for _, _, r in sorted(keyed)]


def _derived_pipelines(d: Path) -> tuple:
    up = {
        "name": "minutes_up",
        **COMMON,
        "lateness": {"allowed": "30s"},
        "dagster": {"keep_epochs": 1_000},  # a rewind of the stage replays the upstream's epochs
        "windows": [{"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"clicks": "count"}}],
    }
    down = {
        "name": "detect",
        "inputs": [{"name": "minutes", "pipeline": "minutes_up", "output": "per_minute", "key": "key"}],
        "fields": {"double_clicks": "clicks * 2"},
        "dagster": {"keep_epochs": 1_000},  # every epoch kept: the test rewinds to epoch 1
        "partition": "5m",
        "start": COMMON["start"],
        "end": COMMON["end"],
        "computations": [
            {"name": "spikes", "input": "minutes", "code": "spike:CountSpikeDetector", "outputs": ["spikes"]},
            {"name": "echo", "input": "minutes", "code": "echo:Echo", "outputs": ["echoes"]},
        ],
    }
    (d / "echo.py").write_text(ECHO)
    (d / "minutes_up.yaml").write_text(yaml.safe_dump(up))
    (d / "detect.yaml").write_text(yaml.safe_dump(down))
    return load_pipeline(d / "minutes_up.yaml"), load_pipeline(d / "detect.yaml")


def _derived_origin(row: dict, n: int) -> str:
    ident = json.dumps(["minutes", row["key"], row["window_start"], row["window_end"]])
    return "d:" + hashlib.sha256(ident.encode()).hexdigest()[:20] + f"/{n}"


@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_computation_over_a_window_equals_the_reference_composition(store, spark, tmp_path: Path, seed: int) -> None:
    """The spike detector over the clicks per user per minute (a window's derived stream), the
    stage syncing to the upstream between its epochs at random: the counts it is given are the
    plain-Python counts per user and minute (each delivered once, in event-time order; a late
    firing delivered again as an update, its last delivery the final count), and its spikes are
    the reference executor's over those counts (the composition; the detector ignores updates,
    so a count delivered twice counts as first delivered).

        clicks ... (random, 6 late within the 30 s upstream lateness) | a click per user at e-20s
        and one at e+OOO+1s (W passes e: the minute [e-60s, e) fires) | a click per user at
        e-0.5s (late: every user's minute fires again, an update downstream) | closed
    """
    rnd = random.Random(seed)
    d = _modules(tmp_path / "p")
    up, down = _derived_pipelines(d)
    events = _minute_events(rnd, 40, 4, late=6)
    e = max(x["ts"] for x in events) // 60_000 * 60_000 + 120_000  # a minute end after every click
    users = sorted({x["user_id"] for x in events})
    extra = [[{"ts": e - 20_000, "user_id": u} for u in users] + [{"ts": e + OOO + 1_000, "user_id": users[0]}]]
    extra.append([{"ts": e - 500, "user_id": u} for u in users])
    for n, batch in enumerate(extra):
        for j, x in enumerate(batch):
            x.update(event_id=f"x{n}-{j}", amount=1)
    level = stream_spec("clicks", "ts", "event_id", up)

    def produce(rows: list[dict], name: str) -> None:
        f = tmp_path / f"{name}.jsonl"
        f.write_text("".join(json.dumps(x) + "\n" for x in rows))
        streams.produce(store, level, f)

    def drain() -> None:
        while engine.process(store, up, spark, max_epochs=5).committed:
            pass
        computestage.process(store, down, spark, max_epochs=3, single_task=rnd.random() < 0.5)

    i = 0
    while i < len(events):
        n = rnd.randint(20, 120)
        produce(events[i : i + n], f"e{i}")
        i += n
        engine.process(store, up, spark, max_epochs=1)
        if rnd.random() < 0.7:  # the stage syncs to the upstream's latest commit, or waits
            computestage.process(store, down, spark, max_epochs=2, single_task=rnd.random() < 0.5)
    for n, batch in enumerate(extra):
        produce(batch, f"x{n}")
        drain()
    streams.close_stream(store, "clicks")
    drain()
    events += [x for batch in extra for x in batch]
    m = Checkpoints(store, "detect").latest()
    latest_up = Checkpoints(store, "minutes_up").committed()[-1]
    assert m is not None and m.watermark == INF and m.remap == {"minutes": latest_up}

    counts: dict = {}
    for x in events:
        k = (x["user_id"], x["ts"] - (x["ts"] - T0) % 60_000)
        counts[k] = counts.get(k, 0) + 1
    echoes = computestage.read_output(store, down, "echoes")
    assert len({r["id"] for r in echoes}) == len(echoes)
    deliveries: dict = {}
    for r in sorted(echoes, key=lambda r: (r["key"], r["window_start"], r["id"])):
        seen = r["record"]["seen"]
        k = (seen["key"], seen["window_start"])
        assert set(seen) == {"key", "window_start", "window_end", "clicks", "double_clicks", "_update"}
        assert r["key"] == seen["key"] and r["window_start"] == seen["window_end"] - 1
        assert seen["double_clicks"] == 2 * seen["clicks"]  # the pipeline's derived field
        assert seen["_update"] == (k in deliveries)  # the first delivery, then updates
        assert r["record"]["late"] or not seen["_update"]  # an update is a late firing's: late
        deliveries.setdefault(k, []).append(seen["clicks"])
    assert {k: v[-1] for k, v in deliveries.items()} == counts  # each final count, delivered last
    assert {k for k, v in deliveries.items() if len(v) > 1} >= {(u, e - 60_000) for u in users}
    # the spike detector: the reference executor over the counts as first delivered
    rows = [
        {"key": u, "window_start": m0, "window_end": m0 + 60_000, "clicks": n, "double_clicks": 2 * n, "_update": False}
        for (u, m0), v in deliveries.items()
        for n in v[:1]
    ]
    ref_events = [
        {
            "t": r["window_end"] - 1,
            "key": r["key"],
            "pos": ("minutes", r["window_start"], 0),
            "rec": r,
            "origin": _derived_origin(r, 0),
        }
        for r in rows
    ]
    cls = load_class("spike:CountSpikeDetector", str(d), "spike")
    spec_c = ComputationSpec(name="spikes", input="minutes", code="spike:CountSpikeDetector", outputs=("spikes",))
    want, failures = reference(cls, spec_c, ref_events)
    got = [
        ("spikes", r["key"], r["window_start"], r["id"], json.dumps(r["record"], sort_keys=True))
        for r in computestage.read_output(store, down, "spikes")
    ]
    assert _sorted(got) == _sorted(want) and not failures
    assert want, "the reference found spikes"
    # conservation, per computation: every delivered row is counted
    t = m.totals
    for c in down.computations:
        assert t.events_in == t.counted[c.name] + t.malformed + t.filtered
    # a rewind replays the recorded upstream epochs: the same records, the same ids
    before = {w.name: computestage.read_output(store, down, w.name) for w in down.windows}
    replay.rewind(store, down, 1)
    while computestage.process(store, down, spark, max_epochs=5).committed:
        pass
    assert {w.name: computestage.read_output(store, down, w.name) for w in down.windows} == before


def test_derived_fields_are_in_the_record_a_computation_gets(store, spark, tmp_path: Path) -> None:
    """`fields:` (SQL over the record) are set in the record as the windows see them."""
    d = _modules(tmp_path)
    (d / "echo.py").write_text(ECHO)
    body = {
        "name": "eur",
        **COMMON,
        "fields": {"amount_eur": "amount * 0.92", "big": "amount > 50"},
        "computations": [{"name": "echo", "code": "echo:Echo", "outputs": ["echoes"]}],
    }
    (d / "eur.yaml").write_text(yaml.safe_dump(body))
    spec = load_pipeline(d / "eur.yaml")
    events = _minute_events(random.Random(2), 5, 3, late=0)
    f = tmp_path / "e.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    streams.produce(store, stream_spec("clicks", "ts", "event_id", spec), f)
    streams.close_stream(store, "clicks")
    computestage.process(store, spec, spark, max_epochs=3)
    seen = {
        r["record"]["seen"]["event_id"]: r["record"]["seen"] for r in computestage.read_output(store, spec, "echoes")
    }
    assert len(seen) == len(events)
    for e in events:
        got = seen[e["event_id"]]
        assert got["amount_eur"] == pytest.approx(e["amount"] * 0.92) and got["big"] == (e["amount"] > 50)
        assert {k: got[k] for k in e} == e  # the record's own fields, as produced


@pytest.mark.parametrize(
    ("inputs", "says"),
    [
        (
            [{"name": "a", "stream": "clicks", "time": "ts"}, {"name": "b", "stream": "views", "time": "ts"}],
            "over several inputs is not built yet",
        ),
    ],
)
def test_a_computation_over_several_inputs_is_refused_in_one_line(inputs: list, says: str) -> None:
    body = {
        "name": "p",
        "inputs": inputs,
        "partition": "5m",
        "computations": [{"name": "c", "code": "q:Q", "outputs": ["o"]}],
    }
    with pytest.raises(WireInputError) as e:
        pipeline_from_dict(body)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_computation_over_another_computations_output_is_refused_in_one_line(tmp_path: Path) -> None:
    d = _modules(tmp_path)
    _pipeline(d, comps=COMPS[:1], name="users")
    body = {
        "name": "second",
        "inputs": [{"name": "alerts", "pipeline": "users", "output": "alerts", "key": "key"}],
        "partition": "5m",
        "computations": [{"name": "c", "code": "quiet:QuietAlert", "outputs": ["o"]}],
    }
    (d / "second.yaml").write_text(yaml.safe_dump(body))
    with pytest.raises(WireInputError) as e:
        computestage.synced_upstreams(load_pipeline(d / "second.yaml"))
    assert "another computation's output (users.alerts) is not built yet" in str(e.value)


def test_a_session_merged_upstream_is_retracted_downstream(store, spark, tmp_path: Path) -> None:
    """On Spark, through both stages: a late click merges two fired sessions upstream (allowed
    lateness 2 min); the computation over the sessions is given both again, retracted, and the
    merged session as a new row. What it was given, replayed, ends in the upstream's rows.

        clicks of u   0 10 20 s        60 70 80 s           (a click of "clock" at 118 s: W 116 s)
        sessions      A [0, 50)        B [60, 110)          fired, delivered
        late click           45 s  ->  M [0, 110)           A, B retracted; M delivered
    """
    d = _modules(tmp_path / "p")
    (d / "echo.py").write_text(ECHO)
    up_body = {
        "name": "sess_up",
        **COMMON,
        "lateness": {"allowed": "2m"},
        "windows": [{"name": "sessions", "type": "session", "gap": "30s", "aggregates": {"clicks": "count"}}],
    }
    down_body = {
        "name": "sess_down",
        "inputs": [{"name": "minutes", "pipeline": "sess_up", "output": "sessions", "key": "key"}],
        "partition": "5m",
        "start": COMMON["start"],
        "end": COMMON["end"],
        "computations": [{"name": "echo", "code": "echo:Echo", "outputs": ["echoes"]}],
    }
    (d / "sess_up.yaml").write_text(yaml.safe_dump(up_body))
    (d / "sess_down.yaml").write_text(yaml.safe_dump(down_body))
    up, down = load_pipeline(d / "sess_up.yaml"), load_pipeline(d / "sess_down.yaml")
    t = T0 + 3_600_000
    batches = [
        [{"ts": t + s * 1000, "user_id": "u"} for s in (0, 10, 20, 60, 70, 80)]
        + [{"ts": t + 118_000, "user_id": "clock"}],
        [{"ts": t + 45_000, "user_id": "u"}],
    ]
    level = stream_spec("clicks", "ts", "event_id", up)
    for n, batch in enumerate(batches):
        f = tmp_path / f"b{n}.jsonl"
        f.write_text("".join(json.dumps({**x, "event_id": f"b{n}-{j}"}) + "\n" for j, x in enumerate(batch)))
        streams.produce(store, level, f)
        engine.process(store, up, spark, max_epochs=3)
        computestage.process(store, down, spark, max_epochs=3)
    streams.close_stream(store, "clicks")
    while engine.process(store, up, spark, max_epochs=3).committed:
        pass
    computestage.process(store, down, spark, max_epochs=3)

    def span(r: dict) -> tuple:
        return (r["key"], (r["window_start"] - t) // 1000, (r["window_end"] - t) // 1000)

    echoes = sorted(computestage.read_output(store, down, "echoes"), key=lambda r: (r["window_start"], r["id"]))
    given = [
        (span(r["record"]["seen"]), r["record"]["seen"]["_update"], "_retract" in r["record"]["seen"]) for r in echoes
    ]
    u = [g for g in given if g[0][0] == "u"]
    assert sorted(u) == sorted(
        [
            (("u", 0, 50), False, False),  # A, when it fired
            (("u", 60, 110), False, False),  # B, when it fired
            (("u", 0, 50), True, True),  # both merged away by the late click: retracted
            (("u", 60, 110), True, True),
            (("u", 0, 110), False, False),  # the merged session: a new row
        ]
    )
    live: dict = {}
    for r in echoes:  # replaying what the computation was given gives the upstream's rows
        seen = r["record"]["seen"]
        if seen.get("_retract"):
            del live[span(seen)]
        else:
            live[span(seen)] = seen["clicks"]
    from wire_dagster.results import read_results

    assert live == {span(r): r["clicks"] for r in read_results(store, up, "sessions").to_pylist()}
    assert live[("u", 0, 110)] == 7
    # what `wire status` and `wire dlq` show of the stage
    from wire_dagster.results import read_dead_letters
    from wire_dagster.status import pipeline_status

    assert pipeline_status(store, down) and read_dead_letters(store, down) == []
