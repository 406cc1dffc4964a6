"""The engine's settings from the environment: each knob is read and checked here, once, with its
default, so a bad value is one WireInputError naming the variable wherever the knob is used.

WIRE_KEEP_EPOCHS (committed epochs garbage collection keeps), WIRE_EPOCHS_PER_JOB (a backlog's
epochs one Spark job computes), WIRE_SINGLE_TASK_ROWS (the size up to which an epoch is one Spark
task), WIRE_COMPUTATION_EPOCH_ROWS and WIRE_COMPUTATION_EPOCH_BYTES (the input rows and stored
bytes an epoch of computations reads at most),
WIRE_DERIVED_BLOCK_FILES (the upstream files one task of a derived stage's recomputation owns),
WIRE_DRIVER_RESULT_BYTES (the bytes of a job's results that travel through Spark's driver).
An empty variable counts as unset (compose passes `VAR=` for "unset"). The Spark session's own
settings are in sparkconf.py / sparksession.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import WireInputError
from .sparkconf import env_value
from .spec import Pipeline

#: Default of WIRE_EPOCHS_PER_JOB: a backlog's epochs computed by one Spark job (one task), as far
#: as they fit one worker together (measured: benchmarks/kernel.py).
EPOCHS_PER_JOB = 8
#: Default of WIRE_SINGLE_TASK_ROWS (measured: benchmarks/kernel.py --single-task-rows).
SINGLE_TASK_ROWS = 2_000_000
#: Default of WIRE_COMPUTATION_EPOCH_ROWS: the input rows one epoch (and one Spark job) of a stage of
#: computations reads at most. NEXMark q7's pass-through of 9.2 M bids in one epoch ran a 4 GB
#: driver out of heap collecting what it produced (benchmarks/nexmark_queries.py --events 10M).
COMPUTATION_EPOCH_ROWS = 1_000_000
#: Default of WIRE_COMPUTATION_EPOCH_BYTES: the stored (Parquet, zstd) chunk bytes one epoch (and one
#: Spark job) of a stage of computations reads at most. Its results are one packed Arrow value per
#: table, at most 2 GB, held whole by the task and by Wire. NEXMark's bids pack to 5x their stored
#: bytes (14.9 B a bid stored, 74 B packed), so 32 MB leaves q7's 1 M-row epochs (15 MB) whole and
#: keeps an epoch of big records to some 160 MB of results (more for records that compress better).
COMPUTATION_EPOCH_BYTES = 32 << 20
#: Default of WIRE_DRIVER_RESULT_BYTES: the packed results of a Spark job that travel
#: through Spark's driver to Wire; the rest goes through the object store. The embedded server's
#: 2 GB driver took a task's 140 MB, hung on 300 MB and stopped its SparkContext on 450 MB; q7's
#: 1 M-bid epoch (74 MB) took 1.1 s longer through the store (benchmarks/results/HISTORY.md).
DRIVER_RESULT_BYTES = 128 << 20
#: Default of WIRE_DERIVED_BLOCK_FILES: a derived stage's recomputation over more upstream
#: partition files than this is split into Spark tasks by event time (derived._blocks).
DERIVED_BLOCK_FILES = 8


def count(name: str, value: int | None, default: int) -> int:
    """A count >= 1: `value`, else the environment variable `name`, else `default`."""
    raw = value if value is not None else os.environ.get(name) or default
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise WireInputError(f"{name}: expected an integer >= 1, got {raw!r}")
    return n


def keep_epochs(spec: Pipeline, value: int | None = None) -> int:
    """Committed epochs garbage collection keeps: `value` (a caller's explicit count, `wire gc
    --keep`), else WIRE_KEEP_EPOCHS, else the pipeline's `dagster.keep_epochs` (default 10)."""
    return count("WIRE_KEEP_EPOCHS", value, spec.orchestration.keep_epochs)


@dataclass(frozen=True)
class EpochBound:
    """What one epoch reads at most (whole chunks, at least one), and one Spark job computes:
    `rows` input rows and `bytes` of stored chunks."""

    rows: int
    bytes: int

    def over(self, rows: int, nbytes: int) -> bool:
        return rows > self.rows or nbytes > self.bytes


def epoch_bound(spec: Pipeline) -> EpochBound | None:
    """What one epoch of `spec` reads at most, and one Spark job computes: None (no bound but
    `max_chunks_per_epoch`) for windows, whose results are aggregates; for a stage of
    computations WIRE_COMPUTATION_EPOCH_ROWS (default COMPUTATION_EPOCH_ROWS) input rows and
    WIRE_COMPUTATION_EPOCH_BYTES (default COMPUTATION_EPOCH_BYTES) stored bytes: it holds each
    record of an epoch, and a job hands Wire what the records produced (the pass-through: every
    record) at once."""
    if not spec.computations:
        return None
    return EpochBound(
        count("WIRE_COMPUTATION_EPOCH_ROWS", None, COMPUTATION_EPOCH_ROWS),
        count("WIRE_COMPUTATION_EPOCH_BYTES", None, COMPUTATION_EPOCH_BYTES),
    )


def derived_block_files() -> int:
    """Upstream partition files one task of a derived stage's recomputation owns at most
    (WIRE_DERIVED_BLOCK_FILES, default DERIVED_BLOCK_FILES; 1: a task per upstream partition)."""
    return count("WIRE_DERIVED_BLOCK_FILES", None, DERIVED_BLOCK_FILES)


def driver_result_bytes() -> int:
    """The bytes of a Spark job's packed results (a stage of computations', a derived stage's
    recomputation) that reach Wire through Spark's driver, whose heap holds a job's results whole
    (WIRE_DRIVER_RESULT_BYTES, default DRIVER_RESULT_BYTES); each table beyond them reaches it
    through the object store (handover.py). A job of several tasks gives each an equal share."""
    return count("WIRE_DRIVER_RESULT_BYTES", None, DRIVER_RESULT_BYTES)


def epochs_per_job() -> int:
    """Most epochs one Spark job computes (WIRE_EPOCHS_PER_JOB, default EPOCHS_PER_JOB; 1: a job
    per epoch)."""
    return count("WIRE_EPOCHS_PER_JOB", None, EPOCHS_PER_JOB)


def single_task_rows() -> int:
    """An epoch whose events plus carried rows (window state, id memory) number at most this
    runs as one Spark task with no shuffle: a stage's fixed cost (scheduling, shuffle files, the
    hand-over to Python workers) outweighs parallelism for small epochs. WIRE_SINGLE_TASK_ROWS,
    default SINGLE_TASK_ROWS; 0 always distributes by key bucket."""
    raw = env_value("WIRE_SINGLE_TASK_ROWS")
    if raw is None:
        return SINGLE_TASK_ROWS
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise WireInputError(f"WIRE_SINGLE_TASK_ROWS: expected an integer >= 0, got {raw!r}")
    return n
