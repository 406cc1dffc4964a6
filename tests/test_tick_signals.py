"""What `wire tick` does around its runs (sensors/runs.py, issue 21): Ctrl-C and SIGTERM stop a
running or waiting tick within seconds, a tick waits for a run holding its pipeline's pool
without spinning, dead runs are told apart from live ones (pid and start time on this host,
heartbeat elsewhere), and a failed run is one line naming the Wire error inside Dagster's wrapper.

The CLI tests run `wire tick` subprocesses on a private DAGSTER_HOME (runs attached to the
session's Spark Connect server) and hold a run at a known step with WIRE_PAUSE;
the others drive sensors.runs in-process on a temporary Dagster instance.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import dagster as dg
import psutil
import pytest

from cli_setup import write_pipelines
from commit_scenario import assert_results, subprocess_env, wait_for, wire_exe
from sensors import runs as R
from test_cli_tick import PIPELINE, make_events
from test_tick_kill import expected, last_epoch, new_home
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.embedded import EmbeddedS3
from wire_dagster.errors import CommitStateUnknown, WireError, WireInputError
from wire_dagster.objectstore import ObjectStore
from wire_dagster.streams import close_stream, produce

NAME = PIPELINE["name"]
POOL = f"wire_{NAME}"
STOP_S = 10.0  # "within a few seconds", on a loaded 2-core machine


def closed_stream(store: ObjectStore, tmp_path: Path):
    pdir = tmp_path / "pipelines"
    (spec,) = write_pipelines(pdir, PIPELINE)
    f = tmp_path / "events.jsonl"
    events = make_events()
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert produce(store, spec, f, segment="0").events == len(events)
    close_stream(store, spec)
    return spec, pdir


class Tick:
    """A `wire tick` subprocess with its output in files (read while it runs)."""

    def __init__(self, env: dict[str, str], tmp_path: Path, tag: str, *args: str):
        self.out, self.err = tmp_path / f"{tag}.out", tmp_path / f"{tag}.err"
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.p = subprocess.Popen(
                [wire_exe(), *args, "tick", "--pipeline", NAME], env=env, stdout=o, stderr=e, start_new_session=True
            )

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stop_within(self, sig: int, bound: float) -> float:
        """Send `sig`; seconds until the tick exited (fails past `bound`)."""
        t = time.monotonic()
        os.kill(self.p.pid, sig)
        try:
            self.p.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"still running {bound:.0f} s after {signal.Signals(sig).name}: {self.stderr()[-3000:]}"
            ) from None
        return time.monotonic() - t

    def finish(self, bound: float = 600) -> int:
        try:
            return self.p.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"did not finish within {bound:.0f} s: {self.stderr()[-3000:]}") from None

    def kill(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(timeout=30)


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def pipeline_runs(home: Path) -> list[dg.DagsterRun]:
    with dg.DagsterInstance.from_config(str(home)) as inst:
        return list(inst.get_runs(filters=dg.RunsFilter(tags={"wire/pipeline": NAME})))


def pool_claims(home: Path) -> list:
    with dg.DagsterInstance.from_config(str(home)) as inst:
        info = inst.event_log_storage.get_concurrency_info(POOL)
        return [*info.claimed_slots, *info.pending_steps]


# ---------------------------------------------------------------------------------------------
# Signals, through the CLI


def test_sigint_stops_a_waiting_tick_and_sigterm_a_running_one(store, cli_env, spark_remote, tmp_path: Path) -> None:
    """Tick A is held inside its run with the epoch staged and its manifest written, right
    before the commit marker (WIRE_PAUSE=before-marker); tick B waits for A's pipeline lock,
    saying so; SIGUSR1 makes B write its threads' stacks and wait on. Ctrl-C (SIGINT) stops B,
    SIGTERM stops A, each within seconds with one error line; A's run ends FAILURE with its
    slot freed and nothing committed; the next tick commits the epoch, equal to the reference."""
    spec, pdir = closed_stream(store, tmp_path)
    home = tmp_path / "dagster-home"
    pause = tmp_path / "pause"
    pause.mkdir()
    env = subprocess_env(cli_env, spark_remote, WIRE_PIPELINES=str(pdir), DAGSTER_HOME=str(home))
    held = dict(env, WIRE_PAUSE="before-marker", WIRE_PAUSE_DIR=str(pause), WIRE_PAUSE_TIMEOUT="300")
    a = Tick(held, tmp_path, "a")
    b = None
    try:
        wait_for(lambda: (pause / "before-marker.paused").exists(), 300, a.p, "tick A reached its commit")
        b = Tick(env, tmp_path, "b")
        wait_for(lambda: f"waiting for wire tick (pid {a.p.pid} on " in b.stderr(), 300, b.p, "tick B waits for A")

        # An operator's `kill -USR1`: every thread's stack on stderr, and the tick goes on waiting.
        os.kill(b.p.pid, signal.SIGUSR1)
        wait_for(lambda: "sensors/runs.py" in b.stderr(), 30, b.p, "tick B's stacks on stderr")
        assert "(most recent call first)" in b.stderr() and b.p.poll() is None, b.stderr()[-3000:]

        took = b.stop_within(signal.SIGINT, STOP_S)
        assert b.p.returncode == 1, b.stderr()
        assert (
            lines(b.stderr())[-1] == f"error: Interrupted: interrupted by SIGINT while waiting for pipeline {NAME}"
        ), b.stderr()
        assert "Traceback" not in b.stderr() and b.stdout() == ""

        took_a = a.stop_within(signal.SIGTERM, STOP_S)
        assert a.p.returncode == 1, a.stderr()
        err = lines(a.stderr())
        assert len(err) == 1 and re.fullmatch(
            rf"error: Interrupted: interrupted by SIGTERM during {re.escape(NAME)}:e1:\S+ "
            r"\(run [0-9a-f]{8} marked failed; the next tick resumes from the last commit\)",
            err[0],
        ), err
    finally:
        for t in (a, b):
            if t is not None:
                t.kill()
    (run,) = pipeline_runs(home)  # B never created a run
    assert run.status == dg.DagsterRunStatus.FAILURE and run.tags["wire/pid"] == str(a.p.pid)
    assert pool_claims(home) == []
    cp = Checkpoints(store, spec.name)
    assert cp.latest() is None and cp.epochs() == [1]  # prepared, never committed: nothing visible

    c = Tick(env, tmp_path, "c")
    assert c.finish() == 0, c.stderr()[-3000:]
    assert re.fullmatch(rf"run {re.escape(NAME)}:e1:\S+: SUCCESS", c.stdout().strip()), c.stdout()
    assert last_epoch(cp) == 1
    assert_results(store, spec, expected(spec, {"0": make_events()}))
    print(f"SIGINT stopped the waiting tick in {took:.1f} s, SIGTERM the running one in {took_a:.1f} s")


def test_tick_waits_for_a_run_holding_the_pool_without_spinning(store, cli_env, spark_remote, tmp_path: Path) -> None:
    """A run the Dagster daemon launched (no Wire tags) holds the pipeline's pool slot. A tick
    says whom it waits for, uses little CPU while it waits (Dagster's plan loop spun at ~90 %),
    leaves that run alone, and stops on SIGTERM; the next tick goes on as soon as the slot is
    freed and commits."""
    from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext

    spec, pdir = closed_stream(store, tmp_path)
    home = new_home(tmp_path)
    env = subprocess_env(cli_env, spark_remote, WIRE_PIPELINES=str(pdir), DAGSTER_HOME=str(home))
    rid = str(uuid.uuid4())
    with dg.DagsterInstance.from_config(str(home)) as inst:
        daemon_run = inst.add_run(
            dg.DagsterRun(
                job_name=f"{NAME}_job", run_id=rid, status=dg.DagsterRunStatus.STARTED, tags={"wire/pipeline": NAME}
            )
        )
        with InstanceConcurrencyContext(inst, daemon_run) as icc:
            assert icc.claim(POOL, f"{NAME}_windows")
    waiting = f"waiting for run {rid[:8]} (launched by the Dagster daemon) to free pool {POOL}"

    first = Tick(env, tmp_path, "first")
    try:
        wait_for(lambda: waiting in first.stderr(), 300, first.p, "the tick waits for the daemon's run")
        proc = psutil.Process(first.p.pid)
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        wait_for(lambda: time.monotonic() - t0 >= 4.0, 10, first.p, "four seconds of waiting")
        cpu = sum(proc.cpu_times()[:2]) - cpu0
        assert cpu < 1.0, f"the waiting tick used {cpu:.2f} s of CPU in 4 s"
        first.stop_within(signal.SIGTERM, STOP_S)
    finally:
        first.kill()
    assert first.p.returncode == 1
    assert lines(first.stderr())[-1].startswith(
        f"error: Interrupted: interrupted by SIGTERM while waiting to run {NAME}:e1:"
    ), first.stderr()
    runs = {r.run_id: r for r in pipeline_runs(home)}
    assert set(runs) == {rid} and runs[rid].status == dg.DagsterRunStatus.STARTED  # the daemon's run: left alone

    second = Tick(env, tmp_path, "second")
    try:
        wait_for(lambda: waiting in second.stderr(), 300, second.p, "the next tick waits too")
        with dg.DagsterInstance.from_config(str(home)) as inst:
            inst.event_log_storage.free_concurrency_slots_for_run(rid)  # the daemon's run ends
            inst.report_run_canceled(daemon_run)
        assert second.finish(300) == 0, second.stderr()[-3000:]
    finally:
        second.kill()
    assert re.fullmatch(rf"run {re.escape(NAME)}:e1:\S+: SUCCESS", second.stdout().strip()), second.stdout()
    assert last_epoch(Checkpoints(store, spec.name)) == 1 and pool_claims(home) == []


def test_failed_run_is_one_line_naming_the_wire_error(tmp_path: Path, cli_env, spark_remote) -> None:
    """The object store goes away while the run is held before its Spark phase: `wire tick`
    exits 1 with one line, the ObjectStoreError inside Dagster's step failure, no stack dump and
    nothing on stdout; the run's event log keeps the whole report."""
    srv = EmbeddedS3(tmp_path / "s3-outage")
    cfg = srv.start()
    t = None
    try:
        store = ObjectStore(cfg)
        store.ensure_bucket()
        spec, pdir = closed_stream(store, tmp_path)
        home = tmp_path / "dagster-home"
        pause = tmp_path / "pause"
        pause.mkdir()
        env = subprocess_env(
            cli_env, spark_remote, WIRE_PIPELINES=str(pdir), DAGSTER_HOME=str(home), **cfg.export_env()
        )
        t = Tick(dict(env, WIRE_PAUSE="before-spark", WIRE_PAUSE_DIR=str(pause)), tmp_path, "t")
        wait_for(lambda: (pause / "before-spark.paused").exists(), 300, t.p, "the run reached its Spark phase")
        srv.stop()
        (pause / "before-spark.go").touch()
        assert t.finish() == 1, t.stderr()[-3000:]
        err = lines(t.stderr())
        assert len(err) == 1 and err[0].startswith("error: ObjectStoreError: ") and cfg.endpoint in err[0], t.stderr()[
            -3000:
        ]
        assert t.stdout() == ""
        (run,) = pipeline_runs(home)
        assert run.status == dg.DagsterRunStatus.FAILURE and pool_claims(home) == []
        with dg.DagsterInstance.from_config(str(home)) as inst:
            failures = [e.dagster_event for e in inst.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)]
        error = failures[0].step_failure_data.error if failures and failures[0] else None
        assert error is not None and "Stack Trace:" in error.to_string()
    finally:
        if t is not None:
            t.kill()
        srv.stop()


