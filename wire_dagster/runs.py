"""One Dagster run's work, as a plain function: commit what is pending, report a partition."""

from __future__ import annotations

from collections.abc import Callable

from .checkpoint import Checkpoints
from .engine import process
from .errors import CommitConflict
from .manifest import Manifest
from .objectstore import ObjectStore
from .spec import Pipeline
from .status import partition_report


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
                # Garbage collection keeps `settings.keep_epochs(spec)` epochs: WIRE_KEEP_EPOCHS, else the file's.
                out = process(store, spec, spark, max_epochs=spec.orchestration.max_epochs_per_run, progress=log)
                if log and out.repaired:
                    log(f"self-correction rewrote {len(out.repaired)} published files: {', '.join(out.repaired)}")
                break
            except CommitConflict as e:
                if log:
                    log(f"lost a commit race ({e}); retrying from the winner's epoch")
                if attempt == 2:
                    raise
    m = Checkpoints(store, spec.name).latest()
    return partition_report(spec, m, partition), m
