"""Shared helpers for the benchmarks (and the tests' Dagster stack): an object store, a
process-tree memory sampler, Markdown tables, a small-epoch Spark Connect conf and a clean
child-process environment; and the scaffolding of the benchmarks that run `wire` commands
against peer processes (compare.py, nexmark_queries.py): measured commands, the load sampler,
Wire's Spark server, each side's bucket and environment, the ticks until a sensor is idle, the
machine and software lines and the report file."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parent.parent
WIRE = str(Path(sys.executable).parent / "wire")
CMD_TIMEOUT = 3600  # seconds, per command (a 10 M tick on 2 cores is long, but must end)
MAX_TICKS = 12  # `wire tick`s of one pipeline before its sensor must be idle

# Small epochs: without AQE and with one shuffle partition an epoch runs far fewer Spark jobs.
CONNECT_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
}


def clean_env() -> dict[str, str]:
    """This process's environment without its Spark/Dagster wiring, for a child that gets its own."""
    from wire_dagster.sparkserver import SPARK_CLIENT_ENV

    drop = {*SPARK_CLIENT_ENV, "DAGSTER_HOME", "WIRE_PIPELINES"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


@contextlib.contextmanager
def bench_store(tmp: Path) -> Iterator:
    """An ObjectStore on a fresh bucket: WIRE_S3_* when set, else an embedded S3 server in `tmp`
    (stopped at the end)."""
    from wire_dagster.embedded import EmbeddedS3
    from wire_dagster.objectstore import ObjectStore, S3Config

    server = None
    cfg = S3Config.from_env()
    if cfg is None:
        server = EmbeddedS3(tmp / "s3")
        cfg = server.start()
    try:
        cfg = replace(cfg, bucket="bench-" + uuid.uuid4().hex[:8])
        store = ObjectStore(cfg)
        store.ensure_bucket()
        yield store
    finally:
        if server is not None:
            server.stop()


@dataclass
class Peak:
    driver: int = 0  # this Python process
    spark: int = 0  # the Spark JVM(s) and Python workers below this process
    total: int = 0  # both, at the same instant


class TreeRss:
    """Samples the RSS of this process and its descendants (but not the S3 server) every `interval` seconds;
    `cpu` is the tree's CPU seconds spent inside the `with` block (robust to other load on the machine)."""

    def __init__(self, interval: float = 0.1, exclude: tuple[str, ...] = ("weed",)) -> None:
        import psutil

        self._me = psutil.Process()
        self.interval = interval
        self.exclude = exclude
        self.peak = Peak()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Peak:
        import psutil

        driver = self._me.memory_info().rss
        spark = 0
        for p in self._me.children(recursive=True):
            try:
                if p.name() in self.exclude:
                    continue
                spark += p.memory_info().rss
            except psutil.Error:
                continue
        return Peak(driver, spark, driver + spark)

    def _run(self) -> None:
        while not self._stop.is_set():
            s = self.sample()
            self.peak = Peak(
                max(self.peak.driver, s.driver), max(self.peak.spark, s.spark), max(self.peak.total, s.total)
            )
            self._stop.wait(self.interval)

    def cpu_by_kind(self) -> dict[str, float]:
        """User + system CPU seconds so far of this process ("driver"), of java ("jvm") and of the other
        descendants ("python workers"); children already reaped count with their parents."""
        import psutil

        out = {"driver": 0.0, "jvm": 0.0, "python workers": 0.0}
        for p in [self._me, *self._me.children(recursive=True)]:
            try:
                name = p.name()
                if p is not self._me and name in self.exclude:
                    continue
                t = p.cpu_times()
                kind = "driver" if p is self._me else ("jvm" if name == "java" else "python workers")
                own = t.user + t.system
                reaped = t.children_user + t.children_system
                if p is self._me:
                    out["driver"] += own  # reaped children of the driver are its finished subprocesses: not Spark
                else:
                    out[kind] += own
                    out["python workers"] += reaped  # executors/daemons reap exited Python workers
            except psutil.Error:
                continue
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU of this process tree so far."""
        return sum(self.cpu_by_kind().values())

    def __enter__(self) -> Self:
        self.peak = self.sample()
        self._cpu0 = self.cpu_by_kind()
        self.cpu = 0.0
        self.cpu_kinds: dict[str, float] = {}
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        now = self.cpu_by_kind()
        self.cpu_kinds = {k: now[k] - self._cpu0.get(k, 0.0) for k in now}
        self.cpu = sum(self.cpu_kinds.values())


def md_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A Markdown table; `align` is one char per column (l or r), default: first left, others right."""
    align = align or "l" + "r" * (len(headers) - 1)
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def mb(n: int) -> str:
    return f"{n / 2**20:,.0f}"


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    """`with timed() as t: ...` then t[0] is the wall time in seconds."""
    box = [0.0]
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - t0


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def comma_list(option: str) -> list[str]:
    """The items of a comma-separated option (`--sizes 1M,10M`), stripped, empty ones dropped."""
    return [x.strip() for x in option.split(",") if x.strip()]


def parse_sides(option: str) -> set[str]:
    """`--sides`: which of the engines wire, spark and duckdb to run (ValueError otherwise)."""
    sides = set(comma_list(option))
    if not sides or not sides <= {"wire", "spark", "duckdb"}:
        raise ValueError("--sides: choose among wire, spark, duckdb")
    return sides


def log(msg: str) -> None:
    """Progress, on stderr (stdout carries the report)."""
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Running one measured command


def tree_cpu(roots: list) -> float:
    """User + system seconds so far of the processes `roots` (psutil) and their descendants,
    the children they reaped included."""
    import psutil

    total = 0.0
    for root in roots:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
    return total


class ProcTree(TreeRss):
    """TreeRss over a child process and its descendants (Spark's JVM, its Python workers); the
    servers' (the S3 server's and, in Wire's server mode, the Spark server's) RSS is sampled beside
    it, never counted in the tree, and their CPU over the command is `servers_cpu()`.

    CPU: the child's own rusage (os.wait4: itself and the children it reaped) plus, for every
    descendant seen by the sampler, its last user + system time and that of the children it
    reaped (the JVM reaps its Python workers). A JVM is not reaped by the Python process that
    started it (it exits on its own once its parent is gone), so rusage alone would miss it."""

    def __init__(self, pid: int, server_pids: list[int], interval: float = 0.2) -> None:
        import psutil

        super().__init__(interval=interval, exclude=("weed",))
        self._me = psutil.Process(pid)
        self._servers = [psutil.Process(s) for s in server_pids]
        self.server_peak = 0
        self.with_server_peak = 0
        self.desc_cpu: dict[int, float] = {}
        self._servers_cpu0 = self._servers_cpu_now()

    def _servers_cpu_now(self) -> float:
        return tree_cpu(self._servers)

    def servers_cpu(self) -> float:
        """The servers' CPU seconds since this tree was created: the work they did for the command."""
        return max(0.0, self._servers_cpu_now() - self._servers_cpu0)

    def sample(self) -> Peak:
        import psutil

        try:
            p = super().sample()
            for c in self._me.children(recursive=True):
                try:
                    t = c.cpu_times()
                    self.desc_cpu[c.pid] = t.user + t.system + t.children_user + t.children_system
                except psutil.Error:
                    continue
        except psutil.Error:  # the child exited between two samples
            return Peak()
        s = 0
        for server in self._servers:
            try:
                s += server.memory_info().rss + sum(c.memory_info().rss for c in server.children(recursive=True))
            except psutil.Error:
                continue
        self.server_peak = max(self.server_peak, s)
        self.with_server_peak = max(self.with_server_peak, p.total + s)
        return p

    def cpu_by_kind(self) -> dict[str, float]:
        return {}  # see the class doc: CPU is computed from rusage and the sampled descendants


class LoadSampler:
    """The 1-minute load average every few seconds (the machine is shared: a figure means little without it)."""

    def __init__(self, interval: float = 5.0) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), os.getloadavg()[0]))
            self._stop.wait(self._interval)

    def start(self) -> LoadSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def mean(self, t0: float | None = None, t1: float | None = None) -> float | None:
        xs = [v for t, v in self.samples if (t0 is None or t >= t0) and (t1 is None or t <= t1)]
        return sum(xs) / len(xs) if xs else None

    def max(self) -> float:
        return max((v for _, v in self.samples), default=0.0)


