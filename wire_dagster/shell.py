"""`wire shell`: many `wire` commands in one long-lived process.

A `wire` command started as its own process pays for Python, the imports (Dagster, PySpark,
pandas), the pipeline file's Dagster definitions, the Dagster instance, the store's clients
and, for a command that computes, a Spark session (a local JVM, or attaching to a Spark
Connect server): about 2 s before a `wire tick` does anything, more than the work of a small
epoch. The shell pays them once and keeps them between commands, as `pyspark`'s shell keeps its
session: what Spark Structured Streaming users call a warm session.

Each line of input is one command as it follows `wire` (`tick -p clicks`, or with the `wire`
in front), split as a POSIX shell splits words (`shlex`); blank lines and `#` comments are
skipped. Every command runs as the `wire` CLI runs it (same checks, same output, same exit
codes) and ends with one line on stderr, `wire: exit <code> in <seconds> s`, which a script
driving the shell through a pipe waits for. On a terminal the shell prompts `wire> `.

What a command changes is undone before the next one: `-v` (WIRE_DEBUG) holds for its own
command only, and an error is its one line (-v: its trace) whatever the command, so one bad
command never ends the shell. The shell ends at the end of its input or on `exit`; its exit
code is the last failed command's (0 if none failed).

Signals, as a shell treats them: SIGTERM stops the running command as it stops on its own (a
tick within seconds, between database writes: sensors.runs.Signals) and ends the shell, exit
143, running nothing after it. SIGINT (Ctrl-C) on a terminal stops the running command, or
clears the line being typed, and the shell goes on; with commands from a pipe or a file it ends
the shell as SIGTERM does (130).
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO

from .errors import one_line

#: A command the shell refuses to run inside itself, each with the reason.
REFUSED = {
    "shell": "a shell is already running",
}

PROMPT = "wire> "


def parse(line: str) -> list[str] | None:
    """A command's arguments (without a leading `wire`), or None for a blank or comment line.
    ValueError for unbalanced quotes."""
    argv = shlex.split(line, comments=True)
    if argv and argv[0] == "wire":
        argv = argv[1:]
    return argv or None


def lines(stream: TextIO, prompt: bool, err: TextIO, stops: Stops | None = None) -> Iterator[str]:
    """The input's lines; on a terminal, each after the prompt. Ctrl-C at the prompt clears the
    line being typed, as a shell does; Ctrl-D ends the input; a signal that ends the shell
    (`stops`) is raised (KeyboardInterrupt) to `run`."""
    while True:
        if prompt:
            err.write(PROMPT)
            err.flush()
        try:
            line = stream.readline()
        except KeyboardInterrupt:
            if not prompt or (stops is not None and stops.signum is not None):
                raise
            err.write("\n")
            continue
        if not line:
            if prompt:
                err.write("\n")
            return
        yield line


class Stops:
    """The signals that end the shell (module doc): while installed, SIGTERM (and SIGINT unless
    `interactive`) is remembered and stops the running command (KeyboardInterrupt). A command
    that handles signals itself (a tick) puts these handlers back when it ends and reports the
    signal it took through `taken` (sensors.runs.Signals.last)."""

    def __init__(self, interactive: bool, taken: Callable[[], int | None] = lambda: None) -> None:
        self.interactive, self.taken = interactive, taken
        self.signum: int | None = None
        self._saved: list = []

    def _handler(self, signum, _frame) -> None:
        self.signum = signum
        raise KeyboardInterrupt

    def __enter__(self) -> Stops:
        if threading.current_thread() is threading.main_thread():
            sigs = [signal.SIGTERM] + ([] if self.interactive else [signal.SIGINT])
            self._saved = [(s, signal.signal(s, self._handler)) for s in sigs]
        return self

    def __exit__(self, *exc) -> None:
        for s, old in reversed(self._saved):
            signal.signal(s, old)
        self._saved = []

    def after_command(self) -> int | None:
        """The exit code that ends the shell after the command just run (128 + the signal), or None."""
        taken, self.signum = self.signum or self.taken(), None
        if taken == signal.SIGTERM or (taken is not None and not self.interactive):
            return 128 + taken
        return None


def run(
    main: Callable[[list[str]], int],
    inputs: Iterable[str],
    err: TextIO,
    setup: Callable[[], None] | None = None,
    stops: Stops | None = None,
) -> int:
    """Run each input line through `main` (the CLI's, which returns an exit code and prints its
    own one-line error); returns the last failed command's exit code, or 0, or 128 + the signal
    that ended the shell (`stops`, module doc). `setup` runs first (`wire shell --warm`: Spark
    and the definitions): its failure is the shell's one line and exit 1."""
    stops = stops or Stops(interactive=True)
    with stops:
        try:
            return _run(main, inputs, err, setup, stops)
        except KeyboardInterrupt:  # between commands (or in `setup`): a signal that ends the shell
            return _ended(err, stops.after_command() or 128 + signal.SIGINT)


def _ended(err: TextIO, code: int) -> int:
    err.write(f"wire: shell ended by {signal.Signals(code - 128).name}\n")
    err.flush()
    return code


def _run(main, inputs: Iterable[str], err: TextIO, setup, stops: Stops) -> int:
    if setup is not None:
        started = time.perf_counter()
        try:
            setup()
        except Exception as e:
            err.write(f"error: {one_line(e)}\n")
            return 1
        err.write(f"wire: ready in {time.perf_counter() - started:.2f} s\n")
        err.flush()
    failed = 0
    for line in inputs:
        try:
            argv = parse(line)
        except ValueError as e:
            err.write(f"error: {e}: {line.strip()}\n")
            failed = _status(err, 2, 0.0)
            continue
        if argv is None:
            continue
        if argv == ["exit"] or argv == ["quit"]:
            break
        if argv[0] in REFUSED:
            err.write(f"error: {argv[0]}: {REFUSED[argv[0]]}\n")
            failed = _status(err, 2, 0.0)
            continue
        code, seconds = command(main, argv, err)
        failed = _status(err, code, seconds) or failed
        ended = stops.after_command()
        if ended is not None:
            return _ended(err, ended)
    return failed


def command(main: Callable[[list[str]], int], argv: list[str], err: TextIO) -> tuple[int, float]:
    """One command in this process: its exit code and wall seconds. The environment variables a
    command sets for itself (`-v`: WIRE_DEBUG) are put back afterwards; an exception `main` lets
    through (it re-raises under -v) is printed, and its command failed with exit 1."""
    saved = os.environ.get("WIRE_DEBUG")
    started = time.perf_counter()
    try:
        code = main(argv)
    except KeyboardInterrupt:
        err.write("error: interrupted\n")
        code = 130
    except BaseException as e:  # SystemExit too: no command ends the shell
        if os.environ.get("WIRE_DEBUG"):
            traceback.print_exc(file=err)
        else:
            err.write(f"error: {one_line(e)}\n")
        code = 1 if not isinstance(e, SystemExit) or not isinstance(e.code, int) else e.code
    finally:
        if saved is None:
            os.environ.pop("WIRE_DEBUG", None)
        else:
            os.environ["WIRE_DEBUG"] = saved
    sys.stdout.flush()
    return code, time.perf_counter() - started


def _status(err: TextIO, code: int, seconds: float) -> int:
    err.write(f"wire: exit {code} in {seconds:.2f} s\n")
    err.flush()
    return code
