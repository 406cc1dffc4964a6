"""What passes from a Spark task to Wire, or from one Spark job to the next, through the object
store instead of through Spark.

A Spark job's packed tables (bucketkernel.pack: one row per table) reach Wire through Spark's
driver, whose heap holds a job's results whole: the embedded server's 2 GB driver took one task's
140 MB, hung on 300 MB and stopped its SparkContext on 450 MB (benchmarks/results/HISTORY.md). An
epoch whose results do not fit would fail, or hang, the same way on every retry, since it is
planned again from the same chunks: its pipeline would be blocked. So a task hands its tables
through Spark while they fit its share of `settings.driver_result_bytes` and puts each one beyond
in the store (`Handover`); Wire reads and deletes them (`unpacked`). A stage of computations
(computestage.py), a derived stage's recomputation (derived.py) and the window kernel (kernel.py)
hand their results over so.

Such objects live under `scratch_prefix`: the staging of a run of its own that never commits.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from . import settings
from .bucketkernel import unpack
from .checkpoint import Checkpoints, new_run_id
from .errors import ObjectStoreError
from .faults import pause
from .objectstore import ObjectStore, S3Config


def scratch_prefix(store: ObjectStore, pipeline: str, what: str) -> str:
    """Where objects that only pass from a Spark task to Wire, or from one Spark job to the next,
    go: a job's results beyond the driver's room (`results`, Handover), a backfill's state between
    its jobs (`backfill-state`, computestage.recompute). The staging of a run of its own that
    never commits (`pipelines/<p>/staging/<run-id>/<what>/`): nothing else reads a staging it did
    not write (each call is a new run id), so an object a killed run leaves is inert, and garbage
    collection (`Checkpoints.gc`, run after every tick that commits, and by `wire gc`) deletes it
    as the staging of a run that never committed once it is older than the grace period."""
    return Checkpoints(store, pipeline).staging_prefix(new_run_id()) + f"{what}/"


@dataclass
class Handover:
    """How a task hands its packed tables to Wire: through Spark while their bytes fit `room`,
    each table beyond as an object of its own under `prefix` (`scratch_prefix`), its key in the
    row's `ref` and its `data` null. Called in the task, on each packed table it yields; the
    task's copy counts down its own room."""

    cfg: S3Config
    prefix: str
    room: int

    @classmethod
    def of_results(cls, store: ObjectStore, pipeline: str) -> Handover:
        """The hand-over of a Spark job's results for `pipeline`: the room through Spark is
        `settings.driver_result_bytes`, the rest goes under a new `results` scratch prefix."""
        return cls(store.cfg, scratch_prefix(store, pipeline, "results"), settings.driver_result_bytes())

    def share(self, tasks: int) -> Handover:
        """This room split among the `tasks` of one job (a job by key bucket, by block)."""
        return replace(self, room=self.room // max(1, tasks))

    def __call__(self, packed: pa.Table) -> pa.Table:
        sizes = pc.binary_length(packed["data"]).to_pylist()  # pyright: ignore[reportAttributeAccessIssue]  generated at import
        if sum(sizes) <= self.room:
            self.room -= sum(sizes)
            return packed
        store = ObjectStore(self.cfg)
        data, refs = packed["data"].to_pylist(), packed["ref"].to_pylist()
        for i, n in enumerate(sizes):
            if n <= self.room:
                self.room -= n
                continue
            refs[i] = f"{self.prefix}{uuid.uuid4().hex}.arrow"
            store.put(refs[i], data[i])
            data[i] = None
        packed = packed.set_column(packed.schema.get_field_index("data"), "data", pa.array(data, pa.binary()))
        return packed.set_column(packed.schema.get_field_index("ref"), "ref", pa.array(refs, pa.string()))


def unpacked(store: ObjectStore, packed: pa.Table, epochs: int = 1) -> list[dict[tuple[str, str], list[pa.Table]]]:
    """`bucketkernel.unpack` of a job's results, the tables handed over through the store read
    from there, then deleted (if the store fails first, garbage collection deletes them)."""
    pause("after-spark")
    refs = [r for r in packed["ref"].to_pylist() if r is not None]
    out = unpack(packed, epochs, store.get)
    if refs:
        try:
            store.delete_many(refs)
        except ObjectStoreError:
            pass
    return out
