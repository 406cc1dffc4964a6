"""The live stack of the latency and recovery benchmarks, and what they read from it.

    embedded S3      SeaweedFS (`weed mini`) under a temporary WIRE_HOME, its own process group
    Spark Connect    the embedded Spark server (wire_dagster.sparkserver.EmbeddedSpark, local[2]) under
                     the same WIRE_HOME, own process group; runs attach to it through WIRE_SPARK_REMOTE
                     instead of booting a JVM
    dagster dev      webserver + daemon + code server, own process group, a temporary DAGSTER_HOME
                     whose dagster.yaml is the project's (wire_dagster.devstack.instance_yaml) plus
                     the overrides a benchmark asks for, and a temporary WIRE_PIPELINES directory
                     holding the benchmark's one pipeline

Process handling (start in a new session, stop = SIGTERM then SIGKILL to the group, report
anything left) and the bounded polls come from wire_dagster.procgroup, the Spark conf and the
child environment from benchmarks/common.py: the end-to-end tests' stack (tests/dagster_stack.py)
uses the same ones. Every process is stopped by its group in `stop()`, which the
benchmarks call from a `finally` (SIGTERM and Ctrl-C included: `common.install_signal_handlers`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from benchmarks.common import CONNECT_CONF, clean_env
from wire_dagster.procgroup import Proc, free_port, wait_until

if TYPE_CHECKING:
    from wire_dagster.embedded import EmbeddedS3
    from wire_dagster.objectstore import ObjectStore
    from wire_dagster.sparkserver import EmbeddedSpark
    from wire_dagster.spec import Pipeline

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 300  # dagster dev (three Python processes) and the Connect JVM on a loaded 2-core machine
ACTIVE = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING", "MANAGED")
PARTITION_FMT = "%Y-%m-%d-%H:%M"


def partition_key(p_ms: int) -> str:
    return datetime.fromtimestamp(p_ms / 1000, tz=UTC).strftime(PARTITION_FMT)


def instance_config(home: Path, overrides: dict | None = None) -> dict:
    """The project's Dagster instance config for `home` (what `wire dev` writes), with `overrides`
    merged in (dicts recursively)."""
    from wire_dagster.devstack import instance_yaml

    cfg = yaml.safe_load(instance_yaml(home))

    def merge(a: dict, b: dict) -> dict:
        for k, v in b.items():
            a[k] = merge(dict(a.get(k) or {}), v) if isinstance(v, dict) and isinstance(a.get(k), dict | None) else v
        return a

    return merge(cfg, overrides or {})


@dataclass
class BenchStack:
    tmp: Path
    pipeline: dict  # the pipeline file's content (DESIGN §4 YAML as a dict)
    instance_overrides: dict | None = None  # merged into the project's dagster.yaml
    dagster_env: dict[str, str] = field(default_factory=dict)  # extra environment for dagster dev (and so its runs)
    spark_ui: bool = False  # the Connect server's UI + REST API (job times), bound to 127.0.0.1
    procs: list[Proc] = field(default_factory=list)
    s3: EmbeddedS3 | None = None
    spark: EmbeddedSpark | None = None  # the server the runs attach to
    # Set by start(), which every use follows: no None to test for afterwards.
    store: ObjectStore = field(init=False)
    spec: Pipeline = field(init=False)
    remote: str = ""
    ui_port: int = 0
    port: int = 0
    home: Path | None = None
    instance: dict | None = None
    stopped: bool = False
    _app_id: str | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self, log=print) -> BenchStack:
        from wire_dagster.devstack import dagster_dev_command
        from wire_dagster.embedded import EmbeddedS3
        from wire_dagster.objectstore import ObjectStore
        from wire_dagster.spec import load_pipeline

        try:
            wire_home = self.tmp / "wire-home"
            self.s3 = EmbeddedS3(wire_home / "s3")
            t0 = time.monotonic()
            cfg = replace(self.s3.start(), bucket="bench-" + uuid.uuid4().hex[:8])
            self.store = ObjectStore(cfg)
            self.store.ensure_bucket()
            log(f"embedded S3 at {cfg.endpoint} ({time.monotonic() - t0:.1f}s)")

            pdir = self.tmp / "pipelines"
            pdir.mkdir(parents=True, exist_ok=True)
            path = pdir / f"{self.pipeline['name']}.yaml"
            path.write_text(yaml.safe_dump(self.pipeline, sort_keys=False))
            self.spec = load_pipeline(path)

            self.home = self.tmp / "dagster-home"
            self.home.mkdir(parents=True, exist_ok=True)
            self.instance = instance_config(self.home, self.instance_overrides)
            (self.home / "dagster.yaml").write_text(yaml.safe_dump(self.instance, sort_keys=False))

            from wire_dagster.sparkserver import EmbeddedSpark

            confs = dict(CONNECT_CONF)
            if self.spark_ui:
                self.ui_port = free_port()
                # SPARK_LOCAL_IP=127.0.0.1 binds the UI to loopback; keep every job of the benchmark.
                confs.update(
                    {
                        "spark.ui.enabled": "true",
                        "spark.ui.port": str(self.ui_port),
                        "spark.ui.retainedJobs": "100000",
                        "spark.ui.retainedStages": "100000",
                        "spark.sql.ui.retainedExecutions": "100000",
                        "spark.port.maxRetries": "0",
                    }
                )
            self.spark = EmbeddedSpark(wire_home / "spark")
            # Launched now, ready-waited below: it starts while dagster dev loads its code location.
            self.remote = self.spark.start(master="local[2]", driver_memory="1g", conf=confs, wait=False)

            self.port = free_port()
            dev_env = clean_env()
            dev_env.update(cfg.export_env())
            dev_env.update(
                DAGSTER_HOME=str(self.home),
                WIRE_PIPELINES=str(pdir),
                WIRE_SPARK_REMOTE=self.remote,
                WIRE_HOME=str(wire_home),
                WIRE_TICK_LOG_LEVEL="INFO",
            )
            dev_env.update(self.dagster_env)
            self.procs.append(
                Proc(
                    "dagster-dev", dagster_dev_command(self.port), dev_env, self.tmp / "dagster-dev.log", cwd=str(ROOT)
                ).start()
            )

            t0 = time.monotonic()
            self.spark.wait_ready(START_TIMEOUT)
            log(f"Spark Connect at {self.remote} answered a query ({time.monotonic() - t0:.1f}s)")
            wait_until(self.location_loaded, START_TIMEOUT, "dagster dev: code location loaded", self.alive, every=1.0)
            log(f"dagster dev at {self.url}, code location loaded ({time.monotonic() - t0:.1f}s)")
            return self
        except BaseException:
            self.print_tails(4000)
            if self.spark is not None:
                print(f"---- spark-connect log tail ----\n{self.spark._log_tail(4000)}", file=sys.stderr)
            self.stop()
            raise

    def alive(self) -> str | None:
        return next((p.dead() for p in self.procs if p.dead()), None) or (
            self.spark.dead() if self.spark is not None else None
        )

    def print_tails(self, chars: int) -> None:
        """The last `chars` characters of each process's log, on stderr (what a failure needs)."""
        for p in self.procs:
            print(f"---- {p.name} log tail ----\n{p.tail(chars)}", file=sys.stderr)

    @contextlib.contextmanager
    def stopped_at_end(self, diagnose: Callable[[], None] = lambda: None) -> Iterator[BenchStack]:
        """A benchmark's body on the stack: on failure (Ctrl-C and SIGTERM included) the traceback,
        `diagnose()` and the processes' log tails go to stderr; the stack is stopped either way."""
        try:
            yield self
        except BaseException:
            traceback.print_exc()
            diagnose()
            self.print_tails(3000)
            raise
        finally:
            left = self.stop()
            if left:
                print(f"WARNING: processes left: {left}", file=sys.stderr)

    def check_runs(self, allowed_failures: Collection[str] = ()) -> list[dict]:
        """The stack's runs; RuntimeError naming the first that failed or was canceled (but those
        in `allowed_failures`: runs the benchmark killed itself), with its last failure messages."""
        runs = self.runs()
        bad = [r for r in runs if r["status"] in ("FAILURE", "CANCELED") and r["runId"] not in allowed_failures]
        if bad:
            r = bad[0]
            msgs = [
                e["message"]
                for e in self.run_events(r["runId"])
                if e["eventType"] in ("STEP_FAILURE", "RUN_FAILURE", "ENGINE_EVENT")
            ]
            raise RuntimeError(
                f"run {r['runId']} (partition {r['tags'].get('dagster/partition')}) ended {r['status']}: "
                + " | ".join(m[:1500] for m in msgs[-3:])
            )
        return runs

    def runs_ended(self, allowed_failures: Collection[str] = ()) -> bool:
        """No run of the stack still active (check_runs: a failed one not allowed raises)."""
        return not any(r["status"] in ACTIVE for r in self.check_runs(allowed_failures))

    def stop(self) -> dict[str, list]:
        """Stop dagster dev, then Spark Connect (each by its process group), then the S3 server; what
        was left (nothing)."""
        if self.stopped:
            return {}
        self.stopped = True
        left: dict[str, list] = {p.name: p.stop() for p in reversed(self.procs)}
        if self.spark is not None:
            from wire_dagster.errors import SparkServerError

            try:
                self.spark.stop()
            except SparkServerError as exc:  # its group survived SIGKILL
                left["spark-connect"] = [str(exc)]
        if self.s3 is not None:
            self.s3.stop()
        bad = {k: v for k, v in left.items() if v}
        if bad:
            print(f"processes left after killing their groups: {bad}", file=sys.stderr)
        return bad

    # ------------------------------------------------------------------ GraphQL
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def gql(self, query: str, variables: dict | None = None, timeout: float = 60) -> dict:
        req = urllib.request.Request(
            self.url + "/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = json.load(r)
        if body.get("errors"):
            raise RuntimeError(f"GraphQL errors: {json.dumps(body['errors'])[:2000]}")
        return body["data"]

    def location_loaded(self) -> bool:
        try:
            d = self.gql(
                """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
                locationOrLoadError { __typename ... on PythonError { message } } } } } }""",
                timeout=10,
            )
        except (OSError, urllib.error.URLError):
            return False
        for e in d["workspaceOrError"].get("locationEntries") or []:
            err = e.get("locationOrLoadError") or {}
            if err.get("__typename") == "PythonError":
                raise RuntimeError(f"code location {e['name']} failed to load: {err['message'][:2000]}")
            if e["loadStatus"] == "LOADED" and err.get("__typename") == "RepositoryLocation":
                return True
        return False

    def runs(self) -> list[dict]:
        """Every run of the pipeline: runId, status, creationTime/startTime/endTime (epoch s), tags (dict)."""
        d = self.gql(
            """query($f: RunsFilter) { runsOrError(filter: $f) { __typename ... on Runs { results {
                 runId status startTime endTime creationTime tags { key value } } } ... on PythonError { message }
               } }""",
            {"f": {"tags": [{"key": "wire/pipeline", "value": self.spec.name}]}},
        )
        r = d["runsOrError"]
        if r["__typename"] != "Runs":
            raise RuntimeError(f"runsOrError: {r}")
        for run in r["results"]:
            run["tags"] = {t["key"]: t["value"] for t in run["tags"]}
        return r["results"]

    def run_events(self, run_id: str) -> list[dict]:
        """The run's event log: [{type, eventType, timestamp (s), message, stepKey}], in order."""
        d = self.gql(
            """query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { eventConnection(limit: 5000) {
                 events { __typename ... on MessageEvent { timestamp message eventType stepKey } } } } } }""",
            {"id": run_id},
        )
        r = d["runOrError"]
        if r["__typename"] != "Run":
            raise RuntimeError(f"runOrError: {r}")
        return [
            {
                "type": e["__typename"],
                "eventType": e.get("eventType"),
                "t": int(e["timestamp"]) / 1000,
                "message": e.get("message") or "",
                "step": e.get("stepKey"),
            }
            for e in r["eventConnection"]["events"]
            if e.get("timestamp")
        ]

    def sensor_ticks(self, after: float | None = None, limit: int = 2000) -> list[dict]:
        """The watermark sensor's ticks (timestamp/endTimestamp in s, status, runIds, runKeys), oldest first."""
        from sensors import sensor_name

        d = self.gql(
            """query($s: SensorSelector!, $after: Float, $limit: Int) { sensorOrError(sensorSelector: $s) { __typename
                 ... on Sensor { sensorState { ticks(afterTimestamp: $after, limit: $limit) {
                   timestamp endTimestamp status runIds runKeys skipReason error { message } } } }
                 ... on PythonError { message } } }""",
            {
                "s": {
                    "repositoryLocationName": "wire",
                    "repositoryName": "__repository__",
                    "sensorName": sensor_name(self.spec),
                },
                "after": after,
                "limit": limit,
            },
        )
        r = d["sensorOrError"]
        if r["__typename"] != "Sensor":
            raise RuntimeError(f"sensorOrError: {r}")
        return sorted(r["sensorState"]["ticks"], key=lambda t: t["timestamp"])

    def pools(self) -> list[dict]:
        """Dagster's concurrency pools: key, limit, slots claimed (by which runs), steps pending."""
        d = self.gql("""{ instance { concurrencyLimits { concurrencyKey slotCount limit activeRunIds pendingStepRunIds
                 claimedSlots { runId stepKey } } } }""")
        return d["instance"]["concurrencyLimits"]

    # ------------------------------------------------------------------ Spark (REST API of the Connect server)
    def spark_jobs(self) -> list[dict]:
        """Jobs the Connect server ran: id, submitted/completed (epoch s, ms precision), status, stage count."""
        if not self.spark_ui:
            return []
        base = f"http://127.0.0.1:{self.ui_port}/api/v1/applications"
        if self._app_id is None:
            with urllib.request.urlopen(base, timeout=30) as r:
                self._app_id = json.load(r)[0]["id"]
        with urllib.request.urlopen(f"{base}/{self._app_id}/jobs", timeout=60) as r:
            jobs = json.load(r)

        def ts(s: str | None) -> float | None:
            if not s:
                return None
            return datetime.strptime(s.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()

        return sorted(
            (
                {
                    "id": j["jobId"],
                    "submitted": ts(j.get("submissionTime")),
                    "completed": ts(j.get("completionTime")),
                    "status": j["status"],
                    "stages": len(j.get("stageIds") or []),
                }
                for j in jobs
            ),
            key=lambda j: j["id"],
        )

    # ------------------------------------------------------------------ the object store
    def marker_key(self, epoch: int) -> str:
        from wire_dagster.checkpoint import Checkpoints

        return Checkpoints(self.store, self.spec.name).marker_key(epoch)

    def manifest(self, epoch: int):
        from wire_dagster.checkpoint import Checkpoints

        return Checkpoints(self.store, self.spec.name).load(epoch)


def load_average() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return load_average()


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
