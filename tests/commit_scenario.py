"""The commit-protocol tests' shared scenario and checks (DESIGN §2, §3).

One pipeline with a tumbling, a sliding and a session window (so every crash
covers all three at once); small batches of events over two segments, each
batch after the first carrying late events (one still counted, one a dead
letter), a retried append of an earlier event, a duplicate within the batch and
a malformed line; the reference (tests/reference.py) run with the same epoch
splits; and the checks every committed state must pass:

- results equal the reference, with no window identity twice;
- conservation: totals balance, events in = input lines, and the counts and
  dead letters are the reference's, position by position;
- every committed marker names a loadable manifest whose files are intact;
- every published file is named by the latest committed manifest, with its
  sha256 (no file visible that no committed manifest names).

Epoch splits are known by construction: each `process` after a batch reads the
whole batch (the chunk budget is larger than a batch), so epoch k = the chunks
of batch k, and W_k = max(W_{k-1}, min over segments of max event time - 2 s),
computed here from the events, not taken from the engine.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

import reference
from conftest import run_wire
from wire_dagster import results
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.extract import read_chunk
from wire_dagster.manifest import Manifest, sha256
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import Pipeline, load_pipeline
from wire_dagster.streams import produce, read_stream
from wire_dagster.timeutil import NEG_INF, parse_iso

T0 = parse_iso("2026-03-02T00:00:00Z")
OOO = 2_000  # watermark.max_out_of_orderness
SEGMENTS = ("a", "b")
KEYS = ("u0", "u1", "u2")
BATCH_SPAN = 20_000  # event time covered by one batch (ms)
P_STEP = 10_000  # the pipeline's partition size (ms)


def pipeline_dict(name: str, chunk_rows: int = 8, max_chunks: int = 1000) -> dict:
    return {
        "name": name,
        "stream": name,
        "event": {"key": "user", "time": "ts", "id": "eid"},
        "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
        "lateness": {"allowed": "4s"},
        "partition": "10s",
        "start": "2026-01-01T00:00:00Z",
        "limits": {"chunk_rows": chunk_rows, "max_chunks_per_epoch": max_chunks},
        "windows": [
            {
                "name": "tumble",
                "type": "tumbling",
                "size": "10s",
                "aggregates": {"n": "count", "total": "sum(amount)", "top": "max(amount)"},
            },
            {
                "name": "slide",
                "type": "sliding",
                "size": "10s",
                "slide": "5s",
                "aggregates": {"n": "count", "mean": "avg(amount)"},
            },
            {"name": "sess", "type": "session", "gap": "3s", "aggregates": {"n": "count", "total": "sum(amount)"}},
        ],
    }


def write_pipeline(directory: Path, name: str = "crash", **kw) -> tuple[Pipeline, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(pipeline_dict(name, **kw), sort_keys=False))
    return load_pipeline(path), path


# ---------------------------------------------------------------------------
# Input


def make_batches(seed: int, n: int) -> list[dict[str, list[str]]]:
    """`n` batches of JSON lines per segment (see the module docstring)."""
    rng = random.Random(seed)
    out: list[dict[str, list[str]]] = []
    max_t: dict[str, int] = {}
    w_prev = NEG_INF
    last_a: str | None = None
    for k in range(n):
        base = T0 + k * BATCH_SPAN
        lines: dict[str, list[str]] = {}
        for s in SEGMENTS:
            evs = []
            for u in KEYS:
                for lo, hi in ((0, 7_000), (10_000, 16_000)):  # two bursts per key: sessions close and merge
                    t = base + rng.randrange(lo, hi)
                    for _ in range(2):
                        evs.append(
                            {"user": u, "ts": t, "eid": f"s{seed}-b{k}-{s}{len(evs)}", "amount": rng.randrange(1, 100)}
                        )
                        t += rng.randrange(200, 1_500)
            evs.sort(key=lambda e: e["ts"] + rng.randrange(0, OOO))  # out of order within the bound
            max_t[s] = max([max_t.get(s, NEG_INF)] + [e["ts"] for e in evs])
            lines[s] = [json.dumps(e) for e in evs]
            if s == "a":
                newest = max(evs, key=lambda e: e["ts"])
        a, b = lines["a"], lines["b"]
        if last_a is not None:  # from the second batch on
            a.insert(
                rng.randrange(len(a) + 1),
                json.dumps({"user": "u1", "ts": w_prev - 1_000, "eid": f"s{seed}-b{k}-late-counted", "amount": 7}),
            )
            a.insert(
                rng.randrange(len(a) + 1),
                json.dumps({"user": "zz", "ts": w_prev - 15_000, "eid": f"s{seed}-b{k}-late-dead", "amount": 9}),
            )
            a.insert(rng.randrange(len(a) + 1), last_a)  # a retried append of the previous batch's newest event
        b.insert(rng.randrange(1, len(b) + 1), b[0])  # a duplicate within the batch
        b.insert(rng.randrange(len(b) + 1), json.dumps({"user": "u2", "ts": "yesterday", "eid": f"s{seed}-b{k}-bad"}))
        last_a = json.dumps(newest)
        w_prev = max(w_prev, min(max_t.values()) - OOO)
        out.append(lines)
    return out


def produce_batch(
    store: ObjectStore, spec: Pipeline, directory: Path, batch: dict[str, list[str]], k: int
) -> dict[str, list[int]]:
    """Append a batch (one file per segment); returns the chunk sequences written per segment."""
    seqs = {}
    for s, lines in batch.items():
        f = directory / f"{spec.name}-b{k}-{s}.jsonl"
        f.write_text("\n".join(lines) + "\n")
        seqs[s] = produce(store, spec, f, segment=s).chunks
    return seqs


def batch_lines(batch: dict[str, list[str]]) -> int:
    return sum(len(v) for v in batch.values())


def batch_malformed(batch: dict[str, list[str]]) -> int:
    return sum(1 for v in batch.values() for line in v if '"yesterday"' in line)


# ---------------------------------------------------------------------------
# The reference


@dataclass
class Expected:
    """The reference after some epochs: its state (view, counts, dead letters), W per epoch, input totals."""

    state: reference.RefState
    watermarks: list[int]
    lines: int
    malformed: int
    splits: list[dict[str, list[int]]] = field(default_factory=list)


def chunk_events(store: ObjectStore, spec: Pipeline) -> dict[tuple[str, int], list[dict]]:
    """The valid events of every chunk of the stream, as the reference takes them."""
    out = {}
    for seg, view in read_stream(store, spec.stream, {}).items():
        for c in view.chunks:
            rows = read_chunk(store, spec, c).to_pylist()
            for r in rows:
                r["_seg"], r["_seq"] = seg, c.seq
            out[(seg, c.seq)] = rows
    return out


def expect(
    store: ObjectStore, spec: Pipeline, splits: list[dict[str, list[int]]], lines: int, malformed: int
) -> Expected:
    """Run the reference over the epochs `splits` (segment -> chunk sequences of each epoch)."""
    events = chunk_events(store, spec)
    st = reference.RefState()
    max_t: dict[str, int] = {}
    ws = []
    w = NEG_INF
    for split in splits:
        evs = [e for s, seqs in split.items() for q in seqs for e in events[(s, q)]]
        for e in evs:
            max_t[e["_seg"]] = max(max_t.get(e["_seg"], NEG_INF), e["_t"])
        segs = {s for s in SEGMENTS if any(k[0] == s for k in events)}
        if segs <= set(max_t):
            w = max(w, min(max_t[s] for s in segs) - OOO)
        reference.run_epoch(spec, st, evs, w)
        ws.append(w)
    return Expected(st, ws, lines, malformed, list(splits))


# ---------------------------------------------------------------------------
# Checks


def read_all(store: ObjectStore, spec: Pipeline) -> dict[str, dict[tuple, dict]]:
    """Committed results per window, keyed by window identity; fails on an identity seen twice."""
    out = {}
    for w in spec.windows:
        rows = results.read_results(store, spec, w.name).to_pylist()
        ids = [(r["key"], r["window_start"], r["window_end"]) for r in rows]
        dup = [i for i, n in Counter(ids).items() if n > 1]
        assert not dup, f"{w.name}: window identities committed twice: {dup[:5]}"
        out[w.name] = dict(zip(ids, rows, strict=True))
    return out


def assert_results(store: ObjectStore, spec: Pipeline, exp: Expected) -> None:
    got = read_all(store, spec)
    for w in spec.windows:
        want = exp.state.view.get(w.name, {})
        g = got[w.name]
        assert set(g) == set(want), (
            f"{w.name}: missing {sorted(set(want) - set(g))[:5]}, extra {sorted(set(g) - set(want))[:5]}"
        )
        for ident, row in want.items():
            for col, v in row.items():
                x = g[ident][col]
                if isinstance(v, float) and x is not None:
                    same = math.isclose(x, v, rel_tol=1e-9, abs_tol=1e-9)
                else:
                    same = x == v
                assert same, f"{w.name} {ident} {col}: {x} != reference {v}"


def assert_counts(store: ObjectStore, spec: Pipeline, exp: Expected, stream_malformed: int | None = None) -> Manifest:
    """Totals, W and dead letters equal the reference's; `stream_malformed`: malformed lines in the whole
    stream (their dead letters are written at ingestion, so they show before their epoch commits)."""
    m = Checkpoints(store, spec.name).latest()
    assert m is not None
    t = m.totals
    assert t.balanced(), f"conservation broken: {t}"
    assert t.events_in == exp.lines, f"events_in {t.events_in} != input lines {exp.lines}"
    assert t.malformed == exp.malformed
    assert t.duplicate == exp.state.counts["duplicate"]
    assert t.counted == {w: c["counted"] for w, c in exp.state.window_counts.items()}
    assert t.late == {w: c["late"] for w, c in exp.state.window_counts.items()}
    assert m.watermark == exp.watermarks[-1], f"W {m.watermark} != reference {exp.watermarks[-1]}"
    letters = results.read_dead_letters(store, spec)
    got = Counter(
        (d["reason"], d["window"], d["segment"], d["chunk"], d["row"])
        for d in letters
        if not d["reason"].startswith("malformed")
    )
    want = Counter((r, w, e["_seg"], e["_seq"], e["_row"]) for r, w, e in exp.state.dead)
    assert got == want, f"dead letters differ: extra {got - want}, missing {want - got}"
    malformed = sum(1 for d in letters if d["reason"].startswith("malformed"))
    assert malformed == (exp.malformed if stream_malformed is None else stream_malformed)
    return m


def assert_committed_sound(store: ObjectStore, spec: Pipeline) -> None:
    """Every committed marker names a loadable manifest (checksum checked) whose files are all intact."""
    cp = Checkpoints(store, spec.name)
    for n in cp.committed():
        m = cp.load(n)
        assert m.epoch == n
        assert cp.verify(m) == [], f"epoch {n}: files gone or altered: {cp.verify(m)}"


def published(store: ObjectStore, spec: Pipeline) -> dict[str, str]:
    cp = Checkpoints(store, spec.name)
    return {i.key: sha256(store.get(i.key)) for i in store.list(f"{cp.root}output/")}


def wanted_published(store: ObjectStore, spec: Pipeline, m: Manifest | None = None) -> dict[str, str]:
    cp = Checkpoints(store, spec.name)
    m = m or cp.latest()
    if m is None:
        return {}
    return {cp.published_key(w, int(p)): ref.sha256 for w, parts in m.outputs.items() for p, ref in parts.items()}


def assert_published(store: ObjectStore, spec: Pipeline, m: Manifest | None = None) -> None:
    """Every object under output/ is named by the (latest) committed manifest, with its sha256, and vice versa."""
    got, want = published(store, spec), wanted_published(store, spec, m)
    altered = sorted(k for k in got if got[k] != want.get(k))[:5]
    missing = sorted(set(want) - set(got))[:5]
    assert got == want, f"published output differs from the manifest: extra/altered {altered}, missing {missing}"


def assert_all(store: ObjectStore, spec: Pipeline, exp: Expected) -> Manifest:
    assert_results(store, spec, exp)
    m = assert_counts(store, spec, exp)
    assert_committed_sound(store, spec)
    assert_published(store, spec)
    return m


def staging_runs(store: ObjectStore, spec: Pipeline) -> set[str]:
    root = f"pipelines/{spec.name}/staging/"
    return {i.key[len(root) :].split("/", 1)[0] for i in store.list(root)}


def scratch_objects(store: ObjectStore, pipeline: str, what: str) -> list[str]:
    """The scratch objects of `pipeline` under `what` (handover.scratch_prefix): a job's results
    handed over through the store ("results"), a backfill's state between jobs ("backfill-state")."""
    return [o.key for o in store.list(f"pipelines/{pipeline}/staging/") if f"/{what}/" in o.key]