# ---------------------------------------------------------------------------------------------
# In-process: dead or alive, reaping, one-line errors


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_gone_tells_dead_runs_from_live_ones(monkeypatch) -> None:
    me = R.owner()
    here = socket.gethostname()
    now = time.time()
    assert R.gone(me, None) is None
    assert R.gone(dict(me, started=me["started"] - 100), None) == "its process is gone"  # the pid was reused
    assert R.gone({"host": here, "pid": dead_pid(), "started": now}, None) == "its process is gone"
    monkeypatch.setenv("WIRE_RUN_STALE_S", "60")
    assert R.gone({"host": "elsewhere", "pid": 1, "beat": now - 30}, None, now) is None
    assert (
        R.gone({"host": "elsewhere", "pid": 1, "beat": now - 90}, None, now)
        == "no heartbeat from host elsewhere for 90 s"
    )
    assert R.gone(None, now - 10, now) is None  # no owner recorded (an older Wire): the run's own activity
    assert R.gone(None, now - 600, now) == "no heartbeat from an unknown host for 600 s"


def test_reap_fails_dead_runs_and_frees_their_slots_only(tmp_path: Path, monkeypatch) -> None:
    from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext

    monkeypatch.setenv("WIRE_RUN_STALE_S", "60")
    home = new_home(tmp_path)
    me = R.owner()
    here = socket.gethostname()
    step = f"{NAME}_windows"

    def tags(host, pid, started, by="wire tick"):
        return {
            "wire/pipeline": NAME,
            R.LAUNCHED_BY_TAG: by,
            R.HOST_TAG: host,
            R.PID_TAG: str(pid),
            R.PID_STARTED_TAG: f"{started:.3f}",
        }

    cases = {
        "alive": (dg.DagsterRunStatus.STARTED, tags(here, me["pid"], me["started"])),
        "killed": (dg.DagsterRunStatus.STARTED, tags(here, dead_pid(), time.time())),
        "reused": (dg.DagsterRunStatus.STARTING, tags(here, me["pid"], me["started"] - 50, "wire backfill")),
        "stale": (dg.DagsterRunStatus.STARTED, tags("elsewhere", 1, 0.0)),
        "fresh": (dg.DagsterRunStatus.STARTED, tags("elsewhere", 1, 0.0)),
        "daemon": (dg.DagsterRunStatus.STARTED, {"wire/pipeline": NAME}),
        "finished": (dg.DagsterRunStatus.FAILURE, tags(here, me["pid"], me["started"])),
    }
    ids = {k: str(uuid.uuid4()) for k in cases}
    with dg.DagsterInstance.from_config(str(home)) as inst:
        runs = {
            k: inst.add_run(dg.DagsterRun(job_name=f"{NAME}_job", run_id=ids[k], status=status, tags=t))
            for k, (status, t) in cases.items()
        }
        beat = {"stale": time.time() - 300, "fresh": time.time()}
        for k, when in beat.items():
            inst.run_storage.set_cursor_values(
                {R.OWNER_KEY + ids[k]: json.dumps({"host": "elsewhere", "pid": 1, "beat": when})}
            )
        # claims: the finished run holds the slot; the killed run and two run-less claims wait
        for k in ("finished", "killed"):
            with InstanceConcurrencyContext(inst, runs[k]) as icc:
                icc.claim(POOL, step)
        orphan, pending = str(uuid.uuid4()), str(uuid.uuid4())
        inst.run_storage.set_cursor_values(
            {
                R.OWNER_KEY + orphan: json.dumps({"host": here, "pid": dead_pid(), "started": time.time()}),
                R.OWNER_KEY + pending: json.dumps({**me, "beat": time.time()}),
            }
        )
        for rid in (orphan, pending):
            inst.event_log_storage.claim_concurrency_slot(POOL, rid, step)

        said: list[str] = []
        done = R.reap(inst, NAME, POOL, "test", said.append)
        assert done == said
        status = {r.run_id: r.status for r in inst.get_runs()}
        status = {k: status[ids[k]] for k in cases}
        assert status == {
            "alive": dg.DagsterRunStatus.STARTED,
            "killed": dg.DagsterRunStatus.FAILURE,
            "reused": dg.DagsterRunStatus.FAILURE,
            "stale": dg.DagsterRunStatus.FAILURE,
            "fresh": dg.DagsterRunStatus.STARTED,
            "daemon": dg.DagsterRunStatus.STARTED,
            "finished": dg.DagsterRunStatus.FAILURE,
        }
        info = inst.event_log_storage.get_concurrency_info(POOL)
        held = {s.run_id for s in info.claimed_slots} | {s.run_id for s in info.pending_steps}
        assert held == {pending}  # the live claim only; the finished, killed and orphaned ones freed
        failure = [e for e in inst.all_logs(ids["killed"]) if e.dagster_event and e.dagster_event.is_run_failure]
        assert "Marked failed by test: its process is gone" in failure[0].message
        assert len(done) == 5 and sum("freed the" in d for d in done) == 2, done
        assert R.reap(inst, NAME, POOL, "test") == []  # nothing left to do


