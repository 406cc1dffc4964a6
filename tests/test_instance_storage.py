"""The project-local Dagster instance's event log (resources/instance.py): Dagster's SQLite event
log with each database's connection kept open. It must be Dagster's storage in every other way:
the same files (a plain Dagster instance reads them, and the other way round), events from other
processes and threads all stored and seen, a bounded number of open run databases."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import AssetMaterializationPlannedData, DagsterEvent, StepMaterializationData
from dagster._core.storage.dagster_run import DagsterRun
from dagster._core.storage.event_log import SqliteEventLogStorage

from resources.instance import WireSqliteEventLogStorage
from wire_dagster.devstack import instance_yaml

ASSET = dg.AssetKey(["t", "windows"])


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "dagster home"  # a space: the yaml quotes the path
    h.mkdir()
    (h / "dagster.yaml").write_text(instance_yaml(h))
    return h


def _instance(home: Path) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(str(home))


def _wire_storage(inst: dg.DagsterInstance) -> WireSqliteEventLogStorage:
    st = inst.event_log_storage
    assert isinstance(st, WireSqliteEventLogStorage), type(st)
    return st


def _new_run(inst: dg.DagsterInstance) -> str:
    return inst.run_storage.add_run(DagsterRun(job_name="j", run_id=str(uuid.uuid4()))).run_id


def _materialize(inst: dg.DagsterInstance, run_id: str, partition: str, tags: dict[str, str] | None = None) -> None:
    inst.report_dagster_event(
        DagsterEvent(
            event_type_value="ASSET_MATERIALIZATION",
            job_name="j",
            step_key="s",
            event_specific_data=StepMaterializationData(
                dg.AssetMaterialization(asset_key=ASSET, partition=partition, metadata={"p": partition}, tags=tags)
            ),
        ),
        run_id,
    )


def _plan(inst: dg.DagsterInstance, run_id: str, partition: str) -> None:
    inst.report_dagster_event(
        DagsterEvent.build_asset_materialization_planned_event(
            "j", "s", AssetMaterializationPlannedData(ASSET, partition=partition)
        ),
        run_id,
    )


def _materialized(inst: dg.DagsterInstance) -> set[str]:
    return set(inst.get_materialized_partitions(ASSET))


def test_the_project_instance_uses_it_where_dagster_keeps_its_event_log(home):
    with _instance(home) as inst:
        st = inst.event_log_storage
        assert isinstance(st, WireSqliteEventLogStorage)
        assert Path(st._base_dir) == home / "history" / "runs"  # Dagster's default place
        run_id = _new_run(inst)
        _materialize(inst, run_id, "p0")
        assert (home / "history" / "runs" / f"{run_id}.db").exists()
        assert (home / "history" / "runs" / "index.db").exists()


def test_a_plain_dagster_instance_reads_what_it_wrote_and_the_other_way_round(home):
    with _instance(home) as inst:
        a = _new_run(inst)
        for p in ("p0", "p1"):
            _plan(inst, a, p)
            _materialize(inst, a, p)
    (home / "dagster.yaml").write_text("")  # Dagster's defaults: its own SQLite event log, same directory
    with _instance(home) as plain:
        assert type(plain.event_log_storage) is SqliteEventLogStorage
        assert _materialized(plain) == {"p0", "p1"}
        assert len(plain.get_records_for_run(a).records) == 4
        b = _new_run(plain)
        _materialize(plain, b, "p2")
    (home / "dagster.yaml").write_text(instance_yaml(home))
    with _instance(home) as inst:
        assert _materialized(inst) == {"p0", "p1", "p2"}
        assert [r.event_log_entry.dagster_event_type for r in inst.get_records_for_run(b).records] == [
            dg.DagsterEventType.ASSET_MATERIALIZATION
        ]


def test_events_other_processes_write_meanwhile_are_stored_and_seen(home):
    with _instance(home) as inst:
        mine = _new_run(inst)
        _materialize(inst, mine, "mine-0")  # this process's connections are now open
        child = textwrap.dedent(f"""
            import sys, uuid
            sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).parent.parent)]!r}
            from test_instance_storage import _instance, _materialize, _new_run
            from pathlib import Path
            inst = _instance(Path(sys.argv[1]))
            run_id = _new_run(inst)
            for i in range(40):
                _materialize(inst, run_id, f"{{sys.argv[2]}}-{{i}}")
            inst.dispose()
        """)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")]),
        }
        procs = [subprocess.Popen([sys.executable, "-c", child, str(home), name], env=env) for name in ("a", "b")]
        for i in range(1, 40):  # written while the two children write theirs
            _materialize(inst, mine, f"mine-{i}")
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
        expected = {f"{n}-{i}" for n in ("a", "b", "mine") for i in range(40)}
        assert _materialized(inst) == expected
        with _instance(home) as fresh:
            assert _materialized(fresh) == expected


def test_threads_of_one_process_share_the_connections(home):
    with _instance(home) as inst:
        runs = [_new_run(inst) for _ in range(4)]
        errors: list[BaseException] = []

        def work(k: int) -> None:
            try:
                for i in range(30):
                    _plan(inst, runs[k], f"{k}-{i}")
                    _materialize(inst, runs[k], f"{k}-{i}")
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors
        assert _materialized(inst) == {f"{k}-{i}" for k in range(4) for i in range(30)}
        assert all(len(inst.get_records_for_run(r).records) == 60 for r in runs)


def test_open_run_databases_are_bounded_and_a_closed_one_reopens(home):
    with _instance(home) as inst:
        st = _wire_storage(inst)
        runs = [_new_run(inst) for _ in range(st.RUN_SHARDS + 4)]
        for i, r in enumerate(runs):
            _materialize(inst, r, f"p{i}")
        open_ = st.open_shards()
        assert "index" in open_
        assert [s for s in open_ if s != "index"] == runs[-st.RUN_SHARDS :]  # the most recently used
        assert len(inst.get_records_for_run(runs[0]).records) == 1  # closed, reopened on use
        _materialize(inst, runs[0], "again")
        assert len(inst.get_records_for_run(runs[0]).records) == 2
        assert runs[1] not in st.open_shards()
    assert st.open_shards() == []


def test_wipe_closes_and_deletes_the_run_databases(home):
    with _instance(home) as inst:
        r = _new_run(inst)
        _materialize(inst, r, "p0")
        inst.event_log_storage.wipe()
        assert not (home / "history" / "runs" / f"{r}.db").exists()
        assert _materialized(inst) == set()
        _materialize(inst, r, "p1")  # the run's database is created again
        assert _materialized(inst) == {"p1"}


def test_schema_checks_are_asked_once_and_a_missing_table_each_time(home, monkeypatch):
    asked: list[str] = []
    has_table = SqliteEventLogStorage.has_table

    def counting(self, name: str) -> bool:
        asked.append(name)
        return has_table(self, name)

    monkeypatch.setattr(SqliteEventLogStorage, "has_table", counting)
    with _instance(home) as inst:
        st = _wire_storage(inst)
        r = _new_run(inst)
        for i in range(20):
            _plan(inst, r, f"p{i}")
            _materialize(inst, r, f"p{i}", tags={"dagster/data_version": f"v{i}"})  # tags: a table check each
        assert _materialized(inst) == {f"p{i}" for i in range(20)}
        versions = inst.get_latest_data_version_record(ASSET, partition_key="p7")
        mat = versions.asset_materialization if versions is not None else None
        assert mat is not None and (mat.tags or {}).get("dagster/data_version") == "v7"
        assert asked and len(asked) == len(set(asked))  # every table asked about once, not per event
        assert "asset_event_tags" in asked
        assert not st.has_table("no_such_table") and not st.has_table("no_such_table")
        assert asked.count("no_such_table") == 2  # a missing table is asked again: it may be created
        before = len(asked)
        st.wipe()
        _materialize(inst, r, "after", tags={"dagster/data_version": "v"})
        assert "asset_event_tags" in asked[before:]  # a wipe forgets what was found: asked again
        assert _materialized(inst) == {"after"}


def _synchronous(st: WireSqliteEventLogStorage) -> tuple[int, int]:
    """PRAGMA synchronous of the index's and a run database's connection (1 NORMAL, 2 FULL)."""
    import sqlalchemy as sa

    with st.index_connection() as conn:
        index = conn.execute(sa.text("PRAGMA synchronous")).scalar_one()
    with st.run_connection("r-pragma") as conn:
        run = conn.execute(sa.text("PRAGMA synchronous")).scalar_one()
    return index, run


@pytest.mark.parametrize(("config", "expected"), [(None, 1), ("FULL", 2), ("NORMAL", 1)])
def test_synchronous_is_normal_unless_configured(home, config, expected):
    import yaml

    if config is not None:
        cfg = yaml.safe_load(instance_yaml(home))
        cfg["event_log_storage"]["config"]["synchronous"] = config
        (home / "dagster.yaml").write_text(yaml.safe_dump(cfg))
    with _instance(home) as inst:
        assert _synchronous(_wire_storage(inst)) == (expected, expected)


def test_a_bad_synchronous_value_is_one_clear_error(tmp_path):
    with pytest.raises(ValueError, match="synchronous must be one of NORMAL, FULL, not 'OFF'"):
        WireSqliteEventLogStorage(str(tmp_path), synchronous="OFF")
    assert not (tmp_path / "index.db").exists()  # nothing created


def _schema(path: Path) -> tuple[list[tuple[str, str, str]], list[tuple[str]], str]:
    """A SQLite database's schema (its objects' SQL), alembic revision and journal mode."""
    import sqlite3

    con = sqlite3.connect(path)
    try:
        objects = con.execute("SELECT type, name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        return (
            objects,
            con.execute("SELECT version_num FROM alembic_version").fetchall(),
            con.execute("PRAGMA journal_mode").fetchone()[0],
        )
    finally:
        con.close()


def test_a_new_run_database_is_the_one_dagster_builds(home, tmp_path):
    """A run database copied from the template has Dagster's schema, revision and WAL mode, and
    the template is built once, beside the run databases but never listed as a run."""
    with _instance(home) as inst:
        r = _new_run(inst)
        _materialize(inst, r, "p0")
        base = home / "history" / "runs"
        templates = list(base.glob(".wire-run-template-*"))
        assert len(templates) == 1 and templates[0].name == f".wire-run-template-{dg.__version__}"
        assert r in inst.event_log_storage.get_all_run_ids()  # pyright: ignore[reportAttributeAccessIssue]
        assert all(not x.startswith(".") for x in inst.event_log_storage.get_all_run_ids())  # pyright: ignore[reportAttributeAccessIssue]
    plain = SqliteEventLogStorage(str(tmp_path / "plain"))  # Dagster's own storage builds one
    with plain.run_connection("r"):
        pass
    plain.dispose()
    assert _schema(base / f"{r}.db") == _schema(tmp_path / "plain" / "r.db")
    assert _schema(base / f"{r}.db")[2] == "wal"
    assert not list(base.glob("*.tmp")) and not list(base.glob(".*.tmp"))  # no copy left half-made


def test_processes_creating_the_same_run_databases_at_once_all_store(tmp_path):
    """Four processes, no template yet, open the same ten new run databases in the same order
    (the template and each database made by whichever comes first) and store an event in each:
    every event is stored, each database made once."""
    base = tmp_path / "runs"
    runs = [str(uuid.uuid4()) for _ in range(10)]
    child = textwrap.dedent(f"""
        import sys
        sys.path[:0] = {[str(Path(__file__).parent.parent)]!r}
        from dagster._core.events.log import EventLogEntry
        from resources.instance import WireSqliteEventLogStorage
        st = WireSqliteEventLogStorage(sys.argv[1])
        for r in sys.argv[3:]:
            st.store_event(EventLogEntry(error_info=None, level=20, user_message=sys.argv[2], run_id=r,
                                         timestamp=0.0, step_key=None, job_name="j", dagster_event=None))
        st.dispose()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", child, str(base), f"w{k}", *runs]) for k in range(4)]
    assert [p.wait(timeout=180) for p in procs] == [0, 0, 0, 0]
    st = WireSqliteEventLogStorage(str(base))
    try:
        for r in runs:
            got = sorted(rec.event_log_entry.user_message for rec in st.get_records_for_run(r).records)
            assert got == ["w0", "w1", "w2", "w3"], (r, got)
    finally:
        st.dispose()
    assert sorted(p.name for p in base.iterdir() if p.name.endswith(".db")) == sorted(
        [*(f"{r}.db" for r in runs), "index.db"]
    )
    assert [p.name for p in base.iterdir() if p.name.startswith(".")] == [f".wire-run-template-{dg.__version__}"]
