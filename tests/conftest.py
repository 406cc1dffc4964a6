"""Shared fixtures: one real embedded S3 server (SeaweedFS) per test session, a fresh bucket per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace

import pytest

from wire_dagster.embedded import EmbeddedS3
from wire_dagster.objectstore import ObjectStore, S3Config


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Config]:
    """The S3Config of one embedded server started for the whole session (stopped by process group at the end)."""
    server = EmbeddedS3(tmp_path_factory.mktemp("s3server"))
    cfg = server.start()
    try:
        yield cfg
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server: S3Config, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """WIRE_S3_* for a fresh, empty bucket on the session server, also set in os.environ."""
    cfg = replace(s3_server, bucket="t-" + uuid.uuid4().hex[:10])
    env = cfg.export_env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def store(s3_env: dict[str, str]) -> ObjectStore:
    """An ObjectStore on this test's fresh bucket (the bucket exists)."""
    cfg = S3Config.from_env(s3_env)
    assert cfg is not None
    st = ObjectStore(cfg)
    st.ensure_bucket()
    return st


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the test session: local[2], UI off, few shuffle partitions."""
    from wire_dagster.sparksession import get_spark

    s = get_spark(master="local[2]", cores=2)
    yield s
    s.stop()


@pytest.fixture
def cli_env(s3_env: dict[str, str], tmp_path) -> dict[str, str]:
    """Environment for `wire` subprocesses: this test's bucket, the project's pipelines, a private WIRE_HOME."""
    import os
    import sys
    from pathlib import Path

    env = dict(os.environ)
    env.update(s3_env)
    env["WIRE_HOME"] = str(tmp_path / "wire-home")
    env.setdefault("WIRE_PIPELINES", str(Path(__file__).resolve().parent.parent / "pipelines"))
    env["PYSPARK_PYTHON"] = sys.executable
    return env


def run_wire(args: list[str], env: dict[str, str], timeout: float = 300, check: bool = False):
    """Run the installed `wire` command; returns CompletedProcess (text)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("wire", path=str(Path(sys.executable).parent)) or "wire"
    p = subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"wire {' '.join(args)} exited {p.returncode}: {p.stderr[-2000:]}")
    return p
