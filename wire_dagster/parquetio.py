"""How Wire writes its Parquet files (stream chunks, dead letters, staged results, state, ids).

One writer for all of them, with the encodings chosen per column type instead of pyarrow's
defaults (dictionary encoding for every column):

- strings and binaries: dictionary (keys, channels, URLs repeat), except the columns the caller
  names `distinct` (event ids: every value differs, so a dictionary only repeats the data):
  DELTA_LENGTH_BYTE_ARRAY;
- integers: DELTA_BINARY_PACKED, no dictionary. Event times, row numbers and ids are unique or
  nearly sorted: a dictionary of them overflows its page limit and falls back to plain after
  the work of building it. On a 50,000-row chunk of NEXMark bids this writes in a third of the
  time (13.1 -> 4.4 ms) and half the bytes (831 -> 416 kB), and reads no slower;
- everything else (floats, booleans, nested): plain.

zstd throughout. The file goes to an Arrow buffer, not a Python file object, so the write
holds no GIL while it encodes (several appends encode side by side).
"""

from __future__ import annotations

from collections.abc import Collection

import pyarrow as pa
import pyarrow.parquet as pq


def _dictionary(t: pa.DataType) -> bool:
    return (
        pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_dictionary(t)
    )


def parquet_bytes(table: pa.Table, distinct: Collection[str] = ()) -> bytes:
    """`table` as a Parquet file (see the module docstring for the encodings); `distinct`: string
    columns whose values are (nearly) all different."""
    fields = list(table.schema)
    dictionary = [f.name for f in fields if _dictionary(f.type) and f.name not in distinct]
    delta = {f.name: "DELTA_BINARY_PACKED" for f in fields if pa.types.is_integer(f.type)}
    delta |= {
        f.name: "DELTA_LENGTH_BYTE_ARRAY"
        for f in fields
        if f.name in distinct and _dictionary(f.type) and not pa.types.is_dictionary(f.type)
    }
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        use_dictionary=dictionary or False,  # pyright: ignore[reportArgumentType]  untyped: "bool or list" (its docs)
        column_encoding=delta or None,
    )
    return sink.getvalue().to_pybytes()
