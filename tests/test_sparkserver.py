"""The embedded Spark Connect server (wire_dagster/sparkserver.py, `wire spark start|stop|status`).

Real processes, no mocks. One server is started (a Spark Connect JVM costs ~1 GB and 10-30 s on
a loaded 2-core machine), under a private WIRE_HOME so no other test attaches to it; the failed
starts fail within seconds (a `local[0]` master) or before anything is launched (a taken port,
a bad master, no Java). Every wait is a bounded poll on a condition.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from dagster_stack import group_gone
from wire_dagster.procgroup import wait_until
from wire_dagster.sparkserver import EmbeddedSpark, shared_session_id

#: Cheaper JIT and GC for a short-lived server, as conftest's spark_remote uses.
JAVA_OPTS = "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
STARTED_WITHIN = 240  # s, a Spark JVM plus a probe query on a loaded machine


def wire_exe() -> str:
    return shutil.which("wire", path=str(Path(sys.executable).parent)) or "wire"


def base_env(home: Path) -> dict[str, str]:
    """This environment without any Wire, Spark or AWS setting, plus WIRE_HOME and a small driver."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WIRE_", "SPARK_", "AWS_")) and k not in ("PYSPARK_SUBMIT_ARGS", "DAGSTER_HOME")
    }
    env.update(WIRE_HOME=str(home), WIRE_SPARK_DRIVER_MEMORY="768m", PYSPARK_PYTHON=sys.executable)
    return env


