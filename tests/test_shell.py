"""`wire shell`: many `wire` commands in one process, its Spark session kept between them.

Driven as a script drives it, through pipes: each command is written to its stdin and the
test waits for the command's `wire: exit <code>` line on stderr before the next. Checked
against independent expectations: the committed windows equal the plain batch aggregation
(tests/reference.py) after two produce + tick rounds; both ticks compute in the very JVM
`--warm` started before the first command (the shell's child processes, before and after); a bad command is its
one line and the next command still runs; `-v` holds for its own command only; `exit` ends
the shell before the lines after it; the shell's exit code is the last failed command's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest

from cli_setup import local_spark, pipeline_env
from reference import batch_of_clicks
from test_cli_tick import PIPELINE, make_events, parse_iso

STATUS = re.compile(r"^wire: exit (\d+) in [0-9.]+ s$")


class Shell:
    """A real `wire shell` in its own process group; `send` writes one command line and returns
    its exit code and the stderr lines it wrote before its status line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        exe = shutil.which("wire", path=str(Path(sys.executable).parent)) or "wire"
        self.proc = subprocess.Popen(
            [exe, "shell", *args],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.stdout: list[str] = []
        self._drain = threading.Thread(target=self._read_stdout, daemon=True)
        self._drain.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.append(line)

    def until_ready(self) -> None:
        """Until `--warm`'s ready line (a local JVM's own warnings may come before it)."""
        assert self.proc.stderr is not None
        seen = []
        for line in self.proc.stderr:
            if line.startswith("wire: ready in "):
                return
            seen.append(line)
        raise AssertionError(f"the shell ended (exit {self.proc.wait()}) before it was ready: {seen}")

    def until_status(self) -> tuple[int, list[str]]:
        assert self.proc.stderr is not None
        seen: list[str] = []
        for line in self.proc.stderr:
            m = STATUS.match(line.rstrip("\n"))
            if m:
                return int(m.group(1)), seen
            seen.append(line.rstrip("\n"))
        raise AssertionError(f"the shell ended (exit {self.proc.wait()}) without a status line; stderr: {seen}")

    def write(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def send(self, line: str) -> tuple[int, list[str]]:
        self.write(line)
        return self.until_status()

    def close(self, timeout: float = 120) -> tuple[int, str]:
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        rest = self.proc.stderr.read()
        code = self.proc.wait(timeout=timeout)
        self._drain.join(timeout=10)
        return code, rest

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def databases(self) -> list[str]:
        """The SQLite database files the shell has open (a path twice: two connections to it)."""
        return sorted(f.path for f in psutil.Process(self.proc.pid).open_files() if f.path.endswith(".db"))

    def jvms(self) -> set[int]:
        """The shell's descendant JVMs (a local Spark session's)."""
        kids = psutil.Process(self.proc.pid).children(recursive=True)
        return {p.pid for p in kids if "java" in (p.name() or "")}


def test_a_shell_ticks_twice_in_one_jvm_and_commits_what_separate_commands_do(store, cli_env, tmp_path: Path) -> None:
    # A local session (no spark_remote): its JVM is the shell's child, to be seen.
    (spec,), env, _, _ = pipeline_env(tmp_path, local_spark(cli_env), PIPELINE)
    events = make_events()
    half = len(events) // 2
    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "never.jsonl"]
    for f, evs in zip(files, (events[:half], events[half:], events[:1]), strict=True):
        f.write_text("".join(json.dumps(e) + "\n" for e in evs))

    sh = Shell(["--warm"], env)
    try:
        sh.until_ready()
        first_jvms = sh.jvms()
        assert len(first_jvms) == 1, first_jvms  # --warm: the local session is up before any command
        # ... and the modules a run imports late are in (the chart's: matplotlib's font library)
        assert any("matplotlib/ft2font" in m.path for m in psutil.Process(sh.proc.pid).memory_maps())
        assert sh.send(f"produce -p ticky --file {files[0]}")[0] == 0
        code, err = sh.send("wire tick --pipeline ticky")
        assert code == 0, err
        assert sh.jvms() == first_jvms  # the tick computed in it, and it is kept after the command
        dbs = sh.databases()
        assert dbs, "the tick's Dagster instance has no database open"
        assert sh.send(f"produce -p ticky --file '{files[1]}'  # the second half")[0] == 0
        assert sh.send("close -p ticky")[0] == 0
        code, err = sh.send("tick -p ticky")
        assert code == 0, err
        assert sh.jvms() == first_jvms  # computed in the JVM the first tick started
        # ... and in the Dagster instance the first tick used: the databases it had open are
        # open as often as before, not once more per command (each tick's own instance left
        # its index connection open: 2 -> 3 -> 4 handles of index.db over three ticks)
        again = Counter(sh.databases())
        assert all(again[db] == n for db, n in Counter(dbs).items()), (dbs, again)
        code, err = sh.send("tick -p nosuch")  # a bad command: its one line, the shell goes on
        assert code == 2 and len(err) == 1 and err[0].startswith("error: --pipeline: no pipeline named 'nosuch'"), err
        code, err = sh.send('status -p "ticky')
        assert code == 2 and err == ['error: No closing quotation: status -p "ticky'], err
        assert sh.send("shell") == (2, ["error: shell: a shell is already running"])
        for w in spec.windows:
            assert sh.send(f"read -p ticky --window {w.name} --format jsonl")[0] == 0
        sh.proc.stdin.write(f"exit\nproduce -p ticky --file {files[2]}\n")  # pyright: ignore[reportOptionalMemberAccess]
        code, rest = sh.close()
    finally:
        sh.kill()
    assert code == 2, rest  # the last failed command's (the nested shell)
    assert rest == "", rest  # nothing ran after `exit`: the produce after it wrote no status line

    rows = [json.loads(ln) for ln in sh.stdout if ln.startswith("{")]
    want = batch_of_clicks(spec, events)
    got_keys = sorted((r["key"], parse_iso(r["window_start"]), parse_iso(r["window_end"])) for r in rows)
    want_keys = sorted((r["key"], r["window_start"], r["window_end"]) for w in spec.windows for r in want[w.name])
    assert got_keys == want_keys
    assert sum(r["n"] for r in rows) == sum(r["n"] for w in spec.windows for r in want[w.name])


def test_a_command_cannot_leave_verbose_on_for_the_next(
    cli_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """In-process, through the CLI's own `main`: `-v` sets WIRE_DEBUG for its command only."""
    from wire_dagster import cli, shell

    monkeypatch.delenv("WIRE_DEBUG", raising=False)
    monkeypatch.setenv("WIRE_PIPELINES", str(tmp_path))
    seen: list[str | None] = []

    def main(argv: list[str]) -> int:
        code = cli.main(argv)
        seen.append(os.environ.get("WIRE_DEBUG"))
        return code

    import io

    err = io.StringIO()
    code = shell.run(main, ["-v status -p nosuch\n", "\n", "# a comment\n", "status -p nosuch\n"], err)
    assert code == 2
    assert seen == ["1", None]  # set during the -v command, gone before the next
    assert os.environ.get("WIRE_DEBUG") is None
    lines = [ln for ln in err.getvalue().splitlines() if STATUS.match(ln)]
    assert len(lines) == 2, err.getvalue()  # blank and comment lines are not commands


def test_sigterm_stops_the_running_tick_and_ends_the_shell(store, cli_env, spark_remote, tmp_path: Path) -> None:
    """A tick held before its commit marker (WIRE_PAUSE), the next command already written: SIGTERM
    to the shell stops the tick as it stops a `wire tick` (one line, its run failed, nothing
    committed) and ends the shell (143) within seconds, without running the next command."""
    from commit_scenario import subprocess_env, wait_for
    from test_tick_signals import NAME, STOP_S, closed_stream
    from wire_dagster.checkpoint import Checkpoints

    spec, pdir = closed_stream(store, tmp_path)
    pause = tmp_path / "pause"
    pause.mkdir()
    env = subprocess_env(
        cli_env,
        spark_remote,
        WIRE_PIPELINES=str(pdir),
        DAGSTER_HOME=str(tmp_path / "dagster-home"),
        WIRE_PAUSE="before-marker",
        WIRE_PAUSE_DIR=str(pause),
        WIRE_PAUSE_TIMEOUT="300",
    )
    sh = Shell([], env)
    try:
        sh.write(f"tick -p {NAME}")
        sh.write(f"close -p {NAME}  # never run: the shell ends first")
        wait_for(lambda: (pause / "before-marker.paused").exists(), 300, sh.proc, "the tick reached its commit")
        os.kill(sh.proc.pid, signal.SIGTERM)
        code = sh.proc.wait(timeout=STOP_S)
        assert sh.proc.stderr is not None
        err = [ln for ln in sh.proc.stderr.read().splitlines() if ln.strip()]
    finally:
        sh.kill()
    assert code == 143, err
    assert err[0].startswith(f"error: Interrupted: interrupted by SIGTERM during {NAME}:e1:"), err
    assert [ln for ln in err if STATUS.match(ln)] == [err[1]] and err[1].startswith("wire: exit 1 in "), err
    assert err[-1] == "wire: shell ended by SIGTERM", err
    assert Checkpoints(store, spec.name).latest() is None  # prepared, never committed


@pytest.mark.parametrize(
    ("interactive", "sig", "want", "goes_on"),
    [
        (False, "SIGTERM", 143, False),
        (False, "SIGINT", 130, False),
        (True, "SIGTERM", 143, False),
        (True, "SIGINT", 130, True),
    ],
)
def test_a_signal_during_a_command_ends_the_shell_unless_ctrl_c_on_a_terminal(
    interactive: bool, sig: str, want: int, goes_on: bool
) -> None:
    """In-process, a real signal to this process while a command runs: it stops the command
    (KeyboardInterrupt, exit 130); SIGTERM then ends the shell, and so does SIGINT from a pipe,
    while Ctrl-C on a terminal lets the shell go on to the next command."""
    import io

    from wire_dagster import shell

    ran: list[str] = []

    def main(argv: list[str]) -> int:
        ran.append(argv[0])
        if argv[0] == "first":
            os.kill(os.getpid(), getattr(signal, sig))
            time.sleep(30)  # interrupted long before
        return 0

    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    err = io.StringIO()
    code = shell.run(main, ["first\n", "second\n"], err, stops=shell.Stops(interactive))
    assert code == want, err.getvalue()
    assert ran == (["first", "second"] if goes_on else ["first"]), err.getvalue()  # 130: the failed command's
    assert "wire: exit 130 in " in err.getvalue()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # handlers put back
