"""`wire dev`: the embedded S3 server, the embedded Spark Connect server and `dagster dev`, all
stopped by one Ctrl-C.

`wire dev` runs in a session of its own (as in a terminal) with a private WIRE_HOME and
DAGSTER_HOME and a free webserver port, and neither WIRE_SPARK_REMOTE nor WIRE_SPARK_MASTER (so
it starts the embedded Spark server and hands its URL to dagster dev). Once the webserver answers
with the code location loaded, the embedded S3 server answers an authenticated request and the
Spark server accepts connections, the test records every process involved: `wire dev` and its
descendants, every member of dagster dev's process group (webserver, daemon, code servers) and
of each server's group (their pid files under WIRE_HOME). Then SIGINT goes to `wire dev`'s
process group, as a terminal's Ctrl-C does: `wire dev` must exit 0 within a bound, and every one
of those processes must be gone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from wire_dagster.procgroup import free_port, wait_until

START_TIMEOUT = 240  # dagster dev loads the code location in three Python processes on a loaded machine
STOP_TIMEOUT = 90  # wire dev: SIGTERM to dagster dev's group (20 s grace, then SIGKILL), then the Spark and S3 servers
#: Cheaper JIT and GC for the short-lived Spark server of a test already running before `wire dev`.
JAVA_OPTS = "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

PIPELINE = {
    "name": "devp",
    "stream": "devp",
    "event": {"key": "user", "time": "ts"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-01T01:00:00Z",
    "windows": [{"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"n": "count"}}],
    "dagster": {"sensor_interval": "30s"},
}


def wire_exe() -> str:
    return shutil.which("wire", path=str(Path(sys.executable).parent)) or "wire"


def location_loaded(port: int) -> bool:
    """The webserver answers GraphQL and its code location is loaded (so the code servers run)."""
    q = (
        b'{"query": "{ workspaceOrError { ... on Workspace { locationEntries { loadStatus '
        b'locationOrLoadError { __typename } } } } }"}'
    )
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=q, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            d = json.loads(r.read())
    except (OSError, ValueError):
        return False
    entries = ((d.get("data") or {}).get("workspaceOrError") or {}).get("locationEntries") or []
    return bool(entries) and all(
        e["loadStatus"] == "LOADED" and e["locationOrLoadError"]["__typename"] == "RepositoryLocation" for e in entries
    )


def group_members(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def running(p: psutil.Process) -> bool:
    """The very process recorded (same pid and start time) still runs (a zombie does not)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def cmdline(p: psutil.Process) -> list[str]:
    """The process's arguments; none for one that ended since it was listed (a short-lived child)."""
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def tree(proc: subprocess.Popen) -> list[psutil.Process]:
    """`wire dev`, its descendants, and every member of their process groups (what it started)."""
    try:
        wire = psutil.Process(proc.pid)
        procs = [wire, *wire.children(recursive=True)]
    except psutil.Error:
        return []
    groups = set()
    for p in procs:
        try:
            groups.add(os.getpgid(p.pid))
        except ProcessLookupError:
            continue
    return procs + [m for g in groups for m in group_members(g)]


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm", "ctrl-c, servers already running"])
def test_ctrl_c_stops_dagster_dev_and_the_embedded_servers(tmp_path: Path, how: str) -> None:
    """`ctrl-c`: SIGINT to wire dev's process group, as a terminal sends it; `sigterm`: SIGTERM to
    wire dev alone, as `kill` or a process supervisor sends it. Both must stop everything. With the
    embedded S3 and Spark servers already running (`wire s3 start`, `wire spark start`) before
    `wire dev`, wire dev uses them and leaves them running: it stops what it started."""
    from wire_dagster.embedded import EmbeddedS3
    from wire_dagster.sparkserver import EmbeddedSpark

    home = tmp_path / "wire-home"
    pdir = tmp_path / "pipelines"
    pdir.mkdir()
    (pdir / "devp.yaml").write_text(yaml.safe_dump(PIPELINE))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WIRE_", "AWS_", "SPARK_", "DAGSTER_"))}
    env.update(
        WIRE_HOME=str(home),
        DAGSTER_HOME=str(tmp_path / "dagster-home"),
        WIRE_PIPELINES=str(pdir),
        WIRE_SPARK_DRIVER_MEMORY="512m",
        PYSPARK_PYTHON=sys.executable,
    )
    shared = how.endswith("already running")
    if shared:
        p = subprocess.run(
            [wire_exe(), "s3", "start"], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert p.returncode == 0, p.stderr
        p = subprocess.run(
            [wire_exe(), "spark", "start", "--conf", JAVA_OPTS],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert p.returncode == 0, p.stderr
    port = free_port()
    log = tmp_path / "wire-dev.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [wire_exe(), "dev", "--port", str(port)],
            env=env,
            cwd=str(tmp_path),
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    recorded: dict[int, psutil.Process] = {}
    s3 = EmbeddedS3(home / "s3")
    spark = EmbeddedSpark(home / "spark")

    def dead() -> str | None:
        if proc.poll() is not None:
            return f"wire dev exited {proc.returncode}:\n{log.read_text(errors='replace')[-4000:]}"
        return None

    try:
        wait_until(
            lambda: location_loaded(port),
            START_TIMEOUT,
            "the Dagster webserver with its code location",
            dead,
            every=1.0,
        )
        wait_until(s3.running, 60, "the embedded S3 server answers", dead)
        url = wait_until(spark.running, START_TIMEOUT, "the embedded Spark server accepts connections", dead)
        # wire dev is up once it says so (after its probe query of the Spark server, a child of its own, ended).
        wait_until(
            lambda: "Ctrl-C stops them" in log.read_text(errors="replace"), START_TIMEOUT, "wire dev's ready line", dead
        )
        info = json.loads((home / "s3" / "weed.pid").read_text())
        spark_info = json.loads((home / "spark" / "spark.pid").read_text())

        wire = psutil.Process(proc.pid)
        dagster_dev = [
            c
            for c in wire.children()
            if any(Path(a).name == "dagster" for a in c.cmdline()[:2]) and "dev" in c.cmdline()
        ]
        assert len(dagster_dev) == 1, [c.cmdline() for c in wire.children()]
        assert dagster_dev[0].environ().get("WIRE_SPARK_REMOTE") == url  # every run attaches to the server
        # Dagster's daemon at WARNING: no two INFO lines per sensor every 5 s burying Wire's banner;
        # the freshness daemon evaluates every 5 s, not 30.
        cmd = dagster_dev[0].cmdline()
        assert cmd[cmd.index("--log-level") + 1] == "warning", cmd
        assert dagster_dev[0].environ().get("FRESHNESS_DAEMON_INTERVAL_SECONDS") == "5"
        banner = log.read_text(errors="replace").rsplit("Wire is up", 1)
        assert len(banner) == 2 and f"http://127.0.0.1:{port}" in banner[1], banner[-1][-2000:]
        assert "Checking for new runs for sensor" not in log.read_text(errors="replace")
        procs = tree(
            proc
        )  # wire dev and its descendants and their groups: dagster dev's (webserver, daemon, code servers)
        s3_procs = group_members(int(info["pgid"]))  # the S3 server's group, named by its pid file
        assert int(info["pid"]) in {p.pid for p in s3_procs}
        spark_procs = group_members(int(spark_info["pgid"]))  # the Spark server's group (the JVM, its Python workers)
        assert int(spark_info["pid"]) in {p.pid for p in spark_procs}
        if not shared:
            procs += s3_procs + spark_procs
        recorded.update({p.pid: p for p in procs})
        names = " ".join(" ".join(cmdline(p)) for p in recorded.values())
        for part in ("dagster_webserver", "dagster._daemon", *(() if shared else ("weed", "SparkConnectServer"))):
            assert part in names, f"{part} not among the recorded processes: {names[:2000]}"

        if how == "ctrl-c":  # Ctrl-C in the terminal: SIGINT to the foreground process group, wire dev's
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"wire dev still running {STOP_TIMEOUT}s after {how}:\n{log.read_text(errors='replace')[-4000:]}"
            )
        assert rc == 0, log.read_text(errors="replace")[-4000:]
        # Everything it started is stopped before it exits; allow a few seconds for the kernel's bookkeeping.
        deadline = time.monotonic() + 10
        while (left := [p for p in recorded.values() if running(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, [(p.pid, cmdline(p)) for p in left if running(p)]
        if shared:
            assert all(running(p) for p in s3_procs) and s3.running(), "wire dev stopped an S3 server it did not start"
            assert running(psutil.Process(int(spark_info["pid"]))) and spark.running() == url, (
                "wire dev stopped a Spark server it did not start"
            )
        else:
            assert not (home / "s3" / "weed.pid").exists(), "the S3 server's pid file outlived it"
            assert s3.config is None
            assert not (home / "spark" / "spark.pid").exists(), "the Spark server's pid file outlived it"
            assert spark.running() is None and not group_members(int(spark_info["pgid"]))
        out = log.read_text(errors="replace")
        assert "Traceback" not in out, out[-4000:]
    finally:
        # Whatever happened above, stop everything this test started, by process group.
        for p in tree(proc):
            recorded.setdefault(p.pid, p)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        for p in recorded.values():
            if running(p):
                try:
                    os.killpg(os.getpgid(p.pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        subprocess.run([wire_exe(), "spark", "stop"], env=env, capture_output=True, timeout=120, check=False)
        subprocess.run([wire_exe(), "s3", "stop"], env=env, capture_output=True, timeout=120, check=False)