def wire(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([wire_exe(), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def python(code: str, env: dict[str, str], timeout: float = 180) -> str:
    """Run `code` in a fresh interpreter (a Connect session would mark this whole process remote); its stdout."""
    p = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def servers_of(directory: Path) -> list[int]:
    """Pids whose command line marks them as the Spark server of `directory` (whatever their state)."""
    marker = f"spark.wire.dir={directory.resolve()}"
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if marker in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


TARGETS = """
import json, os
from wire_dagster.sparksession import spark_target
out = {"none": spark_target(), "argument": spark_target(master="local[2]")}
os.environ["WIRE_SPARK_MASTER"] = "local[1]"
out["master"] = spark_target()
os.environ["WIRE_SPARK_REMOTE"] = "sc://127.0.0.1:1"
out["remote"] = spark_target()
print(json.dumps(out))
"""

QUERY = """
import json, sys
from pyspark.sql import SparkSession
s = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
def where(batches):
    import sys
    import pyarrow as pa
    import wire_dagster  # the workers run this project's interpreter
    for b in batches:
        yield pa.RecordBatch.from_pydict({"exe": [sys.executable] * b.num_rows})
rows = s.range(6).mapInArrow(where, "exe string").distinct().collect()
print(json.dumps({"sum": s.range(10).selectExpr("sum(id) AS s").first().s, "exe": [r.exe for r in rows],
                  "tz": s.conf.get("spark.sql.session.timeZone")}))
"""

GET_SPARK = """
import json
from wire_dagster.sparksession import get_spark
s = get_spark()
print(json.dumps({"module": type(s).__module__, "n": s.range(5).count()}))
"""

SHARED = """
import json
from wire_dagster.sparksession import get_spark
s = get_spark()
print(json.dumps({"session": s.session_id, "n": s.range(5).count()}))
s.stop()
"""

#: SHARED with a Python job: the server starts (or reuses) the session's Python daemon.
SHARED_PYTHON = """
import json
from wire_dagster.sparksession import get_spark
s = get_spark()
n = s.range(5).mapInArrow(lambda batches: batches, "id long").count()
print(json.dumps({"session": s.session_id, "n": n}))
s.stop()
"""

PRELOAD = """
from wire_dagster.sparksession import preload_client
preload_client().join()
"""


def kernel_workers(jvm: psutil.Process) -> set[int]:
    """The server's Python workers (forked by a pyspark.daemon child of the JVM) that have loaded DuckDB."""
    out = set()
    for daemon in jvm.children():
        try:
            for w in daemon.children():
                if any("duckdb" in m.path for m in w.memory_maps()):
                    out.add(w.pid)
        except psutil.Error:
            continue
    return out


def python_daemons(jvm: psutil.Process) -> set[int]:
    """The server's pyspark.daemon processes (one per Spark Connect session that ran Python)."""
    out = set()
    for c in jvm.children():
        try:
            if "pyspark.daemon" in " ".join(c.cmdline()):
                out.add(c.pid)
        except psutil.Error:  # gone, or a zombie, since the listing
            continue
    return out


RELEASE = """
import sys
from pyspark.sql import SparkSession
SparkSession.builder.remote(sys.argv[1]).getOrCreate().stop()
"""


def test_start_query_reuse_resolve_stop(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = base_env(home)
    server = EmbeddedSpark(home / "spark")
    try:
        t0 = time.monotonic()
        p = wire(["spark", "start", "--master", "local[2]", "--conf", JAVA_OPTS], env)
        started_s = time.monotonic() - t0
        assert p.returncode == 0, p.stderr
        url = p.stdout.strip()
        assert re.fullmatch(r"sc://127\.0\.0\.1:\d+", url), p.stdout
        assert started_s < STARTED_WITHIN

        # The pid file names the JVM itself (spark-submit ran in the foreground), leader of its own group.
        info = json.loads(server.pid_file.read_text())
        assert info["url"] == url and info["pid"] == info["pgid"] and info["master"] == "local[2]"
        jvm = psutil.Process(info["pid"])
        assert os.path.basename(jvm.exe()) == "java", jvm.cmdline()[:3]
        assert "org.apache.spark.sql.connect.service.SparkConnectServer" in jvm.cmdline()
        assert "-Xmx768m" in jvm.cmdline()  # WIRE_SPARK_DRIVER_MEMORY
        assert os.getpgid(info["pid"]) == info["pgid"] != os.getpgid(0)
        # Java's dual-stack sockets show IPv4 loopback as ::ffff:127.0.0.1.
        listening = {
            c.laddr.ip.removeprefix("::ffff:")
            for c in jvm.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
        assert listening == {"127.0.0.1"}, listening
        assert server.running() == url

        # A client in another process runs a query; its Python workers are this project's interpreter.
        got = json.loads(python(QUERY.replace("sys.argv[1]", repr(url)), env))
        assert got == {"sum": 45, "exe": [sys.executable], "tz": "UTC"}, got
        # The JVM's temporary files (Spark's artifacts directory among them) stay in the server's directory.
        assert any(p.name.startswith("artifacts-") for p in server.tmp_dir.iterdir()), list(server.tmp_dir.iterdir())

        # A second start reuses the running server (same JVM), whatever it is asked for.
        t0 = time.monotonic()
        assert EmbeddedSpark(home / "spark").start(master="local[1]") == url
        assert time.monotonic() - t0 < 10
        assert json.loads(server.pid_file.read_text())["pid"] == info["pid"]
        p = wire(["spark", "start"], env)
        assert (p.returncode, p.stdout.strip()) == (0, url), p.stderr
        p = wire(["spark", "status"], env)
        assert (p.returncode, p.stdout.strip()) == (0, url), p.stderr

        # Session resolution with only WIRE_HOME set: the embedded server; explicit settings win.
        targets = json.loads(python(TARGETS, env))
        assert targets == {
            "none": ["remote", url],
            "argument": ["master", "local[2]"],
            "master": ["master", "local[1]"],
            "remote": ["remote", "sc://127.0.0.1:1"],
        }, targets
        got = json.loads(python(GET_SPARK, env))
        assert got["module"].startswith("pyspark.sql.connect") and got["n"] == 5, got

        # Every client of the embedded server shares one session, so that each run's Python workers are
        # warm: the same id from two processes, and a stop() in one does not close it for the next. Once
        # the session is closed on the server (released by a client outside Wire), clients fall back to
        # sessions of their own.
        shared = shared_session_id(url, home)
        assert shared_session_id("sc://127.0.0.1:1", home) != shared
        runs = [json.loads(python(SHARED, env)) for _ in range(2)]
        assert runs == [{"session": shared, "n": 5}] * 2, runs

        # The clients of any other Spark Connect server (here this one, named by WIRE_SPARK_REMOTE from
        # another Wire home) share a session too: Spark keeps a session's Python daemon until the server
        # stops, so a session per run left one more process on the server for every run. Two runs: one
        # daemon more. Once the server closed it, the next client moves the home's generation on, and
        # the runs share the next session.
        other = dict(env, WIRE_HOME=str(tmp_path / "other-home"), WIRE_SPARK_REMOTE=url)
        theirs = shared_session_id(url, tmp_path / "other-home")
        assert theirs != shared
        daemons = python_daemons(jvm)
        runs = [json.loads(python(SHARED_PYTHON, other)) for _ in range(2)]
        assert runs == [{"session": theirs, "n": 5}] * 2, runs
        more = python_daemons(jvm) - daemons
        assert len(more) == 1, more
        python(RELEASE.replace("sys.argv[1]", repr(f"{url}/;session_id={theirs}")), other)
        runs = [json.loads(python(SHARED_PYTHON, other)) for _ in range(2)]
        following = shared_session_id(url, tmp_path / "other-home")
        assert following != theirs and runs == [{"session": following, "n": 5}] * 2, runs
        # A process that preloads the client starts the shared session's Python workers, one per core (the
        # server's local[2]), with the kernel's modules imported: Spark stops a worker idle for a minute, and
        # the run's first job would start them again. Spark reuses the workers for its next tasks.
        before = kernel_workers(jvm)
        python(PRELOAD, env)
        assert len(kernel_workers(jvm) - before) == 2, (before, kernel_workers(jvm))
        python(RELEASE.replace("sys.argv[1]", repr(f"{url}/;session_id={shared}")), env)
        own = json.loads(python(SHARED, env))
        assert own["n"] == 5 and own["session"] != shared, own

        # Stop: the whole process group goes, and the pid file with it.
        p = wire(["spark", "stop"], env, timeout=120)
        assert p.returncode == 0, p.stderr
        wait_until(lambda: group_gone(info["pgid"]), 30, f"the server's process group {info['pgid']} gone", every=0.1)
        assert not server.pid_file.exists()
        assert server.running() is None and servers_of(server.dir) == []
        p = wire(["spark", "status"], env)
        assert p.returncode == 1 and "not running" in p.stdout, (p.returncode, p.stdout, p.stderr)
        assert json.loads(python(TARGETS, env))["none"] == ["master", "local[*]"]
    finally:
        server.stop()


def test_a_shared_sessions_generation_moves_once_and_keeps_no_url_parameter(tmp_path: Path) -> None:
    """Clients that find the shared session of another server closed move the home's generation on
    once (the second finds it moved already and takes the same next id); the record of generations
    names the server by host and port only, never the URL's parameters (a token)."""
    from wire_dagster.sparkserver import renew_session_id

    url = "sc://10.0.0.9:15002/;token=SECRET-TOKEN;use_ssl=true"
    first = shared_session_id(url, tmp_path)
    assert shared_session_id("sc://10.0.0.9:15002", tmp_path) == first  # the same server
    nxt = renew_session_id(url, first, tmp_path)
    assert nxt is not None and nxt != first and renew_session_id(url, first, tmp_path) == nxt
    assert shared_session_id(url, tmp_path) == nxt != shared_session_id(url, tmp_path / "elsewhere")
    saved = (tmp_path / "spark" / "remote-sessions.json").read_text()
    assert json.loads(saved) == {"10.0.0.9:15002": 1} and "SECRET" not in saved


def test_failed_starts_say_why_and_leave_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = base_env(home)
    sdir = home / "spark"

    def nothing_left() -> None:
        assert not (sdir / "spark.pid").exists()
        assert servers_of(sdir) == []

    # The JVM starts and exits at once (a local master with no threads): the cause and the log, one line.
    t0 = time.monotonic()
    p = wire(["spark", "start", "--master", "local[0]", "--conf", JAVA_OPTS], env)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Asked to run locally with 0 threads" in p.stderr and str(sdir / "spark.log") in p.stderr, p.stderr
    assert time.monotonic() - t0 < 120
    nothing_left()

    # Bad input: nothing is launched, exit 2 with one line.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = wire(["spark", "start", "--port", str(port)], env)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "already in use" in p.stderr, p.stderr
    p = wire(["spark", "start", "--master", "nowhere"], env)
    assert p.returncode == 2 and "--master" in p.stderr, p.stderr
    no_java = {k: v for k, v in env.items() if k != "JAVA_HOME"}
    no_java["PATH"] = str(Path(sys.executable).parent)
    p = wire(["spark", "start"], no_java)
    assert p.returncode == 2 and "Java 17 is missing" in p.stderr, p.stderr
    nothing_left()
    p = wire(["spark", "status"], env)
    assert p.returncode == 1, p.stdout
