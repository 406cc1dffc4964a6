"""Typed errors, one per failure kind (Delta/Iceberg style).

`WireInputError` is bad input or configuration: the CLI prints its one-line
message and exits 2. Everything else exits 1.
"""

from __future__ import annotations


class WireError(Exception):
    """Base of every error Wire raises on purpose."""


class WireInputError(WireError):
    """Bad input or configuration; the message is one line naming the field and the fix."""


class ObjectStoreError(WireError):
    """The object store failed or is unreachable (never a dead letter)."""


class SparkServerError(WireError):
    """The embedded Spark Connect server failed to start, answer or stop (see its log file)."""


class ObjectExists(WireError):
    """A create-if-absent PUT found the key already there (HTTP 412)."""

    def __init__(self, key: str):
        super().__init__(f"object already exists: {key}")
        self.key = key


class ObjectNotFound(WireError):
    def __init__(self, key: str):
        super().__init__(f"object not found: {key}")
        self.key = key


class CommitConflict(WireError):
    """Another run committed this epoch first: this attempt lost and had no visible effect."""


class CommitStateUnknown(WireError):
    """The commit marker PUT got no answer: the marker may or may not exist; check before retrying."""


class CorruptManifest(WireError):
    """A committed manifest failed validation."""


class InjectedFault(WireError):
    """Raised only in tests' fault-injection path (never in production)."""


def worker_cause(message: str) -> tuple[str, str] | None:
    """The exception a Spark Python worker raised, as (its class name, its message's first line),
    from the message PySpark gives the driver ("An exception was thrown from the Python worker:"
    and the worker's traceback, whose last unindented line is the exception); None for any other
    message. The first line alone names no cause."""
    lines = (message or "").splitlines()
    # the marker opens the message, or follows the class name (Dagster's record of an error)
    at = next((i for i, x in enumerate(lines[:3]) if "exception was thrown from the python worker" in x.lower()), None)
    if at is None:
        return None
    last = None
    for line in lines[at + 1 :]:
        if line.startswith("JVM stacktrace"):
            break
        if line.strip() and not line[0].isspace() and not line.startswith("Traceback"):
            last = line
    if last is None:
        return None
    head, sep, rest = last.partition(": ")
    if not sep or " " in head:
        return None
    return head.rpartition(".")[2], rest


def one_line(e: BaseException) -> str:
    """An unexpected error as the one line a command prints for it: its class, then the first
    line of its message (the class again when it has none); an error of a Spark Python worker,
    the worker's own exception (`worker_cause`). `wire` and `wire shell` both."""
    cause = worker_cause(str(e))
    if cause is not None:
        return f"{cause[0]}: {cause[1]}"
    msg = str(e).splitlines()[0] if str(e) else e.__class__.__name__
    return f"{e.__class__.__name__}: {msg}"
