"""One Spark session factory for `local[*]`, a standalone cluster and Spark Connect.

Resolution, first match wins: the arguments; `WIRE_SPARK_REMOTE` (sc://host:port;
empty = unset) attaches to a Spark Connect server; `WIRE_SPARK_MASTER`
(`local[*]`, `spark://host:port`, ...) starts or joins a classic session; with
neither set, the embedded Spark Connect server of the Wire home
(`wire spark start`, `wire dev`; wire_dagster/sparkserver.py) if it is running;
else `local[*]`. In one process the active classic session is reused, whatever
the environment says. Every client of a Spark Connect server from one Wire home
(the embedded server, found or named by WIRE_SPARK_REMOTE as `wire dev` does, or
any other) attaches to one shared Connect session (`sparkserver.shared_session_id`):
the server starts Python workers per session, so a run (a new process) finds them
warm instead of paying ~1 s for its first job, and keeps a session's Python daemon
until it stops (Spark 4.3), so a session per run would leave a process per run.

Local defaults: UI off, shuffle partitions sized to the cores, session time
zone UTC, Python workers on this interpreter (they import pyarrow), the driver
bound to 127.0.0.1. On a cluster whose master is not on loopback the executors
must reach the driver, so the driver's address is Spark's own choice (the
host name, or SPARK_LOCAL_IP) unless `WIRE_SPARK_DRIVER_HOST` names it.

A command that will need a local session after other work (`wire tick`, `wire process`, `wire
backfill`) calls `start_ahead` first: its JVM is launched at once and the rest built meanwhile
(jvmlaunch.py); `get_spark` then hands that session out. Every JVM launched here maps the class
archive `make setup` makes (jvmarchive.py).

A Spark Connect server owns its cluster-side settings (Python executable of
its workers, memory, cores): start it with `PYSPARK_PYTHON` pointing at an
interpreter that has this package and pyarrow installed. The client sets only
session-scoped SQL options.

Other knobs (all optional): WIRE_SPARK_DRIVER_MEMORY (default 2g),
WIRE_SPARK_EXECUTOR_MEMORY (cluster executors; Spark's default 1g),
WIRE_SPARK_SHUFFLE_PARTITIONS (default: the local cores, at least 2),
WIRE_SPARK_UI (false), WIRE_SPARK_LOCAL_DIR (where a local session's spill files and JVM temporary files
go, in a directory of the process's own removed at its exit or, after a kill, by the next local session;
default <tmp>/wire-spark),
WIRE_SPARK_DRIVER_HOST (the engine's own knobs, WIRE_SINGLE_TASK_ROWS among them: settings.py). Any other Spark setting:
spark-defaults.conf under SPARK_CONF_DIR, as for every Spark application.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

from .errors import WireInputError
from .jvmarchive import launch_options
from .sparkconf import (
    LOOPBACK,
    check_master,
    driver_host,
    driver_memory,
    env_value,
    java_problem,
    local_cores,
    session_cores,
    with_late_c2,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    from .jvmlaunch import Ahead


def spark_target(master: str | None = None, remote: str | None = None) -> tuple[str, str]:
    """`("remote", "sc://…")` or `("master", "local[*]" | "spark://…" | …)`: the arguments first, then
    WIRE_SPARK_REMOTE, then WIRE_SPARK_MASTER; with none of them, the Wire home's embedded Spark
    Connect server if it runs (a pid-file read, a liveness check and a TCP connect: no subprocess),
    else `local[*]`."""
    kind, url, _ = _resolve(master, remote)
    return kind, url


def _resolve(master: str | None, remote: str | None) -> tuple[str, str, bool]:
    """spark_target's answer, and whether it is the embedded server (found, not configured)."""
    remote = (remote or "").strip() or env_value("WIRE_SPARK_REMOTE")
    if remote:
        if not remote.startswith("sc://") or not urlsplit(remote).hostname:
            raise WireInputError(
                f"WIRE_SPARK_REMOTE: expected a Spark Connect URL like sc://127.0.0.1:15002, got {remote!r}"
            )
        return "remote", remote, False
    master = (master or "").strip() or env_value("WIRE_SPARK_MASTER")
    if master is None:
        from .sparkserver import embedded_url

        url = embedded_url()
        if url is not None:
            return "remote", url, True
        master = "local[*]"
    return "master", check_master(master), False


