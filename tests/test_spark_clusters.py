"""The kernel, unchanged, on a Spark standalone cluster and through Spark Connect (DESIGN §5).

One small pipeline (tumbling, sliding and session windows; an id field with
retried appends) is produced once to the embedded S3 server and processed
three times, each time by `engine.process` into its own checkpoints:

    local[2]    in this process (the session-wide `spark` fixture)
    standalone  a driver subprocess with WIRE_SPARK_MASTER=spark://127.0.0.1:P
                (master + 2 workers started here from pyspark's jars; the
                executors are separate JVMs with their own Python workers, and
                read the chunks from S3 themselves)
    connect     a driver subprocess with WIRE_SPARK_REMOTE=sc://127.0.0.1:P
                (the session's Spark Connect server, conftest `spark_remote`:
                local[2], no AQE, one shuffle partition; or, if that one is
                unavailable, one started here in the foreground)

The committed results must be identical across the three, and equal to a
brute-force batch aggregation (the stream is closed, nothing is late).

A classic SparkContext is one per process, and a Spark Connect session marks
the whole process as "remote" (SPARK_CONNECT_MODE_ENABLED), so both drivers
run in subprocesses: this very file run as a script (`python
test_spark_clusters.py '<json>'`), both at once. The JVMs boot while this
process runs the local[2] baseline. Every process started here is in its own
process group; teardown kills each group and asserts nothing of it is left.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from reference import batch_of_clicks
from test_computation_crash import cli_env_module, template  # noqa: F401  (fixtures: the computation test below)
from wire_dagster.procgroup import Proc, free_port, group_members, port_answers, wait_until
from wire_dagster.sparkserver import SPARK_CLIENT_ENV, spark_home

PIPELINE = {
    "name": "kc_local",
    "stream": "kc",
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "5s", "idle_timeout": "1m"},
    "lateness": {"allowed": "30s"},
    "partition": "5m",
    "start": "2026-01-01T00:00:00Z",
    "limits": {"chunk_rows": 400, "max_chunks_per_epoch": 4},
    "windows": [
        {
            "name": "per_minute",
            "type": "tumbling",
            "size": "1m",
            "aggregates": {
                "events": "count",
                "total": "sum(amount)",
                "top": "max(amount)",
                "pages": "count_distinct(page)",
            },
        },
        {
            "name": "five_by_one",
            "type": "sliding",
            "size": "5m",
            "slide": "1m",
            "aggregates": {"events": "count", "mean": "avg(amount)", "low": "min(amount)"},
        },
        {
            "name": "sessions",
            "type": "session",
            "gap": "30s",
            "aggregates": {"events": "count", "total": "sum(amount)"},
        },
    ],
}
WINDOWS = [w["name"] for w in PIPELINE["windows"]]
DRIVER_TIMEOUT = 300  # seconds for both driver subprocesses (JVM start + 2 epochs each)
START_TIMEOUT = 120  # seconds for the master, the workers or the Connect server to come up


def base_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SPARK_CLIENT_ENV}
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOG_DIR=str(tmp / "logs"),
        SPARK_PID_DIR=str(tmp / "pids"),
        SPARK_DAEMON_MEMORY="512m",
        SPARK_DAEMON_JAVA_OPTS="-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        SPARK_CONNECT_MODE="0",
        WIRE_SPARK_LOCAL_DIR=str(tmp / "local"),
        WIRE_SPARK_DRIVER_MEMORY="1g",
        WIRE_SPARK_EXECUTOR_MEMORY="512m",
    )
    return env


# ---------------------------------------------------------------------------
# The JVMs: a standalone cluster (master + 2 workers) and a Spark Connect server,
# booted while this process runs the local[2] baseline.


@dataclass
class Cluster:
    master_url: str
    ui: int
    work_dirs: list[Path]

    def state(self) -> dict:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=2) as r:
                return json.load(r)
        except (OSError, ValueError):
            return {}


@dataclass
class Jvms:
    """The daemons of this module; `ready()` waits until the master, both workers and the Connect server are up."""

    tmp: Path
    env: dict[str, str]
    cluster: Cluster
    connect_url: str
    daemons: list[Proc] = field(default_factory=list)
    _ready: bool = False

    def _dead(self) -> str | None:
        return next((d.dead() for d in self.daemons if d.dead()), None)

    def ready(self) -> Jvms:
        if self._ready:
            return self
        c = self.cluster
        wait_until(lambda: c.state().get("status") == "ALIVE", START_TIMEOUT, "standalone master", self._dead)

        def alive() -> bool:
            return sum(w.get("state") == "ALIVE" for w in c.state().get("workers", [])) == 2

        wait_until(alive, START_TIMEOUT, "two standalone workers registered", self._dead)
        port = int(self.connect_url.rsplit(":", 1)[1])

        wait_until(lambda: port_answers("127.0.0.1", port), START_TIMEOUT, "Spark Connect server listening", self._dead)
        self._ready = True
        return self


def own_connect_server(tmp: Path, env: dict[str, str], grpc: int) -> Proc:
    """What `start-connect-server.sh --wait` runs (spark-daemon.sh `submit`), without the pid file and nohup."""
    return Proc(
        "connect-server",
        [
            f"{spark_home()}/bin/spark-submit",
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name",
            "Spark Connect server",
            "--master",
            "local[2]",
            "--driver-memory",
            "1g",
            "--conf",
            f"spark.connect.grpc.binding.port={grpc}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.driver.bindAddress=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--conf",
            f"spark.pyspark.python={sys.executable}",
            "--conf",
            f"spark.local.dir={tmp / 'connect-local'}",
        ],
        env,
        tmp / "connect.log",
    )


@pytest.fixture(scope="module")
def jvms(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jvms]:
    """Starts the master and the workers (not waiting for them) and takes the session's Spark Connect
    server (conftest `spark_remote`), or starts one of its own if that one is unavailable.
    Stops every group it started at the end."""
    tmp = tmp_path_factory.mktemp("jvms")
    env = base_env(tmp)
    port, ui = free_port(), free_port()
    j = Jvms(tmp, env, Cluster(f"spark://127.0.0.1:{port}", ui, [tmp / f"work{i}" for i in range(2)]), "")
    master = Proc(
        "master",
        [
            f"{spark_home()}/bin/spark-class",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        ],
        env,
        tmp / "master.log",
    )
    # Workers started with the master retry until it is up (Worker's registration retries).
    workers = [
        Proc(
            f"worker{i}",
            [
                f"{spark_home()}/bin/spark-class",
                "org.apache.spark.deploy.worker.Worker",
                j.cluster.master_url,
                "--cores",
                "1",
                "--memory",
                "1g",
                "--host",
                "127.0.0.1",
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(wd),
            ],
            env,
            tmp / f"worker{i}.log",
        )
        for i, wd in enumerate(j.cluster.work_dirs)
    ]
    try:
        for d in (master, *workers):
            j.daemons.append(d.start())
        j.connect_url = request.getfixturevalue("spark_remote") or ""  # boots (if not up yet) while the cluster does
        if not j.connect_url:
            grpc = free_port()
            j.daemons.append(own_connect_server(tmp, env, grpc).start())
            j.connect_url = f"sc://127.0.0.1:{grpc}"
        yield j
    finally:
        left = {d.name: d.stop(grace=20) for d in reversed(j.daemons)}
        assert not any(left.values()), f"processes left after killing their groups: {left}"


# ---------------------------------------------------------------------------
# The data, produced once, and the local[2] run in this process.


def make_events(seed: int = 11, keys: int = 24) -> list[dict]:
    """Bursts per key (sessions), gaps of 40 s to 4 min between bursts, about 3000 events over ~40 min,
    out of order by up to 2 s (less than the 5 s bound: nothing is late); some appends retried (same id)."""
    rng = random.Random(seed)
    t0 = 1_767_225_600_000 + 3_600_000  # 2026-01-01T01:00:00Z
    out = []
    for k in range(keys):
        t = t0 + rng.randrange(0, 120_000)
        while t < t0 + 40 * 60_000:
            for _ in range(rng.randrange(3, 15)):
                out.append(
                    {
                        "user": f"u{k:02d}",
                        "ts": t,
                        "amount": rng.choice(
                            [None, round(rng.uniform(0, 100), 2)] + [round(rng.uniform(0, 100), 2)] * 8
                        ),
                        "page": f"p{rng.randrange(6)}",
                    }
                )
                t += rng.randrange(500, 12_000)
            t += rng.randrange(40_000, 240_000)
    out.sort(key=lambda e: e["ts"])
    for i, e in enumerate(out):
        e["eid"] = f"e{i}"
        e["ts"] += rng.randrange(-2000, 2000)
    return out


@dataclass
class Dataset:
    store: object
    s3_env: dict[str, str]
    events: list[dict]  # unique events (the retries removed)
    retries: int
    now: int
    local: dict  # what the local[2] run committed


def run_outputs(store, spec) -> dict:
    """Everything a run committed that must not depend on where Spark ran."""
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.results import read_dead_letters, read_results

    m = Checkpoints(store, spec.name).latest()
    return {
        "results": {w: read_results(store, spec, w).to_pylist() for w in WINDOWS},
        "dead": sorted(
            (d["reason"], d["window"] or "", d["segment"], d["chunk"], d["row"]) for d in read_dead_letters(store, spec)
        ),
        "totals": m.totals.model_dump(mode="json") if m else None,
        "epochs": m.epoch if m else 0,
        "watermark": m.watermark if m else None,
    }


def spec_named(name: str):
    from wire_dagster.spec import pipeline_from_dict

    return pipeline_from_dict(dict(PIPELINE, name=name))


@pytest.fixture(scope="module")
def dataset(s3_server, spark, jvms: Jvms, tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    """Produced once; the local[2] run in this process (while the cluster and the Connect server boot)."""
    from wire_dagster.engine import process
    from wire_dagster.objectstore import ObjectStore
    from wire_dagster.streams import close_stream, produce

    cfg = replace(s3_server, bucket="t-clusters-" + uuid.uuid4().hex[:8])
    store = ObjectStore(cfg)
    store.ensure_bucket()
    spec = spec_named("kc_local")
    events = make_events()
    rng = random.Random(5)
    tmp = tmp_path_factory.mktemp("clusters-data")
    retries = 0
    for seg in ("a", "b"):  # two segments (two producers), keys split between them
        rows = [e for e in events if (int(e["user"][1:]) % 2 == 0) == (seg == "a")]
        lines = []
        for e in rows:
            lines.append(json.dumps(e))
            if rng.random() < 0.02:  # a retried append: same id, same content, a few rows later
                lines.insert(len(lines) - rng.randrange(0, 3) - 0, json.dumps(e))
                retries += 1
        path = tmp / f"{seg}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        rep = produce(store, spec, path, segment=seg)
        assert rep.malformed == 0 and rep.events == len(lines)
    close_stream(store, spec)
    now = max(e["ts"] for e in events) + 1000  # a fixed processing time: the same idle decisions in every mode
    t0 = time.monotonic()
    out = process(store, spec, spark, max_epochs=50, now=now)
    print(f"kc_local: process {time.monotonic() - t0:.1f} s")
    assert len(out.committed) >= 2, f"expected several epochs (state carried across them), got {out.committed}"
    return Dataset(store, cfg.export_env(), events, retries, now, run_outputs(store, spec))


@dataclass
class Driver:
    """This file run as a script in its own process group: get_spark() from the environment, then engine.process."""

    name: str
    log: Path
    proc: subprocess.Popen

    @classmethod
    def start(cls, ds: Dataset, name: str, env_extra: dict[str, str], tmp: Path) -> Driver:
        env = base_env(tmp)
        env.update(ds.s3_env)
        env.update(env_extra)
        arg = json.dumps({"pipeline": dict(PIPELINE, name=name), "now": ds.now})
        log = tmp / f"{name}.log"
        with open(log, "wb") as f:
            p = subprocess.Popen(
                [sys.executable, __file__, arg],
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=str(Path(__file__).parent),
            )
        return cls(name, log, p)

    def finish(self, deadline: float) -> dict:
        """Its report; kills the group if it overruns; asserts its JVM and Python workers went with it."""
        p = self.proc
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
            tail = self.log.read_text(errors="replace")[-3000:]
            raise AssertionError(f"driver {self.name} did not finish in {DRIVER_TIMEOUT}s:\n{tail}") from None
        finally:
            # The driver's own JVM (and its Python workers) exit with it: give them a bounded while.
            until = time.monotonic() + 30
            while (left := group_members(p.pid)) and time.monotonic() < until:
                time.sleep(0.2)
            if left:
                os.killpg(p.pid, signal.SIGKILL)
        text = self.log.read_text(errors="replace")
        assert p.returncode == 0, f"driver {self.name} exited {p.returncode}:\n{text[-4000:]}"
        assert not left, f"driver {self.name} left processes behind: {left}"
        reports = [ln[len("WIRE_REPORT ") :] for ln in text.splitlines() if ln.startswith("WIRE_REPORT ")]
        assert reports, text[-3000:]
        return json.loads(reports[-1])


@pytest.fixture(scope="module")
def remote_runs(dataset: Dataset, jvms: Jvms, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Both drivers at once (a standalone app and a Connect session do not share cores); their reports and outputs."""
    tmp = tmp_path_factory.mktemp("drivers")
    jvms.ready()
    drivers = [
        # An empty WIRE_SPARK_REMOTE means unset (compose passes `WIRE_SPARK_REMOTE=`).
        Driver.start(
            dataset, "kc_standalone", {"WIRE_SPARK_MASTER": jvms.cluster.master_url, "WIRE_SPARK_REMOTE": ""}, tmp
        ),
        # WIRE_SPARK_REMOTE wins over WIRE_SPARK_MASTER.
        Driver.start(
            dataset, "kc_connect", {"WIRE_SPARK_REMOTE": jvms.connect_url, "WIRE_SPARK_MASTER": "local[1]"}, tmp
        ),
    ]
    deadline = time.monotonic() + DRIVER_TIMEOUT
    out, errors = {}, []
    for d in drivers:  # finish every driver, even if one fails
        try:
            out[d.name] = {"report": d.finish(deadline), "outputs": run_outputs(dataset.store, spec_named(d.name))}
        except AssertionError as e:
            errors.append(str(e))
    assert not errors, "\n\n".join(errors)
    for name, r in out.items():
        print(f"{name}: session {r['report']['session_s']} s, process {r['report']['process_s']} s")
    return out


