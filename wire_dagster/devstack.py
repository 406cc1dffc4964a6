"""`wire dev`: the embedded S3 server, the embedded Spark Connect server and `dagster dev`,
all stopped on Ctrl-C.

Process management only: Dagster runs in its own process (started by its CLI),
so the core never imports it. Everything started here is stopped by its
process group, never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from .embedded import EmbeddedS3, default_home
from .errors import WireInputError
from .sparkserver import EmbeddedSpark

PROJECT = Path(__file__).resolve().parent.parent

INSTANCE_YAML = """\
# Written by Wire: a project-local Dagster instance (SQLite storage under this directory).
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1  # Dagster's default 5 s adds ~1.5 s to every run's latency
concurrency:
  runs:
    tag_concurrency_limits:
      - key: wire/pipeline
        value:
          applyLimitPerUniqueValue: true
        limit: 1
  pools:
    default_limit: 1
# A run whose worker died (kill -9, OOM) is marked failed within seconds, its pool slot is
# freed and it is retried: safe, since nothing becomes visible before its commit marker.
# Without this a killed run keeps the pipeline's only slot and nothing runs again
# (benchmarks/recovery.py measured both). Failures of the assets themselves are not retried.
run_monitoring:
  enabled: true
  poll_interval_seconds: 5
  free_slots_after_run_end_seconds: 1
  max_resume_run_attempts: 0
run_retries:
  enabled: true
  max_retries: 2
  retry_on_asset_or_op_failure: false
telemetry:
  enabled: false
"""


# Dagster's SQLite event log with each database's connection kept open (resources/instance.py):
# 1.2 instead of 6 ms per event, and a range run logs two per partition and asset. Same files
# and schema as Dagster's default, in the same place (given absolutely: a storage class of the
# instance config is not told the instance's directory).
EVENT_LOG_YAML = """\
event_log_storage:
  module: resources.instance
  class: WireSqliteEventLogStorage
  config:
    base_dir: {base_dir}
"""


def instance_yaml(home: Path, storage: dict | None = None) -> str:
    """The dagster.yaml of a project-local instance in directory `home`: SQLite storage under it,
    or, given `storage` (the mapping of a dagster.yaml `storage:` section, e.g. docker/dagster.yaml's
    PostgreSQL one, whose `env:` references Dagster resolves when it loads the instance), that
    storage with the rest of the same instance config."""
    if storage is not None:
        header = "# Written by Wire: a project-local Dagster instance with the storage below.\n"
        return header + INSTANCE_YAML.partition("\n")[2] + yaml.safe_dump({"storage": storage}, sort_keys=False)
    return INSTANCE_YAML + EVENT_LOG_YAML.format(base_dir=json.dumps(str(Path(home).resolve() / "history" / "runs")))


def dagster_home() -> Path:
    """DAGSTER_HOME, else `<WIRE_HOME>/dagster` (not created)."""
    return Path(os.environ.get("DAGSTER_HOME") or default_home() / "dagster").resolve()


def ensure_dagster_home(path: Path | None = None, storage: dict | None = None) -> Path:
    """DAGSTER_HOME (or `path`, else `<WIRE_HOME>/dagster`), created with Wire's instance config
    (`storage`: see instance_yaml)."""
    d = Path(path).resolve() if path else dagster_home()
    d.mkdir(parents=True, exist_ok=True)
    cfg = d / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text(instance_yaml(d, storage))
    os.environ["DAGSTER_HOME"] = str(d)
    return d


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process group, then SIGKILL it after `grace` seconds."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    return
            time.sleep(0.2)


#: The environment `dagster dev` gets from `wire dev` (and the tests' stacks): Dagster's freshness
#: daemon evaluates the assets' freshness policies every 5 s instead of 30 s, so a window's status
#: in the UI follows its partitions as closely as the sensors do.
DEV_ENV = {"FRESHNESS_DAEMON_INTERVAL_SECONDS": "5"}

#: Dagster's services log at this level under `wire dev` (WIRE_DEV_LOG_LEVEL overrides): at INFO the
#: daemon writes two lines per sensor every 5 s, which buries what Wire prints. Runs, ticks and
#: their logs stay in the UI whatever the level.
DEV_LOG_LEVEL = "warning"


def dagster_dev_command(port: int, host: str = "127.0.0.1", log_level: str | None = None) -> list[str]:
    ws = PROJECT / "workspace.yaml"
    if not ws.is_file():
        raise WireInputError(f"workspace.yaml not found beside the package ({ws}); run wire dev from a source checkout")
    exe = Path(sys.executable).parent / "dagster"
    return [str(exe), "dev", "-w", str(ws), "-h", host, "-p", str(port)] + (
        ["--log-level", log_level] if log_level else []
    )


def _wait_for_ui(proc: subprocess.Popen, port: int, timeout_s: float = 300.0) -> bool:
    """Whether Dagster's webserver answers on `port` before `proc` exits or `timeout_s` passes."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return False


