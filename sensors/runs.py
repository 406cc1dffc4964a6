"""The runs `wire tick` and `wire backfill` execute in their own process (`execute_in_process`).

The daemon path has run monitoring; these commands have what follows instead, in one place:

- Who runs a run: every run is tagged with the launching command, host, pid and the pid's start
  time, and its owner record (the same, plus a heartbeat refreshed every `HEARTBEAT_S` by a thread)
  is kept in the instance's key-value store under `wire/run-owner/<run id>` from before its pool
  slot is claimed until it ends.
- Dead runs never hold a pipeline (`reap`): before launching, and while waiting, a run of the
  pipeline left NOT_STARTED/STARTING/STARTED/CANCELING by a `wire tick` or `wire backfill`
  whose process is gone (same host: its pid is not alive with the recorded start time, so a
  reused pid does not count; another host: no heartbeat for `stale_after()` seconds) is marked
  failed with `DagsterInstance.report_run_failed`, and its concurrency slots are freed with
  `event_log_storage.free_concurrency_slots_for_run`, as the daemon's run monitoring and
  concurrency iteration do. Slots held by finished runs, or by a claim whose owner is gone
  before it created its run, are freed too. Runs the daemon launched are its run monitoring's.
- Nothing waits by spinning (`PipelineRuns`): ticks and backfills of one pipeline on one host
  take turns on an advisory lock (`flock`, released by the kernel when a process dies, kill -9
  included), the loser saying whom it waits for; then the pipeline's pool slot is claimed
  before the run starts, polling the instance (Dagster's claim back-off, 1 s rising to 15 s),
  so Dagster's in-process executor never waits for it: its plan loop waits for a slot without
  sleeping (`InstanceConcurrencyContext.interval_to_next_pending_claim_check` is never positive,
  dagster-io/dagster#20367) and never looks at the interrupt it captured meanwhile.
- SIGINT and SIGTERM stop a waiting or running command within seconds (`Signals`). While
  Dagster executes a run it replaces both handlers with one that only sets a flag
  (`capture_interrupts`), raised when a step's user code starts or runs (`raise_interrupts_as`):
  a tick waiting for a slot in the plan loop never got there, which is why the observed one
  ignored SIGTERM. Outside Dagster's execution a signal is remembered and raised only where
  nothing is half-written (our sleeps and lock waits, or the next check): raised anywhere, a
  KeyboardInterrupt inside SQLAlchemy turned into "Cannot operate on a closed database". One
  arriving while Dagster creates the run sets Dagster's flag too, so the step raises it; a wake-up
  fd (`signal.set_wakeup_fd`) sees the ones Dagster's handler swallowed. The interrupted run
  ends failed (by Dagster, else here) with its slot freed; the two-phase commit leaves nothing
  half-committed whatever the moment.
- One line per failure (`run_error`): the Wire error inside Dagster's step-failure wrapper
  (the `cause` chain of its SerializableErrorInfo), as an exception the CLI prints as
  `error: <Class>: <first line>`; Dagster's console logger stays quiet unless WIRE_DEBUG
  (`wire -v`) or WIRE_TICK_LOG_LEVEL asks for it, and the run's event log keeps the stack.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import dagster as dg
import psutil
from dagster._core.events import JobFailureData, RunFailureReason
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._utils import interrupts as dagster_interrupts
from dagster_shared.error import SerializableErrorInfo

from wire_dagster.errors import WireError

#: `wire/launched-by` values of the commands that execute runs in their own process.
LAUNCHED_BY_TAG = "wire/launched-by"
LAUNCHERS = ("wire tick", "wire backfill")
HOST_TAG, PID_TAG, PID_STARTED_TAG = "wire/host", "wire/pid", "wire/pid-started"
OWNER_KEY = "wire/run-owner/"  # + run id, in the instance's key-value store
HEARTBEAT_S = 15.0
#: Run statuses a dead process can leave a run in.
UNFINISHED = [
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


class Interrupted(WireError):
    """SIGINT or SIGTERM stopped `wire tick` / `wire backfill`."""


#: The Dagster instance of each DAGSTER_HOME this process's commands used (at most one).
_INSTANCES: dict[str, dg.DagsterInstance] = {}


@contextlib.contextmanager
def command_instance() -> Iterator[dg.DagsterInstance]:
    """The Dagster instance of $DAGSTER_HOME for one command, kept for the process's next ones:
    `wire shell` runs every command in its one process, and creating the instance (its
    configuration, storages, their schema checks) took 0.07-0.24 s per tick, three times for a
    three-stage `wire tick --upstream`; a new one per command also left the last one's database
    connections open. A command that raises (interrupted, or an error) drops it, disposed, so the
    next starts from a fresh one; so does a change of DAGSTER_HOME."""
    home = os.environ.get("DAGSTER_HOME", "")
    inst = _INSTANCES.get(home)
    if inst is None:
        while _INSTANCES:
            _INSTANCES.popitem()[1].dispose()
        inst = _INSTANCES[home] = dg.DagsterInstance.get()
    try:
        yield inst
    except BaseException:
        if _INSTANCES.get(home) is inst:
            del _INSTANCES[home]
            inst.dispose()
        raise


def verbose() -> bool:
    """Stack traces and Dagster's log on the terminal: `wire -v` (which sets WIRE_DEBUG) or WIRE_DEBUG."""
    return bool(os.environ.get("WIRE_DEBUG"))