# ---------------------------------------------------------------------------


def assert_rows_equal(got: list[dict], want: list[dict], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} rows, want {len(want)}"
    for g, w in zip(got, want, strict=True):
        assert set(g) == set(w), f"{what}: columns {sorted(g)} vs {sorted(w)}"
        for c in w:
            if isinstance(w[c], float) and g[c] is not None:
                assert g[c] == pytest.approx(w[c], rel=1e-12, abs=1e-9), f"{what}: {c} of {w}: got {g[c]}"
            else:
                assert g[c] == w[c], f"{what}: {c} of {w}: got {g[c]}"


def test_local_run_matches_brute_force(dataset: Dataset) -> None:
    """The baseline: local[2], several epochs, closed stream → a plain batch aggregation; retries are duplicates."""
    spec = spec_named("kc_local")
    want = batch_of_clicks(spec, dataset.events, fields=("amount", "page"))
    for w in WINDOWS:
        assert_rows_equal(dataset.local["results"][w], want[w], w)
    dead = dataset.local["dead"]
    assert [d[0] for d in dead] == ["duplicate"] * dataset.retries and dataset.retries > 0
    t = dataset.local["totals"]
    assert t["events_in"] == len(dataset.events) + dataset.retries
    for w in WINDOWS:
        assert t["counted"][w] == len(dataset.events) and t["late"][w] == 0
    assert dataset.local["watermark"] == 2**62  # closed stream, all read


