"""`wire diff`: what changed in a pipeline's committed results between two epochs (DESIGN §3).

Each committed epoch's manifest names the full content of every window partition
(`outputs[window][partition]`, a staged Parquet file with its sha256). Two epochs are compared
partition by partition: a partition whose file has the same sha256 in both is identical and is
not read; the others are read on both sides and their rows compared by window identity
`(key, window_start, window_end)`: a row only in the later epoch is *added*, only in the earlier
one *removed*, in both with other aggregates *changed*.

Epoch 0 is the empty pipeline (before the first epoch). An epoch garbage collection deleted
cannot be compared: the error names `--keep` / WIRE_KEEP_EPOCHS, which keep more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .checkpoint import Checkpoints
from .errors import WireInputError
from .manifest import FileRef, Manifest
from .objectstore import ObjectStore
from .results import read_file
from .spec import Pipeline
from .status import describe_epoch
from .timeutil import iso

IDENTITY = ("key", "window_start", "window_end")

Ident = tuple[Any, int, int]


@dataclass
class WindowDiff:
    """One window's difference between two epochs; rows as `wire read --format jsonl` prints them."""

    window: str
    added: list[dict] = field(default_factory=list)
    removed: list[dict] = field(default_factory=list)
    changed: list[tuple[dict, dict]] = field(default_factory=list)  # (before, after), same identity
    unchanged: int = 0  # rows in both epochs with the same aggregates
    partitions: int = 0  # partitions whose content differs (the ones read)

    def counts(self) -> dict[str, int]:
        return {
            "added": len(self.added),
            "removed": len(self.removed),
            "changed": len(self.changed),
            "unchanged": self.unchanged,
            "partitions": self.partitions,
        }


@dataclass
class EpochDiff:
    pipeline: str
    from_epoch: int
    to_epoch: int
    from_manifest: Manifest | None
    to_manifest: Manifest | None
    windows: list[WindowDiff]

    def summary(self, m: Manifest | None, n: int) -> str:
        """`epoch 6 (W 2026-…Z; read segment a: chunk 3)` for one side."""
        if m is None:
            return f"epoch {n} (nothing committed)"
        return f"epoch {n} ({m.kind}, W {iso(m.watermark)}; {describe_epoch(m)})"

    def rows(self) -> list[dict]:
        """Every differing row, window by window (`--format jsonl`): the identity, the change and
        the aggregates `before` and/or `after`."""
        out = []
        for wd in self.windows:
            for r in wd.removed:
                out.append(_row(wd.window, "removed", r, r, None))
            for r in wd.added:
                out.append(_row(wd.window, "added", r, None, r))
            for a, b in wd.changed:
                out.append(_row(wd.window, "changed", b, a, b))
        return out


def _row(window: str, change: str, ident: dict, before: dict | None, after: dict | None) -> dict:
    row: dict[str, Any] = {"window": window, "change": change}
    row.update({c: (iso(ident[c]) if c != "key" else ident[c]) for c in IDENTITY})
    if before is not None:
        row["before"] = {k: v for k, v in before.items() if k not in IDENTITY}
    if after is not None:
        row["after"] = {k: v for k, v in after.items() if k not in IDENTITY}
    return row


def committed_epoch(cp: Checkpoints, n: int, flag: str) -> Manifest | None:
    """The committed manifest of epoch n (None for epoch 0, the empty pipeline); WireInputError
    (one line) for an epoch that does not exist, never committed, or was garbage-collected."""
    committed = cp.committed()
    last = committed[-1] if committed else 0
    if n < 0 or n > last:
        what = (
            f"the last committed epoch is {last}" if committed else f"pipeline {cp.pipeline!r} has no committed epoch"
        )
        raise WireInputError(f"{flag}: epoch {n} does not exist ({what})")
    if n == 0:
        return None
    if n not in committed:
        kept = f"{committed[0]}..{last}" if len(committed) > 1 else str(last)
        if n > committed[0]:
            raise WireInputError(f"{flag}: epoch {n} was never committed; kept epochs: {kept}")
        raise WireInputError(
            f"{flag}: epoch {n} was garbage-collected (kept epochs: {kept}); to compare older epochs keep more "
            "of them: WIRE_KEEP_EPOCHS or the pipeline's dagster.keep_epochs (and `wire gc --keep N`)"
        )
    return cp.load(n)


def _rows_by_identity(store: ObjectStore, ref: FileRef | None) -> dict[Ident, dict]:
    t = read_file(store, ref)
    if t is None:
        return {}
    return {(r["key"], r["window_start"], r["window_end"]): r for r in t.to_pylist()}


def diff_manifests(
    store: ObjectStore, spec: Pipeline, a: Manifest | None, b: Manifest | None, windows: list[str] | None = None
) -> list[WindowDiff]:
    """Per window (the pipeline's, then any other either manifest names), the rows of `b` against `a`."""
    out_a = a.outputs if a else {}
    out_b = b.outputs if b else {}
    names = [w.name for w in spec.windows]
    names += sorted((set(out_a) | set(out_b)) - set(names))
    if windows is not None:
        names = [w for w in names if w in set(windows)]
    result = []
    for name in names:
        pa_, pb = out_a.get(name, {}), out_b.get(name, {})
        wd = WindowDiff(name)
        before: dict[Ident, dict] = {}
        after: dict[Ident, dict] = {}
        for p in sorted(set(pa_) | set(pb), key=int):
            ra, rb = pa_.get(p), pb.get(p)
            if ra is not None and rb is not None and ra.sha256 == rb.sha256:
                wd.unchanged += rb.rows  # the same file: not read
                continue
            wd.partitions += 1
            before.update(_rows_by_identity(store, ra))
            after.update(_rows_by_identity(store, rb))
        for ident in sorted(set(before) | set(after), key=_order):
            x, y = before.get(ident), after.get(ident)
            if x is None:
                assert y is not None
                wd.added.append(y)
            elif y is None:
                wd.removed.append(x)
            elif x != y:
                wd.changed.append((x, y))
            else:
                wd.unchanged += 1
        result.append(wd)
    return result


def _order(ident: Ident) -> tuple[str, int, int]:
    return (str(ident[0]), ident[1], ident[2])


def diff_epochs(
    store: ObjectStore, spec: Pipeline, from_epoch: int, to_epoch: int, windows: list[str] | None = None
) -> EpochDiff:
    """The committed results of epoch `to_epoch` against those of `from_epoch` (either may be the
    earlier one), per window. WireInputError for an epoch that is not kept."""
    for w in windows or []:
        spec.window(w)
    cp = Checkpoints(store, spec.name)
    a = committed_epoch(cp, from_epoch, "--from-epoch")
    b = committed_epoch(cp, to_epoch, "--to-epoch")
    return EpochDiff(spec.name, from_epoch, to_epoch, a, b, diff_manifests(store, spec, a, b, windows))