def run_config() -> dict:
    """Dagster's console logger for a run: quiet (CRITICAL) unless verbose (WARNING, stacks included);
    WIRE_TICK_LOG_LEVEL overrides both. The run's event log keeps everything either way."""
    level = os.environ.get("WIRE_TICK_LOG_LEVEL") or ("WARNING" if verbose() else "CRITICAL")
    return {"loggers": {"console": {"config": {"log_level": level}}}}


def stale_after() -> float:
    """Seconds without a heartbeat after which a run owned by another host counts as dead
    (WIRE_RUN_STALE_S, default 120: eight missed heartbeats)."""
    return float(os.environ.get("WIRE_RUN_STALE_S") or 120)


# ---------------------------------------------------------------------------------------------
# Who runs a run


def owner() -> dict:
    """This process: host, pid, and the pid's start time (a reused pid has another)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def launch_tags(launcher: str) -> dict[str, str]:
    me = owner()
    return {
        LAUNCHED_BY_TAG: launcher,
        HOST_TAG: me["host"],
        PID_TAG: str(me["pid"]),
        PID_STARTED_TAG: f"{me['started']:.3f}",
    }


def _pid_alive(pid: int, started: float | None) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and (started is None or abs(p.create_time() - started) < 1.0)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def gone(record: Mapping | None, last_seen: float | None, now: float | None = None) -> str | None:
    """Why the process that owns a run is gone, or None while it may be alive. `record`: the owner
    (host, pid, started, and `beat`, the last heartbeat); `last_seen`: the run's latest sign of
    life in the instance, for runs without a heartbeat."""
    now = time.time() if now is None else now
    if record and record.get("host") == socket.gethostname() and record.get("pid"):
        if _pid_alive(int(record["pid"]), record.get("started")):
            return None
        return "its process is gone"
    beat = max(float((record or {}).get("beat") or 0), last_seen or 0)
    if beat and now - beat < stale_after():
        return None
    where = f"host {record['host']}" if record and record.get("host") else "an unknown host"
    return f"no heartbeat from {where} for {now - beat:.0f} s" if beat else f"no heartbeat from {where}"


def _owner_record(instance: dg.DagsterInstance, run_id: str) -> dict | None:
    key = OWNER_KEY + run_id
    raw = instance.run_storage.get_cursor_values({key}).get(key)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _owner_from_tags(tags: Mapping[str, str]) -> dict | None:
    if PID_TAG not in tags:
        return None
    try:
        return {
            "host": tags.get(HOST_TAG),
            "pid": int(tags[PID_TAG]),
            "started": float(tags.get(PID_STARTED_TAG) or 0) or None,
        }
    except ValueError:
        return None


@contextlib.contextmanager
def _owning(instance: dg.DagsterInstance, run_id: str) -> Iterator[None]:
    """Record this process as the owner of `run_id` and keep its heartbeat while the block runs."""
    key = OWNER_KEY + run_id
    rec = owner()

    def beat() -> None:
        instance.run_storage.set_cursor_values({key: json.dumps({**rec, "beat": time.time()})})

    beat()
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(HEARTBEAT_S):
            with contextlib.suppress(Exception):  # a missed beat only brings staleness closer
                beat()

    t = threading.Thread(target=loop, name=f"wire-heartbeat-{run_id[:8]}", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()


# ---------------------------------------------------------------------------------------------
# Dead runs


def _describe(run: dg.DagsterRun | None, run_id: str) -> str:
    if run is None:
        return f"run {run_id[:8]}"
    by = run.tags.get(LAUNCHED_BY_TAG)
    if by in LAUNCHERS and PID_TAG in run.tags:
        return f"run {run_id[:8]} ({by}, pid {run.tags[PID_TAG]} on {run.tags.get(HOST_TAG, '?')})"
    return f"run {run_id[:8]} ({by or 'launched by the Dagster daemon'})"


def reap(
    instance: dg.DagsterInstance, pipeline: str, pool: str | None, who: str, say=None, skip: str | None = None
) -> list[str]:
    """Fail this pipeline's runs whose `wire tick`/`wire backfill` process is gone and free their
    slots; free the slots of `pool` held by finished runs or by dead claims without a run.
    Returns what was done, one line each (also passed to `say`)."""
    done: list[str] = []
    storage = instance.event_log_storage
    seen: set[str] = set()
    for rec in instance.get_run_records(filters=dg.RunsFilter(tags={"wire/pipeline": pipeline}, statuses=UNFINISHED)):
        run = rec.dagster_run
        seen.add(run.run_id)
        if run.run_id == skip or run.tags.get(LAUNCHED_BY_TAG) not in LAUNCHERS:
            continue  # ours, running; or the daemon's (its run monitoring watches those)
        record = _owner_record(instance, run.run_id)  # written before the run exists, then beating
        if record is not None:
            why = gone(record, None)
        else:  # a run of an older Wire: its tags, and its last change for a heartbeat
            last = max(t.timestamp() for t in (rec.create_timestamp, rec.update_timestamp) if t is not None)
            why = gone(_owner_from_tags(run.tags), last)
        if why is None:
            continue
        instance.report_run_failed(
            run,
            f"Marked failed by {who}: {why}; nothing of the run is visible before its commit marker.",
            JobFailureData(error=None, failure_reason=RunFailureReason.UNEXPECTED_TERMINATION),
        )
        if storage.supports_global_concurrency_limits:
            storage.free_concurrency_slots_for_run(run.run_id)
        done.append(f"marked {_describe(run, run.run_id)} failed: {why}; freed its slots")
    if pool and storage.supports_global_concurrency_limits:
        info = storage.get_concurrency_info(pool)
        for run_id in sorted({s.run_id for s in info.claimed_slots} | {s.run_id for s in info.pending_steps}):
            if run_id == skip or run_id in seen:
                continue
            run = instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                continue  # another pipeline's run in this pool, or not yet listed: left alone
            if run is None and gone(_owner_record(instance, run_id), None) is None:
                continue  # a claim made before its run exists, by a live process
            storage.free_concurrency_slots_for_run(run_id)
            done.append(f"freed the {pool} slot of {_describe(run, run_id)} ({run.status.value if run else 'no run'})")
    if say is not None:
        for line in done:
            say(line)
    return done


def holders(instance: dg.DagsterInstance, pool: str, mine: str) -> list[str]:
    """Who holds (or waits ahead for) `pool`, for a 'waiting for' line."""
    info = instance.event_log_storage.get_concurrency_info(pool)
    ids = [s.run_id for s in info.claimed_slots if s.run_id != mine] or [
        s.run_id for s in info.pending_steps if s.run_id != mine and s.assigned_timestamp
    ]
    return [_describe(instance.get_run_by_id(r), r) for r in dict.fromkeys(ids)]


# ---------------------------------------------------------------------------------------------
# Signals


class Signals:
    """SIGINT and SIGTERM, for a command that must stop within seconds without being cut in the
    middle of a database write: a signal is remembered, and raised (KeyboardInterrupt) at once
    only inside `waiting()` (a sleep, a lock), else at the next `check()`. A wake-up fd sees the
    signals Dagster's own handler swallows while it executes a run. Leaving the block with the
    interrupt raises `Interrupted`, one line naming the signal and what was being done (`doing`).

    `Signals.last` is the last signal a block received, for a process that runs many commands
    (`wire shell`): the handlers it had are back after the block, and the signal was this one's."""

    last: int | None = None

    def __init__(self) -> None:
        self.received: int | None = None
        self.doing = "before any run started"
        self._armed = False
        self._r = self._w = -1
        self._saved: list = []

    def _handler(self, signum, _frame) -> None:
        self.received = signum
        if self._armed:
            self._armed = False
            raise KeyboardInterrupt
        # Not here: maybe a run is being created, before Dagster's own handler is in place. Dagster
        # raises the interrupt it captured when its step starts (`raise_interrupts_as`).
        dagster_interrupts._received_interrupt["received"] = True

    def __enter__(self) -> Signals:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers belong to the main thread: nothing to catch here
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._saved = [
            ("fd", signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)),
            (signal.SIGINT, signal.signal(signal.SIGINT, self._handler)),
            (signal.SIGTERM, signal.signal(signal.SIGTERM, self._handler)),
        ]
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.pending():  # before the wake-up fd closes: a signal Dagster's handler swallowed too
            Signals.last = self.received
        for what, old in reversed(self._saved):
            if what == "fd":
                signal.set_wakeup_fd(old)
            else:
                signal.signal(what, old)
        self._saved = []
        for fd in (self._r, self._w):
            if fd >= 0:
                os.close(fd)
        self._r = self._w = -1
        dagster_interrupts.pop_captured_interrupt()  # nothing left for a later run in this process
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            raise Interrupted(f"interrupted by {self.name()} {self.doing}".rstrip()) from None
        return False

    def pending(self) -> bool:
        if self._r >= 0:
            try:
                data = os.read(self._r, 512)
            except BlockingIOError:
                data = b""
            hits = [b for b in data if b in (signal.SIGINT, signal.SIGTERM)]
            if hits:
                self.received = hits[-1]
        return self.received is not None

    def check(self) -> None:
        """Raise KeyboardInterrupt if SIGINT or SIGTERM arrived."""
        if self.pending():
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """A wait a signal may cut short (nothing half-written inside)."""
        self.check()
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else "SIGINT"