def test_standalone_cluster_matches_local(dataset: Dataset, jvms: Jvms, remote_runs: dict) -> None:
    """WIRE_SPARK_MASTER=spark://… runs the kernel on two executor JVMs (one per worker), whose Python
    workers read the chunks from S3 with the credentials shipped in the closure."""
    rep, got = remote_runs["kc_standalone"]["report"], remote_runs["kc_standalone"]["outputs"]
    cluster = jvms.cluster
    assert rep["kind"] == "classic" and rep["master"] == cluster.master_url, rep
    assert rep["executors"] == 2, rep
    for wd in cluster.work_dirs:  # each worker launched an executor for this application
        assert list((wd / rep["app_id"]).glob("*/stderr")), f"no executor of {rep['app_id']} ran under {wd}"
    st = cluster.state()
    assert [a for a in st.get("completedapps", []) + st.get("activeapps", []) if a.get("id") == rep["app_id"]]
    assert got == dataset.local


def test_spark_connect_matches_local(dataset: Dataset, remote_runs: dict) -> None:
    """WIRE_SPARK_REMOTE=sc://… gives a Spark Connect session: the driver process starts no JVM of its own."""
    rep, got = remote_runs["kc_connect"]["report"], remote_runs["kc_connect"]["outputs"]
    assert rep["kind"] == "connect", rep
    assert rep["java_children"] == [], rep
    assert got == dataset.local


