"""Benchmark: recovery under `dagster dev` — kill -9 of a run worker during its Spark jobs → the next commit.

    .venv/bin/python benchmarks/recovery.py [--scenarios project,retries,monitored] [--warmup 2]
        [--events-per-chunk 200] [--windows all|tumbling] [--max-retries 2] [--observe 90] [--stuck-wait 120]

For each scenario, a stack of its own (benchmarks/stack.py: embedded S3 in a temporary WIRE_HOME,
a Spark Connect server with its REST API on 127.0.0.1, `dagster dev` with a temporary DAGSTER_HOME
and WIRE_PIPELINES; the pipeline and its chunks are benchmarks/latency.py's: one chunk completes
one 1-minute partition, sensor interval 5 s). Scenarios differ only in dagster.yaml:

    project    the project's instance config as `wire dev` writes it (wire_dagster.devstack:
               QueuedRunCoordinator, one run per pipeline, pools default_limit 1, no run retries)
    retries    + `run_retries: {enabled: true, max_retries: N, retry_on_asset_or_op_failure: false}`
               (the daemon re-executes a run whose worker crashed; as docker/dagster.yaml)
    monitored  + run_retries as above + `run_monitoring: {enabled: true, poll_interval_seconds: 5,
               free_slots_after_run_end_seconds: 1, max_resume_run_attempts: 0}` (the monitoring
               daemon frees the pool slot a dead run still claims)

Every run worker of the stack gets WIRE_PAUSE=before-spark (wire_dagster/faults.py): a run stops
right before its Spark phase and waits for `<dir>/before-spark.go`. The go file exists during the
warm-up partitions; for the victim partition it is removed, the chunk lands, and once the run
worker is held (its pid is in `before-spark.paused`, checked against Dagster's "Started process
for run (pid)" event) the go file is created again and the benchmark polls the Connect server's
REST API until a Spark job of this epoch is RUNNING, then sends SIGKILL to that pid (and checks
that no object of the epoch existed yet). Then it measures the time from the kill to the commit
marker of the epoch that reads the victim's chunk, and says what brought it: first `--observe`
seconds with no new data (a retry, or nothing), then, if nothing committed, the next chunk lands
(a new partition, a new run key) and it waits `--stuck-wait` seconds more. A scenario that does
not recover is reported as such, with the runs and Dagster's pool slots.

Last, the committed results are checked against tests/reference.py run over the committed epochs
(the epoch splits from the committed manifests, the events from the benchmark's own input, the
watermarks computed from those events; a negative control with one altered amount must fail the
check), the counts must balance and equal the reference's, and every landed partition should have
a Dagster materialization. Prints Markdown and writes benchmarks/results/recovery-<date>.md; exits
1 if committed results differ from the reference. Every process started is stopped by its process
group at the end, on failure and on Ctrl-C alike.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import comma_list, git_commit, install_signal_handlers, save_report
from benchmarks.latency import OOO, CommitWatcher, M, chunk_events, pipeline_dict, run_phases, wait
from benchmarks.stack import (
    ACTIVE,
    BenchStack,
    partition_key,
    uptime,
)

ROOT = Path(__file__).resolve().parent.parent
H = 3_600_000


def land(bs: BenchStack, tmp: Path, t0: int, k: int, n: int, rng: random.Random, inputs: dict) -> tuple[int, float]:
    from wire_dagster.streams import produce

    evs = chunk_events(t0, k, n, rng)
    f = tmp / f"chunk-{k}.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in evs))
    rep = produce(bs.store, bs.spec, f, segment="0")
    t = time.time()
    if rep.events != len(evs) or rep.malformed or len(rep.chunks) != 1:
        raise RuntimeError(f"chunk {k}: produce wrote {rep}")
    inputs[rep.chunks[0]] = evs
    return rep.chunks[0], t


def pid_gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def materialized(bs: BenchStack, window: str, partitions: list[str]) -> dict[str, str]:
    """partition key -> run id of its latest materialization of `window`."""
    d = bs.gql(
        """query($k: AssetKeyInput!, $p: [String!]) { assetOrError(assetKey: $k) { __typename ... on Asset {
                 assetMaterializations(partitions: $p) { partition runId timestamp } } } }""",
        {"k": {"path": [bs.spec.name, window]}, "p": partitions},
    )
    a = d["assetOrError"]
    out: dict[str, tuple[float, str]] = {}
    if a["__typename"] == "Asset":
        for m in a["assetMaterializations"]:
            if m["partition"] not in out or float(m["timestamp"]) > out[m["partition"]][0]:
                out[m["partition"]] = (float(m["timestamp"]), m["runId"])
    return {k: v[1] for k, v in out.items()}


def check_against_reference(bs: BenchStack, inputs: dict[int, list[dict]], commits) -> dict:
    """tests/reference.py over the committed epochs' splits; results and counts must be equal."""
    import reference
    from commit_scenario import read_all
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.spec import field_column
    from wire_dagster.timeutil import NEG_INF

    spec = bs.spec
    st = reference.RefState()
    lo, max_t, w = 0, NEG_INF, NEG_INF
    for c in commits:
        evs = []
        for seq in range(lo, c.upto):
            for i, e in enumerate(inputs[seq]):
                evs.append(
                    {
                        "_seg": "0",
                        "_seq": seq,
                        "_row": i,
                        "_t": e["ts"],
                        "_key": e["user"],
                        "_id": e["eid"],
                        field_column("amount"): float(e["amount"]),
                    }
                )
                max_t = max(max_t, e["ts"])
        lo = c.upto
        w = max(w, max_t - OOO)
        reference.run_epoch(spec, st, evs, w)
    got = read_all(bs.store, spec)
    problems = []
    rows = {}
    for win in spec.windows:
        want, g = st.view.get(win.name, {}), got[win.name]
        rows[win.name] = (len(g), len(want))
        if set(g) != set(want):
            problems.append(
                f"{win.name}: missing {sorted(set(want) - set(g))[:3]}, extra {sorted(set(g) - set(want))[:3]}"
            )
            continue
        for ident, row in want.items():
            for col, v in row.items():
                x = g[ident][col]
                same = (
                    math.isclose(x, v, rel_tol=1e-9, abs_tol=1e-9) if isinstance(v, float) and x is not None else x == v
                )
                if not same:
                    problems.append(f"{win.name} {ident} {col}: {x} != reference {v}")
    m = Checkpoints(bs.store, spec.name).latest()
    if m is None:  # the warm-up partitions commit before the kill: this is a broken run
        return {"rows": rows, "problems": [*problems, "no epoch is committed"]}
    t = m.totals
    produced = sum(len(v) for seq, v in inputs.items() if seq < lo)  # the chunks the committed epochs read
    if not t.balanced():
        problems.append(f"counts do not balance: {t}")
    if t.events_in != produced:
        problems.append(f"events_in {t.events_in} != {produced} produced")
    if (
        t.duplicate != st.counts["duplicate"]
        or t.counted != {k: v["counted"] for k, v in st.window_counts.items()}
        or t.late != {k: v["late"] for k, v in st.window_counts.items()}
    ):
        problems.append(f"counts {t} != reference {st.counts} {st.window_counts}")
    if m.watermark != w:
        problems.append(f"W {m.watermark} != reference {w}")
    return {
        "rows": rows,
        "problems": problems,
        "totals": t.model_dump(),
        "produced": produced,
        "chunks_committed": lo,
        "chunks_landed": len(inputs),
        "epoch": m.epoch,
        "watermark": m.watermark,
    }


