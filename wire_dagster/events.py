"""The events of a stream as Wire stores them (DESIGN §1 Streams, §6 shared streams): the chunk
formats and their column names, and the dead-letter schema of a chunk's malformed records.

The one definition of what a chunk's Parquet file holds: the producer (streams.py appends it)
and the readers (extract.py, kernel.py, bucketkernel.py) import the column names and schemas
from here, so a column cannot be renamed on one side only.

Two formats (`ChunkMeta.format`):

- RECORDS (2, what `wire produce` writes): the stream's records, each once, whole, for every
  pipeline that reads the stream: `_t` (event time), `_id`, `_row` (the record's line in the
  chunk's input), and the record as given — `_raw`, its JSON line, or `_rec`, a struct of its
  Parquet columns. Each pipeline extracts its key, filter, fields and values where it reads
  (extract.py), to the pipeline's event schema below.
- EVENTS (1, chunks of earlier versions): one pipeline's events, already in its event schema.
"""

from __future__ import annotations

import pyarrow as pa

from .spec import Pipeline, field_column

#: A pipeline's event columns (besides one column per payload field the pipeline uses).
TIME, KEY, ID, ROW = "_t", "_key", "_id", "_row"
#: Beside ROW, an event's source position: its (remap) segment and chunk; and a record's JSON
#: text (the bucket kernels', computestage.py's, passthrough.py's tables).
SEG, SEQ, JSON = "_seg", "_seq", "_json"
#: A RECORDS chunk's record, as a JSON line or as a struct of Parquet columns.
RAW, REC = "_raw", "_rec"
EVENTS, RECORDS = 1, 2  # chunk formats
#: Read with the events: why a record makes no event (null: it does — FILTERED, or a dead
#: letter's reason), and a dead letter's record text (extract.py, kernel.py, bucketkernel.py).
ERR, SRC = "_err", "_src"
FILTERED = "filtered"


def chunk_schema(spec: Pipeline) -> pa.Schema:
    """A pipeline's events (an EVENTS chunk's columns): the event time, key, id and input row, then
    one column per payload field the pipeline's windows use (numbers as float64, distinct values
    as strings, gaps as int64)."""
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
