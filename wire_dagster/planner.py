"""What a watermark sensor asks for (DESIGN §1 Partitions), as a pure core function.

A partition P = [p_start, p_end) is *ready* when W >= p_end and *final* when
W >= p_end + allowed_lateness (partitions.py). The planner returns one request
per partition and epoch: for every committed epoch after the cursor, the
partitions it changed (or made ready); and for the pending chunks, epoch by
epoch as the next run will commit them (up to `max_epochs_per_run`, planned by
the engine's own planner, `reclock.plan_epochs`), the partitions each epoch
will make ready or that late data in it can change. `spans` makes them runs:
one per committed epoch over the range of its partitions, and one for the
whole backlog of pending epochs (the run that commits them all reports each
partition once), keyed by (pipeline, epochs, first, last partition), so one
tick never launches twice. The cursor holds the last committed epoch seen (it
moves only with commits) and the backlog run just requested: once its epochs
are committed, what they changed inside its range is not requested again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from . import partitions, reclock, windows
from .checkpoint import Checkpoints
from .objectstore import ObjectStore
from .spec import Pipeline
from .streams import check_stream, read_inputs
from .timeutil import NEG_INF, iso, now_ms


@dataclass(frozen=True)
class Request:
    epoch: int
    partition: int  # partition start, ms
    reason: str  # committed | ready | late | progress

    def run_key(self, pipeline: str) -> str:
        return run_key(pipeline, self.epoch, self.partition, self.partition)


def run_key(pipeline: str, epoch: int, first: int, last: int, last_epoch: int | None = None) -> str:
    """`<pipeline>:e<epoch>:<partition>` for one epoch and partition; `e<epoch>-<last epoch>` for
    the epochs of a backlog, `...:<first>..<last>` for a range of partitions."""
    epochs = f"e{epoch}" + (f"-{last_epoch}" if last_epoch is not None and last_epoch != epoch else "")
    return f"{pipeline}:{epochs}:{iso(first)}" + (f"..{iso(last)}" if last != first else "")


@dataclass(frozen=True)
class RunSpan:
    """One run: the epochs [epoch, last_epoch] it is for and the consecutive partitions
    [first, last] it reports (every one of them is ready once those epochs are committed: the
    requested ones are, and W is monotonic)."""

    epoch: int
    first: int
    last: int
    reasons: tuple[str, ...]
    last_epoch: int | None = None  # the last epoch of a backlog run (None: one epoch)

    @property
    def epochs(self) -> str:
        """`N`, or `N-M` for a backlog run."""
        return str(self.epoch) + (f"-{self.last_epoch}" if self.last_epoch not in (None, self.epoch) else "")

    def run_key(self, pipeline: str) -> str:
        return run_key(pipeline, self.epoch, self.first, self.last, self.last_epoch)


def _span(rs: list[Request]) -> RunSpan:
    first_epoch, last_epoch = min(r.epoch for r in rs), max(r.epoch for r in rs)
    return RunSpan(
        first_epoch,
        min(r.partition for r in rs),
        max(r.partition for r in rs),
        tuple(sorted({r.reason for r in rs})),
        last_epoch if last_epoch != first_epoch else None,
    )


def spans(requests: list[Request], pending_from: int | None = None) -> list[RunSpan]:
    """The runs of an evaluation: one per committed epoch, covering the range of its requested
    partitions; and one for every epoch from `pending_from` on (the backlog the next run
    commits in one go: it commits every pending epoch, then reports each partition of the
    range once), so a backlog of N epochs is one run, not N runs that mostly only report."""
    by: dict[int, list[Request]] = {}
    backlog = []
    for r in requests:
        if pending_from is not None and r.epoch >= pending_from:
            backlog.append(r)
        else:
            by.setdefault(r.epoch, []).append(r)
    return [_span(rs) for _, rs in sorted(by.items())] + ([_span(backlog)] if backlog else [])


@dataclass(frozen=True)
class Plan:
    requests: list[Request]
    cursor: str
    committed_epoch: int
    watermark: int
    predicted_watermark: int
    pending_chunks: int

    @property
    def runs(self) -> list[RunSpan]:
        return spans(self.requests, self.committed_epoch + 1)


def parse_cursor(cursor: str | None) -> int:
    """The last committed epoch the previous evaluation saw (0 for none)."""
    if not cursor:
        return 0
    return int(json.loads(cursor).get("epoch", 0))


def parse_planned(cursor: str | None) -> tuple[int, int, int] | None:
    """(last epoch, first partition, last partition) of the backlog run the previous evaluation
    requested, if any."""
    planned = json.loads(cursor).get("planned") if cursor else None
    return (int(planned["to"]), int(planned["first"]), int(planned["last"])) if planned else None


def _last_window_end(spec: Pipeline, t: int) -> int:
    """The latest end of any window an event at t belongs to (a session: its one-event
    window; sessions it merges with are found by the commit and requested after it)."""
    return max(windows.assign(w, t)[-1][1] for w in spec.windows)


def plan(store: ObjectStore, spec: Pipeline, cursor: str | None, now: int | None = None) -> Plan:
    cp = Checkpoints(store, spec.name)
    seen = parse_cursor(cursor)
    planned = parse_planned(cursor)
    latest = cp.latest()
    committed = latest.epoch if latest else 0
    reqs: dict[tuple[int, int], Request] = {}
    for n in range(seen + 1, committed + 1):
        if cp.marker(n) is None:
            continue
        m = latest if latest is not None and n == latest.epoch else cp.load(n)
        # A run is for a ready partition: a window that fired into a partition whose end W
        # has not reached yet is reported once the partition is ready.
        ready = {p for parts in m.changed.values() for p in parts if partitions.ready(spec, m.watermark, p)}
        if planned and m.kind == "process" and n <= planned[0] and all(planned[1] <= p <= planned[2] for p in ready):
            continue  # the backlog run the previous evaluation requested reports these
        for p in sorted(ready):
            reqs.setdefault((n, p), Request(n, p, "committed"))
    predicted = latest.watermark if latest else NEG_INF
    if spec.derived:  # the next epoch syncs to the upstreams' latest commits (derived.py)
        from .derived import predict

        nxt = predict(store, spec, latest)
        pending = 0 if nxt is None else 1
        if nxt is not None:
            d, parts = nxt
            for p in parts:
                reqs.setdefault((d.epoch, p), Request(d.epoch, p, "ready"))
            if not parts:
                p = partitions.newest_ready(spec, d.w_new)
                reqs[(d.epoch, p)] = Request(d.epoch, p, "progress")
            predicted = d.w_new
    else:
        check_stream(store, spec)
        views = read_inputs(store, spec, latest.remap if latest else {})
        pending = sum(len(v.chunks) for v in views.values())
        # The epochs the next run will commit (it commits up to max_epochs_per_run of them), planned
        # from chunk metadata alone (no Spark) by the engine's own planner: one request per epoch, so
        # that the partitions of every pending epoch are requested in this evaluation.
        now = now if now is not None else now_ms()
        limit = spec.orchestration.max_epochs_per_run
        for p in reclock.plan_epochs(spec, reclock.from_manifest(latest), views, now, limit):
            _request_epoch(spec, reqs, p.epoch, p.w_prev, p.clock, p.taken, bool(p.chunks) or p.replayed)
            predicted = p.clock.watermark
    ordered = sorted(reqs.values(), key=lambda r: (r.epoch, r.partition))
    # The cursor: the last committed epoch (it moves only with commits), and the backlog run
    # requested now, whose epochs the next evaluations then need not request again once committed.
    state: dict = {"epoch": committed}
    backlog = [r for r in ordered if r.epoch > committed]
    if backlog:
        state["planned"] = {
            "key": _span(backlog).run_key(spec.name),  # its run: if that fails, nothing reports these
            "to": max(r.epoch for r in backlog),
            "first": min(r.partition for r in backlog),
            "last": max(r.partition for r in backlog),
        }
    return Plan(ordered, json.dumps(state), committed, latest.watermark if latest else NEG_INF, predicted, pending)


def _request_epoch(spec: Pipeline, reqs: dict, nxt: int, w: int, clock, taken: dict, reads: bool) -> None:
    """The requests of one predicted epoch `nxt` that moves W from `w` to `clock.watermark`."""
    # (the engine also counts the open windows' starts in lo_t; they exist before a first finite
    # watermark only if every segment was idle until now: then the commit's request covers the rest)
    lo_t = min((c.min_t for cs in taken.values() for c in cs if c.min_t is not None), default=None)
    for p in partitions.became_ready(spec, w, clock.watermark, clock.max_t, lo_t):
        reqs.setdefault((nxt, p), Request(nxt, p, "ready"))
    # late data: pending events older than W can change ready-but-not-final partitions
    for chunks in taken.values():
        for c in chunks:
            if c.min_t is None or c.min_t >= w:
                continue
            lo = c.min_t
            # the last partition a late event of this chunk can change: the one holding
            # (end - 1) of the latest-ending window of an event at min(max_t, W - 1)
            hi = _last_window_end(spec, min(c.max_t, w - 1)) - 1
            for p in partitions.between(spec, lo, hi):
                if partitions.ready(spec, w, p) and not partitions.final(spec, w, p):
                    reqs.setdefault((nxt, p), Request(nxt, p, "late"))
    if reads and not any(r.epoch == nxt for r in reqs.values()):
        # The epoch reads chunks but makes no partition ready (partitions longer than an epoch's
        # budget of event time): a run must still commit it, or the watermark never reaches the
        # next partition end and the sensor waits forever. It reports the newest ready partition
        # (the first one before any is ready).
        p = partitions.newest_ready(spec, clock.watermark)
        reqs[(nxt, p)] = Request(nxt, p, "progress")
