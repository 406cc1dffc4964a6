"""The end-to-end Dagster stack shared by test_e2e_dagster.py and test_browser.py.

    embedded S3 (the session's server, a bucket of its own)
    Spark Connect server  the session's (`spark_remote` in conftest.py); without one, one of the
                          stack's own (wire_dagster.sparkserver.EmbeddedSpark, own process group)
    dagster dev           webserver + daemon + code server, own process group, project-local
                          DAGSTER_HOME (wire_dagster.devstack: QueuedRunCoordinator, one run per
                          pipeline at a time), WIRE_SPARK_REMOTE=sc://... so each run attaches
                          to the Connect server instead of booting a JVM

A small pipeline whose sensor ticks every 2 s; events are produced and the stream
closed once the UI is up, and `start()` returns when the sensor's runs have
materialized every ready partition with the committed content's data version.
Every wait is a bounded poll on a condition; every process is stopped by its group.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from benchmarks.common import CONNECT_CONF, clean_env
from wire_dagster.procgroup import Proc, free_port, port_answers, wait_until

if TYPE_CHECKING:
    from wire_dagster.manifest import Manifest
    from wire_dagster.objectstore import ObjectStore
    from wire_dagster.sparkserver import EmbeddedSpark
    from wire_dagster.spec import Pipeline

M = 60_000
H = 3_600_000
# Event time starts an hour or two ago, and the pipeline's partitions start there and end 10 min
# ahead of the clock (limits.max_future): about a hundred Dagster partitions, so the UI's
# partition pages stay light (a 1m-partitioned pipeline starting months ago has ~10^5 of them).
T0 = (int(time.time() * 1000) // H - 1) * H
NAME = "e2e"
LOCATION = "wire"  # workspace.yaml's code location
PIPELINE = {
    "name": NAME,
    "stream": NAME,
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "3s", "idle_timeout": "1h"},
    "lateness": {"allowed": "20s"},
    "partition": "1m",
    "start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 / 1000)),
    "limits": {"max_future": "10m"},
    "windows": [
        {
            "name": "per_minute",
            "type": "tumbling",
            "size": "1m",
            "aggregates": {"n": "count", "total": "sum(amount)", "top": "max(amount)"},
        },
        {
            "name": "two_by_one",
            "type": "sliding",
            "size": "2m",
            "slide": "1m",
            "aggregates": {"n": "count", "mean": "avg(amount)"},
        },
        {"name": "sessions", "type": "session", "gap": "15s", "aggregates": {"n": "count", "total": "sum(amount)"}},
    ],
    "dagster": {"sensor_interval": "2s"},
}
START_TIMEOUT = 240  # dagster dev (three Python processes) and the Connect JVM on a loaded machine
SETTLE_TIMEOUT = 360  # the sensor's runs, one at a time
ACTIVE = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING", "MANAGED")
# The code location's WIRE_USER_ASSETS module (definitions.py), in the stack's `user_code` directory
# on dagster dev's PYTHONPATH: empty (no assets) until a test writes its own (Stack.add_user_assets).
USER_MODULE = "wire_stack_user_assets"


def group_gone(pgid: int) -> bool:
    """True once the kernel knows no process of group `pgid` (zombies included: they must be reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def make_events() -> list[dict]:
    """Two users over 0:00-0:58, out of order by < 3 s (nothing late), unique ids: results in
    partitions 0:00 (tumbling, sliding [-1, 1), a session) and 0:01 (sliding [0, 2), sessions
    ending after 1:00)."""
    rng = random.Random(17)
    evs = [{"user": "u1", "ts": T0 + i * 4000, "amount": i % 9} for i in range(15)]
    evs += [{"user": "u2", "ts": T0 + 5_000 + i * 3000, "amount": 3 + i % 4} for i in range(5)]
    evs += [{"user": "u2", "ts": T0 + 40_000 + i * 2000, "amount": i} for i in range(10)]
    evs.sort(key=lambda e: e["ts"] + rng.randrange(0, 2500))
    for i, e in enumerate(evs):
        e["eid"] = f"e{i}"
    return evs


@dataclass
class Stack:
    tmp: Path
    s3_env: dict[str, str]
    store: ObjectStore
    spec: Pipeline
    events: list[dict]
    port: int
    home: Path
    procs: list[Proc] = field(default_factory=list)
    spark: EmbeddedSpark | None = None  # the stack's own, when it started one
    stopped: bool = False
    first_settle: dict = field(default_factory=dict)  # what `settled()` saw when start() returned

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ GraphQL
    def gql(self, query: str, variables: dict | None = None, timeout: float = 60) -> dict:
        req = urllib.request.Request(
            self.url + "/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = json.load(r)
        if body.get("errors"):
            raise AssertionError(f"GraphQL errors: {json.dumps(body['errors'])[:2000]}")
        return body["data"]

    def alive(self) -> str | None:
        return next((p.dead() for p in self.procs if p.dead()), None) or (
            self.spark.dead() if self.spark is not None else None
        )

    def location_loaded(self) -> bool:
        try:
            d = self.gql(
                """{ workspaceOrError { __typename ... on Workspace { locationEntries { name loadStatus
                locationOrLoadError { __typename ... on PythonError { message } } } } } }""",
                timeout=10,
            )
        except (OSError, urllib.error.URLError):
            return False
        entries = d["workspaceOrError"].get("locationEntries") or []
        for e in entries:
            err = e.get("locationOrLoadError") or {}
            if err.get("__typename") == "PythonError":
                raise AssertionError(f"code location {e['name']} failed to load: {err['message'][:2000]}")
        return any(
            e["loadStatus"] == "LOADED"
            and (e.get("locationOrLoadError") or {}).get("__typename") == "RepositoryLocation"
            for e in entries
        )

    def runs(self, tags: dict[str, str] | None = None) -> list[dict]:
        tags = tags or {"wire/pipeline": NAME}
        d = self.gql(
            """query($f: RunsFilter) { runsOrError(filter: $f) { __typename ... on Runs { results {
                 runId status startTime endTime creationTime tags { key value } } }"""
            """ ... on PythonError { message } } }""",
            {"f": {"tags": [{"key": k, "value": v} for k, v in tags.items()]}},
        )
        r = d["runsOrError"]
        assert r["__typename"] == "Runs", r
        out = r["results"]
        for run in out:
            run["tags"] = {t["key"]: t["value"] for t in run["tags"]}
        return out

    def latest_materializations(self, window: str, partitions: list[str]) -> dict[str, dict]:
        """partition key -> the latest materialization (runId, timestamp, data version, metadata texts)."""
        d = self.gql(
            """query($k: AssetKeyInput!, $p: [String!]) { assetOrError(assetKey: $k) { __typename ... on Asset {
                 assetMaterializations(partitions: $p) { partition runId timestamp tags { key value }
                   metadataEntries { label __typename ... on TextMetadataEntry { text }"""
            """ ... on IntMetadataEntry { intValue } } } } } }""",
            {"k": {"path": [NAME, window]}, "p": partitions},
        )
        a = d["assetOrError"]
        if a["__typename"] != "Asset":
            return {}
        out: dict[str, dict] = {}
        for m in a["assetMaterializations"]:
            cur = out.get(m["partition"])
            if cur is None or float(m["timestamp"]) > float(cur["timestamp"]):
                out[m["partition"]] = m
        for m in out.values():
            m["tags"] = {t["key"]: t["value"] for t in m["tags"]}
            m["meta"] = {e["label"]: e.get("text", e.get("intValue")) for e in m["metadataEntries"]}
        return out

    # ------------------------------------------------------------------ what is committed
    def committed_versions(self) -> tuple[Manifest | None, dict[str, dict[int, str]]]:
        """The latest committed manifest and, per window and partition, the content hash of its file."""
        from wire_dagster.checkpoint import Checkpoints

        m = Checkpoints(self.store, NAME).latest()
        if m is None:
            return None, {}
        return m, {
            w: {int(p): hashlib.sha256(self.store.get(ref.key)).hexdigest()[:32] for p, ref in parts.items()}
            for w, parts in m.outputs.items()
        }

    def to_report(self) -> set[str]:
        """Partition keys the sensor must ask for: those every committed epoch changed while ready."""
        from wire_dagster.checkpoint import Checkpoints

        cp = Checkpoints(self.store, NAME)
        out = set()
        for n in cp.committed():
            m = cp.load(n)
            out |= {partition_key(p) for ps in m.changed.values() for p in ps if m.watermark >= p + self.spec.partition}
        return out

    def settled(self) -> dict | None:
        """When the closed stream is committed and every partition a sensor run was for shows, for every
        window, the committed content's data version, with no run in flight: what was seen."""
        from wire_dagster.timeutil import INF

        runs = self.runs()
        failed = [r for r in runs if r["status"] in ("FAILURE", "CANCELED")]
        if failed:
            raise AssertionError(
                f"sensor runs failed: {[(r['runId'], run_partitions(r)) for r in failed]}\n"
                f"dagster dev log tail:\n{self.procs[-1].tail(6000)}"
            )
        if not runs or any(r["status"] in ACTIVE for r in runs):
            return None
        m, versions = self.committed_versions()
        if m is None or m.watermark < INF:
            return None
        parts = sorted({pk for r in runs for pk in run_partitions(r)})
        if not self.to_report() <= set(parts):
            return None  # a committed epoch whose partitions the sensor has not asked for yet
        # A partition only "progress" runs were named after, with no committed content, is not
        # materialized (assets._materializations): it is not among the partitions reported.
        progress_only = {
            pk
            for pk in parts
            if all(r["tags"].get("wire/reason") == "progress" for r in runs if pk in run_partitions(r))
            and not any(partition_ms(pk) in v for v in versions.values())
        }
        parts = [pk for pk in parts if pk not in progress_only]
        mats = {}
        for w in self.spec.windows:
            mats[w.name] = self.latest_materializations(w.name, parts)
            for pk in parts:
                got = mats[w.name].get(pk)
                want = versions.get(w.name, {}).get(partition_ms(pk), "empty")
                if got is None or got["tags"].get("dagster/data_version") != want:
                    return None
        return {"runs": runs, "partitions": parts, "materializations": mats, "manifest": m}

    # ------------------------------------------------------------------ more pipelines, runs from inside
    # For tests that bring a pipeline of their own into the running stack (test_e2e_kill.py);
    # the stack's own pipeline, NAME, is left as it is.
    def add_user_assets(self, pipeline: dict, source: str):
        """Write `source` as the code location's user-assets module (USER_MODULE), then add
        `pipeline` (whose windows it may read) and reload the location: see add_pipeline."""
        (self.tmp / "user_code" / f"{USER_MODULE}.py").write_text(source)
        return self.add_pipeline(pipeline)

    def add_pipeline(self, pipeline: dict):
        """Write `pipeline` into the stack's WIRE_PIPELINES directory, reload the code location
        (GraphQL `reloadRepositoryLocation`, as the UI's Reload button) and return its loaded
        Pipeline once the webserver lists its sensor."""
        from sensors import sensor_name
        from wire_dagster.spec import load_pipeline

        path = self.tmp / "pipelines" / f"{pipeline['name']}.yaml"
        path.write_text(yaml.safe_dump(pipeline))
        spec = load_pipeline(path)
        r = self.gql(
            """mutation($n: String!) { reloadRepositoryLocation(repositoryLocationName: $n) { __typename
                 ... on WorkspaceLocationEntry { loadStatus } ... on Error { message } } }""",
            {"n": LOCATION},
        )["reloadRepositoryLocation"]
        assert r["__typename"] == "WorkspaceLocationEntry", f"reloading code location {LOCATION}: {r}"

        def listed() -> bool:
            return self.location_loaded() and self.sensor(sensor_name(spec)) is not None

        wait_until(listed, START_TIMEOUT, f"code location {LOCATION} reloaded with {spec.name}", self.alive)
        return spec

    def sensor(self, name: str) -> dict | None:
        """The sensor `name` (id, status) as the webserver shows it, or None if the location has none."""
        d = self.gql(
            """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) { __typename
                 ... on Sensor { id sensorState { status } } } }""",
            {"s": self._selector(name)},
        )["sensorOrError"]
        return {"id": d["id"], "status": d["sensorState"]["status"]} if d["__typename"] == "Sensor" else None

    def set_sensor(self, name: str, running: bool) -> None:
        """Start or stop sensor `name` (GraphQL startSensor / stopSensor, as the UI's toggle)."""
        if running:
            r = self.gql(
                """mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename
                     ... on Sensor { sensorState { status } } ... on Error { message } } }""",
                {"s": self._selector(name)},
            )["startSensor"]
            ok = r["__typename"] == "Sensor" and r["sensorState"]["status"] == "RUNNING"
        else:
            s = self.sensor(name)
            assert s is not None, f"no sensor {name}"
            r = self.gql(
                """mutation($id: String) { stopSensor(id: $id) { __typename
                     ... on StopSensorMutationResult { instigationState { status } } ... on Error { message } } }""",
                {"id": s["id"]},
            )["stopSensor"]
            ok = r["__typename"] == "StopSensorMutationResult" and r["instigationState"]["status"] == "STOPPED"
        assert ok, f"{'starting' if running else 'stopping'} sensor {name}: {r}"

    @staticmethod
    def _selector(sensor: str) -> dict:
        return {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "sensorName": sensor}

    def run_events(self, run_id: str) -> list[dict]:
        """The run's event log, in order: [{eventType, t (epoch s), message}]."""
        d = self.gql(
            """query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { eventConnection(limit: 5000) {
                 events { __typename ... on MessageEvent { timestamp message eventType } } } } } }""",
            {"id": run_id},
        )["runOrError"]
        assert d["__typename"] == "Run", d
        events = [e for e in d["eventConnection"]["events"] if e.get("timestamp")]
        return [
            {"eventType": e.get("eventType"), "t": int(e["timestamp"]) / 1000, "message": e.get("message") or ""}
            for e in events
        ]

    def pool_claims(self, pool: str) -> list[str]:
        """Run ids holding a slot of Dagster's concurrency pool `pool`."""
        d = self.gql("{ instance { concurrencyLimits { concurrencyKey claimedSlots { runId } } } }")
        limits = [lim for lim in d["instance"]["concurrencyLimits"] if lim["concurrencyKey"] == pool]
        return [c["runId"] for lim in limits for c in lim["claimedSlots"]]

    # ------------------------------------------------------------------ asset pages (issue 25)
    # For test_browser.py and test_dagster_ui.py: lineage, per-partition metadata, checks, freshness.
    def materialization(self, path: list[str], partition: str | None) -> dict | None:
        """The latest materialization of asset `path` (of `partition`): runId, timestamp, tags, metadata values."""
        d = self.gql(
            """query($k: AssetKeyInput!, $p: [String!]) { assetOrError(assetKey: $k) { __typename ... on Asset {
                 assetMaterializations(partitions: $p) { partition runId timestamp tags { key value }
                   metadataEntries { """
            + METADATA_FIELDS
            + """ } } } } }""",
            {"k": {"path": path}, "p": [partition] if partition is not None else None},
        )
        a = d["assetOrError"]
        if a["__typename"] != "Asset" or not a["assetMaterializations"]:
            return None
        m = max(a["assetMaterializations"], key=lambda x: float(x["timestamp"]))
        return {
            "runId": m["runId"],
            "partition": m["partition"],
            "tags": {t["key"]: t["value"] for t in m["tags"]},
            "meta": metadata_values(m["metadataEntries"]),
        }

    def asset_node(self, path: list[str]) -> dict:
        """What the asset graph says of asset `path`: upstream and downstream keys, freshness policy
        and status, whether it is materializable, its checks."""
        d = self.gql(
            """query($k: AssetKeyInput!) { assetNodeOrError(assetKey: $k) { __typename ... on AssetNode {
                 isMaterializable isPartitioned dependencyKeys { path } dependedByKeys { path } kinds description
                 internalFreshnessPolicy { __typename
                   ... on TimeWindowFreshnessPolicy { failWindowSeconds warnWindowSeconds } }
                 freshnessStatusInfo { freshnessStatus }
                 assetChecksOrError { __typename ... on AssetChecks { checks { name description canExecuteIndividually
                   jobNames } } } } } }""",
            {"k": {"path": path}},
        )["assetNodeOrError"]
        assert d["__typename"] == "AssetNode", d
        return d

    def check_executions(self, path: list[str], check: str, limit: int = 1000) -> list[dict]:
        """Every execution of check `check` on asset `path`, newest first: runId, status, partition, evaluation."""
        return self.gql(
            """query($k: AssetKeyInput!, $c: String!, $n: Int!) { assetCheckExecutions(assetKey: $k, checkName: $c,
                 limit: $n) { runId status partition timestamp evaluation { partition success severity description
                 metadataEntries { """
            + METADATA_FIELDS
            + """ } } } }""",
            {"k": {"path": path}, "c": check, "n": limit},
        )["assetCheckExecutions"]

    def launch_checks(self, job: str, checks: list[tuple[list[str], str]]) -> str:
        """Launch a run of `job` with no asset and these checks, as the UI's "Execute all" does; its run id."""
        r = self.gql(
            """mutation($p: ExecutionParams!) { launchPipelineExecution(executionParams: $p) { __typename
                 ... on LaunchRunSuccess { run { runId } } ... on Error { message }
                 ... on RunConfigValidationInvalid { errors { message } } } }""",
            {
                "p": {
                    "mode": "default",
                    "executionMetadata": {},
                    "runConfigData": "{}",
                    "selector": {
                        "jobName": job,
                        "repositoryLocationName": LOCATION,
                        "repositoryName": "__repository__",
                        "assetSelection": [],
                        "assetCheckSelection": [{"assetKey": {"path": p}, "name": c} for p, c in checks],
                    },
                }
            },
        )["launchPipelineExecution"]
        assert r["__typename"] == "LaunchRunSuccess", r
        return r["run"]["runId"]

    def run_status(self, run_id: str) -> str:
        d = self.gql(
            """query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { status } } }""", {"id": run_id}
        )["runOrError"]
        assert d["__typename"] == "Run", d
        return d["status"]

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        left = {p.name: p.stop() for p in reversed(self.procs)}
        if self.spark is not None:
            self.spark.stop()  # by its process group; raises if anything of it survives SIGKILL
        assert not any(left.values()), f"processes left after killing their groups: {left}"


def run_partitions(run: dict) -> list[str]:
    """The partition keys a run reports: its partition, or every one of its range (a sensor run
    for an epoch, or a single-run backfill)."""
    t = run["tags"]
    if "dagster/asset_partition_range_start" in t:
        lo, hi = (
            partition_ms(t["dagster/asset_partition_range_start"]),
            partition_ms(t["dagster/asset_partition_range_end"]),
        )
        return [partition_key(p) for p in range(lo, hi + M, M)]
    return [t["dagster/partition"]]


def partition_key(p: int) -> str:
    return datetime.fromtimestamp(p / 1000, tz=UTC).strftime("%Y-%m-%d-%H:%M")


def partition_ms(pk: str) -> int:
    return int(datetime.strptime(pk, "%Y-%m-%d-%H:%M").replace(tzinfo=UTC).timestamp() * 1000)


def start(s3_server, tmp: Path, remote: str | None = None, storage: dict | None = None) -> Stack:
    """Start everything, produce and close the stream, wait for the sensor's runs to settle.

    `remote`: a running Spark Connect server to attach the runs to (the session's, when there
    is one); otherwise one is started here for the stack. `storage`: a dagster.yaml `storage:`
    section for the instance in place of SQLite (devstack.instance_yaml), e.g. PostgreSQL."""
    from wire_dagster.devstack import DEV_ENV, dagster_dev_command, ensure_dagster_home
    from wire_dagster.objectstore import ObjectStore
    from wire_dagster.spec import load_pipeline
    from wire_dagster.streams import close_stream, produce

    cfg = replace(s3_server, bucket="e2e-" + uuid.uuid4().hex[:8])
    store = ObjectStore(cfg)
    store.ensure_bucket()
    pdir = tmp / "pipelines"
    pdir.mkdir()
    (tmp / "user_code").mkdir()
    (tmp / "user_code" / f"{USER_MODULE}.py").write_text('"""No user assets yet."""\n')
    (pdir / f"{NAME}.yaml").write_text(yaml.safe_dump(PIPELINE))
    spec = load_pipeline(pdir / f"{NAME}.yaml")
    with pytest.MonkeyPatch.context() as mp:  # ensure_dagster_home also exports DAGSTER_HOME: not for this process
        mp.delenv("DAGSTER_HOME", raising=False)
        home = ensure_dagster_home(tmp / "dagster-home", storage=storage)
    assert "QueuedRunCoordinator" in (home / "dagster.yaml").read_text()
    stack = Stack(tmp, cfg.export_env(), store, spec, make_events(), free_port(), home)

    dev_env = clean_env()
    dev_env.update(stack.s3_env)
    dev_env.update(DAGSTER_HOME=str(home), WIRE_PIPELINES=str(pdir), WIRE_TICK_LOG_LEVEL="INFO", **DEV_ENV)
    dev_env.update(
        WIRE_USER_ASSETS=USER_MODULE,
        PYTHONPATH=os.pathsep.join([str(tmp / "user_code"), *filter(None, [dev_env.get("PYTHONPATH")])]),
    )
    dev = Proc(
        "dagster-dev",
        dagster_dev_command(stack.port),
        dev_env,
        tmp / "dagster-dev.log",
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    stack.procs = [dev]
    try:
        # One Spark Connect server for every run of the test (DESIGN §5 Latency).
        if remote is None:
            from wire_dagster.sparkserver import EmbeddedSpark

            stack.spark = EmbeddedSpark(tmp / "spark")
            # Launched now, ready-waited below: it starts while dagster dev loads its code location.
            remote = stack.spark.start(master="local[2]", driver_memory="1g", conf=CONNECT_CONF, wait=False)
        dev_env["WIRE_SPARK_REMOTE"] = remote
        for p in stack.procs:
            p.start()
        if stack.spark is not None:
            stack.spark.wait_ready(START_TIMEOUT)
        else:
            host, port = remote[len("sc://") :].split(":")[0], int(remote.rsplit(":", 1)[1])

            wait_until(
                lambda: port_answers(host, port),
                START_TIMEOUT,
                f"Spark Connect server listening at {remote}",
                stack.alive,
            )
        wait_until(stack.location_loaded, START_TIMEOUT, "dagster dev: code location loaded", stack.alive, every=1.0)

        f = tmp / "events.jsonl"
        f.write_text("".join(json.dumps(e) + "\n" for e in stack.events))
        rep = produce(store, spec, f, segment="0")
        assert rep.events == len(stack.events) and rep.malformed == 0
        close_stream(store, spec)
        stack.first_settle = wait_until(
            stack.settled, SETTLE_TIMEOUT, "the sensor's runs materialize every ready partition", stack.alive, every=2.0
        )
        return stack
    except BaseException:
        for p in stack.procs:
            print(f"---- {p.name} log tail ----\n{p.tail(6000)}", file=sys.stderr)
        if stack.spark is not None:
            print(f"---- spark-connect log tail ----\n{stack.spark._log_tail(6000)}", file=sys.stderr)
        stack.stop()
        raise


_RUNNING: list[Stack] = []


def stop_running() -> None:
    """Stop the shared stack now (called after the last test that uses it)."""
    while _RUNNING:
        _RUNNING.pop().stop()


# ---------------------------------------------------------------------------- asset pages
# Added for test_browser.py and test_dagster_ui.py (issue 25: lineage, per-partition metadata,
# checks and freshness as the UI and GraphQL show them).

METADATA_FIELDS = """label __typename
  ... on TextMetadataEntry { text } ... on IntMetadataEntry { intValue }
  ... on FloatMetadataEntry { floatValue } ... on TimestampMetadataEntry { timestamp }
  ... on MarkdownMetadataEntry { mdStr } ... on JsonMetadataEntry { jsonString }
  ... on PathMetadataEntry { path } ... on UrlMetadataEntry { url }
  ... on TableSchemaMetadataEntry { schema { columns { name type description } } }"""


def metadata_values(entries: list[dict]) -> dict[str, object]:
    """GraphQL metadata entries as label -> value (JSON parsed, a table schema as its columns)."""
    out: dict[str, object] = {}
    for e in entries:
        t = e["__typename"]
        if t == "JsonMetadataEntry":
            out[e["label"]] = json.loads(e["jsonString"])
        elif t == "TableSchemaMetadataEntry":
            out[e["label"]] = e["schema"]["columns"]
        else:
            out[e["label"]] = next((v for k, v in e.items() if k not in ("label", "__typename")), None)
    return out
