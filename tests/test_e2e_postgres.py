"""End to end through `dagster dev` with Dagster's storage on a real PostgreSQL: the one
docker/dagster.yaml configures.

A PostgreSQL server of the test's own (tests/postgres.py: Debian's binaries, `make postgresql`;
a fresh data directory, TCP on 127.0.0.1, stopped by its pid afterwards) and the end-to-end
stack of tests/dagster_stack.py, whose DAGSTER_HOME/dagster.yaml takes its `storage:` section
from docker/dagster.yaml, loaded from the file (only that section: the rest of that file is the
container's, e.g. its compute-log directory). That section reads DAGSTER_PG_USER, _PASSWORD,
_HOST, _PORT and _DB from the environment, the only place the password is. The stack produces
a closed stream and waits until the sensor's runs materialized every ready partition. Then:

1. the committed results equal a plain batch aggregation;
2. the runs are in PostgreSQL: the `runs` table holds exactly the pipeline's runs the webserver
   lists, each SUCCESS, launched by the sensor (its tag in `run_tags`); the daemon's sensor ticks
   are in `job_ticks`;
3. the materializations are in PostgreSQL: `event_logs` holds an ASSET_MATERIALIZATION for every
   window and every partition the runs reported, the latest one carrying the data version of
   the committed content (read from the object store, not from Dagster);
4. Dagster wrote no SQLite database under DAGSTER_HOME.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import dagster_stack as ds
from dagster_stack import NAME, partition_ms
from postgres import PostgresServer

DOCKER_DAGSTER_YAML = Path(__file__).resolve().parents[1] / "docker" / "dagster.yaml"


@pytest.fixture(scope="module")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path_factory.mktemp("postgres")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pg_stack(s3_server, spark_remote, pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory):
    storage = yaml.safe_load(DOCKER_DAGSTER_YAML.read_text())["storage"]
    assert set(storage) == {"postgres"}, storage
    # dagster dev (webserver, daemon, code server, runs) inherits this environment.
    with pytest.MonkeyPatch.context() as mp:
        for key, value in pg_server.env().items():
            mp.setenv(key, value)
        stack = ds.start(s3_server, tmp_path_factory.mktemp("dagster-pg"), remote=spark_remote, storage=storage)
        try:
            yield stack
        finally:
            stack.stop()


def query(server: PostgresServer, sql: str, args: tuple = ()) -> list[tuple]:
    with contextlib.closing(server.connect()) as conn, conn.cursor() as cur:
        cur.execute(sql, args)
        return cur.fetchall()


def test_dagster_dev_on_postgres_storage(pg_stack, pg_server: PostgresServer) -> None:
    from dagster import EventLogEntry
    from dagster._serdes import deserialize_value

    from reference import assert_same_rows, batch_of_clicks
    from wire_dagster.results import read_results

    st = pg_stack
    spec, store, first = st.spec, st.store, st.first_settle
    cfg = yaml.safe_load((st.home / "dagster.yaml").read_text())
    assert cfg["storage"] == yaml.safe_load(DOCKER_DAGSTER_YAML.read_text())["storage"]
    assert cfg["run_coordinator"]["class"] == "QueuedRunCoordinator"  # the rest: the stack's own instance
    assert pg_server.password not in (st.home / "dagster.yaml").read_text()

    # 1. Committed results = batch aggregation.
    want = batch_of_clicks(spec, st.events)
    assert_same_rows(spec, {w.name: read_results(store, spec, w.name).to_pylist() for w in spec.windows}, want)

    # 2. The runs, in PostgreSQL.
    runs = {r["runId"]: r for r in first["runs"]}
    assert runs and all(r["status"] == "SUCCESS" for r in runs.values())
    rows = query(
        pg_server,
        """SELECT r.run_id, r.status FROM runs r JOIN run_tags t ON t.run_id = r.run_id
           WHERE t.key = 'wire/pipeline' AND t.value = %s""",
        (NAME,),
    )
    assert dict(rows) == dict.fromkeys(runs, "SUCCESS"), (rows, sorted(runs))
    assert query(pg_server, "SELECT count(*) FROM runs") == [(len(runs),)]
    sensor_tagged = query(
        pg_server,
        "SELECT run_id FROM run_tags WHERE key = 'dagster/sensor_name' AND value = %s",
        (f"{NAME}_watermark",),
    )
    assert {r for (r,) in sensor_tagged} == set(runs)
    ticks = query(pg_server, "SELECT count(*) FROM job_ticks WHERE type = 'SENSOR' AND status = 'SUCCESS'")
    assert ticks[0][0] >= 1, "no successful sensor tick in PostgreSQL"

    # 3. The materializations, in PostgreSQL: every window, every partition the runs reported,
    #    the latest with the committed content's data version (the stack's hash of the file in S3).
    parts = first["partitions"]
    _, versions = st.committed_versions()
    latest: dict[tuple[str, str], tuple[int, str | None]] = {}
    for event_id, asset_key, partition, body in query(
        pg_server,
        """SELECT id, asset_key, partition, event FROM event_logs
           WHERE dagster_event_type = 'ASSET_MATERIALIZATION' AND run_id = ANY(%s)""",
        (list(runs),),
    ):
        key = (json.loads(asset_key)[-1], partition)
        entry = deserialize_value(body, EventLogEntry)
        mat = entry.asset_materialization
        assert mat is not None and mat.partition == partition
        if key not in latest or event_id > latest[key][0]:
            latest[key] = (event_id, (mat.tags or {}).get("dagster/data_version"))
    for w in spec.windows:
        for pk in parts:
            assert (w.name, pk) in latest, f"no materialization of {w.name} {pk} in PostgreSQL"
            assert latest[(w.name, pk)][1] == versions.get(w.name, {}).get(partition_ms(pk), "empty"), (w.name, pk)

    print(
        f"PostgreSQL {pg_server.host}:{pg_server.port}: {len(rows)} runs, {ticks[0][0]} sensor ticks, "
        f"{len(latest)} asset partitions materialized"
    )

    # 4. Nothing of Dagster's storage in SQLite.
    assert sorted(str(p.relative_to(st.home)) for p in st.home.rglob("*.db")) == []
