"""The embedded SeaweedFS server: credentials, ports, reuse, outage and restart, clean stop (a second server)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dagster_stack import group_gone
from wire_dagster.embedded import EmbeddedS3, default_home, resolve_s3
from wire_dagster.errors import ObjectStoreError
from wire_dagster.objectstore import ObjectStore, S3Config
from wire_dagster.procgroup import wait_until


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A Wire home whose embedded server (home/s3) is stopped at the end of the module."""
    path = tmp_path_factory.mktemp("home")
    yield path
    EmbeddedS3(path / "s3").stop()


@pytest.fixture
def server(home: Path) -> EmbeddedS3:
    srv = EmbeddedS3(home / "s3")
    srv.start()  # starts, or reuses the module's running server
    return srv


def _pid_info(srv: EmbeddedS3) -> dict:
    return json.loads(srv.pid_file.read_text())


def test_credentials_file_is_private_and_stable(server: EmbeddedS3) -> None:
    mode = stat.S_IMODE(server.cred_file.stat().st_mode)
    assert mode == 0o600
    first = server.credentials()
    assert first == EmbeddedS3(server.dir).credentials()
    cfg = server.config
    assert cfg is not None and (cfg.access_key, cfg.secret_key) == first
    assert len(cfg.secret_key) >= 30


