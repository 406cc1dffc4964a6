"""Rewind (DESIGN §2 Determinism, §3): make a committed epoch current again, and record the epochs
after it as a replay, so that the engine's own epoch loop re-reads the same chunks in the same
epochs with the same idleness decisions and, with the same inputs, commits the same results.

Rewind commits one manifest and computes nothing: the replay itself is `engine.process`
(`reclock.plan_epoch` takes a replayed epoch's recorded chunks and decisions). A backfill
(backfill.py) replays the recorded timeline through the same epoch computation (`engine.compute`).
"""

from __future__ import annotations

from typing import Any

from .checkpoint import Checkpoints, new_run_id
from .errors import WireInputError
from .faults import fault
from .manifest import Manifest
from .objectstore import ObjectStore
from .spec import Pipeline
from .timeutil import NEG_INF, now_ms


def rewind(store: ObjectStore, spec: Pipeline, epoch: int, run_id: str | None = None) -> Manifest:
    """Make epoch N current again: a new epoch pointing at N's offsets, watermark, state and outputs.

    The epochs after N are recorded as a replay, so the next runs re-read the same
    chunks in the same epochs and, with the same inputs, commit the same results.
    """
    cp = Checkpoints(store, spec.name)
    cur = cp.latest()
    if cur is None:
        raise WireInputError(f"--epoch: pipeline {spec.name!r} has no committed epoch yet")
    if epoch < 0 or epoch > cur.epoch:
        raise WireInputError(f"--epoch: {epoch} is not a committed epoch (last is {cur.epoch})")
    if epoch == 0:
        target = None
    else:
        if cp.marker(epoch) is None:
            raise WireInputError(f"--epoch: epoch {epoch} is not kept any more (garbage-collected); choose a later one")
        target = cp.load(epoch)
        bad = cp.verify(target)
        if bad:
            raise WireInputError(f"--epoch: epoch {epoch} cannot be restored, {len(bad)} of its files are gone")
    replay = []
    for n in range(epoch + 1, cur.epoch + 1):
        if cp.marker(n) is None:
            continue
        m = cp.load(n)
        if m.kind == "rewind":
            replay = []  # an earlier rewind: its own timeline is what we replay
            continue
        replay.append({"remap": m.remap, "decisions": m.decisions})
    run_id = run_id or new_run_id()
    fault("during-rewind")
    base: dict[str, Any] = dict(
        pipeline=spec.name,
        epoch=cur.epoch + 1,
        previous=cur.epoch,
        run_id=run_id,
        kind="rewind",
        rewound_to=epoch,
        fingerprint=spec.fingerprint(),
        config=spec.model_dump(mode="json", exclude={"source"}),
        created_ms=now_ms(),
        replay=replay,
    )
    if target is None:
        m = Manifest(
            **base,
            remap={},
            segments={},
            segment_watermarks={},
            decisions={},
            watermark=NEG_INF,
            prev_watermark=cur.watermark,
        )
    else:
        m = Manifest(
            **base,
            remap=target.remap,
            segments=target.segments,
            segment_watermarks=target.segment_watermarks,
            decisions=target.decisions,
            watermark=target.watermark,
            prev_watermark=cur.watermark,
            outputs=target.outputs,
            state=target.state,
            ids=target.ids,
            dead_letters=target.dead_letters,
            totals=target.totals,
            upstream=target.upstream,
            upstream_letters=target.upstream_letters,
            join_numbers=target.join_numbers,
        )
    changed = {}
    for w in spec.windows:
        a = cur.outputs.get(w.name, {})
        b = m.outputs.get(w.name, {})
        diff = sorted(
            int(p) for p in set(a) | set(b) if (a[p].sha256 if p in a else None) != (b[p].sha256 if p in b else None)
        )
        if diff:
            changed[w.name] = diff
    m = m.model_copy(update={"changed": changed})
    cp.prepare(m)
    cp.commit(m)
    cp.publish(m)
    return m