# ---------------------------------------------------------------------------------------------
# One pipeline's runs, one at a time


def _lock_path(instance: dg.DagsterInstance, pipeline: str) -> Path:
    d = Path(instance.root_directory) / "wire-locks"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{pipeline}.lock"


class PipelineRuns:
    """What `wire tick` and `wire backfill` hold while they work on a pipeline (see the module
    docstring), inside a `Signals` block: `with PipelineRuns(...) as runs:` waits for the
    pipeline's lock and reaps dead runs; `runs.execute(...)` runs one run of the job, and the run
    ends finished with its slots freed whatever happens."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        pipeline: str,
        job: dg.JobDefinition,
        launcher: str,
        signals: Signals,
        console=None,
    ):
        self.instance, self.pipeline, self.job, self.launcher, self.console = instance, pipeline, job, launcher, console
        self.signals = signals
        pools = ((n.name, getattr(n.definition, "pool", None)) for n in job.graph.nodes_in_topological_order)
        self.steps: list[tuple[str, str]] = [(step, pool) for step, pool in pools if pool]
        self.who = f"{launcher} (pid {os.getpid()} on {socket.gethostname()})"
        self.say: Callable[[str], None] = say_on(console) or (lambda _line: None)
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> PipelineRuns:
        self.signals.check()
        with contextlib.ExitStack() as stack:
            self.signals.doing = f"while waiting for pipeline {self.pipeline}"
            stack.enter_context(self._lock())
            self.signals.doing = "while looking for dead runs"
            for pool in [pool for _step, pool in self.steps] or [None]:
                reap(self.instance, self.pipeline, pool, self.who, self.say)
            self.signals.doing = "before any run started"
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc) -> bool:
        self._stack.close()
        return False

    def check(self) -> None:
        self.signals.check()

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        path = _lock_path(self.instance, self.pipeline)
        f = open(path, "a+")  # closed below; closing releases the lock
        try:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.say(f"waiting for {self._holder(f)} to finish with pipeline {self.pipeline}")
                # Tried again every 0.2 s, not one blocking flock: a signal the kernel hands to
                # another thread (a library's) would not interrupt that call, and the handler,
                # which runs in the main thread, would wait for the holder to finish.
                while True:
                    with self.signals.waiting():
                        time.sleep(0.2)
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        continue
            f.seek(0)
            f.truncate()
            f.write(self.who)
            f.flush()
            yield
        finally:
            f.close()

    def _holder(self, f) -> str:
        """Who holds the lock, as the holder wrote it. A holder names itself just after taking
        the lock, so an empty file is a holder between the two: read again for up to a second
        (two ticks started together meet there)."""
        deadline = time.monotonic() + 1.0
        while True:
            f.seek(0)
            holder = f.read().strip()
            if holder or time.monotonic() >= deadline:
                return holder or "another wire process"
            with self.signals.waiting():
                time.sleep(0.02)

    def execute(self, *, partition_key: str | None, tags: Mapping[str, str], what: str) -> dg.ExecuteInProcessResult:
        """Run the job once in this process: claim its pool slots first (waiting, reaping), then
        `execute_in_process`; whatever happens, the run ends finished and its slots are freed."""
        run_id = str(uuid.uuid4())
        tags = {**tags, **launch_tags(self.launcher)}
        self.check()
        try:
            with _owning(self.instance, run_id):
                self.signals.doing = f"while waiting to run {what}"
                self._claim(run_id, tags)
                self.check()
                self.signals.doing = (
                    f"during {what} (run {run_id[:8]} marked failed; the next tick resumes from the last commit)"
                )
                res = self.job.execute_in_process(
                    instance=self.instance,
                    run_id=run_id,
                    partition_key=partition_key,
                    tags=tags,
                    raise_on_error=False,
                    run_config=run_config(),
                )
                if res.success:
                    self.signals.doing = f"after {what} (run {run_id[:8]} succeeded)"
                self.check()
                return res
        finally:
            self._finish(run_id)

    def _claim(self, run_id: str, tags: Mapping[str, str]) -> None:
        run = dg.DagsterRun(job_name=self.job.name, run_id=run_id, tags=dict(tags))
        for step, pool in self.steps:
            told: list[str] | None = None
            icc = InstanceConcurrencyContext(self.instance, run).__enter__()
            try:
                next_reap = time.monotonic() + 5.0
                while not icc.claim(pool, step):
                    now = holders(self.instance, pool, run_id)
                    if now and now != told:
                        self.say(f"waiting for {', '.join(now)} to free pool {pool}")
                        told = now
                    if time.monotonic() >= next_reap:
                        if reap(self.instance, self.pipeline, pool, self.who, self.say, skip=run_id):
                            icc.__exit__(None, None, None)  # claim again at once, not after Dagster's back-off
                            icc = InstanceConcurrencyContext(self.instance, run).__enter__()
                        next_reap = time.monotonic() + 5.0
                    with self.signals.waiting():
                        time.sleep(0.5)
            finally:
                icc.__exit__(None, None, None)  # frees a pending claim, never a claimed slot

    def _finish(self, run_id: str) -> None:
        storage = self.instance.event_log_storage
        run = self.instance.get_run_by_id(run_id)
        if run is not None and not run.is_finished:
            why = f"interrupted by {self.signals.name()}" if self.signals.received else "an error outside the run"
            self.instance.report_run_failed(
                run,
                f"{self.who} stopped before the run ended ({why}).",
                JobFailureData(error=None, failure_reason=RunFailureReason.UNEXPECTED_TERMINATION),
            )
        if storage.supports_global_concurrency_limits:
            storage.free_concurrency_slots_for_run(run_id)


# ---------------------------------------------------------------------------------------------
# One line per failure


def _strip_class(cls_name: str, message: str) -> str:
    first = (message or "").strip().splitlines()[0] if (message or "").strip() else ""
    head, sep, rest = first.partition(": ")
    if sep and (head == cls_name or head.endswith("." + cls_name)):
        return rest
    return "" if first == cls_name or first.endswith("." + cls_name) else first


def _cause(err: SerializableErrorInfo) -> SerializableErrorInfo:
    """The first error inside Dagster's wrappers (DagsterExecutionStepExecutionError and the like)."""
    while err.cls_name and err.cls_name.startswith("Dagster"):
        inner = err.cause or err.context
        if inner is None:
            break
        err = inner
    return err


