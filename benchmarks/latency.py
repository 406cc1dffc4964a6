"""Benchmark: latency under `dagster dev` — landing the chunk that completes a partition → its commit marker.

    .venv/bin/python benchmarks/latency.py [--partitions 24] [--warmup 2] [--events-per-chunk 200]
        [--windows all|tumbling] [--sensor-interval 4] [--interval 0] [--dequeue-interval N] [--seed 7]

Starts its own stack (benchmarks/stack.py: an embedded S3 server in a temporary WIRE_HOME, a
Spark Connect server, `dagster dev` with a temporary DAGSTER_HOME holding the project's
dagster.yaml and a temporary WIRE_PIPELINES holding one pipeline whose watermark sensor has a
4 s interval: the default), then lands one chunk per partition on segment 0: chunk k holds the events of
event time (p_k + 2 s, p_k+1 + 2 s] (1-minute partitions, max_out_of_orderness 2 s), so it
moves the watermark from p_k exactly to p_k+1 = the end of partition k: partition k becomes
ready with that chunk, and nothing is late.

Pacing. `--interval 0` (default): closed loop — the next chunk lands once the previous
partition's run has ended, after a random 0..sensor-interval delay, so arrivals fall at a
random phase of the sensor's and the run queue's loops (which is what a stream whose
partitions complete once a minute sees; `--interval 60` lands them in event-time real time).
`--interval S`: open loop, a chunk every S seconds whatever is still running (queueing then
shows in the figures).

Per partition: t_land (when `streams.produce` returned, i.e. after the chunk's index object
was claimed); the commit marker of the first epoch that read the chunk: t_commit, when a HEAD
poll every 0.1 s first saw it (SeaweedFS's LastModified has whole-second precision, so it
cannot time the marker; the manifest's created_ms, written just before the marker, bounds it
from below); the Dagster run that committed that epoch (GraphQL: its record and event log) and
the sensor tick that requested it; and the Spark jobs the Connect server ran for the epoch
(its REST API, submission/completion times, ms precision). Breakdown of land → commit:

    sensor wait   land → run created          (until the next tick, + the tick's evaluation)
    run launch    created → RUN_START         (RUN_ENQUEUED → RUN_STARTING: the daemon's run queue
                                               loop; → RUN_START: the run worker process started,
                                               imports, definitions loaded)
    run setup     started → "epoch N" logged  (step start, resource init, Spark Connect attach,
                                               reading the last manifest, self-correction check)
    epoch         "epoch N" → manifest        (state reads, the Spark jobs, staging of outputs)
      of which Spark jobs: first job submitted → last job completed, on the server
    commit        manifest created → marker seen (prepare, fence, conditional PUT, ≤ 0.1 s poll)

Prints Markdown to stdout and writes benchmarks/results/latency-<date>.md. Every process it
started is stopped by its process group at the end, on failure and on Ctrl-C alike.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import git_commit, install_signal_handlers, md_table, save_report
from benchmarks.stack import (
    BenchStack,
    partition_key,
    pct,
    uptime,
)

ROOT = Path(__file__).resolve().parent.parent
NAME = "latency"
M = 60_000
H = 3_600_000
OOO = 2_000
WINDOWS = {
    "tumbling": {
        "name": "per_minute",
        "type": "tumbling",
        "size": "1m",
        "aggregates": {"n": "count", "total": "sum(amount)", "top": "max(amount)"},
    },
    "sliding": {
        "name": "two_by_one",
        "type": "sliding",
        "size": "2m",
        "slide": "1m",
        "aggregates": {"n": "count", "mean": "avg(amount)"},
    },
    "session": {
        "name": "sessions",
        "type": "session",
        "gap": "15s",
        "aggregates": {"n": "count", "total": "sum(amount)"},
    },
}
WINDOW_SETS = {"all": ["tumbling", "sliding", "session"], "tumbling": ["tumbling"]}
GOAL_P50, GOAL_P99 = 8.0, 20.0


def pipeline_dict(t0: int, windows: str, sensor_interval: int) -> dict:
    from wire_dagster.timeutil import iso

    return {
        "name": NAME,
        "stream": NAME,
        "event": {"key": "user", "time": "ts", "id": "eid"},
        "watermark": {"max_out_of_orderness": f"{OOO // 1000}s", "idle_timeout": "1h"},
        "lateness": {"allowed": "10s"},
        "partition": "1m",
        "start": iso(t0).replace(".000", ""),
        "limits": {"max_future": "10m"},
        "windows": [WINDOWS[k] for k in WINDOW_SETS[windows]],
        "dagster": {"sensor_interval": f"{sensor_interval}s"},
    }


def chunk_events(t0: int, k: int, n: int, rng: random.Random) -> list[dict]:
    """Chunk k: n events in (p_k + OOO, p_k + 1m + OOO], the last exactly at the top (W := p_k + 1m)."""
    lo, hi = t0 + k * M + OOO, t0 + (k + 1) * M + OOO
    ts = sorted(rng.randrange(lo + 1, hi) for _ in range(n - 1)) + [hi]
    return [
        {"user": f"u{rng.randrange(10)}", "ts": t, "amount": rng.randrange(1, 100), "eid": f"k{k}-{i}"}
        for i, t in enumerate(ts)
    ]


@dataclass
class Landing:
    k: int
    seq: int
    t_land: float
    partition: str
    events: int


@dataclass
class Commit:
    epoch: int
    t_seen: float  # first HEAD that found the marker
    created: float  # manifest created_ms / 1000 (just before prepare + marker)
    last_modified: float  # the marker's LastModified (whole seconds on SeaweedFS)
    upto: int  # remap of segment 0: chunks < upto are read
    run_id: str  # Wire's run id (manifest)
    events_in: int


@dataclass
class Row:
    land: Landing
    commit: Commit
    run: dict = field(default_factory=dict)
    ev: dict = field(default_factory=dict)  # named event times of the committing run
    tick: dict | None = None
    spark: dict = field(default_factory=dict)

    @property
    def total(self) -> float:
        return self.commit.t_seen - self.land.t_land


class CommitWatcher:
    """Notices commit markers in epoch order (HEAD polls) and what each epoch read."""

    def __init__(self, bs: BenchStack) -> None:
        self.bs = bs
        self.next_epoch = 1
        self.commits: list[Commit] = []

    def poll(self) -> list[Commit]:
        new = []
        while True:
            info = self.bs.store.head(self.bs.marker_key(self.next_epoch))
            if info is None:
                return new
            t = time.time()
            m = self.bs.manifest(self.next_epoch)
            c = Commit(
                self.next_epoch,
                t,
                m.created_ms / 1000,
                info.last_modified_ms / 1000,
                m.remap.get("0", 0),
                m.run_id,
                m.counts.events_in,
            )
            self.commits.append(c)
            new.append(c)
            self.next_epoch += 1

    def commit_of(self, seq: int) -> Commit | None:
        return next((c for c in self.commits if c.upto > seq), None)

    def committed(self, seq: int) -> Commit | None:
        """Poll, then the commit of chunk `seq` if there is one yet."""
        self.poll()
        return self.commit_of(seq)


def wait(cond, timeout: float, what: str, bs: BenchStack, every: float = 0.1):
    """Poll `cond` until it returns something (returned); fails at once if a process of the stack died."""
    from wire_dagster.procgroup import wait_until

    return wait_until(cond, timeout, what, bs.alive, every=every)


def run_phases(bs: BenchStack, run: dict, epoch: int) -> dict:
    """Named event times (epoch s) of a run, from its Dagster event log."""
    out: dict[str, float] = {}
    for e in bs.run_events(run["runId"]):
        et, msg = e["eventType"], e["message"]
        first = {
            "RUN_ENQUEUED": "enqueued",
            "RUN_DEQUEUED": "dequeued",
            "RUN_STARTING": "starting",
            "RUN_START": "run_start",
            "STEP_START": "step_start",
            "ASSET_MATERIALIZATION": "first_materialization",
            "STEP_SUCCESS": "step_success",
            "RUN_SUCCESS": "run_success",
            "RUN_FAILURE": "run_failure",
        }.get(et)
        if first and first not in out:
            out[first] = e["t"]
        if et == "ENGINE_EVENT" and msg.startswith("Started process for run") and "process_started" not in out:
            out["process_started"] = e["t"]
        if et == "ENGINE_EVENT" and "resource" in msg.lower() and "resources_init" not in out:
            out["resources_init"] = e["t"]
        if e["type"] == "LogMessageEvent" and msg.startswith(f"epoch {epoch}:"):
            out["epoch_log"] = e["t"]
    return out


def find_committing_run(bs: BenchStack, runs: list[dict], c: Commit) -> tuple[dict, dict] | None:
    """The Dagster run whose log says it processed epoch c.epoch (candidates: runs requested for that epoch first)."""
    cands = sorted(runs, key=lambda r: (r["tags"].get("wire/epoch") != str(c.epoch), r["creationTime"]))
    for r in cands:
        if r["creationTime"] > c.t_seen:
            continue
        ev = run_phases(bs, r, c.epoch)
        if "epoch_log" in ev:
            return r, ev
    return None


def collect(bs: BenchStack, rows: list[Row], runs: list[dict]) -> None:
    ticks = bs.sensor_ticks(after=min(r.land.t_land for r in rows) - 60)
    jobs = bs.spark_jobs()
    for row in rows:
        if row.run:
            continue
        found = find_committing_run(bs, runs, row.commit)
        if found is None:
            raise RuntimeError(f"no Dagster run logged epoch {row.commit.epoch}")
        row.run, row.ev = found
        row.tick = next((t for t in ticks if row.run["runId"] in (t["runIds"] or [])), None)
        lo, hi = row.ev["epoch_log"], row.commit.created
        js = [j for j in jobs if j["submitted"] is not None and lo - 0.05 <= j["submitted"] <= hi]
        if js:
            row.spark = {
                "jobs": len(js),
                "first": min(j["submitted"] for j in js),
                "last": max(j["completed"] or j["submitted"] for j in js),
                "busy": sum((j["completed"] or j["submitted"]) - j["submitted"] for j in js),
            }


def phases(row: Row) -> dict[str, float | None]:
    ev, run, c = row.ev, row.run, row.commit
    created, started = run["creationTime"], run["startTime"]
    tick = row.tick["timestamp"] if row.tick else None
    sp = row.spark

    def span(a: str, b: str) -> float | None:
        return (ev[b] - ev[a]) if a in ev and b in ev else None

    return {
        "total": row.total,
        "sensor wait": created - row.land.t_land,
        "land→tick": (tick - row.land.t_land) if tick else None,
        "tick→created": (created - tick) if tick else None,
        "run launch": started - created,
        "created→enqueued": (ev["enqueued"] - created) if "enqueued" in ev else None,
        "queued": span("enqueued", "starting"),
        "worker start": (started - ev["starting"]) if "starting" in ev else None,
        "run setup": ev["epoch_log"] - started,
        "epoch": c.created - ev["epoch_log"],
        "Spark jobs": (sp["last"] - sp["first"]) if sp else None,
        "commit": c.t_seen - c.created,
        "after commit": ((run["endTime"] or c.t_seen) - c.t_seen),
    }


COLS = [
    "total",
    "sensor wait",
    "land→tick",
    "tick→created",
    "run launch",
    "created→enqueued",
    "queued",
    "worker start",
    "run setup",
    "epoch",
    "Spark jobs",
    "commit",
    "after commit",
]
SHARES = {"sensor wait", "run launch", "run setup", "epoch", "commit"}  # these add up to the total


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def report(args, rows: list[Row], warm: list[Row], load0: str, load1: str, ticks_all: list[dict], wall: float) -> str:
    import itertools
    import os

    rev = f"{args.rev0} at the start, {git_commit()} at the end"
    ps = [phases(r) for r in rows]
    totals = [r.total for r in rows]
    mean_total = sum(totals) / len(totals)
    summary = []
    for c in COLS:
        xs = [v for p in ps if (v := p[c]) is not None]
        if not xs:
            summary.append([c, "-", "-", "-", "-", "-", "-"])
            continue
        mean = sum(xs) / len(xs)
        share = f"{100 * mean / mean_total:.0f} %" if c in SHARES else ""
        summary.append(
            [c, f"{pct(xs, 50):.2f}", f"{pct(xs, 99):.2f}", f"{max(xs):.2f}", f"{mean:.2f}", f"{min(xs):.2f}", share]
        )
    p50, p99 = pct(totals, 50), pct(totals, 99)
    spacing = [b["timestamp"] - a["timestamp"] for a, b in itertools.pairwise(ticks_all)]
    evals = [t["endTimestamp"] - t["timestamp"] for t in ticks_all if t.get("endTimestamp")]
    jobs = [r.spark.get("jobs", 0) for r in rows]
    instance = (
        f"the project's dagster.yaml plus `{json.dumps(args.instance_overrides)}`"
        if args.instance_overrides
        else "the project's dagster.yaml (wire_dagster.devstack: QueuedRunCoordinator, one run per pipeline)"
    )
    pacing = (
        f"closed loop, each chunk lands 0..{args.sensor_interval} s (uniform) after the previous partition's run ended"
        if args.interval == 0
        else f"open loop, a chunk every {args.interval} s"
    )
    verdict = (
        f"goal p50 ≤ {GOAL_P50:.0f} s: {'met' if p50 <= GOAL_P50 else 'NOT met'}; "
        f"p99 ≤ {GOAL_P99:.0f} s: {'met' if p99 <= GOAL_P99 else 'NOT met'}"
    )
    out = [
        "# Latency under `dagster dev`: chunk landed → commit marker "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"`{' '.join(['.venv/bin/python', 'benchmarks/latency.py', *sys.argv[1:]])}` at commit {rev}.",
        "",
        f"- Machine: {len(os.sched_getaffinity(0))} cores, shared with other engineers' work. `uptime` before: "
        f"`{load0}`; after: `{load1}`.",
        (
            "- Stack: embedded SeaweedFS, a Spark Connect server (local[2], 1 GB driver, AQE off, 1 shuffle "
            f"partition), `dagster dev` with {instance}."
        ),
        (
            f"- Pipeline: 1-minute partitions, windows {', '.join(WINDOW_SETS[args.windows])}, sensor interval "
            f"{args.sensor_interval} s, {args.events_per_chunk} events per chunk (10 keys, an id field), one segment."
        ),
        f"- Pacing: {pacing}; {len(rows)} measured partitions after {len(warm)} warm-up ones; {wall / 60:.1f} min in "
        "all.",
        "",
        (
            f"**land → commit: p50 {p50:.2f} s, p99 {p99:.2f} s, max {max(totals):.2f} s** ({verdict}). "
            f"p99 over {len(rows)} samples is interpolated between the two largest."
        ),
        "",
        "## Where the time goes (seconds, over the measured partitions)",
        "",
        md_table(["phase", "p50", "p99", "max", "mean", "min", "share of mean total"], summary),
        "",
        (
            "- sensor wait = land → run created. land → tick: until the sensor tick that requested the run started "
            "(negative: the tick had started before the chunk landed and its evaluation still saw it); tick → "
            "created: the tick's evaluation (a gRPC call to the code server, `planner.plan` reading the stream) and "
            "the run's creation."
        ),
        (
            "- run launch = created → RUN_START: created → RUN_ENQUEUED (the daemon writing the run and its planned "
            "events); queued = RUN_ENQUEUED → RUN_STARTING (until the daemon's run queue loop, every "
            "`dequeue_interval_seconds`, launches it); worker start = RUN_STARTING → RUN_START (the code server "
            "spawns the run worker: Python, imports, the definitions)."
        ),
        (
            "- run setup = RUN_START → the engine's `epoch N:` log (step start, resources, Spark Connect attach, "
            "reading the last manifest, the self-correction check of the published output, listing the stream)."
        ),
        (
            "- epoch = `epoch N:` log → the manifest's created_ms (state reads, the kernel's Spark jobs, staging "
            "outputs and state); Spark jobs = first job submitted → last job completed on the Connect server (its "
            "REST API), inside the epoch."
        ),
        (
            "- commit = manifest created → marker first seen by the benchmark's 0.1 s HEAD poll (prepare, fence, "
            "conditional PUT, ≤ 0.1 s of polling); after commit = marker → run ended (publish, GC, report, "
            "materializations; not part of the latency)."
        ),
        (
            f"- Spark jobs per epoch: {min(jobs)}–{max(jobs)}."
            if jobs and max(jobs)
            else "- Spark jobs: not measured (no REST API)."
        ),
    ]
    if len(spacing) > 1 and evals:
        long_gaps = sum(1 for g in spacing if g > 1.5 * args.sensor_interval)
        out.append(
            f"- Sensor ticks while measuring: {len(ticks_all)}; spacing p50 {pct(spacing, 50):.2f} s, min "
            f"{min(spacing):.2f} s, max {max(spacing):.2f} s, {long_gaps} of {len(spacing)} gaps longer than 1.5 × the "
            f"interval; evaluation p50 {pct(evals, 50):.2f} s, max {max(evals):.2f} s."
        )
    out += [
        "",
        "## Per partition",
        "",
        md_table(
            ["k", "partition", "epoch", "events", *COLS],
            [
                [r.land.k, r.land.partition, r.commit.epoch, r.commit.events_in, *[fmt(p[c]) for c in COLS]]
                for r, p in zip(rows, ps, strict=True)
            ],
        ),
        "",
    ]
    if warm:
        parts = [
            f"k={r.land.k} total {r.total:.2f} s (launch {fmt(phases(r)['run launch'])}, setup "
            f"{fmt(phases(r)['run setup'])}, epoch {fmt(phases(r)['epoch'])})"
            for r in warm
        ]
        out += ["Warm-up partitions (not in the figures): " + "; ".join(parts), ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument(
        "--partitions", type=int, default=24, help="measured partitions (at least 20 for the issue's figures)"
    )
    ap.add_argument("--warmup", type=int, default=2, help="partitions landed first and left out of the figures")
    ap.add_argument("--events-per-chunk", type=int, default=200)
    ap.add_argument("--windows", choices=sorted(WINDOW_SETS), default="all")
    ap.add_argument("--sensor-interval", type=int, default=4)  # the pipelines' default (spec.Orchestration)
    ap.add_argument(
        "--interval", type=float, default=0.0, help="0: closed loop (default); S > 0: a chunk every S seconds"
    )
    ap.add_argument(
        "--dequeue-interval",
        type=int,
        default=None,
        help="run_coordinator dequeue_interval_seconds (default: the project's dagster.yaml, i.e. Dagster's 5 s)",
    )
    ap.add_argument(
        "--instance",
        type=json.loads,
        default=None,
        dest="extra_instance",
        help="more dagster.yaml overrides as JSON, merged into the project's",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=600, help="bound on any one wait (s)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if args.partitions < 1 or args.warmup < 0 or args.events_per_chunk < 1:
        ap.error("--partitions >= 1, --warmup >= 0, --events-per-chunk >= 1")
    overrides: dict = {}
    if args.dequeue_interval is not None:
        overrides.setdefault("run_coordinator", {}).setdefault("config", {})["dequeue_interval_seconds"] = (
            args.dequeue_interval
        )
    if args.extra_instance:
        overrides.update(args.extra_instance)
    args.instance_overrides = overrides or None

    install_signal_handlers()
    args.rev0 = git_commit()
    from wire_dagster.streams import produce

    n_total = args.warmup + args.partitions
    now = int(time.time() * 1000)
    t0 = (now - (n_total + 5) * M) // H * H - H  # partitions end well before now + max_future
    rng = random.Random(args.seed)
    load0 = uptime()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wire-latency-") as tmpd:
        tmp = Path(tmpd)
        bs = BenchStack(
            tmp,
            pipeline_dict(t0, args.windows, args.sensor_interval),
            instance_overrides=args.instance_overrides,
            spark_ui=True,
        )

        def log(s: str) -> None:
            print(s, file=sys.stderr, flush=True)

        with bs.stopped_at_end():
            bs.start(log=log)
            watcher = CommitWatcher(bs)
            landings: list[Landing] = []
            rows: list[Row] = []
            t_start = time.time()
            for k in range(n_total):
                if args.interval == 0:
                    # Closed loop: the previous partition's run has ended, then a random arrival phase.
                    wait(bs.runs_ended, args.timeout, "previous runs end", bs, every=0.25)
                    delay = rng.uniform(0, args.sensor_interval)
                    end = time.monotonic() + delay
                    while time.monotonic() < end:  # a deliberate random arrival time, not a wait for a condition
                        time.sleep(min(0.05, end - time.monotonic()))
                else:
                    target = t_start + k * args.interval
                    while time.time() < target:
                        watcher.poll()
                        if bs.alive():
                            raise RuntimeError(bs.alive())
                        time.sleep(min(0.1, max(0.0, target - time.time())))
                f = tmp / f"chunk-{k}.jsonl"
                evs = chunk_events(t0, k, args.events_per_chunk, rng)
                f.write_text("".join(json.dumps(e) + "\n" for e in evs))
                rep = produce(bs.store, bs.spec, f, segment="0")
                t_land = time.time()
                if rep.events != len(evs) or rep.malformed or len(rep.chunks) != 1:
                    raise RuntimeError(f"chunk {k}: produce wrote {rep}")
                landings.append(Landing(k, rep.chunks[0], t_land, partition_key(t0 + k * M), rep.events))
                log(f"k={k} landed chunk {rep.chunks[0]} (partition {landings[-1].partition})")
                if args.interval == 0:
                    c = wait(
                        lambda s=rep.chunks[0]: watcher.committed(s),
                        args.timeout,
                        f"commit of chunk {k}",
                        bs,
                        every=0.1,
                    )
                    log(f"    committed in epoch {c.epoch} after {c.t_seen - t_land:.2f}s")
            wait(
                lambda: watcher.poll() is not None and all(watcher.commit_of(x.seq) for x in landings),
                args.timeout,
                "every chunk committed",
                bs,
                every=0.1,
            )
            wait(bs.runs_ended, args.timeout, "the last runs end", bs, every=0.25)
            runs = bs.check_runs()
            for x in landings:
                commit = watcher.commit_of(x.seq)
                assert commit is not None  # waited for above: every chunk committed
                rows.append(Row(x, commit))
            collect(bs, rows, runs)
            ticks_all = [t for t in bs.sensor_ticks(after=t_start - 1) if t["timestamp"] <= time.time()]
            # Sanity: every event read once, conservation balanced.
            m = bs.manifest(watcher.commits[-1].epoch)
            produced = sum(x.events for x in landings)
            if m.totals.events_in != produced or not m.totals.balanced():
                raise RuntimeError(f"committed totals {m.totals} do not account for the {produced} events produced")
            wall = time.monotonic() - started
            load1 = uptime()
            md = report(args, rows[args.warmup :], rows[: args.warmup], load0, load1, ticks_all, wall)
            raw = [
                {
                    "k": r.land.k,
                    "t_land": r.land.t_land,
                    "commit": r.commit.__dict__,
                    "run": {k: v for k, v in r.run.items() if k != "tags"},
                    "events": r.ev,
                    "tick": r.tick,
                    "spark": r.spark,
                    "phases": phases(r),
                }
                for r in rows
            ]
    return save_report(md, args.out / f"latency-{time.strftime('%Y-%m-%d-%H%M')}.md", raw=raw)


if __name__ == "__main__":
    sys.exit(main())