@dataclass
class Measured:
    cmd: list[str]
    wall: float
    cpu: float  # user + system of the child and the descendants it reaped, plus the servers' during the command
    peak: int  # process tree RSS, bytes
    server_peak: int
    with_server_peak: int
    stdout: str
    stderr: str
    t_start: float  # epoch seconds
    t_end: float

    def last_json(self) -> dict:
        """The JSON line a peer or `wire ... --json` printed last (its figures)."""
        return json.loads(self.stdout.strip().splitlines()[-1])


def run_measured(
    cmd: list[str], env: dict[str, str], tmp: Path, server_pids: list[int], timeout: float = CMD_TIMEOUT
) -> Measured:
    """Run `cmd` in its own process group; wall, CPU (rusage, plus what the servers in `server_pids`
    spent meanwhile), peak tree RSS; fail loudly on a non-zero exit."""
    out_f, err_f = tmp / f"cmd-{uuid.uuid4().hex[:8]}.out", tmp / f"cmd-{uuid.uuid4().hex[:8]}.err"
    t_start = time.time()
    t0 = time.perf_counter()
    with open(out_f, "w") as so, open(err_f, "w") as se:
        p = subprocess.Popen(cmd, env=env, stdout=so, stderr=se, cwd=str(tmp), start_new_session=True)
    killed = threading.Event()

    def kill_group() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)

    def on_timeout() -> None:
        killed.set()
        kill_group()

    timer = threading.Timer(timeout, on_timeout)
    timer.start()
    try:
        with ProcTree(p.pid, server_pids) as mem:
            _, status, usage = os.wait4(p.pid, 0)
    finally:
        timer.cancel()
    wall = time.perf_counter() - t0
    kill_group()  # anything the command left in its process group (it should leave nothing)
    p.returncode = os.waitstatus_to_exitcode(status)
    stdout, stderr = out_f.read_text(), err_f.read_text()
    out_f.unlink()
    err_f.unlink()
    if killed.is_set():
        raise SystemExit(f"timed out after {timeout:.0f} s: {shlex.join(cmd)}")
    if p.returncode != 0:
        # a JVM's stack trace buries its cause: the lines naming an exception first, then the tail
        causes = [ln for ln in stderr.splitlines() if re.search(r"(Exception|Error)\b.*:", ln)][:6]
        raise SystemExit(
            f"{shlex.join(cmd)} exited {p.returncode}:\n" + "\n".join(causes) + f"\n...\n{stderr.strip()[-2000:]}"
        )
    cpu = usage.ru_utime + usage.ru_stime + sum(mem.desc_cpu.values()) + mem.servers_cpu()
    return Measured(
        cmd, wall, cpu, mem.peak.total, mem.server_peak, mem.with_server_peak, stdout, stderr, t_start, time.time()
    )