def _failing_job(exc: BaseException) -> dg.JobDefinition:
    @dg.op
    def boom():
        raise exc

    @dg.job
    def j():
        boom()

    return j


@pytest.mark.parametrize(
    ("exc", "cls", "base", "line"),
    [
        (
            CommitStateUnknown(
                "epoch 2: commit marker state unknown (503 SlowDown; gave up after 17 attempts in 19.5 s)\nmore"
            ),
            "CommitStateUnknown",
            CommitStateUnknown,
            "epoch 2: commit marker state unknown (503 SlowDown; gave up after 17 attempts in 19.5 s)",
        ),
        (
            WireInputError("limits.chunk_rows: expected a positive integer"),
            "WireInputError",
            WireInputError,
            "limits.chunk_rows: expected a positive integer",
        ),
        (KeyError("k"), "KeyError", WireError, "'k'"),
    ],
)
def test_run_error_is_the_error_inside_dagsters_wrapper(exc, cls, base, line, monkeypatch) -> None:
    """One exception naming the cause, of the Wire error's own class; Dagster's whole report only
    when verbose."""
    res = _failing_job(exc).execute_in_process(raise_on_error=False, run_config=R.run_config())
    said: list[str] = []
    monkeypatch.delenv("WIRE_DEBUG", raising=False)
    err = R.run_error(res, said.append)
    assert type(err).__name__ == cls and isinstance(err, base) and str(err) == line
    assert said == []
    monkeypatch.setenv("WIRE_DEBUG", "1")  # what `wire -v` sets
    assert str(R.run_error(res, said.append)) == line
    (report,) = said
    assert "Stack Trace:" in report and "raise exc" in report and "DagsterExecutionStepExecutionError" in report


