"""A PostgreSQL server of a test's own: Debian's binaries (`make postgresql` installs the package),
a fresh data directory, TCP on 127.0.0.1 only, stopped by its pid.

    server = PostgresServer(tmp)      # tmp: where its log goes
    server.start()                    # initdb, postgres on a free port, a role and a database
    server.env()                      # DAGSTER_PG_USER/PASSWORD/HOST/PORT/DB (docker/dagster.yaml's env: references)
    server.connect()                  # psycopg2 over TCP with that password
    server.stop()                     # fast shutdown by the postmaster's pid, then the data directory goes

The password exists only in this process's memory and in the environment handed to the
processes that connect (DAGSTER_PG_PASSWORD): no file holds it. initdb therefore sets no
password; the server trusts connections on its Unix socket, which lives in a directory only the
server's user may enter, and the role gets its password over that socket. Over TCP every
connection needs the password (scram-sha-256).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from wire_dagster.procgroup import Proc, free_port, group_members, wait_until

PG_BINDIRS = "/usr/lib/postgresql/*/bin"  # Debian's layout, one directory per major version
START_TIMEOUT = 60
STOP_TIMEOUT = 30
# Test-only settings: nothing here must survive a crash of the machine, so no fsync.
SERVER_CONF = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",  # dagster dev's webserver, daemon threads, code server and runs
}


def bindir() -> Path | None:
    """The newest Debian PostgreSQL binary directory holding initdb, pg_ctl and postgres, or None."""
    found = [
        Path(d)
        for d in glob.glob(PG_BINDIRS)
        if all((Path(d) / exe).is_file() for exe in ("initdb", "pg_ctl", "postgres"))
    ]
    return max(found, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0) if found else None


def server_user() -> str | None:
    """The user to run initdb and postgres as: None (this process's own) unless this process is
    root. initdb and postgres refuse to run as root, so a root test runs them as an unprivileged
    user instead, through setpriv: Debian's `postgres` system user, which the package creates,
    else `nobody`."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root and neither a postgres nor a nobody user exists to run PostgreSQL as")


def as_user(user: str | None, cmd: list[str]) -> list[str]:
    """`cmd` run as `user` (setpriv execs it: the pid stays the command's own), or as it is."""
    if user is None:
        return cmd
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *cmd]


@dataclass
class PostgresServer:
    tmp: Path  # the server's log goes here
    user: str = "dagster"
    db: str = "dagster"
    host: str = "127.0.0.1"
    port: int = 0
    password: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    base: Path | None = None  # data directory and socket directory, owned by the server's user
    proc: Proc | None = None

    @property
    def datadir(self) -> Path:
        assert self.base is not None
        return self.base / "data"

    @property
    def sockdir(self) -> Path:
        assert self.base is not None
        return self.base / "sock"

    def env(self) -> dict[str, str]:
        """What docker/dagster.yaml's `env:` references read."""
        return {
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_DB": self.db,
        }

    def connect(self, dbname: str | None = None):
        """A psycopg2 connection over TCP, with the password (as Dagster connects)."""
        import psycopg2

        return psycopg2.connect(
            host=self.host, port=self.port, user=self.user, password=self.password, dbname=dbname or self.db
        )

    def _admin(self):
        """The bootstrap superuser over the Unix socket (trusted; only the server's user and root reach it)."""
        import psycopg2

        conn = psycopg2.connect(host=str(self.sockdir), port=self.port, user="wire_admin", dbname="postgres")
        conn.autocommit = True
        return conn

    def start(self) -> PostgresServer:
        bins = bindir()
        assert bins is not None, (
            f"no initdb/pg_ctl/postgres under {PG_BINDIRS}: install Debian's postgresql (make postgresql)"
        )
        run_as = server_user()
        # Not under pytest's tmp directory: that one is private to this process's user (mode 700).
        self.base = Path(tempfile.mkdtemp(prefix="wire-pg-"))
        self.sockdir.mkdir(mode=0o700)
        if run_as is not None:
            pw = pwd.getpwnam(run_as)
            for d in (self.base, self.sockdir):
                os.chown(d, pw.pw_uid, pw.pw_gid)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(LC_ALL="C", LANG="C")
        init = subprocess.run(
            as_user(
                run_as,
                [
                    str(bins / "initdb"),
                    "-D",
                    str(self.datadir),
                    "-U",
                    "wire_admin",
                    "--auth-local=trust",  # the socket directory is the server user's alone
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--no-locale",
                    "--no-sync",
                ],
            ),
            env=env,
            cwd=str(self.base),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert init.returncode == 0, f"initdb exited {init.returncode}:\n{init.stdout[-3000:]}\n{init.stderr[-3000:]}"
        self.port = free_port(self.host)
        cmd = [str(bins / "postgres"), "-D", str(self.datadir), "-p", str(self.port), "-k", str(self.sockdir)]
        for key, value in SERVER_CONF.items():
            cmd += ["-c", f"{key}={value}"]
        self.proc = Proc("postgres", as_user(run_as, cmd), env, self.tmp / "postgres.log", cwd=str(self.base)).start()
        try:
            wait_until(self._answers, START_TIMEOUT, f"PostgreSQL on {self.host}:{self.port}", self.proc.dead)
            with contextlib.closing(self._admin()) as conn, conn.cursor() as cur:
                from psycopg2 import sql

                cur.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(sql.Identifier(self.user)), (self.password,)
                )
                cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(*map(sql.Identifier, (self.db, self.user))))
            with contextlib.closing(self.connect()) as conn, conn.cursor() as cur:
                cur.execute("SELECT current_user::text, host(inet_server_addr())")
                assert cur.fetchone() == (self.user, self.host)
        except BaseException:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        import psycopg2

        try:
            self._admin().close()
        except psycopg2.OperationalError:
            return False
        return True

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster, by its pid): it ends every backend and checkpoints;
        SIGTERM/SIGKILL to its process group if it does not exit in time. Then the data directory goes."""
        if self.proc is not None and self.proc.proc is not None:
            p = self.proc.proc
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=STOP_TIMEOUT)
            left = self.proc.stop(grace=5)  # nothing left normally; else the group is killed
            assert not left and not group_members(p.pid), f"PostgreSQL processes left: {left}"
            self.proc = None
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None
