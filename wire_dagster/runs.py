"""One Dagster run's work, as a plain function: commit what is pending, report a partition."""

from __future__ import annotations

from collections.abc import Callable

from .assetview import epoch_line
from .checkpoint import Checkpoints
from .engine import process
from .errors import CommitConflict, WireError
from .manifest import Manifest
from .objectstore import ObjectStore
from .spec import Pipeline
from .status import partition_report
from .timeutil import now_ms


def run_partition(
    store: ObjectStore,
    spec: Pipeline,
    spark,
    partition: int,
    *,
    process_pending: bool = True,
    log: Callable[[str], None] | None = None,
) -> tuple[dict, Manifest | None]:
    """Commit the pending epochs (bounded by the pipeline's budget), then report `partition`.

    Runs of a pipeline are serialized by Dagster, and fenced anyway: losing a commit
    race to a concurrent run just means re-reading the winner's epoch and going on.
    """
    if process_pending:
        for attempt in range(3):
            try:
                started = now_ms()
                # Garbage collection keeps `settings.keep_epochs(spec)` epochs: WIRE_KEEP_EPOCHS, else the file's.
                out = process(store, spec, spark, max_epochs=spec.orchestration.max_epochs_per_run, progress=log)
                if log and out.repaired:
                    log(f"self-correction rewrote {len(out.repaired)} published files: {', '.join(out.repaired)}")
                if log:
                    log_epochs(store, spec, out.committed, out.manifest, started, log)
                break
            except CommitConflict as e:
                if log:
                    log(f"lost a commit race ({e}); retrying from the winner's epoch")
                if attempt == 2:
                    raise
    m = Checkpoints(store, spec.name).latest()
    return partition_report(spec, m, partition), m


def log_epochs(
    store: ObjectStore,
    spec: Pipeline,
    committed: list[int],
    last: Manifest | None,
    started_ms: int,
    log: Callable[[str], None],
) -> None:
    """One line per epoch the call committed (a streaming query's progress): events in and where
    they went, rows written, rate, W, state size. The time of an epoch runs from the previous
    commit (the call's start for the first); epochs of one Spark job commit together, so their
    rate is the job's."""
    cp = Checkpoints(store, spec.name)
    prev, events = started_ms, 0
    for n in committed:
        try:
            m = last if last is not None and last.epoch == n else cp.load(n)
        except WireError:  # garbage collection kept fewer epochs than this call committed
            log(f"epoch {n} committed (its manifest is already garbage-collected: WIRE_KEEP_EPOCHS)")
            continue
        took = (m.created_ms - prev) / 1000 if m.created_ms and m.created_ms > prev else None
        log(epoch_line(m, took))
        prev, events = max(prev, m.created_ms), events + m.counts.events_in
    if len(committed) > 1:
        s = (now_ms() - started_ms) / 1000
        rate = events / s if s > 0 else 0
        log(f"{len(committed)} epochs committed: {events:,} events in {s:.2f} s ({rate:,.0f} events/s)")
