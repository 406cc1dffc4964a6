"""The event log of Wire's project-local Dagster instance: Dagster's SQLite event log, with each
database's connection kept open.

Dagster's `SqliteEventLogStorage` creates a SQLAlchemy engine and opens (and closes) a SQLite
connection for every statement: a materialization is two of each (the run's database and the
index), and each close checkpoints the WAL. SQLAlchemy compiles the statements afresh for every
new engine too (its compiled cache lives on the engine). A run over a range of partitions logs
one "planned" event and one materialization per partition and asset: a 10 M-event backlog of
334 one-minute partitions is ~1,400 events, 6 ms each on the 2-core VM (sqlalchemy/sqlalchemy#7490
describes the NullPool cost).

`WireSqliteEventLogStorage` is the same storage (same files under `$DAGSTER_HOME/history/runs`,
same schema, readable by a plain Dagster instance) with one engine per database, each keeping
its one connection open (StaticPool). Dagster's per-storage lock already serialises every use of
a connection within the process, so one connection per database is enough; other processes
(daemon, webserver, runs) open their own, and SQLite's WAL mode and busy timeout arbitrate
between them as before. Run databases are kept for the `RUN_SHARDS` most recently used runs,
the index database always. About 1.8 instead of 6 ms per event (planned or materialization).

Its connections also run with `PRAGMA synchronous=NORMAL` (config `synchronous`, default NORMAL;
FULL is Dagster's): in WAL mode a commit then writes the WAL without waiting for fsync. SQLite
stays consistent; a commit can be lost only to an operating-system crash or power loss, not to
a process that dies (kill -9 included). 1.2 instead of 1.8 ms per event. What Wire reports in
these events (a partition's result and its data version) is committed in the object store first
and reported again by the next run.

A new run's database is a copy of a template instead of being built: Dagster creates every
table and index of a run database, then stamps it through alembic, which parses its migration
scripts again each time (~50 ms a run on the 2-core VM, in the process that creates the run and
again, for the check alone, in each process that opens it). The template is such a database,
built once per Dagster version by Dagster's own `_initdb` (`.wire-run-template-<version>` beside
the run databases: Dagster lists only `*.db` there); a run database missing is copied from it
(never over one another process created meanwhile), and a database is taken as initialized when
its alembic revision is the template's, read with one query. Anything else (the index, a
database of another revision, a copy that could not be made) goes through Dagster's `_initdb`.

It also remembers the schema checks Dagster repeats for every asset event (`has_table` opens a
new engine and connection each time; the asset-key columns are inspected each time): a table
or column found stays found (Dagster's migrations only add them; a wipe forgets what was found).

`wire_dagster.devstack` writes it into the dagster.yaml of the project-local DAGSTER_HOME; the
docker/ stack uses PostgreSQL instead.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dagster import Field
from dagster._config import StringSource
from dagster._core.storage.event_log import SqliteEventLogStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME
from dagster._core.storage.sql import create_engine
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._serdes import ConfigurableClassData
from dagster.version import __version__ as dagster_version
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool, StaticPool

SYNCHRONOUS = ("NORMAL", "FULL")


def _revision(engine: Engine) -> str | None:
    """The alembic revision a database is stamped with (None: none, or no database)."""
    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT version_num FROM alembic_version").fetchall()
    except SQLAlchemyError:
        return None
    return str(rows[0][0]) if len(rows) == 1 else None


class WireSqliteEventLogStorage(SqliteEventLogStorage):
    """Dagster's SQLite event log with one open connection per database (see the module docstring).

    Configuration: `base_dir`, as Dagster's (`wire_dagster.devstack` gives `$DAGSTER_HOME/history/runs`,
    where Dagster's default puts it); `synchronous`: NORMAL (default) or FULL."""

    RUN_SHARDS = 8  # run databases kept open, most recently used; the index database always

    def __init__(self, base_dir: str, synchronous: str = "NORMAL", inst_data: ConfigurableClassData | None = None):
        if synchronous not in SYNCHRONOUS:
            raise ValueError(
                f"WireSqliteEventLogStorage: synchronous must be one of {', '.join(SYNCHRONOUS)}, not {synchronous!r}"
            )
        self._synchronous = synchronous
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._found: set[str] = set()  # tables and asset-key columns seen to exist
        self._template_head: str | None = None  # the run-database template's alembic revision
        super().__init__(base_dir, inst_data=inst_data)

    @classmethod
    def config_type(cls) -> Mapping[str, Any]:
        return {"base_dir": StringSource, "synchronous": Field(str, is_required=False, default_value="NORMAL")}

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> WireSqliteEventLogStorage:
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        with self._db_lock:  # as Dagster's: one user of this storage's connections at a time
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                if shard == INDEX_SHARD_NAME or not self._from_template(shard, engine):
                    self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def _from_template(self, shard: str, engine: Engine) -> bool:
        """Whether run database `shard` is initialized once copied from the template if missing
        (module docstring); False: it is for Dagster's `_initdb`. Called before `engine`'s
        first connection, which would create the file empty."""
        head = self._template_revision()
        if head is None:
            return False
        path = Path(self.path_for_shard(shard))
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                shutil.copyfile(self._template_path(), tmp)
                os.link(tmp, path)  # fails where another process created the database meanwhile
            except OSError:
                pass  # that database, or none: the revision below decides
            finally:
                tmp.unlink(missing_ok=True)
        return _revision(engine) == head

    def _template_path(self) -> Path:
        return Path(self._base_dir) / f".wire-run-template-{dagster_version}"

    def _template_revision(self) -> str | None:
        """The alembic revision of the run-database template, built first if missing (None: it
        could not be)."""
        if self._template_head is not None:
            return self._template_head
        path = self._template_path()
        if not path.exists():
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                engine = create_engine(f"sqlite:///{tmp}", poolclass=NullPool)
                super()._initdb(engine)
                with engine.connect() as conn:  # everything in the file itself, none in a WAL
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                engine.dispose()
                os.replace(tmp, path)
            except (OSError, SQLAlchemyError):
                return None
            finally:
                for f in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
                    f.unlink(missing_ok=True)
        engine = create_engine(f"sqlite:///{path}", poolclass=NullPool)
        try:
            self._template_head = _revision(engine)
        finally:
            engine.dispose()
        return self._template_head

    def _engine(self, shard: str) -> Engine:
        """The shard's engine (under the lock), created on first use; the least recently used run
        database beyond RUN_SHARDS is closed."""
        engine = self._engines.pop(shard, None)
        if engine is None:
            engine = create_engine(
                self.conn_string_for_shard(shard),
                poolclass=StaticPool,
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False},
            )
            pragma = f"PRAGMA synchronous={self._synchronous}"
            event.listen(engine, "connect", lambda dbapi_conn, _record: dbapi_conn.execute(pragma))
        self._engines[shard] = engine
        runs = [k for k in self._engines if k != INDEX_SHARD_NAME]
        for old in runs[: max(0, len(runs) - self.RUN_SHARDS)]:
            self._engines.pop(old).dispose()
        return engine

    def has_table(self, table_name: str) -> bool:
        if table_name not in self._found and super().has_table(table_name):
            self._found.add(table_name)
        return table_name in self._found

    def _has_asset_key_col_on_connection(self, conn: Connection, column_name: str) -> bool:
        key = f"asset_keys.{column_name}"
        if key not in self._found and super()._has_asset_key_col_on_connection(conn, column_name):
            self._found.add(key)
        return key in self._found

    def open_shards(self) -> list[str]:
        """The databases whose connection is open, least recently used first."""
        with self._db_lock:
            return list(self._engines)

    def _close_all(self) -> None:
        with self._db_lock:
            while self._engines:
                self._engines.popitem(last=False)[1].dispose()

    def wipe(self) -> None:
        self._close_all()  # the run databases' files are deleted
        self._found.clear()
        super().wipe()

    def dispose(self) -> None:
        self._close_all()
        super().dispose()