class _Stop(Exception):
    """SIGTERM or SIGHUP reached `wire dev`: shut down as on Ctrl-C."""


def _raise_stop(signum, _frame) -> None:
    raise _Stop(signal.Signals(signum).name)


def run_dev(port: int = 3000, pipelines: Path | None = None) -> int:
    """Run the embedded S3 server (unless WIRE_S3_ENDPOINT names one), the embedded Spark Connect
    server (unless WIRE_SPARK_REMOTE or WIRE_SPARK_MASTER says where Spark is) and `dagster dev`
    until Ctrl-C (or SIGTERM / SIGHUP), then stop them in that reverse order: dagster dev by its
    process group, each server by its own. dagster dev gets WIRE_SPARK_REMOTE=<the server's URL>,
    so every run attaches to it instead of booting a Spark JVM; the server starts while dagster
    dev loads its code location, and `wire dev` fails (stopping everything) if it does not come up.

    An embedded server that was already running when `wire dev` started is someone else's: it is
    reused and left running. Returns 0 after a requested stop, else dagster dev's exit code.
    """
    from .embedded import resolve_s3

    server: EmbeddedS3 | None = None
    if not os.environ.get("WIRE_S3_ENDPOINT"):
        candidate = EmbeddedS3(default_home() / "s3")
        if candidate.config is None:
            server = candidate  # ours to stop, even if Ctrl-C comes while it starts
    spark: EmbeddedSpark | None = None  # the embedded Spark server the runs attach to, if any
    spark_ours = False
    spark_at = os.environ.get("WIRE_SPARK_REMOTE", "").strip() or os.environ.get("WIRE_SPARK_MASTER", "").strip()
    if not spark_at:
        spark = EmbeddedSpark(default_home() / "spark")
        spark_ours = spark.recorded() is None  # nothing running or starting there: ours to stop
    proc: subprocess.Popen | None = None
    handlers = {signal.SIGINT: signal.getsignal(signal.SIGINT)}
    handlers.update({sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGHUP)})
    try:
        cfg = resolve_s3()
        home = ensure_dagster_home()
        env = dict(os.environ)
        env.update(cfg.export_env())
        env["DAGSTER_HOME"] = str(home)
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        for k, v in DEV_ENV.items():
            env.setdefault(k, v)
        if pipelines is not None:
            env["WIRE_PIPELINES"] = str(Path(pipelines).resolve())
        if spark is not None:
            spark_at = env["WIRE_SPARK_REMOTE"] = spark.start(wait=False)  # the running one, or launched now
        # Its own session: a terminal's Ctrl-C reaches only `wire dev`, which stops the group in order.
        level = os.environ.get("WIRE_DEV_LOG_LEVEL", "").strip().lower() or DEV_LOG_LEVEL
        cmd = dagster_dev_command(port, log_level=level)
        proc = subprocess.Popen(cmd, cwd=str(PROJECT), env=env, start_new_session=True)
        if spark is not None:
            spark.wait_ready()  # while dagster dev loads its code location
        # Printed once the UI answers, so it is the last thing on the screen rather than above
        # Dagster's start-up lines.
        up = _wait_for_ui(proc, port)
        print(
            "\nWire is up" + ("" if up else " (the Dagster UI did not answer yet)") + "\n"
            f"  Dagster UI  http://127.0.0.1:{port}  (DAGSTER_HOME={home})\n"
            f"  S3          {cfg.endpoint}  (bucket {cfg.bucket})\n"
            f"  Spark       {spark_at}\n"
            f"  Dagster logs at {level} (WIRE_DEV_LOG_LEVEL=info for more); Ctrl-C stops them\n",
            flush=True,
        )
        code = proc.wait()
        print(f"dagster dev exited with code {code}; stopping", file=sys.stderr, flush=True)
        return code
    except (KeyboardInterrupt, _Stop):
        return 0
    finally:
        # A second Ctrl-C (or SIGTERM) must not cut the shutdown short and leave processes behind.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        # Every stop runs even if one before it fails: dagster dev, then Spark, then S3, then the handlers.
        with contextlib.ExitStack() as stops:
            for sig, h in handlers.items():
                stops.callback(signal.signal, sig, h)
            if server is not None:
                stops.callback(server.stop)
            if spark is not None and spark_ours:
                stops.callback(spark.stop)
            if proc is not None:
                stops.callback(stop_group, proc)
