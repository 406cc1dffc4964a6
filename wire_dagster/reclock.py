"""Planning the next epochs from chunk metadata alone (DESIGN §1 Epochs, back-pressure; §2 replay).

An epoch is planned before anything is computed: which chunks it takes (at most
`max_chunks_per_epoch`, the segments kept aligned in event time — `watermark.select_chunks` — or,
after a rewind, exactly the chunks its recorded epoch took), and the watermark it reaches
(`watermark.advance`, with the recorded idleness decisions when replaying). `plan_epoch` is the
one place that decides it: the engine plans the epochs it computes with it, and the sensor's
prediction plans the epochs the next run will commit with it, so the two cannot drift.
`plan_job` groups a backlog's planned epochs into Spark jobs of one task.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import settings
from .errors import WireInputError
from .manifest import Manifest, SegmentRecord
from .objectstore import ObjectStore
from .spec import Pipeline
from .streams import ChunkMeta, SegmentView, read_inputs, views_from
from .timeutil import NEG_INF, iso, now_ms
from .watermark import EpochClock, SegmentClock, advance, select_chunks


@dataclass(frozen=True)
class From:
    """Where the next epoch starts: after the last committed epoch, or after an epoch planned
    before it (the fields of its manifest that planning reads)."""

    epoch: int  # the epoch before (0: none)
    offsets: dict[str, int]
    segments: dict[str, SegmentClock]
    watermark: int
    replay: tuple  # recorded epochs still to replay after a rewind


def from_manifest(prev: Manifest | None) -> From:
    """Where the epoch after committed manifest `prev` (None: no epoch yet) starts."""
    if prev is None:
        return From(0, {}, {}, NEG_INF, ())
    segs = {s: SegmentClock(**r.model_dump()) for s, r in prev.segments.items()}
    return From(prev.epoch, dict(prev.remap), segs, prev.watermark, tuple(prev.replay))


@dataclass(frozen=True)
class Planned:
    """One epoch as planned from chunk metadata alone, before Spark computes it."""

    epoch: int
    taken: dict[str, list[ChunkMeta]]
    chunks: list[ChunkMeta]
    clock: EpochClock
    w_prev: int
    replay: tuple  # the recorded epochs left to replay after this one
    replayed: bool  # whether this epoch replays a recorded one (after a rewind)

    def manifest_fields(self) -> dict:
        """What the epoch's manifest records of its reading and its clock (every engine that plans
        from streams commits these the same way: engine.py, computestage.py)."""
        c = self.clock
        return {
            "remap": c.remap,
            "segments": {s: SegmentRecord(**x.to_json()) for s, x in c.segments.items()},
            "segment_watermarks": c.segment_watermarks,
            "decisions": dict(c.decisions),
            "watermark": c.watermark,
            "prev_watermark": self.w_prev,
            "chunks": {s: [v[0].seq, v[-1].seq] for s, v in self.taken.items() if v},
        }

    def after(self) -> From:
        """Where the epoch after this one starts."""
        # through the manifest's record types, as the next epoch would read them back
        segs = {s: SegmentClock(**SegmentRecord(**c.to_json()).model_dump()) for s, c in self.clock.segments.items()}
        return From(self.epoch, self.clock.remap, segs, self.clock.watermark, self.replay)


def _taken_for_target(views: dict[str, SegmentView], target: dict[str, int]) -> dict[str, list[ChunkMeta]]:
    """The chunks a replayed epoch takes: every chunk before its recorded offsets `target`."""
    out = {}
    for s, v in views.items():
        out[s] = [c for c in v.chunks if c.seq < target.get(s, 0)]
        if out[s] and out[s][-1].seq != target.get(s, 0) - 1:
            raise WireInputError(f"replay of segment {s}: chunks up to {target[s]} are not all readable")
    return out


def plan_epoch(spec: Pipeline, base: From, views: dict[str, SegmentView], now: int | None) -> Planned | None:
    """The next epoch after `base` (None if nothing would change) given the stream's `views` from
    its offsets: its chunks (back-pressure, or a replayed epoch's recorded target) and its clock —
    chunk metadata only, nothing is computed. `now` (None: the clock's) decides idleness."""
    decisions = None
    if base.replay:
        taken = _taken_for_target(views, base.replay[0]["remap"])
        decisions = base.replay[0]["decisions"]
    else:
        taken = select_chunks(views, base.offsets, spec.max_chunks_per_epoch, settings.epoch_bound(spec))
    clock = advance(spec, base.segments, base.watermark, views, taken, now if now is not None else now_ms(), decisions)
    n_chunks = sum(len(v) for v in taken.values())
    if n_chunks == 0 and not base.replay and clock.watermark == base.watermark and clock.segments == base.segments:
        return None
    chunks = [c for s in sorted(taken) for c in taken[s]]
    return Planned(base.epoch + 1, taken, chunks, clock, base.watermark, tuple(base.replay[1:]), bool(base.replay))


def plan_epochs(
    spec: Pipeline, base: From, views: dict[str, SegmentView], now: int | None, limit: int
) -> list[Planned]:
    """Up to `limit` epochs after `base`, each planned by `plan_epoch` from one listing of the
    stream (`views`, read at `base`'s offsets) — the epochs a run of that many will commit if
    nothing is appended meanwhile."""
    out: list[Planned] = []
    while len(out) < limit:
        plan = plan_epoch(spec, base, views_from(views, base.offsets), now)
        if plan is None:
            break
        out.append(plan)
        base = plan.after()
    return out


def one_task(chunks: list[ChunkMeta], carried_rows: int) -> bool:
    """Whether an epoch runs as one Spark task with no shuffle: its events and carried rows
    (window state, id memory) number at most `settings.single_task_rows()`."""
    return sum(c.rows for c in chunks) + carried_rows <= settings.single_task_rows()


def job_length(epochs: list[list[ChunkMeta]], carried: int, bound: settings.EpochBound | None = None) -> int:
    """How many of the leading epochs (each given by its chunks) one Spark job computes, from
    state and id memory of `carried` rows: the first, and the ones after it while they fit one
    task together — at most `settings.epochs_per_job`, and each epoch's events with the next
    one's (the task reads an epoch's chunks while it computes the one before; it holds no other
    epoch's events) plus the carried rows at most `settings.single_task_rows`; with `bound`
    (`settings.epoch_bound`: a stage of computations, whose job hands Wire every epoch's
    produced rows at once) also the job's events and stored bytes together within it. An epoch
    too big for one task is a job of its own (computed by key bucket). The engine's backlog
    (`plan_job`) and a backfill's replay of the timeline group their epochs by this one rule."""
    n = rows = nbytes = 0
    while n < min(len(epochs), settings.epochs_per_job()):
        fits = one_task([*(epochs[n - 1] if n else []), *epochs[n]], carried)  # held together
        rows += sum(c.rows for c in epochs[n])
        nbytes += sum(c.bytes for c in epochs[n])
        if n and (not fits or (bound is not None and bound.over(rows, nbytes))):
            break
        n += 1
        if not fits:
            break
    return n


def plan_job(
    store: ObjectStore,
    spec: Pipeline,
    base: From,
    carried: int,
    now: int | None,
    limit: int,
    progress: Callable[[str], None] | None,
) -> list[Planned]:
    """The epochs one Spark job computes after `base` (the last epoch committed, or the last one
    the previous job computed), whose state and id memory hold `carried` rows: as many of the
    next epochs as `job_length` groups (a replayed epoch after a rewind is a job of its own; the
    job itself stops once its results reach `kernel.JOB_RESULT_BYTES`, and the epochs it leaves
    are planned again for the next job). Their chunks and watermarks depend on chunk metadata
    only, so they are planned before any is computed; each is still staged and committed on its
    own, in order, with the manifest it would have had alone. The stream is listed once per job:
    the later epochs see that listing from their offsets (`views_from`)."""
    planned: list[Planned] = []
    listed = read_inputs(store, spec, base.offsets)
    while len(planned) < min(limit, settings.epochs_per_job()):
        plan = plan_epoch(spec, base, views_from(listed, base.offsets), now)
        if plan is None or (planned and plan.replayed):
            break
        planned.append(plan)
        if plan.replayed:
            break
        base = plan.after()
    batch = planned[: job_length([p.chunks for p in planned], carried, settings.epoch_bound(spec))]
    if progress:
        for plan in batch:
            progress(
                f"epoch {plan.epoch}: {len(plan.chunks)} chunks, W {iso(plan.w_prev)} -> {iso(plan.clock.watermark)}"
            )
    return batch