def results_read(monkeypatch) -> list[str]:
    """The keys of results handed over through the store (handover.Handover) that Wire reads from
    now on, in order: a spy on this process's ObjectStore.get."""
    read: list[str] = []
    get = ObjectStore.get

    def spied(self, key: str) -> bytes:
        if "/results/" in key:
            read.append(key)
        return get(self, key)

    monkeypatch.setattr(ObjectStore, "get", spied)
    return read


def output_hashes(m: Manifest) -> dict[str, dict[str, str]]:
    return {w: {p: r.sha256 for p, r in parts.items()} for w, parts in m.outputs.items()}


# ---------------------------------------------------------------------------
# Subprocesses


def subprocess_env(cli_env: dict[str, str], spark_remote: str | None, **extra: str) -> dict[str, str]:
    """`wire` subprocess environment: attach to the Spark Connect server if there is one, else local[2]."""
    env = dict(cli_env)
    for k in ("WIRE_FAULT", "WIRE_PAUSE", "WIRE_PAUSE_DIR", "WIRE_KEEP_EPOCHS", "WIRE_SPARK_REMOTE"):
        env.pop(k, None)
    if spark_remote:
        env["WIRE_SPARK_REMOTE"] = spark_remote
    else:
        env["WIRE_SPARK_MASTER"] = "local[2]"
        env.setdefault("WIRE_SPARK_DRIVER_MEMORY", "1g")
    env["PYSPARK_PYTHON"] = sys.executable
    env.update(extra)
    return env