def test_spark_target_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """WIRE_SPARK_REMOTE wins when set and non-empty; WIRE_SPARK_MASTER defaults to local[*]; bad
    values are input errors."""
    from wire_dagster.errors import WireInputError
    from wire_dagster.sparkconf import driver_host
    from wire_dagster.sparksession import spark_target

    monkeypatch.setenv("WIRE_HOME", str(tmp_path))  # no embedded Spark server there (test_sparkserver.py covers one)
    monkeypatch.delenv("WIRE_SPARK_REMOTE", raising=False)
    monkeypatch.delenv("WIRE_SPARK_MASTER", raising=False)
    monkeypatch.delenv("WIRE_SPARK_DRIVER_HOST", raising=False)
    assert spark_target() == ("master", "local[*]")
    monkeypatch.setenv("WIRE_SPARK_REMOTE", "  ")
    monkeypatch.setenv("WIRE_SPARK_MASTER", "spark://10.0.0.5:7077")
    assert spark_target() == ("master", "spark://10.0.0.5:7077")
    assert spark_target(master="local[2]") == ("master", "local[2]")
    monkeypatch.setenv("WIRE_SPARK_REMOTE", "sc://127.0.0.1:15002")
    assert spark_target() == ("remote", "sc://127.0.0.1:15002")
    for bad_remote in ("http://x:1", "sc://"):
        monkeypatch.setenv("WIRE_SPARK_REMOTE", bad_remote)
        with pytest.raises(WireInputError, match="WIRE_SPARK_REMOTE"):
            spark_target()
    monkeypatch.delenv("WIRE_SPARK_REMOTE")
    monkeypatch.setenv("WIRE_SPARK_MASTER", "spark:/oops")
    with pytest.raises(WireInputError, match="WIRE_SPARK_MASTER"):
        spark_target()
    # Executors must reach the driver: loopback only when the cluster is on loopback.
    assert driver_host("local[*]") == "127.0.0.1"
    assert driver_host("spark://127.0.0.1:7077") == "127.0.0.1"
    assert driver_host("spark://spark-master:7077") is None
    monkeypatch.setenv("WIRE_SPARK_DRIVER_HOST", "code-location")
    assert driver_host("spark://spark-master:7077") == "code-location"


