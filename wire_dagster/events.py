"""The events of a stream as Wire stores them (DESIGN §1 Streams): the chunk schema and its
column names, and the dead-letter schema of a chunk's malformed records.

The one definition of what a chunk's Parquet file holds: the producer (ingest.py writes it,
streams.py appends it) and the kernels that read it (kernel.py, bucketkernel.py) import the
column names and the schema from here, so a column cannot be renamed on one side only.
"""

from __future__ import annotations

import pyarrow as pa

from .spec import Pipeline, field_column

#: Normalized chunk columns (besides one column per payload field the pipeline uses).
TIME, KEY, ID, ROW = "_t", "_key", "_id", "_row"


def chunk_schema(spec: Pipeline) -> pa.Schema:
    """A chunk's columns: the event time, key, id and input row, then one column per payload field
    the pipeline's windows use (numbers as float64, distinct values as strings, gaps as int64)."""
    fields = [
        pa.field(TIME, pa.int64(), nullable=False),
        pa.field(KEY, pa.string()),
        pa.field(ID, pa.string()),
        pa.field(ROW, pa.int64(), nullable=False),
    ]
    fields += [pa.field(field_column(f), pa.float64()) for f in spec.numeric_fields]
    fields += [pa.field(field_column(f), pa.string()) for f in spec.distinct_fields if f not in spec.numeric_fields]
    fields += [pa.field(field_column(f), pa.int64()) for f in spec.gap_fields]
    # A field used both numerically and distinct is stored once, as a number.
    seen: set[str] = set()
    return pa.schema([f for f in fields if not (f.name in seen or seen.add(f.name))])


DLQ_SCHEMA = pa.schema([("row", pa.int64()), ("reason", pa.string()), ("record", pa.string())])
