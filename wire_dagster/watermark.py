"""Watermarks (DESIGN §1): per segment, per stream, never regressing.

Bounded out-of-orderness (Flink): once an event with time T was read from a
segment, no event older than `T - max_out_of_orderness` is expected from it.
The stream watermark is the minimum over active segments; an idle segment does
not hold it back, a sealed and fully read segment counts as +inf, and a stream
whose segments are all sealed and read has W = +inf. Idle decisions use
processing time, so they are recorded (in the epoch manifest) and replayed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from .spec import Pipeline
from .streams import ChunkMeta, SegmentView
from .timeutil import INF, NEG_INF

if TYPE_CHECKING:
    from .settings import EpochBound


@dataclass(frozen=True)
class SegmentClock:
    """What an epoch remembers of a segment: where reading stopped and what it saw."""

    next_seq: int = 0
    max_t: int = NEG_INF
    last_ingest: int = NEG_INF
    sealed_at: int | None = None

    @property
    def fully_sealed(self) -> bool:
        return self.sealed_at is not None and self.next_seq > self.sealed_at

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EpochClock:
    """The outcome of reading one epoch: offsets, segment clocks, decisions and W."""

    segments: dict[str, SegmentClock]
    segment_watermarks: dict[str, int]
    decisions: dict[str, str]  # segment -> active | idle | sealed
    watermark: int

    @property
    def remap(self) -> dict[str, int]:
        return {s: c.next_seq for s, c in sorted(self.segments.items())}

    @property
    def max_t(self) -> int:
        """The newest event time read in any segment (-inf before any)."""
        return max([c.max_t for c in self.segments.values()] + [NEG_INF])


def select_chunks(
    views: dict[str, SegmentView], offsets: dict[str, int], budget: int, bound: EpochBound | None = None
) -> dict[str, list[ChunkMeta]]:
    """Back-pressure: at most `budget` chunks, and within `bound`'s rows and stored bytes unless
    one chunk alone is beyond them, the segments kept aligned in event time.

    The next chunk taken is always the segment head that starts earliest (`min_t`; a chunk
    with no valid event first), then the segment with fewer chunks taken so far, then the
    segment's name. Taking a fixed share per segment instead (round-robin from the first
    segment) lets one segment run ahead epoch after epoch: the watermark, the minimum over
    segments, stays with the slowest, and the window state of the events read ahead grows
    with the backlog (DESIGN §1: memory never grows with the backlog).
    """
    queues = {s: list(v.chunks) for s, v in sorted(views.items())}
    out: dict[str, list[ChunkMeta]] = {s: [] for s in queues}
    rows = nbytes = 0
    for n in range(budget):
        heads = [(q[0].min_t if q[0].min_t is not None else NEG_INF, len(out[s]), s) for s, q in queues.items() if q]
        if not heads:
            break
        s = min(heads)[2]
        head = queues[s][0]
        if n and bound is not None and bound.over(rows + head.rows, nbytes + head.bytes):
            break
        rows, nbytes = rows + head.rows, nbytes + head.bytes
        out[s].append(queues[s].pop(0))
    return out


def segment_watermark(spec: Pipeline, c: SegmentClock) -> int:
    if c.fully_sealed:
        return INF
    if spec.clock == "ingestion":
        return c.last_ingest - spec.max_event_time_lag if c.last_ingest > NEG_INF else NEG_INF
    return c.max_t - spec.max_out_of_orderness if c.max_t > NEG_INF else NEG_INF


def advance(
    spec: Pipeline,
    prev: dict[str, SegmentClock],
    prev_watermark: int,
    views: dict[str, SegmentView],
    taken: dict[str, list[ChunkMeta]],
    now: int,
    decisions: dict[str, str] | None = None,
) -> EpochClock:
    """The clocks after reading `taken`, and the stream watermark W_N = max(W_{N-1}, computed).

    `decisions`, when given (a replay), are used instead of deciding idleness from `now`.
    """
    segs: dict[str, SegmentClock] = dict(prev)
    waiting = sorted(s for s, v in views.items() if v.missing)
    for s, view in views.items():
        if view.missing:
            continue
        c = segs.get(s, SegmentClock())
        for ch in taken.get(s, []):
            c = replace(
                c,
                next_seq=ch.seq + 1,
                max_t=max(c.max_t, ch.max_t if ch.max_t is not None else NEG_INF),
                last_ingest=max(c.last_ingest, ch.ingest_ms),
            )
        segs[s] = replace(c, sealed_at=view.sealed_at)
    wms = {s: segment_watermark(spec, c) for s, c in segs.items()}
    if decisions is None:
        decisions = {}
        for s, c in segs.items():
            if c.fully_sealed:
                decisions[s] = "sealed"
            elif (
                not taken.get(s)
                and now - c.last_ingest >= spec.idle_timeout
                and not views.get(s, SegmentView(s, [], None)).chunks
            ):
                decisions[s] = "idle"
            else:
                decisions[s] = "active"
        decisions.update({s: "waiting" for s in waiting})
    active = [wms[s] for s, d in decisions.items() if d != "idle" and s in wms]
    if "waiting" in decisions.values():
        computed = NEG_INF  # an input with no segment yet: W waits for it (recorded, so replays agree)
    elif segs and all(d == "sealed" for d in decisions.values()):
        computed = INF
    elif active:
        computed = min(active)
    else:
        computed = NEG_INF  # every segment idle (or none yet): W does not move
    return EpochClock(segs, wms, dict(sorted(decisions.items())), max(prev_watermark, computed))