#: What runs one `wire` command (its arguments after `wire`) and measures it.
Runner = Callable[[list[str]], Measured]


def process_runner(env: dict[str, str], tmp: Path, server_pids: list[int]) -> Runner:
    """Each command a new `wire` process (run_measured)."""
    return lambda args: run_measured([WIRE, *args], env, tmp, server_pids)


class WireShell:
    """One `wire shell --warm` for many commands (the warm pairing): started, its Spark session
    attached with its Python workers up and the pipelines' definitions loaded, before the first
    timed command, as a warm Spark SS session is; then each `run(args)` writes one command line
    and waits for its status line. stdout goes to a file (the shell flushes it before the status
    line, so a command's output is all there when its status arrives); a command's CPU is the
    shell's process tree's and the servers' over the command."""

    _STATUS = re.compile(r"^wire: exit (\d+) in [0-9.]+ s$")

    def __init__(self, env: dict[str, str], tmp: Path, server_pids: list[int]) -> None:
        self.tmp, self.server_pids = tmp, server_pids
        self._out_path = tmp / f"shell-{uuid.uuid4().hex[:8]}.out"
        self._out = open(self._out_path, "w")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [WIRE, "shell", "--warm"],
            env=env,
            cwd=str(tmp),
            stdin=subprocess.PIPE,
            stdout=self._out,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        ready = self._until(lambda line: line.startswith("wire: ready"))
        self.start_s = time.perf_counter() - t0
        if ready is None:
            self.close()
            raise SystemExit("wire shell --warm did not start")

    def _until(self, done: Callable[[str], bool], seen: list[str] | None = None) -> str | None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            if done(line):
                return line
            if seen is not None:
                seen.append(line)
        return None

    def _tree_cpu(self) -> float:
        import psutil

        try:
            return tree_cpu([psutil.Process(self.proc.pid)])
        except psutil.Error:
            return 0.0

    def run(self, args: list[str]) -> Measured:
        assert self.proc.stdin is not None
        before, cpu0 = self._out_path.stat().st_size, self._tree_cpu()
        t_start, t0 = time.time(), time.perf_counter()
        err: list[str] = []
        with ProcTree(self.proc.pid, self.server_pids) as mem:
            self.proc.stdin.write(shlex.join(args) + "\n")
            self.proc.stdin.flush()
            status = self._until(lambda line: bool(self._STATUS.match(line)), err)
        wall = time.perf_counter() - t0
        cmd = ["wire shell:", *args]
        if status is None:
            raise SystemExit(f"{shlex.join(cmd)}: the shell ended: " + "\n".join(err[-20:]))
        code = int(status.split()[2])
        if code != 0:
            raise SystemExit(f"{shlex.join(cmd)} exited {code}:\n" + "\n".join(err[-20:]))
        with open(self._out_path) as f:
            f.seek(before)
            stdout = f.read()
        cpu = self._tree_cpu() - cpu0 + mem.servers_cpu()
        return Measured(
            cmd, wall, cpu, mem.peak.total, mem.server_peak, mem.with_server_peak, stdout, "\n".join(err), t_start,
            time.time(),
        )  # fmt: skip

    def close(self) -> None:
        """End of input, then the shell's process group is stopped (it should have left by itself)."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._out.close()
        self._out_path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------
# The sides' servers, buckets and environments


@contextlib.contextmanager
def spark_server(directory: Path, master: str, wanted: bool, notes: list[str]):
    """Wire's embedded Spark server (what `wire spark start` runs) for the "server" mode, started
    before the timed commands like the S3 server, and stopped by its process group at the end;
    yields its URL and pid ("", None when not wanted). `directory` is `<WIRE_HOME>/spark` of the
    Wire commands, so it is their home's embedded server, as with `wire spark start` (its clients
    share one Connect session: `sparkserver.shared_session_id`)."""
    if not wanted:
        yield "", None
        return
    from wire_dagster.sparkconf import driver_memory
    from wire_dagster.sparkserver import EmbeddedSpark

    t0 = time.perf_counter()
    server = EmbeddedSpark(directory)
    heap = driver_memory()  # what the server is started with
    try:
        url = server.start(master=master)
        notes.append(
            f"Wire's Spark server (`wire spark start`: Spark Connect, {master}, {heap} driver heap) started before "
            f"the timed commands, like the S3 server, in {time.perf_counter() - t0:.1f} s"
        )
        log(notes[-1])
        info = server.recorded()
        yield url, int(info["pid"]) if info else None
    finally:
        server.stop()


def s3_server_pid(tmp: Path) -> int | None:
    """The embedded S3 server bench_store started under tmp (None when WIRE_S3_ENDPOINT points elsewhere)."""
    f = tmp / "s3" / "weed.pid"
    try:
        return int(json.loads(f.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def fresh_bucket(store0, prefix: str):
    """A new bucket on `store0`'s server, so that each side (data set, Spark mode) starts empty."""
    from wire_dagster.objectstore import ObjectStore

    store = ObjectStore(replace(store0.cfg, bucket=prefix + uuid.uuid4().hex[:8]))
    store.ensure_bucket()
    return store


