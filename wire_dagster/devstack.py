"""`wire dev`: the embedded S3 server plus `dagster dev`, both stopped on Ctrl-C.

Process management only: Dagster runs in its own process (started by its CLI),
so the core never imports it. Everything started here is stopped by its
process group, never by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .embedded import EmbeddedS3, default_home
from .errors import WireInputError

PROJECT = Path(__file__).resolve().parent.parent

INSTANCE_YAML = """\
# Written by Wire: a project-local Dagster instance (SQLite storage under this directory).
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
concurrency:
  runs:
    tag_concurrency_limits:
      - key: wire/pipeline
        value:
          applyLimitPerUniqueValue: true
        limit: 1
  pools:
    default_limit: 1
telemetry:
  enabled: false
"""


def ensure_dagster_home(path: Path | None = None) -> Path:
    """DAGSTER_HOME (or `path`, else `<WIRE_HOME>/dagster`), created with Wire's instance config."""
    d = Path(path or os.environ.get("DAGSTER_HOME") or default_home() / "dagster").resolve()
    d.mkdir(parents=True, exist_ok=True)
    cfg = d / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text(INSTANCE_YAML)
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


def dagster_dev_command(port: int, host: str = "127.0.0.1") -> list[str]:
    ws = PROJECT / "workspace.yaml"
    if not ws.is_file():
        raise WireInputError(f"workspace.yaml not found beside the package ({ws}); run wire dev from a source checkout")
    exe = Path(sys.executable).parent / "dagster"
    return [str(exe), "dev", "-w", str(ws), "-h", host, "-p", str(port)]


def run_dev(port: int = 3000, pipelines: Path | None = None) -> int:
    from .embedded import resolve_s3

    started: EmbeddedS3 | None = None
    if not os.environ.get("WIRE_S3_ENDPOINT"):
        started = EmbeddedS3(default_home() / "s3")
    cfg = resolve_s3()
    home = ensure_dagster_home()
    env = dict(os.environ)
    env.update(cfg.export_env())
    env["DAGSTER_HOME"] = str(home)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    if pipelines is not None:
        env["WIRE_PIPELINES"] = str(Path(pipelines).resolve())
    proc = subprocess.Popen(dagster_dev_command(port), cwd=str(PROJECT), env=env, start_new_session=True)
    print(f"embedded S3 at {cfg.endpoint}; Dagster UI at http://127.0.0.1:{port} (DAGSTER_HOME={home}); Ctrl-C stops both", flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop_group(proc)
        if started is not None:
            started.stop()
