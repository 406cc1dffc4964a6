"""Process-group, port and wait helpers shared by the embedded servers (embedded.py,
sparkserver.py), the tests and the benchmarks.

Standard library only, so that reading a server's pid file stays cheap: Spark session
resolution (`sparksession.spark_target`) calls into here on every session it builds.
Nothing here signals a process by name: only by pid or process group.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

T = TypeVar("T")


def default_home() -> Path:
    """WIRE_HOME, else `<project root>/.wire` for a writable source checkout, else `~/.wire`."""
    env = os.environ.get("WIRE_HOME", "").strip()
    if env:
        return Path(env).expanduser().resolve()
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and os.access(root, os.W_OK):
        return root / ".wire"
    return Path.home() / ".wire"


def pid_alive(pid: int) -> bool:
    """True iff a process with this pid exists (possibly a zombie, or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cmdline(pid: int) -> list[bytes] | None:
    """The process's arguments (None where /proc is unavailable or the process is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None


def group_members(pgid: int) -> list[int] | None:
    """Pids in process group `pgid` that are not zombies (None where /proc is unavailable)."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat_line = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat_line[stat_line.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` runs; zombies (exited, not yet reaped) do not count."""
    members = group_members(pgid)
    if members:
        return True
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pgid, os.WNOHANG)  # only zombies left: reap the leader if it is our child
    if members is not None:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


@contextlib.contextmanager
def dir_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock on `directory`/.lock: serialises an embedded server's start and stop across
    the processes sharing its directory."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def wait_group_gone(pgid: int, timeout: float, reap: Callable[[], object] | None = None) -> bool:
    """Wait (bounded) until no process of group `pgid` runs; True if it is gone. `reap` is called
    on every check: a parent reaps its own child, so that its group can disappear."""
    deadline = time.monotonic() + timeout
    while True:
        if reap is not None:
            reap()
        if not group_alive(pgid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def kill_group(pgid: int, grace: float, reap: Callable[[], object] | None = None, note: Path | None = None) -> bool:
    """SIGTERM to process group `pgid`, SIGKILL after `grace` s (with a line in the log file `note`);
    True once no process of the group runs, False if it survived SIGKILL for 10 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    if wait_group_gone(pgid, grace, reap):
        return True
    if note is not None:
        with contextlib.suppress(OSError), open(note, "ab") as log:
            log.write(f"=== wire: still running {grace:.0f}s after SIGTERM: SIGKILL ===\n".encode())
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    return wait_group_gone(pgid, 10, reap)


class GroupOwner:
    """What the embedded servers share to lock their directory `dir` and stop a process group:
    `_proc` is the child this object launched (reaped while waiting, so that its group can
    disappear), `log_file` gets a line when SIGKILL is needed, and `_survived` is the error raised
    if the group outlives it."""

    dir: Path
    _proc: subprocess.Popen[bytes] | None
    log_file: Path
    _survived: ClassVar[Callable[[str], Exception]]
    _what: ClassVar[str]

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        """Serialise start/stop across processes sharing this server's directory."""
        return dir_lock(self.dir)

    def _reap(self) -> None:
        if self._proc is not None:
            self._proc.poll()

    def _wait_group_gone(self, pgid: int, timeout: float) -> bool:
        return wait_group_gone(pgid, timeout, self._reap)

    def _kill_group(self, pgid: int, grace: float) -> None:
        """SIGTERM to the group, SIGKILL after `grace` s; returns once no process of the group runs."""
        if not kill_group(pgid, grace, self._reap, self.log_file):
            raise type(self)._survived(f"{self._what}: process group {pgid} survived SIGKILL")


def port_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """True iff a TCP connection to host:port is accepted within `timeout` s."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_free(host: str, port: int) -> bool:
    """True iff `port` can be bound on `host` now (SO_REUSEADDR, as servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the kernel reports free on `host` now (bind to port 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until(
    cond: Callable[[], T | None],
    timeout: float,
    what: str,
    alive: Callable[[], str | None] = lambda: None,
    every: float = 0.5,
) -> T:
    """Poll `cond` until it returns something truthy (returned); TimeoutError naming `what` after
    `timeout` s, or at once when `alive()` reports a death (its message)."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        dead = alive()
        if dead:
            raise TimeoutError(f"{what}: {dead}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f}s")
        time.sleep(every)


@dataclass
class Proc:
    """A command in its own process group, its output to the file `log`; stopped by its group."""

    name: str
    cmd: list[str]
    env: dict[str, str]
    log: Path
    cwd: str | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                self.cmd,
                env=self.env,
                cwd=self.cwd,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def dead(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"{self.name} exited {self.proc.returncode}; log tail:\n{self.tail()}"
        return None

    def stop(self, grace: float = 30) -> list[int]:
        """SIGTERM the group, SIGKILL what is left after `grace` s; the pids still running (should be none)."""
        if self.proc is None:
            return []
        pgid = self.proc.pid
        kill_group(pgid, grace, self.proc.poll)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return group_members(pgid) or []