@dataclass
class Servers:
    """What the timed `wire` commands run against, started before them: the object store (`store`
    on bench_store's bucket; `s3_pid` None when WIRE_S3_ENDPOINT points elsewhere) and, when
    wanted, Wire's Spark server (`spark_url`, "" when not), all under `tmp`, whose `home` is the
    WIRE_HOME of every side's commands (so the Spark server is their home's, as with `wire spark
    start`)."""

    tmp: Path
    store: Any
    spark_url: str
    spark_pid: int | None
    s3_pid: int | None

    @property
    def wire_home(self) -> Path:
        return self.tmp / "home"

    def pids(self, warm: bool) -> list[int]:
        """The servers whose memory and CPU count for a side's commands: the S3 server's always,
        the Spark server's when the side's runs attach to it (`warm`)."""
        return [p for p in (self.s3_pid, self.spark_pid if warm else None) if p]

    def side(self, pipelines: Path, dagster_home: Path, warm: bool, master: str) -> tuple[Any, dict[str, str]]:
        """A side's own bucket (fresh_bucket) and the environment of its `wire` commands: the
        bucket, its pipeline files, the shared WIRE_HOME, its own Dagster instance; its runs attach
        to the Spark server when `warm`, else each command boots local Spark on `master`."""
        store = fresh_bucket(self.store, "nx-")
        env = dict(os.environ)
        env.update(store.cfg.export_env())
        env.update(
            {
                "WIRE_PIPELINES": str(pipelines),
                "WIRE_HOME": str(self.wire_home),
                "DAGSTER_HOME": str(dagster_home),
                "PYSPARK_PYTHON": sys.executable,
            }
        )
        env.pop("WIRE_SPARK_REMOTE", None)
        env.pop("WIRE_SPARK_MASTER", None)
        env.update({"WIRE_SPARK_REMOTE": self.spark_url} if warm else {"WIRE_SPARK_MASTER": master})
        return store, env