@dg.op
def _nothing() -> None:
    pass


@dg.job
def _nothing_job() -> None:
    """A job for a PipelineRuns that never runs it: only the pipeline's lock is tried."""
    _nothing()


def test_a_lock_wait_ends_when_another_thread_receives_the_signal(tmp_path: Path) -> None:
    """The kernel hands a signal sent to a process to any of its threads that does not block it;
    a library's thread may take it. The main thread, waiting for another tick's pipeline lock,
    must stop all the same, within a second: the wait sleeps and tries again (a blocking flock
    would only see the signal once the other tick released the lock, here after 8 s)."""
    import fcntl
    import threading

    (tmp_path / "home").mkdir()
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as inst:
        holder = open(R._lock_path(inst, "p"), "a+")  # another tick's hold, on its own file description
        fcntl.flock(holder, fcntl.LOCK_EX)
        release = threading.Timer(8.0, holder.close)
        done = threading.Event()
        other = threading.Thread(target=done.wait, name="a library's thread")
        other.start()
        release.start()
        threading.Timer(0.5, lambda: signal.pthread_kill(other.ident or 0, signal.SIGINT)).start()
        t = time.monotonic()
        try:
            with pytest.raises(R.Interrupted, match="interrupted by SIGINT while waiting for pipeline p"):
                with R.Signals() as signals, R.PipelineRuns(inst, "p", _nothing_job, "wire tick", signals):
                    pass
            took = time.monotonic() - t
        finally:
            done.set()
            release.cancel()
            holder.close()
        assert took < 2.0, took