def scenario_overrides(name: str, args) -> dict | None:
    """dagster.yaml overrides (merged into the project's) of each scenario."""
    # As docker/dagster.yaml: retry runs whose worker crashed, not runs whose assets failed.
    retries = {"run_retries": {"enabled": True, "max_retries": args.max_retries, "retry_on_asset_or_op_failure": False}}
    monitoring = {
        "run_monitoring": {
            "enabled": True,
            "poll_interval_seconds": 5,
            "free_slots_after_run_end_seconds": 1,
            "max_resume_run_attempts": 0,
        }
    }
    return {"project": None, "retries": retries, "monitored": {**retries, **monitoring}}[name]


SCENARIOS = ("project", "retries", "monitored")


def scenario(name: str, args, tmp: Path) -> dict:
    pause = tmp / "pause"
    pause.mkdir(parents=True)
    go, held = pause / "before-spark.go", pause / "before-spark.paused"
    go.touch()
    overrides = scenario_overrides(name, args)
    n_total = args.warmup + 2
    t0 = (int(time.time() * 1000) - (n_total + 5) * M) // H * H - H
    rng = random.Random(args.seed)
    bs = BenchStack(
        tmp / "stack",
        pipeline_dict(t0, args.windows, args.sensor_interval),
        instance_overrides=overrides,
        dagster_env={"WIRE_PAUSE": "before-spark", "WIRE_PAUSE_DIR": str(pause), "WIRE_PAUSE_TIMEOUT": "900"},
        spark_ui=True,
    )
    (tmp / "stack").mkdir()

    def log(s: str) -> None:
        print(f"[{name}] {s}", file=sys.stderr, flush=True)

    inputs: dict[int, list[dict]] = {}
    out: dict = {"scenario": name, "instance": overrides or "project"}
    with bs.stopped_at_end(diagnose=lambda: print_runs(bs)):
        bs.start(log=log)
        watcher = CommitWatcher(bs)
        for k in range(args.warmup):
            seq, t_land = land(bs, tmp, t0, k, args.events_per_chunk, rng, inputs)
            c = wait(lambda s=seq: watcher.committed(s), args.timeout, f"commit of warm-up chunk {k}", bs)
            log(f"warm-up k={k}: committed epoch {c.epoch} {c.t_seen - t_land:.1f}s after landing")
            wait(bs.runs_ended, args.timeout, "warm-up runs end", bs, every=0.25)

        # ---- the victim: hold its run before Spark, let it go, kill it while a Spark job of its epoch runs
        k = args.warmup
        go.unlink()
        held.unlink(missing_ok=True)
        seq, t_land = land(bs, tmp, t0, k, args.events_per_chunk, rng, inputs)
        pk = partition_key(t0 + k * M)
        epoch = watcher.next_epoch
        log(f"victim k={k} landed (partition {pk}, epoch {epoch} to come)")
        wait(lambda: held.exists() and held.read_text().strip(), args.timeout, "the run worker held before Spark", bs)
        t_held = time.time()
        pid = int(held.read_text())
        victim = wait(
            lambda: next(
                (r for r in bs.runs() if r["status"] == "STARTED" and r["tags"].get("dagster/partition") == pk), None
            ),
            60,
            "the victim run STARTED",
            bs,
        )
        ev = {e["message"] for e in bs.run_events(victim["runId"])}
        if f"Started process for run (pid: {pid})." not in ev:
            raise RuntimeError(
                f"pid {pid} from the pause file is not run {victim['runId']}'s worker (events: {sorted(ev)[:5]})"
            )
        jobs_before = {j["id"] for j in bs.spark_jobs()}
        go.touch()
        t_go = time.time()
        job = wait(
            lambda: next((j for j in bs.spark_jobs() if j["id"] not in jobs_before and j["status"] == "RUNNING"), None),
            args.timeout,
            "a Spark job of the victim's epoch RUNNING",
            bs,
            every=0.05,
        )
        t_job_seen = time.time()
        os.kill(pid, signal.SIGKILL)
        t_kill = time.time()
        wait(lambda: pid_gone(pid), 30, f"run worker {pid} gone after SIGKILL", bs, every=0.05)
        jobs_seen = [j for j in bs.spark_jobs() if j["id"] not in jobs_before and j["submitted"] <= t_kill]
        from wire_dagster.checkpoint import Checkpoints

        prepared = Checkpoints(bs.store, bs.spec.name).epochs()
        if epoch in prepared:
            raise RuntimeError(f"epoch {epoch} has objects already: the kill came after the manifest, not during Spark")
        log(
            f"killed run worker {pid} of run {victim['runId']} during Spark job {job['id']} "
            f"({len(jobs_seen)} jobs of the epoch submitted, {t_kill - t_go:.2f}s after go)"
        )
        failed = wait(
            lambda: next(
                (r for r in bs.runs() if r["runId"] == victim["runId"] and r["status"] in ("FAILURE", "CANCELED")), None
            ),
            args.timeout,
            "the killed run marked failed",
            bs,
            every=0.1,
        )
        fev = [
            e
            for e in bs.run_events(victim["runId"])
            if e["eventType"] in ("RUN_FAILURE", "ENGINE_EVENT") and e["t"] >= t_kill - 1
        ]
        t_failed = next((e["t"] for e in fev if e["eventType"] == "RUN_FAILURE"), failed.get("endTime"))
        crash_msg = next((e["message"] for e in fev if e["eventType"] == "ENGINE_EVENT"), "")
        after = f"{t_failed - t_kill:.2f}s" if t_failed is not None else "(no failure time)"
        log(f"run marked {failed['status']} {after} after the kill: {crash_msg[:120]}")

        timeline = {
            "landed": t_land,
            "held before Spark": t_held,
            "go": t_go,
            "Spark job submitted": job["submitted"],
            "Spark job seen RUNNING": t_job_seen,
            "SIGKILL": t_kill,
            "run marked failed": t_failed,
        }
        out["pools_after_failure"] = bs.pools()
        out["victim"] = {
            "run": victim["runId"],
            "pid": pid,
            "partition": pk,
            "epoch": epoch,
            "spark_job": job["id"],
            "jobs_submitted_before_kill": len(jobs_seen),
            "crash_event": crash_msg,
        }

        def committed() -> bool:
            watcher.poll()
            return bool(watcher.commit_of(seq))

        def watch(seconds: float) -> bool:
            end = time.time() + seconds
            while time.time() < end:
                if committed():
                    return True
                if bs.alive():
                    raise RuntimeError(bs.alive())
                time.sleep(0.1)
            return committed()

        # 1. Without more data: does anything recover the epoch within --observe seconds?
        ok = watch(args.observe)
        t_obs = time.time()
        ticks = [t for t in bs.sensor_ticks(after=t_kill) if t["timestamp"] <= t_obs]
        new_runs = [r for r in bs.runs() if r["creationTime"] > t_kill and r["creationTime"] <= t_obs]
        out["observed"] = {
            "seconds": args.observe,
            "commit": ok,
            "ticks": len(ticks),
            "tick_statuses": sorted({t["status"] for t in ticks}),
            "new_runs": [
                (
                    r["runId"][:8],
                    r["status"],
                    r["tags"].get("dagster/partition"),
                    (r["tags"].get("dagster/parent_run_id") or "")[:8],
                )
                for r in new_runs
            ],
        }
        log(f"watched {args.observe:.0f}s after the kill: {out['observed']}")
        next_land = None
        if not ok:
            # 2. More data: the next chunk makes the next partition ready (a new run key).
            _, next_land = land(bs, tmp, t0, k + 1, args.events_per_chunk, rng, inputs)
            timeline["next chunk landed"] = next_land
            log(f"landed the next chunk k={k + 1}; waiting up to {args.stuck_wait:.0f}s for a commit")
            ok = watch(args.stuck_wait)
        runs = sorted(bs.runs(), key=lambda r: r["creationTime"])
        out["runs"] = run_rows(runs, t_kill)
        if not ok:
            out["pools_at_end"] = bs.pools()
            stuck = [r for r in runs if r["status"] in ACTIVE]
            out.update(
                recovered_by=None,
                kill_to_commit=None,
                land_to_commit=None,
                next_land_to_commit=None,
                stuck={
                    "seconds_after_kill": time.time() - t_kill,
                    "active_runs": [(r["runId"][:8], r["status"], r["tags"].get("dagster/partition")) for r in stuck],
                },
            )
            log(
                f"NOT recovered {time.time() - t_kill:.0f}s after the kill; active runs {out['stuck']['active_runs']}; "
                f"pools {out['pools_at_end']}"
            )
        else:
            c = watcher.commit_of(seq)
            assert c is not None  # ok: watch() saw it, and commits are never forgotten
            timeline["commit marker seen"] = c.t_seen
            wait(lambda: bs.runs_ended({victim["runId"]}), args.timeout, "runs end", bs, every=0.25)
            runs = sorted(bs.runs(), key=lambda r: r["creationTime"])
            committing = None
            for r in runs:
                if r["runId"] != victim["runId"] and r["creationTime"] >= t_kill - 1:
                    ph = run_phases(bs, r, c.epoch)
                    if "epoch_log" in ph:
                        committing = (r, ph)
                        break
            if committing is None:
                raise RuntimeError(f"no run logged epoch {c.epoch}")
            r, ph = committing
            timeline.update(
                {
                    "recovering run created": r["creationTime"],
                    "recovering run started": r["startTime"],
                    f"epoch {c.epoch} logged (recovering run)": ph["epoch_log"],
                }
            )
            if r["tags"].get("dagster/parent_run_id") == victim["runId"]:
                retry = r["tags"].get("dagster/retry_number", "?")
                recovered_by = f"the daemon's retry {retry} of the killed run (run {r['runId'][:8]})"
            else:
                recovered_by = (
                    f"run {r['runId'][:8]} for partition {r['tags'].get('dagster/partition')} "
                    f"({r['tags'].get('wire/reason', '?')}), "
                    "requested by the sensor" + (" after the next chunk landed" if next_land else "")
                )
            out.update(
                recovered_by=recovered_by,
                kill_to_commit=c.t_seen - t_kill,
                land_to_commit=c.t_seen - t_land,
                next_land_to_commit=(c.t_seen - next_land) if next_land else None,
                commit={"epoch": c.epoch, "chunks_upto": c.upto, "events_in": c.events_in},
            )
            out["runs"] = run_rows(runs, t_kill)
            log(f"recovered: commit of epoch {c.epoch} {c.t_seen - t_kill:.2f}s after the kill, by {recovered_by}")
        out["timeline"] = timeline

        # ---- exactness and the Dagster view
        out["check"] = check_against_reference(bs, inputs, watcher.commits)
        # Negative control: the same check on input with one amount changed must find a difference.
        bent = {q: [dict(e) for e in evs] for q, evs in inputs.items()}
        bent[0][0]["amount"] += 1
        if not check_against_reference(bs, bent, watcher.commits)["problems"]:
            raise RuntimeError("the reference check found no difference on altered input: it cannot fail")
        parts = sorted({partition_key(t0 + i * M) for i in range(len(inputs))})
        mats = {w.name: materialized(bs, w.name, parts) for w in bs.spec.windows}
        out["materialized"] = {p: all(p in mats[w] for w in mats) for p in parts}
        return out


