"""`wire produce` killed with kill -9 partway through a streamed file, then retried (DESIGN §1
Streams and Duplicates, §2 invariant 3).

`wire produce` reads its file a chunk at a time and appends each chunk as it goes (ingest.py's
`_JsonLinesInput` / `_ParquetInput`, streams.py's `_append_input`): a chunk's data file is
written under a unique key, then the chunk is claimed by creating its index object with
create-if-absent; one chunk is in flight per segment, claimed before the next is written. So a
produce killed at any moment (kill -9, the OOM killer, a closed laptop) leaves each segment

- a gapless run of claimed chunks (a reader never stops at a hole), each complete and readable,
  holding exactly the file's next records in order, CHUNK_ROWS a chunk: a prefix of the file;
- at most one data file no index names: the chunk in flight, complete (a PUT cut short leaves
  no object), holding the records after that prefix; no reader sees it (`wire gc` collects it);

and the user's retry (the same `wire produce`) appends the whole file again after the segment's
last chunk, so every re-appended record is a dead letter with reason `duplicate` and every event
is counted once:

    file:       r0 r1 ...                                               r(E-1)
    produce 1:  [c0][c1]..[c(a-1)] ✗ kill -9   (c(a)'s data, unclaimed: invisible)
    produce 2:                     [c(a)]..[c(b-1)] ✗ kill -9      rows 0.. again
    produce 3:                                     [c(b)] ...  [c(z)]   rows 0..E-1, to its end
    close, tick: counted = the E distinct events of the file, once each;
                 duplicate = every record whose id an earlier chunk (or row) of the segment holds

Checked against the file itself (its lines, its Parquet rows) and plain-Python references (a
brute-force window count; the duplicates by walking the chunks in order), through the real CLI:
each `wire produce` in its own process group, killed by its pgid once a seeded random number of
new chunks is in the store (found by listing), after a seeded delay of up to a few chunks' time;
then `wire close`, `wire tick`, `wire read`, `wire status --json`, `wire dlq --format jsonl`.
Three cases: a JSON-lines file, a Parquet file (read by row groups and batches), and three files
into three segments appended side by side by one command, with a `wire tick` after the first
kill, as a running sensor would (the later duplicates are then found by the id memory across
epochs).

Each kill lands at a random point of a chunk's write-then-claim, so a produce that tore chunks
fails here by chance, not surely; hence two kills a test. Tried on copies of the package put
first on the subprocesses' PYTHONPATH: one that claims a chunk before writing its data failed
5 of the 9 tests of 3 seeds in each of two runs, the several-files test every time (three
chunks in flight at each kill): "chunk 26 is claimed, its data ... is not there: a half-chunk";
one that skips a sequence failed every test ("chunk sequence with a hole"); one whose kernel
flags no duplicate (with WIRE_SINGLE_TASK_ROWS=0, so that the flags are made in the `wire tick`
process) failed every test on the brute-force counts.

WIRE_CRASH_SEEDS=n runs n seeds (`make test-long`: 5); WIRE_PRODUCE_KILLS the killed produces
before the one that finishes (default 2); WIRE_PRODUCE_KILL_EVENTS the events per file (default
8,000: 80 chunks of 100 rows, about a second of appending; half as many in each of three files).
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_setup import pipeline_env
from commit_scenario import seeds, subprocess_env, wire, wire_exe
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.events import ID, RAW, REC, ROW
from wire_dagster.objectstore import ObjectStore
from wire_dagster.streams import ChunkMeta, read_stream, segment_prefix, stream_prefix

NAME = "pkill"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
WINDOW = 10_000  # the tumbling window's size
STEP = 100  # ms of event time between a file's events
JITTER = 1_500  # each event up to this late against its position: inside the 2 s bound
EVENTS = int(os.environ.get("WIRE_PRODUCE_KILL_EVENTS") or 8_000)  # per file
KILLS = int(os.environ.get("WIRE_PRODUCE_KILLS") or 2)  # killed produces before the one that finishes
CHUNK_ROWS = 100

PIPELINE = {
    "name": NAME,
    "stream": NAME,
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
    # Longer than the stream's span: a window that counted an id stays live, so the id memory
    # keeps it across epochs and a re-appended event is a `duplicate` (DESIGN §1), never `late`.
    "lateness": {"allowed": "1h"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "windows": [
        {"name": "per_10s", "type": "tumbling", "size": "10s", "aggregates": {"n": "count", "total": "sum(amount)"}}
    ],
}


@dataclass(frozen=True)
class InputFile:
    """One input file of the test: its segment and its records in file order."""

    segment: str
    path: Path
    records: list[dict]

    @property
    def chunks(self) -> int:
        return -(-len(self.records) // CHUNK_ROWS)

    def lines(self) -> list[bytes]:
        """The file's lines as written (JSON lines), without their newline."""
        return self.path.read_bytes().splitlines()


