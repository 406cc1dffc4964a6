"""A run worker killed with SIGKILL mid-epoch under `dagster dev` (issue 21): a later run
commits the rest, exactly once, within the run-monitoring bound plus a run's duration.

The stack is the shared one (tests/dagster_stack.py, fixture `dagster_stack`: webserver,
daemon and code server, QueuedRunCoordinator, run monitoring and run retries from
wire_dagster/devstack.py's INSTANCE_YAML). The test brings in a pipeline of its own (the
stack's windows; 2 chunks an epoch, so one run commits 13 epochs one after another) with its
sensor stopped, produces a closed stream of ~3,700 lines over two segments (retried appends,
late events, malformed lines), then starts the sensor. Its first run is the victim; with an
even seed (the default one) the sensor is stopped again once the victim runs, so that the
daemon's retry alone must recover, with an odd one it keeps running (a sensor run queued
behind the victim then usually commits first, and the retry finds nothing left):

    sensor run ── epochs 1..k committed ── (seeded random delay) ✗ SIGKILL to the run's process
    Dagster: run FAILURE ── the run retry (dagster/parent_run_id), and any sensor run queued
    behind the victim ── epochs k+1..13 committed

The process killed is the one executing the run: the pid of Dagster's "Started process for run
(pid: N)" engine event, checked with psutil to be a child of dagster dev's code server
(`dagster api grpc`; the job's in-process executor runs the step there). Its own children
(Dagster's compute-log tails) must die with it. The moment: a seeded random epoch k among
those of the run's first Spark job (0..7), whose commit marker is waited for (k = 0: the run's
log line of its first epoch, so the kill falls in that Spark job), then a seeded random delay
of up to MAX_DELAY s: the kill lands while the run is inside its epochs — a Spark job, staging
or a commit, with the second job computing alongside — at no named point. Checked right after
the kill: not every epoch was committed (the kill was mid-run).

Then, each wait a condition with a deadline:
- the killed run is FAILURE within the run-monitoring bound, for SIGKILL (the code server that
  spawned the process reports its death; run monitoring frees its pool slot, run retries
  launches the retry);
- every epoch is committed (epoch 13, W = +inf) within that bound plus a run's duration;
- every run of the pipeline ends: the victim FAILURE, its one retry and every other run SUCCESS,
  and no slot of the pipeline's pool is left claimed;
- the committed results equal tests/reference.py run over the committed epochs (their chunk
  splits from the manifests, which must read every chunk exactly once; W computed here from
  the events and the seals), no window identity twice (a negative control must fail the same
  check), the counts balance (events in = input lines = counted + late + duplicate +
  malformed) and equal the reference's, dead letters included; every marker names an intact
  manifest, the published output is exactly the last manifest's, and nothing the killed run
  staged is named by a committed manifest (garbage collection with no grace leaves only named
  files).

WIRE_CRASH_SEEDS=n runs n seeds (default 1), each with a pipeline and stream of its own.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import signal
import time

import psutil
import pytest
import yaml

import reference
from commit_scenario import (
    Expected,
    assert_committed_sound,
    assert_counts,
    assert_published,
    assert_results,
    chunk_events,
    seeds,
)
from dagster_stack import ACTIVE, PIPELINE, T0, M
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.devstack import INSTANCE_YAML
from wire_dagster.procgroup import wait_until
from wire_dagster.settings import epochs_per_job
from wire_dagster.timeutil import INF, NEG_INF

SEGMENTS = ("a", "b")
USERS = tuple(f"u{i}" for i in range(8))
EVENTS_PER_SEGMENT = 1800
SPAN = 36 * M  # event time the stream covers, from T0
CHUNK_ROWS = 150
MAX_CHUNKS = 2  # per epoch: one chunk of each segment, the segments kept aligned in event time
MAX_DELAY = 0.2  # s: the random delay after the anchor

_cfg = yaml.safe_load(INSTANCE_YAML)
# The run-monitoring bound, from the instance the stack runs: the monitoring daemon's poll (it
# frees a dead run's pool slot free_slots_after_run_end_seconds after the run ended), the run
# retry daemon's loop (Dagster's event-log consumer, 5 s by default) and the queue's dequeue.
MONITOR_BOUND = (
    _cfg["run_monitoring"]["poll_interval_seconds"]
    + _cfg["run_monitoring"]["free_slots_after_run_end_seconds"]
    + int(os.environ.get("DAGSTER_EVENT_LOG_CONSUMER_DAEMON_INTERVAL_SECONDS", "5"))
    + _cfg["run_coordinator"]["config"]["dequeue_interval_seconds"]
)
# A run of this stream: a worker process starts (imports, code location, Spark Connect client)
# and commits ~13 epochs in two Spark jobs; ~10 s on an idle machine, far more on a loaded one.
RUN_BOUND = 90
LAUNCH_TIMEOUT = 180  # the daemon sees the new sensor, ticks, queues and launches the first run


def pipeline(name: str) -> dict:
    d = copy.deepcopy(PIPELINE)
    d.update(name=name, stream=name)
    d["limits"] = {**d["limits"], "chunk_rows": CHUNK_ROWS, "max_chunks_per_epoch": MAX_CHUNKS}
    # Stopped until the closed stream is in place; every manifest kept, for the epoch splits.
    d["dagster"] = {**d["dagster"], "sensor_running": False, "keep_epochs": 100}
    return d


def segment_lines(rng: random.Random, seg: str) -> tuple[list[str], int]:
    """A segment's JSON lines (in order, out of order by < 2 s: less than the 3 s bound) with a
    retried append every ~150 lines, a late event every ~120 (half a few seconds behind, which
    may still count, half 4 minutes behind: a dead letter) and 3 malformed lines; and how many
    of the lines are malformed."""
    step = SPAN // EVENTS_PER_SEGMENT
    evs = [
        {
            "user": rng.choice(USERS),
            "ts": T0 + i * step + rng.randrange(0, 2_000),
            "eid": f"{seg}{i}",
            "amount": rng.randrange(1, 100),
        }
        for i in range(EVENTS_PER_SEGMENT)
    ]
    lines = [json.dumps(e) for e in evs]
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        if i % 150 == 149:
            out.append(lines[i - rng.randrange(1, 30)])  # a retried append
        if i % 120 == 60 and i >= 300:  # (4 minutes behind the first minutes would be before the pipeline's start)
            back = rng.randrange(4_000, 15_000) if (i // 120) % 2 else 4 * M
            out.append(
                json.dumps({"user": rng.choice(USERS), "ts": evs[i]["ts"] - back, "eid": f"{seg}late{i}", "amount": 7})
            )
    bad = [
        json.dumps({"user": "u1", "ts": "yesterday", "eid": f"{seg}bad0"}),
        "not json at all",
        json.dumps({"user": "u2", "eid": f"{seg}bad2"}),
    ]
    for b in bad:
        out.insert(rng.randrange(len(out) + 1), b)
    return out, len(bad)


def expected(store, spec, manifests, sealed: dict[str, int], lines: int, malformed: int) -> Expected:
    """tests/reference.py over the committed epochs' chunk splits; W per epoch computed here: per
    segment max event time read - max_out_of_orderness, +inf once its seal is read through; the
    minimum over the segments, never going back."""
    events = chunk_events(store, spec)
    st = reference.RefState()
    read, max_t, w, ws, splits = {}, {}, NEG_INF, [], []
    for m in manifests:
        split = {s: list(range(a, b + 1)) for s, (a, b) in sorted(m.chunks.items())}
        evs = [e for s, q in split.items() for n in q for e in events[(s, n)]]
        for e in evs:
            max_t[e["_seg"]] = max(max_t.get(e["_seg"], NEG_INF), e["_t"])
        for s, q in split.items():
            read[s] = q[-1] + 1
        w = max(
            w,
            min(
                INF if read.get(s, 0) > last else max_t[s] - spec.max_out_of_orderness if s in max_t else NEG_INF
                for s, last in sealed.items()
            ),
        )
        reference.run_epoch(spec, st, evs, w)
        ws.append(w)
        splits.append(split)
    return Expected(st, ws, lines, malformed, splits)


def alive(p: psutil.Process) -> bool:
    """The process runs (a zombie is dead: it only waits to be reaped)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def worker_pid(st, run_id: str) -> int | None:
    """The pid of the process executing the run, from Dagster's engine event."""
    for e in st.run_events(run_id):
        m = re.fullmatch(r"Started process for run \(pid: (\d+)\)\.", e["message"])
        if m:
            return int(m.group(1))
    return None