def test_a_waiting_tick_names_a_holder_that_has_not_written_its_name_yet(tmp_path: Path, monkeypatch) -> None:
    """Two ticks started together: one takes the pipeline's lock, then writes its name into the
    lock file; the other may read the file in between. It reads again rather than saying
    "another wire process" (CI met this once in test_tick_kill's race)."""
    import fcntl

    (tmp_path / "home").mkdir()
    name = "wire tick (pid 4242 on elsewhere)"
    with dg.DagsterInstance.local_temp(str(tmp_path / "home")) as inst:
        holder = open(R._lock_path(inst, "p"), "a+")  # the other tick: it holds the lock, its name not written yet
        fcntl.flock(holder, fcntl.LOCK_EX)
        sleeps: list[float] = []

        def sleep(s: float) -> None:  # while the waiter sleeps, the holder writes its name, then finishes
            sleeps.append(s)
            if len(sleeps) == 1:
                holder.write(name)
                holder.flush()
            else:
                holder.close()

        monkeypatch.setattr(R.time, "sleep", sleep)
        said: list[str] = []
        try:
            with R.Signals() as signals:
                runs = R.PipelineRuns(inst, "p", _nothing_job, "wire tick", signals)
                runs.say = said.append
                with runs:
                    pass
        finally:
            holder.close()
    assert said == [f"waiting for {name} to finish with pipeline p"]
