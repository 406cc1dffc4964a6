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


def one_line(e: BaseException) -> str:
    """An unexpected error as the one line a command prints for it: its class, then the first
    line of its message (the class again when it has none). `wire` and `wire shell` both."""
    msg = str(e).splitlines()[0] if str(e) else e.__class__.__name__
    return f"{e.__class__.__name__}: {msg}"
