"""The Dagster code location (definitions.py) loads, without reading secrets at import time.

`test_defs_can_load` imports `definitions` in a fresh interpreter with WIRE_S3_*
unset and `os.environ` instrumented: the import and the resolution of every
asset, job, sensor and schedule must not look at any WIRE_S3_*/AWS_* variable.
Resources resolve their `dg.EnvVar`s only when they initialise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest

from wire_dagster.assetview import raw_streams
from wire_dagster.spec import load_all, pipeline_from_dict

PROJECT = Path(__file__).resolve().parent.parent
PIPELINES = PROJECT / "pipelines"

PROBE = r"""
import json, os, sys
seen = set()
Base = type(os.environ)

class Spy(Base):
    def __getitem__(self, key):
        seen.add(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        seen.add(key)
        return super().__contains__(key)

os.environ.__class__ = Spy
import dagster as dg
import definitions
defs = definitions.defs
loadable = hasattr(dg.Definitions, "validate_loadable")
if loadable:
    dg.Definitions.validate_loadable(defs)
repo = defs.get_repository_def()
out = {
    "validated": loadable,
    "assets": sorted(k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()),
    "checks": sorted(f"{k.asset_key.to_user_string()}:{k.name}" for k in repo.asset_graph.asset_check_keys),
    "jobs": sorted(j.name for j in repo.get_all_jobs() if not j.name.startswith("__")),
    "sensors": {s.name: [s.job_name, s.minimum_interval_seconds, str(s.default_status)] for s in repo.sensor_defs},
    "schedules": {s.name: [s.job_name, s.cron_schedule, str(s.default_status)] for s in repo.schedule_defs},
    "resources": sorted(repo.get_top_level_resources()),
    "secret_reads": sorted(k for k in seen if k.startswith(("WIRE_S3_", "AWS_"))),
}
print("WIRE_DEFS " + json.dumps(out))
"""


def test_defs_can_load(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WIRE_S3_", "AWS_"))}
    env["WIRE_PIPELINES"] = str(PIPELINES)
    env["DAGSTER_HOME"] = str(tmp_path / "dagster-home")  # never the developer's instance
    p = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-4000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("WIRE_DEFS "))
    got = json.loads(line[len("WIRE_DEFS ") :])

    specs = load_all(PIPELINES)
    assert {s.name for s in specs} >= {"clicks", "bids"}
    want_assets = sorted(
        [f"{s.name}/{w.name}" for s in specs for w in s.windows]
        + [f"{s.name}/dead_letters" for s in specs]
        + sorted({f"streams/{st}" for s in specs for st in raw_streams(s)})  # one external asset per stream
    )
    assert got["assets"] == want_assets
    want_checks = sorted(
        [f"{s.name}/{w.name}:partition_complete" for s in specs for w in s.windows]
        + [f"{s.name}/dead_letters:{c}" for s in specs for c in ("watermark_lag", "conservation", "dead_letter_rate")]
    )
    assert got["checks"] == want_checks
    assert got["jobs"] == sorted(f"{s.name}_job" for s in specs)
    assert got["sensors"] == {
        f"{s.name}_watermark": [f"{s.name}_job", s.orchestration.sensor_interval_s, "DefaultSensorStatus.RUNNING"]
        for s in specs
    }
    assert set(got["schedules"]) == {f"{s.name}_schedule" for s in specs}
    assert all(v[0] in got["jobs"] and v[2] == "DefaultScheduleStatus.STOPPED" for v in got["schedules"].values())
    assert got["resources"] == ["wire_io_manager", "wire_spark", "wire_store"]
    assert got["validated"] is True, "dagster 1.13 has Definitions.validate_loadable"
    assert got["secret_reads"] == [], f"definitions read {got['secret_reads']} at import time"


def test_resources_resolve_env_only_when_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    from resources import default_resources

    for k in ("WIRE_S3_ENDPOINT", "WIRE_S3_ACCESS_KEY", "WIRE_S3_SECRET_KEY", "WIRE_S3_BUCKET"):
        monkeypatch.delenv(k, raising=False)
    res = default_resources()  # building them reads nothing
    with pytest.raises(Exception, match="WIRE_S3_ENDPOINT"), dg.build_resources({"wire_store": res["wire_store"]}) as r:
        r.wire_store.get_store()
    monkeypatch.setenv("WIRE_S3_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("WIRE_S3_ACCESS_KEY", "ak-test")
    monkeypatch.setenv("WIRE_S3_SECRET_KEY", "sk-test")
    monkeypatch.setenv("WIRE_S3_BUCKET", "b-test")
    with dg.build_resources({"wire_store": res["wire_store"]}) as r:
        cfg = r.wire_store.get_store().cfg
        assert (cfg.endpoint, cfg.access_key, cfg.secret_key, cfg.bucket) == (
            "http://127.0.0.1:1",
            "ak-test",
            "sk-test",
            "b-test",
        )
        assert "sk-test" not in repr(cfg)


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


@pytest.mark.parametrize(
    "size,start",
    [
        ("1m", "2026-01-01T00:00:00Z"),
        ("5m", "2026-01-01T00:05:00Z"),
        ("2h", "2026-01-01T02:00:00Z"),
        ("1d", "2026-01-02T00:00:00Z"),
    ],
)
def test_partitions_match_the_pipeline(size: str, start: str) -> None:
    from assets.partitions import partition_key
    from definitions import build_definitions
    from sensors import job_name

    spec = pipeline_from_dict(
        {
            "name": "pd",
            "event": {"time": "ts"},
            "partition": size,
            "start": start,
            "windows": [{"name": "w", "type": "tumbling", "size": "1m", "aggregates": {"n": "count"}}],
        }
    )
    defs = build_definitions(pipelines=[spec])
    repo = defs.get_repository_def()
    keys = [k for k in repo.asset_graph.get_all_asset_keys() if k.path[0] != "streams"]  # streams: unpartitioned
    pdefs = {repo.asset_graph.get(k).partitions_def for k in keys}
    assert len(pdefs) == 1
    pdef = pdefs.pop()
    assert isinstance(pdef, dg.TimeWindowPartitionsDefinition)
    assert defs.resolve_job_def(job_name(spec)).partitions_def == pdef
    first = pdef.get_first_partition_key()
    assert first is not None
    keys = [first]
    while len(keys) < 3:
        nxt = pdef.get_next_partition_key(keys[-1])
        assert nxt is not None
        keys.append(nxt)
    for k in keys:
        tw = pdef.time_window_for_partition_key(k)
        lo, hi = _ms(tw.start), _ms(tw.end)
        assert hi - lo == spec.partition
        assert (lo - spec.start) % spec.partition == 0
        assert partition_key(spec, lo) == k
    assert _ms(pdef.time_window_for_partition_key(first).start) == spec.start
    # An event time maps to the partition that holds it.
    t = spec.start + 3 * spec.partition + 1234
    tw = pdef.time_window_for_partition_key(partition_key(spec, spec.start + 3 * spec.partition))
    assert _ms(tw.start) <= t < _ms(tw.end)
    # Event times may run ahead of the wall clock by limits.max_future (1d): those partitions exist too.
    ahead = _ms(datetime.now(tz=UTC)) + spec.max_future - 1
    last = pdef.time_window_for_partition_key(pdef.get_last_partition_key())
    assert _ms(last.end) > ahead


def test_unsupported_partition_size_is_refused() -> None:
    from definitions import build_definitions
    from wire_dagster.errors import WireInputError

    spec = pipeline_from_dict(
        {
            "name": "bad",
            "event": {"time": "ts"},
            "partition": "7m",
            "start": "2026-01-01T00:00:00Z",
            "windows": [{"name": "w", "type": "tumbling", "size": "1m", "aggregates": {"n": "count"}}],
        }
    )
    with pytest.raises(WireInputError, match="partition: 7m"):
        build_definitions(pipelines=[spec])


HEAP_PROBE = r"""
import gc, sys
import duckdb  # a nanobind module: what leaked warnings at exit would name
import definitions
frozen = gc.get_freeze_count()
con = duckdb.connect()
assert con.execute("SELECT 42").fetchone() == (42,)
print(f"frozen {frozen}")
"""


def test_the_definitions_leave_their_objects_out_of_collections_and_exit_quietly() -> None:
    """Importing the definitions (what a code server, a run worker and `wire tick` do) moves the
    objects made so far to the permanent generation (wire_dagster/heap.py), and the process still
    exits with nothing on stderr: frozen DuckDB objects kept past the last collection made
    nanobind print "leaked instances" there."""
    env = dict(os.environ, WIRE_PIPELINES=str(PIPELINES), PYTHONPATH=str(PROJECT))
    p = subprocess.run(
        [sys.executable, "-c", HEAP_PROBE], env=env, cwd=PROJECT, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-2000:]
    frozen = int(p.stdout.split("frozen ")[1])
    assert frozen > 50_000  # Dagster and the definitions: ~140,000 objects
    assert p.stderr == ""