def get_spark(master: str | None = None, remote: str | None = None, app: str = "wire", cores: int | None = None):
    """The active session if there is one, else a new one configured from the arguments and the environment
    (`spark_target`). A configured Spark Connect URL (argument or WIRE_SPARK_REMOTE) is always attached to; a
    running embedded server only when this process has no active session yet."""
    from pyspark.sql import SparkSession

    kind, url, embedded = _resolve(master, remote)
    if kind == "remote" and embedded:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
    if kind == "remote":
        from .sparkserver import renew_session_id, shared_session_id

        # The clients of a Spark Connect server from one Wire home share one session
        # (`shared_session_id`); a URL that names a session_id itself keeps it.
        if "session_id=" in url:
            return _remote(url, app)
        shared: str | None = shared_session_id(url)
        for _ in range(2):  # the shared session, or its successor once the server closed it
            if shared is None:
                break
            try:
                s = _remote(_with_session(url, shared), app)
            except Exception as e:  # pyspark raises its generic remote error: the message says why
                if "SESSION_CLOSED" not in str(e):
                    raise
                _drop_default_remote()
                shared = renew_session_id(url, shared)
            else:
                s.release_session_on_close = False  # a stop() in one run must not close the others' session
                return s
        return _remote(url, app)
    if _AHEAD is not None:
        return _AHEAD.session()
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    problem = java_problem()
    if problem:
        raise WireInputError(problem)
    opts, submit_opts = _local(url, app, cores)
    saved = os.environ.get("SPARK_SUBMIT_OPTS")
    os.environ["SPARK_SUBMIT_OPTS"] = submit_opts
    try:
        return _session_of(opts)
    finally:
        if saved is None:
            os.environ.pop("SPARK_SUBMIT_OPTS", None)
        else:
            os.environ["SPARK_SUBMIT_OPTS"] = saved


def _session_of(opts: dict[str, str]) -> SparkSession:
    """`SparkSession.builder.getOrCreate()` with the options `opts`."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for k, v in opts.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def _local(master: str, app: str, cores: int | None) -> tuple[dict[str, str], str]:
    """A classic session's configuration, and the SPARK_SUBMIT_OPTS its JVM is launched with (the
    JVM's temporary directory, the class archive and C2 held back: sparkconf.LATE_C2). The Python
    workers run this interpreter unless PYSPARK_PYTHON says."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    n = cores or local_cores(master) or os.cpu_count() or 2
    tmp = env_value("WIRE_SPARK_LOCAL_DIR") or os.path.join(tempfile.gettempdir(), "wire-spark")
    os.makedirs(tmp, exist_ok=True)
    own = _jvm_tmpdir(tmp)  # the driver's spill files and the JVM's temporary files, this process's only
    parts = env_value("WIRE_SPARK_SHUFFLE_PARTITIONS") or str(max(2, n))
    opts = {
        "spark.master": master,
        "spark.app.name": app,
        "spark.ui.enabled": env_value("WIRE_SPARK_UI") or "false",
        "spark.sql.shuffle.partitions": parts,
        "spark.default.parallelism": parts,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.adaptive.enabled": "true",
        "spark.local.dir": own,
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
        "spark.executorEnv.PYSPARK_PYTHON": os.environ["PYSPARK_PYTHON"],
        "spark.python.worker.reuse": "true",
        "spark.driver.memory": driver_memory(),
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "WARN",
    }
    host = driver_host(master)
    if host:
        opts["spark.driver.host"] = host
        if host in LOOPBACK or host.startswith("127."):
            opts["spark.driver.bindAddress"] = host
    mem = env_value("WIRE_SPARK_EXECUTOR_MEMORY")
    if mem:
        opts["spark.executor.memory"] = mem
    # The JVM's temporary files go to that directory too, removed at this process's exit: a classic
    # session ended by stop() leaves its artifacts-<uuid> directory in java.io.tmpdir behind (PySpark 4.3;
    # one per Spark SS run of the benchmarks), the JVM extracts native libraries there, and a `wire tick`
    # left its spark-* and blockmgr-* directories in a shared spark.local.dir every time. Given
    # through SPARK_SUBMIT_OPTS, which the launcher puts before any spark.driver.*JavaOptions: a
    # -Djava.io.tmpdir of the user's own still wins.
    return opts, launch_options(with_late_c2(os.environ.get("SPARK_SUBMIT_OPTS")), own)


_AHEAD: Ahead[SparkSession] | None = None


def start_ahead(app: str = "wire-dagster") -> None:
    """Start the local session `get_spark()` will hand out now, for a command that has other work
    first (`wire tick`, `wire process`, `wire backfill`): its JVM is launched from this thread at
    once, the rest is built meanwhile (jvmlaunch.py). Only from the main thread, before any other
    thread forks; nothing when the target is a Spark Connect server or a session exists already.
    `stop_ahead()` ends it if it was never handed out."""
    global _AHEAD
    if _AHEAD is not None or threading.current_thread() is not threading.main_thread():
        return
    try:
        kind, url, _embedded = _resolve(None, None)
    except WireInputError:
        return  # get_spark reports the bad setting when it is called
    if kind != "master" or java_problem():
        return
    # Imported here, before the helper thread and the others run: PySpark's modules import one
    # another in cycles, and two threads importing them at once can get one half-initialised
    # ("cannot import name 'SQLContext' from partially initialized module 'pyspark.sql'"). ~0.06 s.
    import py4j.clientserver  # noqa: F401
    import pyspark.conf
    import pyspark.sql  # noqa: F401
    from pyspark.core.context import SparkContext

    from .jvmlaunch import Ahead

    if SparkContext._active_spark_context is not None:
        return
    opts, submit_opts = _local(url, app, None)
    _AHEAD = Ahead(opts, {**os.environ, "SPARK_SUBMIT_OPTS": submit_opts}, lambda: _session_of(opts), warm_workers)
    atexit.register(stop_ahead)