def wire(args: Sequence[str | os.PathLike[str]], env: dict[str, str], expect_rc: int | None = 0, timeout: float = 600):
    p = run_wire([str(a) for a in args], env, timeout=timeout)
    if expect_rc is not None:
        assert p.returncode == expect_rc, (
            f"wire {' '.join(map(str, args))} exited {p.returncode}, expected {expect_rc}\n"
            f"stdout: {p.stdout[-1500:]}\nstderr: {p.stderr[-3000:]}"
        )
    return p


@contextlib.contextmanager
def tuned(spark):
    """The session's local Spark tuned for tiny epochs (AQE off, one shuffle partition: ~28 Spark
    jobs an epoch instead of ~70); the previous settings are restored afterwards."""
    keys = ("spark.sql.adaptive.enabled", "spark.sql.shuffle.partitions")
    old = {k: spark.conf.get(k) for k in keys}
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        yield spark
    finally:
        for k, v in old.items():
            spark.conf.set(k, v)


def wire_exe() -> str:
    import shutil

    return shutil.which("wire", path=str(Path(sys.executable).parent)) or "wire"


def wait_for(cond, timeout: float, proc=None, what: str = "") -> None:
    """Poll `cond` (bounded); fail at once if `proc` exited first."""
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"{what}: the process exited {proc.returncode} first: {(err or '')[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout:.0f}s")
        time.sleep(0.1)


