"""Shared fixtures: one real embedded S3 server (SeaweedFS) per test session, a fresh bucket per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

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


# ---------------------------------------------------------------------------
# The end-to-end Dagster stack (tests/dagster_stack.py), shared by test_e2e_dagster.py and
# test_browser.py. Appended for the Dagster-layer tests: the tests using it run next to each
# other, and the stack (dagster dev + a Spark Connect server) is stopped right after the last
# of them, so it never runs alongside the rest of the suite.


@pytest.fixture(scope="session")
def dagster_stack(s3_server: S3Config, spark_remote, tmp_path_factory: pytest.TempPathFactory):
    import dagster_stack as ds

    # The runs attach to the session's Spark Connect server (or, without one, to a server of the stack's own).
    stack = ds.start(s3_server, tmp_path_factory.mktemp("dagster-e2e"), remote=spark_remote)
    ds._RUNNING.append(stack)
    try:
        yield stack
    finally:
        ds.stop_running()


def _uses_stack(item) -> bool:
    return item is not None and "dagster_stack" in getattr(item, "fixturenames", ())


def _unit(item) -> str:
    """The unit of work `item` runs in under pytest-xdist: the stack's users are one, so one worker
    starts the stack and stops it after them; every other module is one, so its module-scoped
    fixtures (a Spark cluster, a server) are set up once."""
    return "dagster_stack" if _uses_stack(item) else item.nodeid.split("::")[0]


#: Seconds each test took (setup and teardown included) in a measured run of the suite: written by
#: `make test-durations` (tests/durations.py); a test it does not know counts as UNKNOWN_SECONDS.
DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_SECONDS = 10.0


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    """Each unit's tests together in their order, the units longest first (by DURATIONS).

    `make test` runs `-n 2 --dist loadgroup --no-loadscope-reorder`: the workers take the units in
    this order, each its next when it runs short, so starting with the longest (LPT scheduling)
    keeps them from ending apart by a long unit (xdist's own order, by number of tests, ended
    them minutes apart). (tryfirst: before xdist's own hook reads the groups.)"""
    import json

    known = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    seconds: dict[str, float] = {}
    first: dict[str, int] = {}
    for n, item in enumerate(items):
        unit = _unit(item)
        seconds[unit] = seconds.get(unit, 0.0) + known.get(item.nodeid, UNKNOWN_SECONDS)
        first.setdefault(unit, n)
    at = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda i: (-seconds[_unit(i)], first[_unit(i)], at[id(i)]))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_unit(item)))


def pytest_runtest_teardown(item, nextitem) -> None:
    if _uses_stack(item) and not _uses_stack(nextitem):
        import dagster_stack as ds

        ds.stop_running()


# ---------------------------------------------------------------------------
# One Spark Connect server for the `wire` subprocesses of the commit-protocol tests
# (test_crash_matrix.py, test_races.py, test_recovery.py). Appended for them: a
# subprocess attaches in ~0.5 s instead of booting its own JVM (4-8 s each).


#: The test server's settings over wire_dagster.sparkserver's defaults. Tiny epochs: without AQE
#: and with one shuffle partition an epoch runs ~28 Spark jobs instead of ~70. C1 only and the
#: serial GC: a short-lived test server spends far less CPU compiling and collecting.
TEST_SPARK_CONF = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "2",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


@pytest.fixture(scope="session")
def spark_remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """`sc://127.0.0.1:<port>` of a Spark Connect server (wire_dagster.sparkserver.EmbeddedSpark:
    local[2], 1 GB driver, TEST_SPARK_CONF; ready once a client in another process ran a query),
    or None when it cannot start (or WIRE_TEST_SPARK_CONNECT=0): subprocesses then boot local
    Spark each. Stopped by its process group at the end of the session."""
    import os
    import warnings

    from wire_dagster.errors import WireError
    from wire_dagster.sparkserver import EmbeddedSpark

    if os.environ.get("WIRE_TEST_SPARK_CONNECT", "1") == "0":
        yield None
        return
    server = EmbeddedSpark(tmp_path_factory.mktemp("spark-connect"))
    try:
        try:
            url = server.start(master="local[2]", driver_memory="1g", conf=TEST_SPARK_CONF)
        except WireError as exc:
            warnings.warn(f"Spark Connect server did not start ({exc}); subprocesses boot local Spark", stacklevel=1)
            yield None
        else:
            yield url
    finally:
        server.stop()