def run_error(res: dg.ExecuteInProcessResult, say: Callable[[str], None] | None = None) -> WireError:
    """A failed run's cause as one exception: the Wire error's own class (a WireInputError stays
    one: exit 2) or, for any other error, a WireError subclass of the same name; its message is
    the error's first line. Verbose, `say` gets Dagster's whole report (stack included)."""
    from wire_dagster import errors

    events = res.all_events
    err = next((e.step_failure_data.error for e in events if e.is_step_failure and e.step_failure_data.error), None)
    failure = next((e for e in events if e.is_run_failure), None)
    if err is None and failure is not None:
        err = failure.job_failure_data.error
    if err is None:  # a run failure without an error (a reaped run, say): its message
        said = (failure.message or "").strip() if failure is not None else ""
        exc = WireError(f"run {res.run_id[:8]} failed" + (f": {said.splitlines()[0]}" if said else ""))
        details = said
    else:
        inner = _cause(err)
        name, message = inner.cls_name or "WireError", inner.message
        worker = errors.worker_cause(message)  # a Spark Python worker's error: its own class and line
        if worker is not None:
            name, message = worker
        cls = getattr(errors, name, None)
        if not (isinstance(cls, type) and issubclass(cls, WireError)):
            cls = type(name, (WireError,), {"__module__": "wire_dagster.errors"})
        exc = cls.__new__(cls)  # the class's own __init__ may want other arguments (ObjectExists(key))
        Exception.__init__(exc, _strip_class(name, message) or f"run {res.run_id[:8]} failed")
        details = err.to_string()
    if say is not None and verbose():
        say(details)
    return exc


def say_on(console) -> Callable[[str], None] | None:
    """Lines printed as they are (no markup) on a rich console, if any."""
    if console is None:
        return None
    return lambda line: console.print(line, markup=False, highlight=False)


def quiet_libraries() -> None:
    """Unless verbose: no library logs on the terminal beside the one error line. The Spark Connect
    client logs each gRPC error as JSON on stderr once a `logging.config` call has re-enabled its
    logger; its level comes from SPARK_CONNECT_LOG_LEVEL when its module is imported (maybe later,
    by `preload_client`'s thread), so both are set."""
    if verbose():
        return
    os.environ.setdefault("SPARK_CONNECT_LOG_LEVEL", "CRITICAL")
    connect_logging = sys.modules.get("pyspark.sql.connect.logging")
    if connect_logging is not None:
        connect_logging.logger.setLevel(os.environ["SPARK_CONNECT_LOG_LEVEL"].upper())


def quiet_sensor_log(ctx) -> None:
    """A sensor evaluated in `wire tick` logs its summary to the terminal only when verbose."""
    ctx.log.setLevel(logging.INFO if verbose() else logging.WARNING)
