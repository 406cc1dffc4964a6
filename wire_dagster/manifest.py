"""The epoch manifest (DESIGN §3): what a committed epoch is — its schema, versioned and validated
on load — and the commit marker that names the winning attempt.

A manifest names every file of its epoch (outputs per window and partition, state, id memory,
dead letters) by key, content hash, rows and size, with the offsets, clocks and watermark the
epoch reached and the counts that must balance; checkpoint.py writes, fences, commits,
publishes and collects them, and everything else reads them through these types.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

MANIFEST_VERSION = 1


class FileRef(BaseModel):
    """A staged file a manifest points at, with what it must contain."""

    model_config = ConfigDict(frozen=True)
    key: str
    sha256: str
    rows: int
    bytes: int
    epoch: int  # the epoch that wrote it
    md5: str | None = None  # hex; an S3 ETag of a single PUT: checks a published copy from a listing


class SegmentRecord(BaseModel):
    model_config = ConfigDict(frozen=True)
    next_seq: int
    max_t: int
    last_ingest: int
    sealed_at: int | None = None


class Counts(BaseModel):
    """Conservation, per window: in == counted + late + other + duplicate + malformed + filtered
    (other: the events of the inputs a window with `input:` does not read)."""

    events_in: int = 0  # records read: valid events + malformed + filtered
    malformed: int = 0
    duplicate: int = 0
    filtered: int = 0  # records the pipeline's `where` is not true for
    counted: dict[str, int] = {}
    late: dict[str, int] = {}
    other: dict[str, int] = {}  # only windows that name an input have an entry

    def add(self, other: Counts) -> Counts:
        keys = set(self.counted) | set(other.counted)
        return Counts(
            events_in=self.events_in + other.events_in,
            malformed=self.malformed + other.malformed,
            duplicate=self.duplicate + other.duplicate,
            filtered=self.filtered + other.filtered,
            counted={k: self.counted.get(k, 0) + other.counted.get(k, 0) for k in sorted(keys)},
            late={k: self.late.get(k, 0) + other.late.get(k, 0) for k in sorted(keys)},
            other={k: self.other.get(k, 0) + other.other.get(k, 0) for k in sorted(set(self.other) | set(other.other))},
        )

    def balanced(self) -> bool:
        return all(
            self.events_in
            == self.counted.get(w, 0)
            + self.late.get(w, 0)
            + self.other.get(w, 0)
            + self.duplicate
            + self.malformed
            + self.filtered
            for w in self.counted
        )


class Manifest(BaseModel):
    """Everything epoch N committed; versioned and validated on load."""

    model_config = ConfigDict(frozen=True)
    version: Literal[1] = MANIFEST_VERSION
    pipeline: str
    epoch: int
    previous: int | None
    run_id: str
    kind: Literal["process", "rewind", "backfill"] = "process"
    rewound_to: int | None = None
    fingerprint: str
    config: dict
    remap: dict[str, int]
    segments: dict[str, SegmentRecord]
    segment_watermarks: dict[str, int]
    decisions: dict[str, str]
    watermark: int
    prev_watermark: int
    chunks: dict[str, list[int]] = {}  # segment -> [first, last] sequence read in this epoch
    outputs: dict[str, dict[str, FileRef]] = {}  # window -> partition start (ms, as str) -> full content
    changed: dict[str, list[int]] = {}  # window -> partitions whose content changed in this epoch
    state: dict[str, FileRef] = {}
    ids: FileRef | None = None
    dead_letters: list[FileRef] = []  # every committed epoch's late/duplicate letters, oldest first
    counts: Counts = Counts()  # this epoch
    totals: Counts = Counts()  # since epoch 0 (on this timeline)
    replay: list[dict] = []  # remaps/decisions still to replay after a rewind, oldest first
    # A pipeline of derived streams (derived.py): per input, the sha256 of each partition of the
    # upstream window it has read (its remap is the upstream's committed epoch per input).
    upstream: dict[str, dict[str, str]] = {}
    # ... and per input, per upstream partition, the dead letters of its content as this pipeline
    # reads it (records its checks refuse), until that partition's content changes.
    upstream_letters: dict[str, dict[str, FileRef]] = {}
    # ... and per input of its joins, the record fields read as numbers so far ("int64", "double"):
    # numbers win across epochs as within one, so a later epoch's text values there are null.
    join_numbers: dict[str, dict[str, str]] = {}
    # A pipeline of computations (computestage.py): per computation, the epoch's counters (records
    # delivered, timers fired, errors, produced, state keys) and its output watermark.
    computed: dict[str, dict[str, int]] = {}
    created_ms: int = 0

    def to_bytes(self) -> bytes:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=1).encode()

    def output_watermark(self) -> int:
        """The pipeline's output watermark after this epoch: W, or with computations the least of
        their output watermarks (min of W and each one's oldest pending timer, computestage.py)."""
        marks = [int(v.get("output_watermark", self.watermark)) for v in self.computed.values()]
        return min(marks, default=self.watermark)

    def letter_files(self) -> list[FileRef]:
        """Every dead-letter file the epoch names: its timeline's, then a derived stage's per input
        and upstream partition."""
        return [*self.dead_letters, *(f for parts in self.upstream_letters.values() for f in parts.values())]

    def files(self) -> list[FileRef]:
        out = [f for parts in self.outputs.values() for f in parts.values()]
        out += list(self.state.values()) + self.letter_files()
        if self.ids:
            out.append(self.ids)
        return out


@dataclass(frozen=True)
class Marker:
    run_id: str
    manifest: str
    sha256: str


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Step:
    """One processing epoch of a pipeline's timeline: what it read and the watermark it reached."""

    epoch: int
    remap: dict[str, int]
    watermark: int