@pytest.mark.parametrize("seed", seeds())
def test_run_worker_killed_mid_epoch_then_retry_commits_exactly(dagster_stack, tmp_path, seed: int) -> None:
    from sensors import sensor_name
    from wire_dagster.streams import close_stream, produce

    st = dagster_stack
    rng = random.Random(seed)
    t0 = time.time()

    def say(what: str) -> None:  # a timeline, shown with a failure (pytest's captured output)
        print(f"[{time.time() - t0:6.2f}s] {what}", flush=True)

    spec = st.add_pipeline(pipeline(f"kill{seed}"))
    sensor = sensor_name(spec)
    store, cp = st.store, Checkpoints(st.store, spec.name)
    tags = {"wire/pipeline": spec.name}
    say(f"pipeline {spec.name} loaded")

    # A closed stream of two segments, in place before the sensor runs.
    lines, malformed = 0, 0
    for s in SEGMENTS:
        seg, bad = segment_lines(rng, s)
        f = tmp_path / f"{s}.jsonl"
        f.write_text("\n".join(seg) + "\n")
        rep = produce(store, spec, f, segment=s)
        assert rep.events + rep.malformed == len(seg) and rep.malformed == bad, rep
        lines, malformed = lines + len(seg), malformed + bad
    sealed = close_stream(store, spec)
    n_chunks = sum(last + 1 for last in sealed.values())
    epochs = -(-n_chunks // MAX_CHUNKS)  # each epoch reads MAX_CHUNKS chunks; the one reading the seals makes W = +inf
    # k among the epochs of the run's first Spark job: the second job (its result, then its >= 4
    # epochs' commits) is still to come after the kill, even on a fast machine where a commit
    # takes a few tens of ms (70-250 ms measured under load 6-11) and MAX_DELAY covers several.
    assert epochs >= epochs_per_job() + 4, (n_chunks, sealed)
    k = rng.randrange(0, epochs_per_job())
    delay = rng.uniform(0, MAX_DELAY)
    retry_alone = seed % 2 == 0  # even seeds stop the sensor once the victim runs; odd ones leave it running
    say(f"{lines} lines in {n_chunks} chunks, stream closed; the kill: {delay:.3f}s after epoch {k} of {epochs}")

    try:
        st.set_sensor(sensor, True)

        # The victim: the sensor's first run, once the process executing it is known.
        def first_run():
            runs = st.runs(tags)
            assert all(r["status"] in (*ACTIVE, "SUCCESS") for r in runs), runs
            started = [r for r in runs if r["status"] == "STARTED"]
            if started:
                pid = worker_pid(st, started[0]["runId"])
                return (started[0], pid) if pid else None
            return None

        victim, pid = wait_until(
            first_run, LAUNCH_TIMEOUT, f"a run of {spec.name} started by the sensor", st.alive, every=0.25
        )
        vid = victim["runId"]
        assert victim["tags"].get("dagster/sensor_name") == sensor and cp.committed() == []
        proc = psutil.Process(pid)
        server = proc.parent()
        # dagster dev's code server (`dagster api grpc`) spawned it: the run's own process, not a daemon's
        assert (
            os.getpgid(pid) == st.procs[-1].proc.pid and server is not None and ["api", "grpc"] == server.cmdline()[3:5]
        ), (pid, server and server.cmdline()[:6])
        born = proc.create_time()
        say(f"run {vid} started, its process {pid}")
        if retry_alone:  # no sensor run can queue behind the victim: the retry alone must commit the rest
            st.set_sensor(sensor, False)

        # The moment: after epoch k's commit marker (k = 0: the run's log of its first epoch), the random delay.
        def anchor() -> bool:
            # the worker's liveness from the kernel, not GraphQL: this poll must keep up with the commits
            assert alive(proc), f"run {vid} ended before epoch {k}"
            if k == 0:
                return any(e["message"].startswith("epoch 1:") for e in st.run_events(vid))
            return k in cp.committed()

        wait_until(anchor, RUN_BOUND, f"run {vid} at epoch {k}", st.alive, every=0.02)
        time.sleep(delay)  # the random moment itself, not a wait for anything
        assert alive(proc) and proc.create_time() == born, f"run worker {pid} is gone before the kill"
        children = proc.children(recursive=True)  # Dagster's compute-log tails and their orphan watchers
        os.kill(pid, signal.SIGKILL)
        t_kill = time.time()
        at_kill = cp.committed()
        wait_until(
            lambda: not any(alive(p) for p in [proc, *children]),
            30,
            f"run worker {pid} and its children gone after SIGKILL",
        )
        where = f"seed {seed}: SIGKILL to {pid} of run {vid} {delay:.3f}s after epoch {k}; epochs {at_kill} committed"
        say(where)
        assert len(at_kill) < epochs, f"{where}: every epoch was committed already — not a kill mid-run"
        assert at_kill == list(range(1, len(at_kill) + 1)), where

        # Dagster marks the run failed at once; the retry (or a sensor run queued behind the victim) commits the rest.
        def failed():
            r = next(r for r in st.runs(tags) if r["runId"] == vid)
            return r if r["status"] == "FAILURE" else None

        v = wait_until(failed, MONITOR_BOUND, f"{where}: run {vid} marked FAILURE", st.alive, every=0.1)
        why = [
            e["message"]
            for e in st.run_events(vid)
            if e["eventType"] in ("ENGINE_EVENT", "RUN_FAILURE") and e["t"] >= t_kill - 1
        ]
        assert any("SIGKILL" in m for m in why), why
        say(f"run FAILURE {v['endTime'] - t_kill:.2f}s after the kill: {why[0][:120]}")

        seen: dict[int, float] = {}

        def complete() -> bool:
            for n in cp.committed():
                seen.setdefault(n, time.time())
            last = cp.latest()
            return len(seen) == epochs and last is not None and last.watermark == INF

        bound = MONITOR_BOUND + RUN_BOUND
        wait_until(
            complete,
            t_kill + bound - time.time(),
            f"{where}: every epoch committed {bound}s after the kill",
            st.alive,
            every=0.1,
        )
        t_next, t_last = (min(t for n, t in seen.items() if n not in at_kill) - t_kill), max(seen.values()) - t_kill
        say(f"next commit {t_next:.2f}s, the last {t_last:.2f}s after the kill")
        assert t_last <= bound

        def ended():
            runs = st.runs(tags)
            return runs if not any(r["status"] in ACTIVE for r in runs) else None

        runs = wait_until(
            ended, MONITOR_BOUND + RUN_BOUND, f"{where}: the runs of {spec.name} end", st.alive, every=0.5
        )
        for r in sorted(runs, key=lambda r: r["creationTime"]):
            at = [f"{(r[t] or t_kill) - t_kill:+.1f}" for t in ("creationTime", "startTime", "endTime")]
            retry = " (the retry)" if r["tags"].get("dagster/parent_run_id") == vid else ""
            by = " (committed the next epoch)" if (r["startTime"] or INF) <= t_next + t_kill <= r["endTime"] else ""
            say(f"run {r['runId'][:8]}{retry} {r['status']}{by}: created, started, ended {', '.join(at)}s after kill")
        bad = [(r["runId"], r["status"]) for r in runs if r["runId"] != vid and r["status"] != "SUCCESS"]
        assert not bad, f"{where}: runs after the kill did not succeed: {bad}"
        retries = [r for r in runs if r["tags"].get("dagster/parent_run_id") == vid]
        assert len(retries) == 1 and retries[0]["status"] == "SUCCESS", f"{where}: retries of the killed run: {retries}"
        assert st.pool_claims(f"wire_{spec.name}") == [], f"{where}: a slot of the pipeline's pool is still claimed"
    finally:
        if (st.sensor(sensor) or {}).get("status") == "RUNNING":
            st.set_sensor(sensor, False)

    # Exactly once: results, counts and dead letters equal the reference over the committed epochs.
    committed = cp.committed()
    assert committed == list(range(1, epochs + 1)), f"{where}: committed epochs {committed}, expected 1..{epochs}"
    manifests = [cp.load(n) for n in committed]
    say(f"epochs prepared at {[m.created_ms - manifests[0].created_ms for m in manifests]} ms after the first")
    exp = expected(store, spec, manifests, sealed, lines, malformed)
    read = {s: [n for sp in exp.splits for n in sp.get(s, [])] for s in sealed}
    assert read == {s: list(range(last + 1)) for s, last in sealed.items()}, (
        f"{where}: chunks not read exactly once: {read}"
    )
    c = exp.state.window_counts
    assert all(c[w.name]["late"] > 0 for w in spec.windows) and exp.state.counts["duplicate"] > 0, (c, exp.state.counts)
    assert any(r == "late" for r, _, _ in exp.state.dead)
    assert_results(store, spec, exp)
    w0 = spec.windows[0].name  # negative control: the same check on a reference with one aggregate off must fail
    ident, row = next(iter(exp.state.view[w0].items()))
    bent = copy.deepcopy(exp)
    bent.state.view[w0][ident] = {**row, "n": row["n"] + 1}
    with pytest.raises(AssertionError):
        assert_results(store, spec, bent)
    m = assert_counts(store, spec, exp)
    assert m.epoch == epochs and m.watermark == INF
    assert_committed_sound(store, spec)
    assert_published(store, spec)
    # Nothing the killed run staged is named by a committed manifest: GC with no grace collects it.
    named = {f.key for n in committed for f in cp.load(n).files()}
    cp.gc(keep=100, grace_s=0)
    left = {i.key for i in store.list(f"{cp.root}staging/")}
    say("results, counts and files checked")
    assert left <= named, f"{where}: staged files left that no committed manifest names: {sorted(left - named)[:5]}"
