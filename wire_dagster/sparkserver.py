"""The embedded Spark server: one long-lived Spark Connect server per Wire home, so that every
run (a new process each, under Dagster) attaches in well under a second instead of booting a
Spark JVM of its own (DESIGN §5, Latency).

It is pyspark's own `org.apache.spark.sql.connect.service.SparkConnectServer`, run by the
wheel's `spark-submit` in the foreground: the recorded pid is the driver JVM, in a process
group of its own with its Python workers. Layout of a server directory (`<WIRE_HOME>/spark`):

    <dir>/spark.pid   JSON {pid, pgid, url, port, master, log} from launch until stopped
    <dir>/port        the port last used (reused while free, so the URL stays stable)
    <dir>/spark.log   the server's output (rotated at 20 MB on start)
    <dir>/local/      spark.local.dir (shuffle and spill files)
    <dir>/tmp/        the JVM's java.io.tmpdir (Spark's artifacts, native libraries); emptied at start

Guarantees: the gRPC endpoint is bound to 127.0.0.1 (and so are the driver and its UI, when
one is enabled, for local and loopback masters); a running server is reused, never started
twice (start and stop are serialised by a lock file); `start` returns only once a client in
another process ran a query (a Spark Connect session marks its whole Python process as
remote, so this process never opens one), and a start that fails stops what it launched;
`stop` signals only the server's process group (SIGTERM, then SIGKILL), never a name.

Standard library only at import time: `sparksession.spark_target` calls `embedded_url`. The
settings it shares with the session factory are in sparkconf.py (this module never imports sparksession).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from .errors import SparkServerError, WireInputError
from .jvmarchive import launch_options
from .procgroup import (
    GroupOwner,
    cmdline,
    default_home,
    pid_alive,
    port_answers,
    port_free,
)
from .sparkconf import check_master, driver_host, env_value, java_problem, local_cores, spark_home
from .sparkconf import driver_memory as default_driver_memory

HOST = "127.0.0.1"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: Ports are drawn from here (below the usual ephemeral range, like the S3 server's).
_PORT_RANGE = (10000, 22000)
_LOG_ROTATE_BYTES = 20 * 1024 * 1024
#: A Spark JVM and its first query on a loaded 2-core machine take 15-30 s.
START_TIMEOUT = 180.0
#: Variables that would make the server or the probe a Connect client, or steer spark-submit.
SPARK_CLIENT_ENV = (
    "SPARK_REMOTE",
    "SPARK_CONNECT_MODE_ENABLED",
    "SPARK_LOCAL_REMOTE",
    "PYSPARK_SUBMIT_ARGS",
    "WIRE_SPARK_REMOTE",
    "WIRE_SPARK_MASTER",
)
#: Secrets the server never needs (runs pass the store's options with each query).
_SECRETS = ("WIRE_S3_ACCESS_KEY", "WIRE_S3_SECRET_KEY")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SPARK_CLIENT_ENV and k not in _SECRETS}


def _check_memory(value: str, what: str) -> str:
    if not re.fullmatch(r"\d+[kKmMgGtT]?", value):
        raise WireInputError(f"{what}: expected a JVM memory size like 512m or 2g, got {value!r}")
    return value


def _shuffle_partitions(master: str) -> str:
    raw = env_value("WIRE_SPARK_SHUFFLE_PARTITIONS")
    if raw is not None:
        if not raw.isdigit() or int(raw) < 1:
            raise WireInputError(f"WIRE_SPARK_SHUFFLE_PARTITIONS: expected an integer >= 1, got {raw!r}")
        return raw
    return str(max(2, local_cores(master) or os.cpu_count() or 2))


class EmbeddedSpark(GroupOwner):
    """One Spark Connect server for one directory: started once, reused while alive, stopped by process group."""

    _survived = SparkServerError
    _what = "embedded Spark server"

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory).expanduser().resolve()
        self.pid_file = self.dir / "spark.pid"
        self.port_file = self.dir / "port"
        self.log_file = self.dir / "spark.log"
        self.local_dir = self.dir / "local"
        self.tmp_dir = self.dir / "tmp"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_from = 0  # where the log of the server this object launched begins

    def __repr__(self) -> str:
        return f"EmbeddedSpark(dir={str(self.dir)!r})"

    # ------------------------------------------------------------ files
    @property
    def _marker(self) -> str:
        """A `--conf` of the server's command line naming this directory (guards against pid reuse)."""
        return f"spark.wire.dir={self.dir}"

    def _read_pid(self) -> dict | None:
        try:
            info = json.loads(self.pid_file.read_text())
            _ = (
                int(info["pid"]),
                int(info["pgid"]),
                int(info["port"]),
                str(info["url"]),
            )  # each field there, of its type
            return info
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def _write_pid(self, info: dict) -> None:
        tmp = self.pid_file.with_name(f".spark.pid.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(self.pid_file)

    def _is_ours(self, pid: int) -> bool:
        """True iff `pid` is alive and is this directory's server (its command line names the directory)."""
        if not pid_alive(pid):
            return False
        args = cmdline(pid)
        if args is None:
            return True  # no /proc: trust the pid file
        return self._marker.encode() in args

    def recorded(self) -> dict | None:
        """The pid file's content ({pid, pgid, url, port, master, log}) if its process is alive and ours, else None
        (a server that is still starting counts)."""
        info = self._read_pid()
        if info is None or not self._is_ours(int(info["pid"])):
            return None
        return info

    # ------------------------------------------------------------ state
    def running(self) -> str | None:
        """The server's URL (`sc://127.0.0.1:<port>`) if the recorded process is alive and its port
        accepts connections, else None. Cheap: a file read, /proc and a TCP connect; no query."""
        info = self.recorded()
        if info is None or not port_answers(HOST, int(info["port"]), timeout=1.0):
            return None
        return str(info["url"])

    def dead(self) -> str | None:
        """None while the server this object launched (or, else, the recorded one) runs; else a one-line reason."""
        if self._proc is not None:
            code = self._proc.poll()
            return None if code is None else f"embedded Spark server exited with code {code}; see {self.log_file}"
        return None if self.recorded() is not None else f"embedded Spark server not running; see {self.log_file}"

    # ------------------------------------------------------------ start
    def start(
        self,
        master: str | None = None,
        *,
        port: int | None = None,
        conf: Mapping[str, str] | None = None,
        driver_memory: str | None = None,
        timeout: float = START_TIMEOUT,
        wait: bool = True,
    ) -> str:
        """The URL `sc://127.0.0.1:<port>` of this directory's server: the running one (reused as it is,
        whatever the arguments ask), else a new one.

        A new server: `master` (else WIRE_SPARK_MASTER, else `local[*]`), driver memory `driver_memory`
        (else WIRE_SPARK_DRIVER_MEMORY, else 2g), `port` (else the last one if free, else a free one),
        and Wire's defaults (UI off, UTC, shuffle partitions = local cores or WIRE_SPARK_SHUFFLE_PARTITIONS,
        Python workers on this interpreter, reused) with `conf` applied over them. With `wait` (the
        default) it returns once a client in another process ran a query, within `timeout` s; without,
        right after the launch (then call `wait_ready`). Raises WireInputError for bad input (Java
        missing, a bad master, a taken --port) before launching anything, and SparkServerError (one line,
        naming the log file) if the server does not come up, after stopping what it launched.
        """
        problem = java_problem()
        if problem:
            raise WireInputError(problem)
        master = check_master(
            (master or "").strip() or env_value("WIRE_SPARK_MASTER") or "local[*]",
            "--master" if master else "WIRE_SPARK_MASTER",
        )
        memory = _check_memory(
            driver_memory or default_driver_memory(),
            "driver memory" if driver_memory else "WIRE_SPARK_DRIVER_MEMORY",
        )
        for key in conf or {}:
            if not str(key).startswith("spark."):
                raise WireInputError(f"--conf {key}: expected a Spark setting (spark.…=value)")
        if port is not None and not 0 < port < 65536:
            raise WireInputError(f"--port {port}: expected a TCP port (1-65535)")
        deadline = time.monotonic() + timeout
        with self._locked():
            info = self._read_pid()
            if info is not None:
                if self._is_ours(int(info["pid"])):
                    if _listening(int(info["pid"]), int(info["port"])):
                        return str(info["url"])
                    try:  # another start still in progress: wait for it (bounded)
                        return self._wait_ready(info, deadline)
                    except (_Gone, _PortClash):
                        pass  # it died while starting: start a fresh one below
                self.pid_file.unlink(missing_ok=True)
            if port is not None and not port_free(HOST, port):
                raise WireInputError(f"--port {port}: {HOST}:{port} is already in use")
            for attempt in range(3):  # a port we chose can be taken between choosing and binding
                info = self._launch(master, memory, port if port is not None else self._choose_port(), dict(conf or {}))
                if not wait:
                    return str(info["url"])
                try:
                    return self._wait_ready(info, deadline)
                except _PortClash:
                    self._stop_locked()
                    if port is not None or attempt == 2:
                        raise SparkServerError(
                            f"embedded Spark server: port {info['port']} was taken while starting; see {self.log_file}"
                        ) from None
                except _Gone as exc:
                    self._stop_locked()
                    raise SparkServerError(str(exc)) from None
                except BaseException:
                    self._stop_locked()
                    raise
        raise AssertionError("unreachable")

    def wait_ready(self, timeout: float = START_TIMEOUT) -> str:
        """After `start(wait=False)` (or while another process starts it): the URL once a client in
        another process ran a query. On failure (SparkServerError) a server this object launched is stopped."""
        deadline = time.monotonic() + timeout
        with self._locked():
            info = self._read_pid()
            if info is None:
                raise SparkServerError(f"embedded Spark server under {self.dir} is not running; see {self.log_file}")
            try:
                return self._wait_ready(info, deadline)
            except BaseException as exc:
                if self._proc is not None and self._proc.pid == int(info["pid"]):
                    self._stop_locked()
                if isinstance(exc, SparkServerError):
                    raise SparkServerError(str(exc)) from None
                raise

    def _choose_port(self) -> int:
        with contextlib.suppress(OSError, ValueError):
            previous = int(self.port_file.read_text())
            if port_free(HOST, previous):
                return previous
        rng = random.SystemRandom()
        for _ in range(500):
            p = rng.randrange(*_PORT_RANGE)
            if port_free(HOST, p):
                return p
        raise SparkServerError(f"embedded Spark server: no free port on {HOST}")

    def _command(self, master: str, memory: str, port: int, conf: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        home = spark_home()
        python = sys.executable
        settings = {
            "spark.ui.enabled": env_value("WIRE_SPARK_UI") or "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": _shuffle_partitions(master),
            "spark.sql.execution.arrow.pyspark.enabled": "true",
            "spark.pyspark.python": python,
            "spark.pyspark.driver.python": python,
            "spark.executorEnv.PYSPARK_PYTHON": python,
            "spark.python.worker.reuse": "true",
            "spark.local.dir": str(self.local_dir),
            "spark.log.level": "WARN",
            # The runs share one session (`shared_session_id`); an idle one is closed after this, and a
            # closed session id cannot be used again (clients then fall back to sessions of their own).
            "spark.connect.session.manager.defaultSessionTimeout": "7d",
        }
        settings["spark.default.parallelism"] = settings["spark.sql.shuffle.partitions"]
        executor_memory = env_value("WIRE_SPARK_EXECUTOR_MEMORY")
        if executor_memory:
            settings["spark.executor.memory"] = _check_memory(executor_memory, "WIRE_SPARK_EXECUTOR_MEMORY")
        env = _clean_env()
        env.update(SPARK_HOME=str(home), PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python, SPARK_CONNECT_MODE="0")
        env["SPARK_SUBMIT_OPTS"] = launch_options(env.get("SPARK_SUBMIT_OPTS"), self.tmp_dir)
        host = driver_host(master)
        if host:
            settings["spark.driver.host"] = host
            if host == HOST or host == "localhost" or host.startswith("127."):
                settings["spark.driver.bindAddress"] = host
                env["SPARK_LOCAL_IP"] = HOST  # and so the UI, when enabled
        settings.update(conf)
        # Not overridable: where clients connect, and the mark that makes this server ours.
        settings.update(
            {
                "spark.connect.grpc.binding.address": HOST,
                "spark.connect.grpc.binding.port": str(port),
                "spark.connect.grpc.port.maxRetries": "0",
                "spark.wire.dir": str(self.dir),
            }
        )
        cmd = [
            str(home / "bin" / "spark-submit"),
            "--class",
            SERVER_CLASS,
            "--name",
            "wire-spark-connect",
            "--master",
            master,
            "--driver-memory",
            memory,
        ]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        return cmd, env

    def _launch(self, master: str, memory: str, port: int, conf: dict[str, str]) -> dict:
        """Start the JVM (spark-submit execs it: the pid is the JVM) in a new session; write the pid file."""
        cmd, env = self._command(master, memory, port, conf)
        for d in (self.local_dir, self.tmp_dir):
            shutil.rmtree(d, ignore_errors=True)  # no server runs: what is left here is a killed one's
            d.mkdir(parents=True, exist_ok=True)
        if self.log_file.exists() and self.log_file.stat().st_size > _LOG_ROTATE_BYTES:
            self.log_file.replace(self.log_file.with_suffix(".log.1"))
        with open(self.log_file, "ab") as log:
            self._log_from = log.seek(0, os.SEEK_END)
            log.write(
                f"\n=== wire: starting the Spark Connect server ({master}, port {port}) at "
                f"{time.strftime('%Y-%m-%dT%H:%M:%S')} ===\n".encode()
            )
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        info = {
            "pid": self._proc.pid,
            "pgid": self._proc.pid,
            "url": f"sc://{HOST}:{port}",
            "port": port,
            "master": master,
            "log": str(self.log_file),
        }
        self._write_pid(info)
        return info

    def _wait_ready(self, info: dict, deadline: float) -> str:
        """Poll until the server process listens on its port and a probe query in a subprocess succeeds;
        raise _Gone / _PortClash / SparkServerError if the process exits or time runs out."""
        pid, port, url = int(info["pid"]), int(info["port"]), str(info["url"])
        last = f"nothing listened on port {port}"
        while True:
            reason = self._exited(pid)
            if reason is not None:
                raise reason
            if time.monotonic() > deadline:
                break
            if not _listening(pid, port):
                time.sleep(0.25)
                continue
            ok, last = self._probe(url, pid, deadline)
            if ok:
                with contextlib.suppress(OSError):
                    self.port_file.write_text(str(port))
                return url
            time.sleep(0.5)
        raise SparkServerError(
            f"embedded Spark server at {url} did not answer a query in time ({last}); see {self.log_file}"
        )

    def _exited(self, pid: int) -> SparkServerError | None:
        """None while `pid` runs as our server; else the error to raise (_PortClash if it could not bind)."""
        if self._proc is not None and self._proc.pid == pid:
            code = self._proc.poll()
            if code is None:
                return None
        elif self._is_ours(pid):
            return None
        else:
            code = None
        tail = self._log_tail()
        if "Address already in use" in tail or "Failed to bind" in tail:
            return _PortClash(f"embedded Spark server: its port was taken; see {self.log_file}")
        what = "exited" if code is None else f"exited with code {code}"
        cause = _cause(tail)
        return _Gone(f"embedded Spark server {what} while starting{': ' + cause if cause else ''}; see {self.log_file}")

    def _probe(self, url: str, pid: int, deadline: float) -> tuple[bool, str]:
        """Run one query through a Spark Connect client in a subprocess (never in this process: a Connect
        session marks its whole process as remote): (it worked, why not). Gives up when the server exits."""
        code = (
            f"from pyspark.sql import SparkSession as S; "
            f"assert S.builder.remote({url!r}).getOrCreate().range(3).count() == 3"
        )
        with tempfile.TemporaryFile() as err:
            p = subprocess.Popen(
                [sys.executable, "-c", code],
                env=_clean_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
            try:
                while p.poll() is None:
                    if self._exited(pid) is not None:
                        return False, "the server exited"
                    if time.monotonic() > deadline:
                        return False, "a probe query did not finish"
                    time.sleep(0.1)
            finally:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            if p.returncode == 0:
                return True, ""
            err.seek(0)
            lines = [ln.strip() for ln in err.read().decode(errors="replace").splitlines() if ln.strip()]
        return False, f"a probe query failed: {lines[-1][:200] if lines else f'exit code {p.returncode}'}"

    def _log_tail(self, nbytes: int = 16384) -> str:
        """The end of the log, from this object's launch on (an earlier run's errors are not this one's)."""
        try:
            with open(self.log_file, "rb") as fh:
                fh.seek(max(self._log_from, fh.seek(0, os.SEEK_END) - nbytes))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    # ------------------------------------------------------------ stop
    def stop(self, grace: float = 20) -> None:
        """No process of this directory's server is left: SIGTERM to its group, SIGKILL after `grace` s;
        the pid file is removed. Returns once the group is gone (SparkServerError if it survives SIGKILL)."""
        with self._locked():
            self._stop_locked(grace)

    def _stop_locked(self, grace: float = 20) -> None:
        info = self._read_pid()
        if info is not None and self._is_ours(int(info["pid"])):
            self._kill_group(int(info["pgid"]), grace)
        if (
            self._proc is not None
            and (info is None or self._proc.pid != int(info["pid"]))
            and self._proc.poll() is None
        ):
            self._kill_group(self._proc.pid, grace)
        if self._proc is not None:
            self._proc.poll()
        self.pid_file.unlink(missing_ok=True)
        self._proc = None


def _listening(pid: int, port: int) -> bool:
    """True iff process `pid` itself listens on `port` (not merely: something answers there)."""
    import psutil

    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return port_answers(HOST, port)
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def _cause(log_tail: str) -> str:
    """The last exception line of a failed start ("…Exception: why"), shortened; "" if none."""
    for line in reversed(log_tail.splitlines()):
        m = re.search(r"((?:[\w$]+\.)+[\w$]*(?:Exception|Error)\b:?.*)$", line)
        if m and not line.lstrip().startswith("at "):
            return m.group(1).strip()[:200]
    return ""


class _Gone(SparkServerError):
    """The server exited while we waited for it."""


class _PortClash(SparkServerError):
    """The port chosen as free was taken before the server bound it."""


def embedded_url(home: Path | None = None) -> str | None:
    """The URL of the embedded Spark server under `home` (default: WIRE_HOME or the checkout's .wire/)
    if it runs, else None."""
    return EmbeddedSpark(Path(home or default_home()) / "spark").running()


def shared_session_id(url: str, home: Path | None = None) -> str:
    """The Spark Connect session id every client of `url` from the Wire home `home` (default:
    WIRE_HOME or the checkout's .wire/) shares, so that each run — a new process under Dagster —
    reuses the session's Python workers: the server starts Python workers per session (a session's
    first Python job measured 0.86–1.25 s, the next ones 0.10–0.16 s, and 0.12 s for another
    process attaching to the same session), and Spark (4.3) keeps a session's Python daemon until
    the server stops (SPARK-54055), so a session per run would leave one more process on the
    server for every run.

    For the home's embedded server a function of the server (its pid and port: a restarted server
    gets a new id); for any other server, of its URL, the home and the session's generation there
    (`renew_session_id`: a server closes an idle session, and a closed id cannot be used again).
    Both also of this project's code (the size and modification time of every module of the
    package, so that Python workers started before an edit are not reused after it)."""
    import uuid

    base = Path(home or default_home())
    info = EmbeddedSpark(base / "spark").recorded()
    if info is not None and str(info["url"]).rstrip("/") == url.rstrip("/"):
        name = f"wire-spark:{info['pid']}:{info['port']}:{_code_digest()}"
    else:  # the URL's parameters (a token among them) are no part of it, nor written anywhere
        gen = _generations(base).get(_server(url), 0)
        name = f"wire-spark-remote:{_server(url)}:{base.resolve()}:{gen}:{_code_digest()}"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, name))


def _server(url: str) -> str:
    """A Spark Connect URL's server: `host:port`."""
    from urllib.parse import urlsplit

    parts = urlsplit(url.split(";", 1)[0])
    return f"{parts.hostname}:{parts.port or 15002}"


def renew_session_id(url: str, closed: str, home: Path | None = None) -> str | None:
    """The next shared session id of another server's clients after `closed` was closed on the
    server (None for the embedded server's, which closes none but by a client outside Wire): the
    home's generation for `url` moves on once, however many clients find it closed together."""
    base = Path(home or default_home())
    if shared_session_id(url, base) != closed:
        return shared_session_id(url, base)  # another client moved it on already
    info = EmbeddedSpark(base / "spark").recorded()
    if info is not None and str(info["url"]).rstrip("/") == url.rstrip("/"):
        return None
    gens = _generations(base)
    key = _server(url)
    gens[key] = gens.get(key, 0) + 1
    path = base / "spark" / _GENERATIONS
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(gens, sort_keys=True))
    os.replace(tmp, path)
    return shared_session_id(url, base)


#: Per Spark Connect server (URL) other than the embedded one, the generation of its shared session.
_GENERATIONS = "remote-sessions.json"


def _generations(home: Path) -> dict[str, int]:
    try:
        data = json.loads((home / "spark" / _GENERATIONS).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _code_digest() -> str:
    import hashlib

    code = hashlib.sha256()
    for f in sorted(Path(__file__).resolve().parent.glob("*.py")):
        st = f.stat()
        code.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return code.hexdigest()