# ---------------------------------------------------------------------------
# Script mode: the driver subprocess.


def _drive(cfg: dict) -> None:
    import psutil

    from wire_dagster.engine import process
    from wire_dagster.objectstore import ObjectStore, S3Config
    from wire_dagster.sparksession import get_spark
    from wire_dagster.spec import pipeline_from_dict

    t0 = time.monotonic()
    spark = get_spark(app="wire-test-clusters")
    t1 = time.monotonic()
    s3 = S3Config.from_env()
    if s3 is None:
        raise SystemExit("WIRE_S3_ENDPOINT is not set: the test hands the driver its store")
    store = ObjectStore(s3)
    spec = pipeline_from_dict(cfg["pipeline"])
    out = process(store, spec, spark, max_epochs=50, now=cfg["now"])
    rep: dict = {
        "committed": out.committed,
        "session_s": round(t1 - t0, 1),
        "process_s": round(time.monotonic() - t1, 1),
    }
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        rep["kind"] = "connect"
    else:
        sc = spark.sparkContext
        jsc = sc._jsc
        assert jsc is not None  # a running classic context has its Java peer
        rep.update(
            kind="classic",
            master=sc.master,
            app_id=sc.applicationId,
            executors=jsc.sc().getExecutorMemoryStatus().size() - 1,  # pyright: ignore[reportOptionalCall]  py4j: untyped Java calls
        )
    rep["java_children"] = [p.pid for p in psutil.Process().children(recursive=True) if "java" in p.name()]
    spark.stop()
    print("WIRE_REPORT " + json.dumps(rep), flush=True)


def test_a_computation_on_a_standalone_cluster_commits_what_spark_connect_did(s3_server, jvms: Jvms, request) -> None:
    """The same epoch on a standalone cluster (master + 2 workers, executors in JVMs of their own
    whose Python workers get the computation's module by value): the same committed bytes and
    records as the run through Spark Connect (or local[2]) that made the expectation: the
    computation crash tests' `template` fixture. Here, on this module's cluster, already up."""
    from test_computation_crash import _assert_equal_to_uninterrupted, _fresh

    expected = request.getfixturevalue("template")

    cluster = jvms.ready()
    st, env, want = _fresh(expected, s3_server)
    cluster_env = dict(base_env(cluster.tmp), **{k: v for k, v in env.items() if k.startswith(("WIRE_S3_", "AWS_"))})
    cluster_env.update(
        WIRE_PIPELINES=env["WIRE_PIPELINES"],
        WIRE_HOME=env["WIRE_HOME"],
        DAGSTER_HOME=env["DAGSTER_HOME"],
        WIRE_SPARK_MASTER=cluster.cluster.master_url,
    )
    from commit_scenario import wire

    wire(["process", "--pipeline", "comp", "--max-epochs", "5"], cluster_env)
    _assert_equal_to_uninterrupted(st, env, want)


if __name__ == "__main__":
    _drive(json.loads(sys.argv[1]))