def print_runs(bs: BenchStack) -> None:
    """Every run of the stack with its last events, on stderr: the diagnosis of a failed scenario."""
    try:
        for r in sorted(bs.runs(), key=lambda r: r["creationTime"]):
            tail = [(e["eventType"] or e["type"], e["message"][:150]) for e in bs.run_events(r["runId"])[-4:]]
            print(
                f"run {r['runId'][:8]} {r['status']} {r['tags'].get('dagster/partition')} "
                f"e{r['tags'].get('wire/epoch')}: {tail}",
                file=sys.stderr,
            )
    except (OSError, RuntimeError, KeyError) as e:  # diagnostics only
        print(f"(runs not listed: {e})", file=sys.stderr)


def run_rows(runs: list[dict], t_kill: float) -> list[dict]:
    """The runs as the report lists them: short id, status, partition, epoch, retry of, created
    when (s after the kill)."""
    return [
        {
            "id": x["runId"][:8],
            "status": x["status"],
            "partition": x["tags"].get("dagster/partition"),
            "epoch": x["tags"].get("wire/epoch"),
            "retry_of": (x["tags"].get("dagster/parent_run_id") or "")[:8],
            "created_after_kill": round(x["creationTime"] - t_kill, 2),
        }
        for x in runs
    ]


def report(args, results: list[dict], load0: str, load1: str, wall: float) -> str:

    from benchmarks.common import md_table

    rev = f"{args.rev0} at the start, {git_commit()} at the end"

    def recovery(r: dict) -> str:
        if r.get("kill_to_commit") is None:
            return (
                f"NOT recovered ({r['stuck']['seconds_after_kill']:.0f} s after the kill; "
                f"next chunk landed {args.observe:.0f} s after it)"
            )
        s = f"{r['kill_to_commit']:.2f} s"
        if r.get("next_land_to_commit") is not None:
            s += f" (only after the next chunk landed; chunk → commit {r['next_land_to_commit']:.2f} s)"
        return s

    def mats(r: dict) -> str:
        m = r["materialized"]
        return f"{sum(m.values())}/{len(m)}" + (
            "" if all(m.values()) else " (missing " + ", ".join(p for p, ok in m.items() if not ok) + ")"
        )

    out = [
        "# Recovery under `dagster dev`: kill -9 of a run worker during Spark → next commit "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"`{' '.join(['.venv/bin/python', 'benchmarks/recovery.py', *sys.argv[1:]])}` at commit {rev}.",
        "",
        f"- Machine: {len(os.sched_getaffinity(0))} cores, shared. `uptime` before: `{load0}`; after: `{load1}`. "
        f"{wall / 60:.1f} min in all.",
        (
            f"- Pipeline: benchmarks/latency.py's (1-minute partitions, windows {args.windows}, sensor interval "
            f"{args.sensor_interval} s, {args.events_per_chunk} events per chunk, one segment); {args.warmup} warm-up "
            "partitions, then the victim partition."
        ),
        (
            "- The victim's run worker is held at WIRE_PAUSE=before-spark, released, and killed (SIGKILL to its pid, "
            "checked against Dagster's "
            '"Started process for run (pid)" event) while the Connect server\'s REST API shows a Spark job of its '
            "epoch RUNNING; no object of the epoch existed at the kill (checked)."
        ),
        f"- Then: watch {args.observe:.0f} s for a commit with no new data; if none, land the next chunk and wait "
        f"{args.stuck_wait:.0f} s more.",
        (
            "- Exactness: the committed results of every window equal tests/reference.py run over the committed "
            "epochs (splits from the manifests, events from the benchmark's own input, W from those events); the "
            "counts balance and equal the reference's."
        ),
        "",
        md_table(
            [
                "scenario",
                "dagster.yaml",
                "kill → run FAILURE",
                "kill → commit",
                "recovered by",
                "results = reference, counts balance",
                "partitions materialized",
            ],
            [
                [
                    r["scenario"],
                    "project's" if r["instance"] == "project" else f"project's + `{json.dumps(r['instance'])}`",
                    f"{r['timeline']['run marked failed'] - r['timeline']['SIGKILL']:.2f} s",
                    recovery(r),
                    r.get("recovered_by") or "-",
                    "yes" if not r["check"]["problems"] else "NO: " + "; ".join(r["check"]["problems"][:3]),
                    mats(r),
                ]
                for r in results
            ],
            align="llrrlll",
        ),
        "",
    ]
    for r in results:
        t_kill = r["timeline"]["SIGKILL"]
        v = r["victim"]
        o = r["observed"]
        out += [
            f"## Scenario `{r['scenario']}`",
            "",
            (
                f"Victim: run {v['run'][:8]} (partition {v['partition']}, epoch {v['epoch']}), worker pid {v['pid']}, "
                "killed during Spark job "
                f"{v['spark_job']} ({v['jobs_submitted_before_kill']} jobs of the epoch submitted by then). "
                f'Dagster: "{v["crash_event"][:170]}"'
            ),
            "",
            f"Pools right after the run was marked failed: `{json.dumps(r['pools_after_failure'])}`.",
            "",
            (
                f"Watched {o['seconds']:.0f} s after the kill with no new data: commit "
                f"{'yes' if o['commit'] else 'no'}; {o['ticks']} sensor ticks "
                f"({', '.join(o['tick_statuses']) or '-'}); runs created: {o['new_runs'] or 'none'}."
            ),
            "",
        ]
        if r.get("stuck"):
            out += [
                f"Not recovered: active runs {r['stuck']['active_runs']}; pools at the end: "
                f"`{json.dumps(r.get('pools_at_end'))}`.",
                "",
            ]
        out += [
            md_table(
                ["event", "t − kill (s)"],
                [[k, f"{t - t_kill:+.2f}"] for k, t in sorted(r["timeline"].items(), key=lambda kv: kv[1])],
            ),
            "",
            (
                f"Check against tests/reference.py (committed epoch {r['check']['epoch']}): rows per window "
                f"(committed, reference) {r['check']['rows']}; {r['check']['chunks_committed']} of "
                f"{r['check']['chunks_landed']} landed chunks committed, holding {r['check']['produced']} events; "
                f"committed totals {json.dumps(r['check']['totals'])}; problems: {r['check']['problems'] or 'none'}."
            ),
            "",
            "Runs (creation − kill, s): "
            + "; ".join(
                f"{x['id']} {x['status']} {x['partition']} e{x['epoch']} ({x['created_after_kill']:+.1f})"
                + (f" retry of {x['retry_of']}" if x["retry_of"] else "")
                for x in r["runs"]
            ),
            "",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated: " + ", ".join(SCENARIOS))
    ap.add_argument("--warmup", type=int, default=2, help="partitions committed before the victim (at least 1)")
    ap.add_argument("--events-per-chunk", type=int, default=200)
    ap.add_argument("--windows", choices=["all", "tumbling"], default="all")
    ap.add_argument("--sensor-interval", type=int, default=5)
    ap.add_argument("--max-retries", type=int, default=2, help="run_retries.max_retries of the retries scenario")
    ap.add_argument(
        "--observe",
        type=float,
        default=90,
        help="seconds to watch for a recovery after the kill before landing more data",
    )
    ap.add_argument(
        "--stuck-wait", type=float, default=120, help="seconds to wait for a commit after the next chunk landed"
    )
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--timeout", type=float, default=600, help="bound on any one wait (s)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    names = comma_list(args.scenarios)
    if not names or any(s not in SCENARIOS for s in names) or args.warmup < 1:
        ap.error(f"--scenarios: some of {', '.join(SCENARIOS)}; --warmup >= 1")
    install_signal_handlers()
    args.rev0 = git_commit()
    load0 = uptime()
    start = time.monotonic()
    results = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"wire-recovery-{name}-") as tmpd:
            results.append(scenario(name, args, Path(tmpd)))
    md = report(args, results, load0, uptime(), time.monotonic() - start)
    path = args.out / f"recovery-{time.strftime('%Y-%m-%d-%H%M')}.md"
    return save_report(md, path, failed=any(r["check"]["problems"] for r in results), raw=results)


if __name__ == "__main__":
    sys.exit(main())