def test_listens_only_on_loopback(server: EmbeddedS3) -> None:
    info = _pid_info(server)
    proc = psutil.Process(info["pid"])
    listening = [c.laddr for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening, "no listening sockets found"
    assert {a.ip for a in listening} == {"127.0.0.1"}
    expected = {p for http in info["ports"].values() for p in (http, http + 10000)}
    assert {a.port for a in listening} <= expected
    assert info["endpoint"] == f"http://127.0.0.1:{info['ports']['s3']}"


def test_s3_requires_signature(server: EmbeddedS3) -> None:
    cfg = server.config
    assert cfg is not None
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(f"{cfg.endpoint}/{cfg.bucket}?list-type=2", timeout=5)
    assert ei.value.code == 403


def test_start_twice_reuses_the_process(server: EmbeddedS3) -> None:
    pid = _pid_info(server)["pid"]
    t0 = time.monotonic()
    again = EmbeddedS3(server.dir).start()  # as a second process would: via the pid file
    assert time.monotonic() - t0 < 5
    assert _pid_info(server)["pid"] == pid
    assert again == server.config
    assert server.running()


def wait_group_gone(pgid: int) -> None:
    """`stop` returns when only zombies are left in the group; one whose parent died (a child of
    weed, or the server after its `start` process) waits for init to reap it. On a loaded 2-core
    machine that took over 10 s once (CI at cf0cfc4, beside another test run), so allow 30 s; a
    live member (not a zombie) fails at once, named with its state."""

    def live_members() -> str | None:
        left = []
        for proc in psutil.process_iter(["pid", "status", "name"]):
            with contextlib.suppress(psutil.Error):
                if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    left.append(f"{proc.info['name']} (pid {proc.pid}, {proc.info['status']})")
        return f"still running after stop: {', '.join(left)}" if left else None

    wait_until(lambda: group_gone(pgid), 30, f"process group {pgid} gone", alive=live_members, every=0.1)


def test_outage_then_restart_keeps_data(server: EmbeddedS3) -> None:
    cfg = server.config
    assert cfg is not None
    ObjectStore(cfg).put("outage/k", b"survives")
    pgid = _pid_info(server)["pgid"]

    t0 = time.monotonic()
    server.stop()
    stop_s = time.monotonic() - t0
    wait_group_gone(pgid)  # nothing left in its process group
    assert not server.pid_file.exists()
    assert server.config is None and not server.running()

    down = ObjectStore(cfg, retry_budget=1.5)
    t0 = time.monotonic()
    with pytest.raises(ObjectStoreError) as ei:
        down.get("outage/k")
    assert time.monotonic() - t0 < 4
    assert "outage/k" in str(ei.value) and cfg.secret_key not in str(ei.value)

    t0 = time.monotonic()
    again = server.start()
    start_s = time.monotonic() - t0
    assert again == cfg  # same ports, same credentials: the endpoint is stable
    assert down.get("outage/k") == b"survives"  # the same client works again
    print(f"weed mini: stop {stop_s:.1f}s, restart {start_s:.1f}s")


def test_crash_then_restart_keeps_data(server: EmbeddedS3) -> None:
    cfg = server.config
    assert cfg is not None
    ObjectStore(cfg).put("crash/k", b"acknowledged")
    os.killpg(_pid_info(server)["pgid"], signal.SIGKILL)  # our own server's group, as a crash would
    again = server.start()  # the pid file is stale now: a fresh process on the same ports
    assert again == cfg
    assert ObjectStore(cfg, retry_budget=0).get("crash/k") == b"acknowledged"  # readable at once


def test_a_server_that_does_not_stop_is_killed_soon_and_keeps_data(server: EmbeddedS3) -> None:
    """weed's graceful stop now and then waits on a connection indefinitely: SIGKILL comes
    STOP_GRACE_S after SIGTERM (not 15 s: `wire s3 stop`, the end of `make demo`), and nothing
    acknowledged is lost. Here the server cannot stop at all (SIGSTOP: SIGTERM stays pending)."""
    from wire_dagster.embedded import STOP_GRACE_S

    cfg = server.config
    assert cfg is not None
    ObjectStore(cfg).put("hung/k", b"acknowledged")
    pgid = _pid_info(server)["pgid"]
    os.killpg(pgid, signal.SIGSTOP)
    t0 = time.monotonic()
    server.stop()
    took = time.monotonic() - t0  # stop() returned: nothing of the group runs (a zombie may wait for its reaper)
    assert f"still running {STOP_GRACE_S:.0f}s after SIGTERM: SIGKILL" in server.log_file.read_text()
    assert took < 12, f"the stop took {took:.1f} s"  # 15 s and more with the old grace
    assert server.start() == cfg
    assert ObjectStore(cfg, retry_budget=0).get("hung/k") == b"acknowledged"


def test_stale_pid_file_is_ignored(server: EmbeddedS3) -> None:
    cfg = server.config
    assert cfg is not None
    ObjectStore(cfg).put("stale/k", b"survives")
    server.stop()
    server.pid_file.write_text(json.dumps({"pid": 999_999_0, "pgid": 999_999_0, "endpoint": "http://127.0.0.1:1"}))
    assert server.config is None
    assert server.start() == cfg
    assert ObjectStore(cfg, retry_budget=0).get("stale/k") == b"survives"  # readable at once
    assert _pid_info(server)["pid"] != 999_999_0


def test_resolve_s3(server: EmbeddedS3, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("WIRE_S3_ENDPOINT", "WIRE_S3_ACCESS_KEY", "WIRE_S3_SECRET_KEY", "WIRE_S3_BUCKET", "WIRE_S3_REGION"):
        monkeypatch.delenv(name, raising=False)
    cfg = resolve_s3(home)  # reuses the running server under home/s3
    assert cfg == server.config
    assert os.environ["WIRE_S3_ENDPOINT"] == cfg.endpoint  # exported for child processes
    assert S3Config.from_env() == cfg
    assert resolve_s3(home / "elsewhere") == cfg  # WIRE_S3_ENDPOINT now wins
    monkeypatch.delenv("WIRE_S3_ENDPOINT")
    with pytest.raises(ObjectStoreError, match="not running"):
        resolve_s3(home / "elsewhere", start=False)


def test_default_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WIRE_HOME", str(tmp_path / "h"))
    assert default_home() == tmp_path / "h"
    monkeypatch.delenv("WIRE_HOME")
    assert default_home().name == ".wire"


def test_cli_start_status_stop(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WIRE_S3_")}
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "wire_dagster.embedded", *a, "--home", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    srv = EmbeddedS3(tmp_path / "s3")
    try:
        started = run("start")
        assert started.returncode == 0, started.stderr
        cfg = srv.config
        assert cfg is not None and cfg.endpoint in started.stdout
        assert cfg.secret_key not in started.stdout + started.stderr
        pgid = _pid_info(srv)["pgid"]
        status = run("status")
        assert status.returncode == 0 and cfg.endpoint in status.stdout
        stopped = run("stop")
        assert stopped.returncode == 0, stopped.stderr
        wait_group_gone(pgid)
        assert run("status").returncode == 1
    finally:
        srv.stop()