def module_cli_env(s3_server, home: Path) -> dict[str, str]:
    """The `wire` CLI's environment on `s3_server` with a WIRE_HOME and DAGSTER_HOME of its own under
    `home`: for module-scoped fixtures (conftest's `cli_env` is per test)."""
    env = dict(os.environ)
    env.update(s3_server.export_env())
    env.update(WIRE_HOME=str(home), DAGSTER_HOME=str(home / "dagster"))
    return env


def kill_at_random_moments(
    args: Sequence[str],
    env: dict[str, str],
    rng: random.Random,
    times: int,
    within: tuple[float, float],
    after_each: Callable[[], None] = lambda: None,
) -> int:
    """Start `wire <args>` `times` times, one after the other, each in its own process group, and
    kill -9 the group at a moment drawn uniformly in `within` (s after its start) unless it ended
    first: a wait for the process, not a sleep, so a run that ends early is not waited for.
    `after_each` checks what each run left behind. Returns how many runs were killed (the others
    ran to their end), for the caller to require at least one."""
    killed = 0
    for _ in range(times):
        proc = subprocess.Popen(
            [wire_exe(), *args], env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            proc.wait(timeout=rng.uniform(*within))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            killed += 1
        proc.wait(timeout=60)
        after_each()
    return killed


def copy_bucket(src: ObjectStore, dst: ObjectStore) -> int:
    n = 0
    for info in src.list(""):
        dst.put(info.key, src.get(info.key))
        n += 1
    return n


def copied_bucket(src: ObjectStore, s3_server, prefix: str = "t-") -> ObjectStore:
    """A fresh bucket on `s3_server` (named `prefix` + random) holding a copy of `src`'s objects:
    a scenario's template state, for a run that must not touch the template."""
    import uuid
    from dataclasses import replace

    dst = ObjectStore(replace(s3_server, bucket=prefix + uuid.uuid4().hex[:10]))
    dst.ensure_bucket()
    copy_bucket(src, dst)
    return dst


def seeds(var: str = "WIRE_CRASH_SEEDS", default: int = 1) -> list[int]:
    return list(range(int(os.environ.get(var) or default)))


# ---------------------------------------------------------------------------
# Spark-free epochs: manifests built by hand over staged Parquet files, for the
# tests of the protocol itself (markers, fencing, publishing, GC).


def tumble_table(spec: Pipeline, rows: list[tuple[str, int, int]]):
    """Rows (key, window_start, n) of the `tumble` window as read_results returns them."""
    import pyarrow as pa

    schema = results.output_schema(spec, "tumble")
    w = spec.window("tumble")
    return pa.Table.from_pylist(
        [
            {"key": k, "window_start": s, "window_end": s + w.size, "n": n, "total": float(n), "top": float(n)}
            for k, s, n in rows
        ],
        schema=schema,
    )


def hand_epoch(
    cp: Checkpoints,
    spec: Pipeline,
    epoch: int,
    run_id: str,
    parts: dict[int, list[tuple[str, int, int]]],
    carry: Manifest | None = None,
    commit: bool = True,
    watermark: int | None = None,
) -> Manifest:
    """Stage `parts` (tumble partition start -> rows) and a state file, prepare epoch `epoch`
    (outputs of `carry` kept, as the engine does) and, unless `commit=False`, commit it."""
    from wire_dagster.parquetio import parquet_bytes

    outputs = {w: dict(p) for w, p in (carry.outputs.items() if carry else [])}
    tumble = outputs.setdefault("tumble", {})
    for p, rows in parts.items():
        t = tumble_table(spec, rows)
        tumble[str(p)] = cp.stage(run_id, f"out/tumble/{p}.parquet", parquet_bytes(t), t.num_rows, epoch)
    st = tumble_table(spec, [])
    state = {"tumble": cp.stage(run_id, "state/tumble.parquet", parquet_bytes(st), 0, epoch)}
    w = watermark if watermark is not None else T0 + epoch * 10_000
    m = Manifest(
        pipeline=spec.name,
        epoch=epoch,
        previous=carry.epoch if carry else None,
        run_id=run_id,
        fingerprint=spec.fingerprint(),
        config={},
        remap={},
        segments={},
        segment_watermarks={},
        decisions={},
        watermark=w,
        prev_watermark=carry.watermark if carry else NEG_INF,
        outputs=outputs,
        changed={"tumble": sorted(parts)},
        state=state,
    )
    cp.prepare(m)
    if commit:
        cp.commit(m)
    return m


def tumble_rows(store: ObjectStore, spec: Pipeline) -> list[tuple[str, int, int]]:
    return [(r["key"], r["window_start"], r["n"]) for r in results.read_results(store, spec, "tumble").to_pylist()]