def stop_ahead() -> None:
    """End the session started ahead if nothing took it."""
    if _AHEAD is not None:
        _AHEAD.stop()


def _jvm_tmpdir(root: str) -> str:
    """A new directory under `root` for the JVM this process launches, removed when the interpreter
    exits; those of processes that are gone (killed before their exit handlers ran) are removed first."""
    from .procgroup import pid_alive

    for old in Path(root).glob("jvm-*-*"):
        pid = old.name.split("-")[1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"jvm-{os.getpid()}-", dir=root)
    atexit.register(shutil.rmtree, path, True)
    return path


_PRELOAD: threading.Thread | None = None


def preload_client(master: str | None = None, remote: str | None = None) -> threading.Thread:
    """Import the Spark client `get_spark(master, remote)` will use (Spark Connect's for a remote
    target, else PySpark's) in a background thread, for a caller that has other work first: the
    imports (~0.3-0.5 s) then overlap its waits on the store and on Dagster's storage. `get_spark`
    works whether it has finished or not (an import in progress is waited for, not repeated).
    Once per process: `wire tick` calls it, then each run it executes in-process.

    For the embedded server's shared session it then attaches and warms the session's Python
    workers (`warm_workers`): Spark stops a Python worker after a minute idle, and the next job
    pays ~1 s to start one and import the kernel's modules; this way that happens while the
    caller reads the store and Dagster creates its run."""
    global _PRELOAD
    if _PRELOAD is not None:
        return _PRELOAD

    def run() -> None:
        try:
            kind, url, _embedded = _resolve(master, remote)
        except Exception:  # get_spark reports a bad setting when it is called; nothing to preload
            return
        import importlib

        importlib.import_module("pyspark.sql.connect.session" if kind == "remote" else "pyspark.sql")
        if kind != "remote":
            return
        try:
            warm_workers(get_spark(master, remote))
        except Exception as e:  # the caller's own first job meets (and reports) whatever failed here
            import logging

            logging.getLogger(__name__).debug("warming the Spark server's Python workers failed: %s", e)

    _PRELOAD = threading.Thread(target=run, name="wire-spark-import", daemon=True)
    _PRELOAD.start()
    return _PRELOAD


def warm_workers(spark) -> None:
    """One task per core (`session_cores`) that starts a Python worker, if the session's pool has
    none idle, and imports the kernel's modules in it; the kernel's next tasks then reuse the
    workers (`spark.python.worker.reuse`). ~0.1 s on the server where they are warm already."""
    from pyspark.sql.types import BooleanType, StructField, StructType

    n = session_cores(spark)  # the type made here: a DDL string is a round trip on Spark Connect
    spark.range(0, n, 1, n).mapInArrow(_warm_task, StructType([StructField("ready", BooleanType())])).collect()


def _warm_task(batches):
    import duckdb  # noqa: F401
    import pyarrow as pa

    from . import kernel  # noqa: F401

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"ready": [True]})


def _remote(url: str, app: str) -> RemoteSession:
    from pyspark.sql import SparkSession

    b = SparkSession.builder.remote(url).appName(app).config("spark.sql.session.timeZone", "UTC")
    parts = env_value("WIRE_SPARK_SHUFFLE_PARTITIONS")
    if parts:
        b = b.config("spark.sql.shuffle.partitions", parts)
    # The classic builder hands a remote URL to Spark Connect's builder and casts its session to
    # the classic type; undo that cast so that the Connect-only attributes type-check.
    return cast("RemoteSession", b.getOrCreate())


def _with_session(url: str, session_id: str) -> str:
    """`url` (sc://host:port, perhaps with /;param=value...) naming the session `session_id`."""
    base = url.rstrip("/")
    return f"{base};session_id={session_id}" if ";" in base else f"{base}/;session_id={session_id}"


def _drop_default_remote() -> None:
    """Forget the Spark Connect session that failed to attach (the builder made it this process's
    default before it failed), without releasing it on the server."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    broken = RemoteSession._get_default_session()
    if broken is not None:
        broken.release_session_on_close = False
        broken.stop()


class LazySession:
    """A Spark session started on first use, for callers that may have nothing to compute:
    a run whose epochs are all committed already (it only reports its partition) never
    starts a JVM or attaches to Spark Connect. Attribute access goes to the real session."""

    def __init__(self, factory):
        self._factory = factory
        self._session = None

    @property
    def started(self) -> bool:
        return self._session is not None

    def get(self):
        """The session, started now if it was not."""
        if self._session is None:
            self._session = self._factory()
        return self._session

    def __getattr__(self, name: str):
        return getattr(self.get(), name)


def started_session(spark):
    """`spark` started in the calling thread: None → `get_spark()`, a LazySession → its session.

    Call it where the session may be created, not on a helper thread: PySpark launches a local
    session's JVM with a `preexec_fn` (Python run in the forked child), and forked from the job
    thread of an in-process Dagster run (`wire demo`) that child died of SIGSEGV before exec."""
    if spark is None:
        return get_spark()
    if isinstance(spark, LazySession):
        return spark.get()
    return spark