def install_signal_handlers() -> None:
    """SIGTERM and SIGHUP raise SystemExit (Ctrl-C already raises KeyboardInterrupt), so `finally`
    blocks stop the stack."""

    def bye(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, bye)
    signal.signal(signal.SIGHUP, bye)
    # Ctrl-C raises KeyboardInterrupt, also when started in the background of a script (where SIGINT is ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def bench_servers(prefix: str, master: str, want_spark: bool, notes: list[str]) -> Iterator[Servers]:
    """A temporary directory, the object store in it (bench_store) and, if `want_spark`, Wire's
    Spark server on `master` (spark_server); all stopped at the end, on SIGTERM and SIGHUP too."""
    install_signal_handlers()
    with (
        tempfile.TemporaryDirectory(prefix=prefix) as tmpd,
        bench_store(Path(tmpd)) as store,
        spark_server(Path(tmpd) / "home" / "spark", master, want_spark, notes) as (url, pid),
    ):
        yield Servers(Path(tmpd), store, url, pid, s3_server_pid(Path(tmpd)))


def peer_env() -> dict[str, str]:
    """The peers' environment: this one's, Python workers on this interpreter, and no Spark Connect
    URL (a peer starts its own Spark)."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    env.pop("WIRE_SPARK_REMOTE", None)
    return env


def tick_until_idle(
    pipeline: str,
    run: Runner,
    extra: tuple[str, ...] | list[str] = (),
    on_tick: Callable[[int, Measured], None] = lambda n, m: None,
) -> tuple[list[Measured], Measured]:
    """`wire tick --pipeline <pipeline> <extra>`, measured (`run`: a process each, or a shell),
    one at a time, until its sensor requests no run; returns the ticks that launched runs and the
    last, empty one (reported apart: it only confirms). SystemExit on a run that did not succeed,
    or after MAX_TICKS ticks."""
    ticks: list[Measured] = []
    for _ in range(MAX_TICKS):
        m = run(["tick", "--pipeline", pipeline, *extra])
        if "sensor requested no run" in m.stdout:
            return ticks, m
        bad = [ln for ln in m.stdout.splitlines() if ln.startswith("run ") and not ln.endswith("SUCCESS")]
        if bad:
            raise SystemExit(f"wire tick --pipeline {pipeline}: {bad}")
        ticks.append(m)
        on_tick(len(ticks), m)
    raise SystemExit(f"wire tick --pipeline {pipeline}: still requesting runs after {MAX_TICKS} ticks")


# ---------------------------------------------------------------------------
# The report


def machine() -> str:
    import psutil

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu or 'unknown CPU'}, {cpu_count()} cores available, {psutil.virtual_memory().total / 2**30:.0f} GB RAM, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def versions() -> str:
    import dagster
    import duckdb
    import pyspark

    return f"PySpark {pyspark.__version__}, DuckDB {duckdb.__version__}, Dagster {dagster.__version__}"


def git(*args: str) -> str | None:
    """The output of `git -C <the repository> <args>`; None when git cannot run."""
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None


#: The tree's code: what a measured run imports (the benchmarks' own reports are not code: a run
#: writes one into the tree, and the next benchmark in the same clone must not count it).
CODE = (
    "wire_dagster",
    "assets",
    "sensors",
    "resources",
    "definitions.py",
    "benchmarks",
    ":(exclude)benchmarks/results",
)


def git_commit() -> str:
    """HEAD's short hash ("?" without git) and, when the code differs from it, the files that
    differ and the first 8 hex digits of the difference's sha256: the two sides of an A/B of
    uncommitted changes tell apart."""
    out = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", *CODE)
    if out is None or dirty is None:
        return "?"
    files = [line[3:] for line in dirty.split("\n") if line.strip()]
    if not files:
        return out.strip()
    diff = (git("diff", "HEAD", "--", *CODE) or "").encode()
    return (
        f"{out.strip()} (uncommitted changes in {', '.join(files)}; diff sha256 {hashlib.sha256(diff).hexdigest()[:8]})"
    )


def software_line() -> str:
    """The report's software line: versions and the commit measured."""
    return f"- software: {versions()}; commit {git_commit()}"


def raw_details(raw) -> str:
    """Raw measurements as a collapsed JSON block, appended to a Markdown report."""
    return (
        "\n<details><summary>raw measurements (JSON)</summary>\n\n```json\n"
        + json.dumps(raw, indent=1, default=str)
        + "\n```\n</details>\n"
    )


def save_report(text: str, path: Path, failed: bool = False, raw=None) -> int:
    """Print the report, write it (with `raw` measurements, if any, appended) to `path` and say
    where; the exit status: 1 when `failed` (results differ), else 0."""
    print(text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + (raw_details(raw) if raw is not None else ""))
    log(f"report written to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    if failed:
        log("RESULTS DIFFER: see the report")
        return 1
    return 0
