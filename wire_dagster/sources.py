"""Events from Python (DESIGN §4 Sources): `wire_dagster.produce(name, records, segment=...)`.

Records in memory — a list of dicts, a pyarrow Table, a pandas DataFrame — become a stream's
chunks by the path of `wire produce` (streams.produce_input): the same checks, dead letters and
report, exactly-once claims per chunk. `name` is a pipeline (its stream, with its checks, as
`--pipeline`) or a stream (its own time and id checks only, as `--stream`). A retry after an
error appends the records again: the pipelines' id memory counts each id once.
"""

from __future__ import annotations

from .embedded import default_store
from .errors import WireInputError
from .ingest import records_input
from .objectstore import ObjectStore
from .spec import check_name, find_pipeline, pipelines_dir
from .streams import ProduceReport, produce_input, producer_spec


def produce(
    name: str,
    records: object,
    segment: str = "0",
    *,
    chunk_rows: int | None = None,
    store: ObjectStore | None = None,
) -> ProduceReport:
    """Append `records` to the stream of pipeline `name`, else to the stream `name`, in `segment`;
    the report says how many events and malformed records (dead letters) went in, in which
    chunks. Bad input (a container of another kind, no record, a bad name, a closed stream)
    raises WireInputError before anything is written."""
    check_name(name, "produce: name")
    inp = records_input(records)
    store = store or default_store()
    try:
        spec = find_pipeline(name)
    except WireInputError:
        spec = producer_spec(store, name, pipelines_dir())
    spec.own_stream("produce to")
    return produce_input(store, spec, inp, segment, chunk_rows)