def make_file(tmp_path: Path, rng: random.Random, segment: str, fmt: str, events: int = EVENTS) -> InputFile:
    """`events` events of 20 users, one every STEP ms of event time (up to JITTER late), unique ids."""
    records = [
        {
            "user": f"u{rng.randrange(20)}",
            "ts": T0 + i * STEP + rng.randrange(JITTER),
            "eid": f"{segment}-{i}",
            "amount": rng.randrange(1, 100),
        }
        for i in range(events)
    ]
    path = tmp_path / f"{segment}.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:  # row groups smaller than a chunk's span, not aligned with chunks: read across them
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=events // 7)
    return InputFile(segment, path, records)


# ---------------------------------------------------------------------------
# The kill

#: Per segment, what each produce of its file appended, in order: (its first chunk, the file's
#: rows [0, rows) it appended, in chunks of CHUNK_ROWS from that chunk on).
Runs = dict[str, list[tuple[int, int]]]


def start_produce(env: dict[str, str], files: list[InputFile]) -> subprocess.Popen:
    args = ["produce", "--pipeline", NAME, "--chunk-rows", str(CHUNK_ROWS)]
    for f in files:
        args += ["--file", str(f.path), "--segment", f.segment]
    return subprocess.Popen(
        [wire_exe(), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, killed by its pgid
    )


def claimed(store: ObjectStore) -> int:
    """Chunk index objects in the stream, over every segment (one listing)."""
    return sum("/index/" in i.key for i in store.list(stream_prefix(NAME) + "segments/"))


def kill_partway(
    store: ObjectStore, env: dict[str, str], files: list[InputFile], rng: random.Random, least: float, why: str
) -> int:
    """Start the produce, wait until a random number k of new chunks (at least `least` of the
    produce's chunks, at most half, at least 1) is in the store, wait a random moment more (up to
    a few chunks' time), then kill -9 its process group. Returns k; fails if the produce ended
    first (it was then not killed partway)."""
    total = sum(f.chunks for f in files)
    k = rng.randint(max(1, int(least * total)), total // 2)
    delay = rng.uniform(0.0, 0.03)
    before = claimed(store)
    proc = start_produce(env, files)
    try:
        while proc.poll() is None and claimed(store) < before + k:  # a condition polled by listing
            time.sleep(0.005)
        try:
            proc.wait(timeout=delay)  # the random moment after it: ends early if the process does
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:  # never left running, whatever failed above
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (
        f"{why}: the produce was not killed partway (rc {proc.returncode}, kill after {k} of {total} chunks)"
        f"\nstdout: {out[-1000:]}\nstderr: {err[-2000:]}"
    )
    return k


# ---------------------------------------------------------------------------
# What a segment holds


def chunk_records(store: ObjectStore, key: str, fmt: str) -> tuple[list, list[str], list[int]]:
    """A chunk data file's records (JSON lines as bytes, or Parquet rows as dicts), ids and rows.
    Reading it whole is the check that the object is complete: a torn Parquet file does not parse."""
    t = pq.read_table(io.BytesIO(store.get(key)))
    recs = t[RAW].to_pylist() if fmt == "jsonl" else t[REC].to_pylist()
    return recs, t[ID].to_pylist(), t[ROW].to_pylist()


def file_slice(f: InputFile, lines: list[bytes], lo: int, hi: int) -> list:
    return lines[lo:hi] if f.path.suffix == ".jsonl" else f.records[lo:hi]


def chunks_of(rows: int) -> int:
    return -(-rows // CHUNK_ROWS)


def check_segment(store: ObjectStore, f: InputFile, runs: list[tuple[int, int]], killed: int, why: str) -> int:
    """A segment after its produces `runs` (the first `killed` of them killed): its index is
    gapless from 0 and the reader takes every chunk; each chunk is complete, named by its index
    with its size, and holds exactly its rows of the file, in order; and each unclaimed data file
    is a killed produce's chunk in flight — complete, holding the rows after that produce's last
    claim — at most one per killed produce. Returns the number of unclaimed data files."""
    fmt = "jsonl" if f.path.suffix == ".jsonl" else "parquet"
    lines = f.lines() if fmt == "jsonl" else []
    objects = {i.key: i for i in store.list(segment_prefix(NAME, f.segment))}
    index = sorted(k for k in objects if "/index/" in k)
    seqs = [int(k.rsplit("/", 1)[1].split(".")[0]) for k in index]
    assert seqs == list(range(len(seqs))), f"{why}: segment {f.segment}: chunk sequence with a hole: {seqs}"
    view = read_stream(store, NAME, {})[f.segment]
    assert [c.seq for c in view.chunks] == seqs, f"{why}: segment {f.segment}: the reader stops before its last chunk"

    want: list[tuple[int, int, int]] = []  # (chunk, file rows lo, hi), from the runs
    for first, rows in runs:
        want += [(first + j, lo, min(lo + CHUNK_ROWS, rows)) for j, lo in enumerate(range(0, rows, CHUNK_ROWS))]
    assert seqs == [c for c, _, _ in want], f"{why}: segment {f.segment}: chunks {seqs}, expected {want}"

    named = set()
    for meta, (seq, lo, hi) in zip(view.chunks, want, strict=True):
        c = ChunkMeta.from_json(json.loads(store.get(index[seq])))
        assert c == meta and c.data_key is not None and c.dlq_key is None, f"{why}: chunk {seq}: {c}"
        assert c.data_key in objects, f"{why}: chunk {seq} is claimed, its data {c.data_key} is not there: a half-chunk"
        assert objects[c.data_key].size == c.bytes, f"{why}: chunk {seq}: its data is not the size its index says"
        recs, ids, rows = chunk_records(store, c.data_key, fmt)
        assert c.rows == len(recs) == hi - lo, f"{why}: chunk {seq} holds {len(recs)} rows, its index {c.rows}"
        assert recs == file_slice(f, lines, lo, hi), f"{why}: segment {f.segment} chunk {seq} != file rows {lo}..{hi}"
        assert ids == [r["eid"] for r in f.records[lo:hi]] and rows == list(range(hi - lo)), f"{why}: chunk {seq}"
        named.add(c.data_key)

    # Where each killed produce's chunk in flight starts in the file (none if it had appended all).
    pending = Counter(rows for _, rows in runs[:killed] if rows < len(f.records))
    orphans = sorted(k for k in objects if "/data/" in k and k not in named)
    for key in orphans:
        recs, _, _ = chunk_records(store, key, fmt)
        at = [lo for lo in pending if pending[lo] and recs == file_slice(f, lines, lo, lo + CHUNK_ROWS)]
        assert at, f"{why}: segment {f.segment}: unclaimed {key} ({len(recs)} rows) is no killed produce's next chunk"
        pending[at[0]] -= 1
    return len(orphans)


def check_after_kill(store: ObjectStore, files: list[InputFile], runs: Runs, why: str) -> int:
    """The stream after a kill: its declaration whole, no seal, nothing but chunk index and data
    objects of the files' segments; the killed produce's chunks added to `runs` (each segment's
    new chunks, a prefix of its file: `check_segment`). Returns the unclaimed data files."""
    segs = "|".join(f.segment for f in files)
    shape = re.compile(rf"segments/({segs})/(index/\d{{12}}\.json|data/[0-9a-f]{{32}}\.parquet)")
    root = stream_prefix(NAME)
    stray = [
        i.key for i in store.list(root) if not shape.fullmatch(i.key[len(root) :]) and i.key != root + "_STREAM.json"
    ]
    assert not stray, f"{why}: unexpected objects in the stream: {stray}"
    assert json.loads(store.get(root + "_STREAM.json"))["id"] == "eid", why  # the declaration: whole
    unclaimed = 0
    for f in files:
        first = sum(chunks_of(rows) for _, rows in runs[f.segment])
        n = sum(1 for _ in store.list(segment_prefix(NAME, f.segment) + "index/"))
        runs[f.segment].append((first, min((n - first) * CHUNK_ROWS, len(f.records))))
        unclaimed += check_segment(store, f, runs[f.segment], len(runs[f.segment]), why)
    return unclaimed


def finish(store: ObjectStore, env: dict[str, str], files: list[InputFile], runs: Runs, why: str) -> None:
    """The user's last retry: the same command, to its end; each file appended whole after its
    segment's last chunk, as it reports; added to `runs` and checked."""
    p = start_produce(env, files)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, f"{why}: the retry exited {p.returncode}: {err[-2000:]}"
    for f in files:
        a = sum(chunks_of(rows) for _, rows in runs[f.segment])
        line = f"appended {len(f.records)} events in {f.chunks} chunks to {NAME}/{f.segment}"
        line += f" (chunks {a}..{a + f.chunks - 1})"
        assert line in out.splitlines(), f"{why}: {out}"
        runs[f.segment].append((a, len(f.records)))
        check_segment(store, f, runs[f.segment], len(runs[f.segment]) - 1, why)


# ---------------------------------------------------------------------------
# Close, tick: the counts


def brute_force(files: list[InputFile]) -> dict[tuple[str, int], tuple[int, int]]:
    """(user, window start) -> (count, sum of amount) over the files' distinct events (by id)."""
    seen: dict[str, dict] = {}
    for f in files:
        for r in f.records:
            seen.setdefault(r["eid"], r)
    out: dict[tuple[str, int], list[int]] = {}
    for r in seen.values():
        acc = out.setdefault((r["user"], r["ts"] - (r["ts"] - T0) % WINDOW), [0, 0])
        acc[0] += 1
        acc[1] += r["amount"]
    return {k: (n, s) for k, (n, s) in out.items()}


def duplicates(files: list[InputFile], runs: Runs) -> dict[tuple[str, int, int], str]:
    """(segment, chunk, row) -> id of every record whose id an earlier position of its segment
    holds (ids are unique across the files): the chunks walked in order."""
    out = {}
    for f in files:
        seen: set[str] = set()
        for first, rows in runs[f.segment]:
            for i, r in enumerate(f.records[:rows]):
                if r["eid"] in seen:
                    out[(f.segment, first + i // CHUNK_ROWS, i % CHUNK_ROWS)] = r["eid"]
                seen.add(r["eid"])
    return out


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def check_counts(env: dict[str, str], files: list[InputFile], runs: Runs, why: str) -> None:
    """After the last retry, close and tick: the window equals the brute-force count of the
    distinct events; the totals balance, every appended record either counted or a duplicate;
    the dead letters are exactly the re-appended records (`duplicates`), each naming its event."""
    out = wire(["read", "--pipeline", NAME, "--window", "per_10s", "--format", "jsonl"], env).stdout
    got = {(r["key"], ms(r["window_start"])): (r["n"], r["total"]) for r in map(json.loads, out.splitlines())}
    want = brute_force(files)
    assert got.keys() == want.keys(), (
        f"{why}: windows missing {sorted(want.keys() - got.keys())[:5]}, extra {sorted(got.keys() - want.keys())[:5]}"
    )
    bad = {k: (got[k], v) for k, v in want.items() if got[k][0] != v[0] or got[k][1] != pytest.approx(v[1])}
    assert not bad, f"{why}: counts differ from the brute force (got, want): {list(bad.items())[:5]}"

    status = json.loads(wire(["status", "--pipeline", NAME, "--json"], env).stdout)
    t = status["totals"]
    distinct = sum(len(f.records) for f in files)
    appended = sum(rows for seg in runs.values() for _, rows in seg)
    assert status["balanced"], f"{why}: totals not balanced: {t}"
    assert (t["events_in"], t["duplicate"], t["malformed"]) == (appended, appended - distinct, 0), f"{why}: {t}"
    assert t["counted"] == {"per_10s": distinct} and t["late"] == {"per_10s": 0}, f"{why}: {t}"
    assert t["events_in"] == t["counted"]["per_10s"] + t["duplicate"], f"{why}: {t}"

    letters = [json.loads(ln) for ln in wire(["dlq", "--pipeline", NAME, "--format", "jsonl"], env).stdout.splitlines()]
    assert {d["reason"] for d in letters} <= {"duplicate"}, f"{why}: {Counter(d['reason'] for d in letters)}"
    got_dup = Counter((d["segment"], d["chunk"], d["row"]) for d in letters)
    dup_ids = duplicates(files, runs)
    want_dup = Counter(dup_ids.keys())
    assert got_dup == want_dup, (
        f"{why}: dead letters are not the re-appended records: extra {sorted(got_dup - want_dup)[:5]}, "
        f"missing {sorted(want_dup - got_dup)[:5]}"
    )
    # each names its event: the record at its position
    wrong = [d for d in letters if json.loads(d["record"])["eid"] != dup_ids[(d["segment"], d["chunk"], d["row"])]]
    assert not wrong, f"{why}: dead letters naming another event than their position holds: {wrong[:3]}"


def setup(tmp_path: Path, cli_env: dict[str, str], spark_remote: str | None) -> dict[str, str]:
    return pipeline_env(tmp_path, subprocess_env(cli_env, spark_remote), PIPELINE, home=tmp_path / "dagster").env


def tick(env: dict[str, str]) -> str:
    """One `wire tick` (rc 0); its output: a line per run, or that the sensor requested none."""
    return wire(["tick", "--pipeline", NAME], env).stdout


# ---------------------------------------------------------------------------
# The cases


def kill_retry_count(
    store: ObjectStore,
    env: dict[str, str],
    files: list[InputFile],
    rng: random.Random,
    why: str,
    least: float = 0.0,
    tick_after_first: bool = False,
) -> str:
    """KILLS produces of `files` killed partway, each checked after its kill (`tick_after_first`:
    a tick after the first), then the retry that finishes, close, a tick, and the counts.
    Then `wire gc` collects the unclaimed data files. Returns what happened (the seed, the kill
    moments, the rows appended), as every failure says."""
    runs: Runs = {f.segment: [] for f in files}
    notes, unclaimed = [], 0
    for n in range(KILLS):
        k = kill_partway(store, env, files, rng, least, f"{why}, kill {n + 1}")
        unclaimed = check_after_kill(store, files, runs, f"{why}, kill {n + 1} after {k} new chunks")
        assert sum(chunks_of(seg[-1][1]) for seg in runs.values()) >= k, f"{why}: kill {n + 1}: {runs}"
        notes.append(f"kill {n + 1} after {k} new chunks, {unclaimed} unclaimed")
        if tick_after_first and n == 0:
            mid = tick(env)  # what the killed produce appended, as the daemon's sensor would see it
            epochs = Checkpoints(store, NAME).committed()
            assert ("SUCCESS" in mid) == bool(epochs), f"{why}: {mid}"
            notes.append(f"a tick committed epochs {epochs}")
    why = f"{why}: {'; '.join(notes)}; rows appended per segment {runs}"
    finish(store, env, files, runs, why)
    wire(["close", "--pipeline", NAME], env)
    assert "SUCCESS" in tick(env), why
    check_counts(env, files, runs, why)

    # What the kills left unclaimed, `wire gc` collects (no grace: no produce runs now); never a
    # claimed chunk's data.
    out = wire(["gc", "--pipeline", NAME, "--grace", "0"], env).stdout
    assert f"stream {NAME}: deleted {unclaimed} unclaimed chunk files" in out, f"{why}: {out}"
    views = read_stream(store, NAME, {})
    for f in files:
        data = {i.key for i in store.list(segment_prefix(NAME, f.segment) + "data/")}
        named = {c.data_key for c in views[f.segment].chunks}
        assert data == named, f"{why}: after wire gc: unclaimed {data - named}, claimed but gone {named - data}"
        n = sum(chunks_of(rows) for _, rows in runs[f.segment])
        assert [c.seq for c in views[f.segment].chunks] == list(range(n)), f"{why}: after wire gc"
    return why


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_produce_killed_partway_then_retried_counts_each_event_once(
    fmt: str, seed: int, store, cli_env, spark_remote, tmp_path: Path
) -> None:
    rng = random.Random(f"{fmt}-{seed}")
    env = setup(tmp_path, cli_env, spark_remote)
    files = [make_file(tmp_path, rng, "0", fmt)]
    print(kill_retry_count(store, env, files, rng, f"seed {seed}"))


@pytest.mark.parametrize("seed", seeds())
def test_produce_of_several_files_killed_partway_then_retried(seed: int, store, cli_env, spark_remote, tmp_path: Path):
    """Three files (JSON lines and Parquet, EVENTS / 2 events each) into three segments, appended
    side by side by one command, killed partway; after the first kill a tick commits what the stream holds, as a
    running sensor would, so the later duplicates are found by the id memory of epoch 1."""
    rng = random.Random(f"several-{seed}")
    env = setup(tmp_path, cli_env, spark_remote)
    kinds = (("a", "jsonl"), ("b", "parquet"), ("c", "jsonl"))
    files = [make_file(tmp_path, rng, s, fmt, EVENTS // 2) for s, fmt in kinds]
    print(kill_retry_count(store, env, files, rng, f"seed {seed}", least=0.25, tick_after_first=True))
