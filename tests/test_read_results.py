"""Reading a window's results whole: sorted by key and window start, whatever their size."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wire_dagster.results import ONE_ARRAY_BYTES, sorted_rows

KEYS = [("key", "ascending"), ("window_start", "ascending")]
ROW_BYTES = 1 << 20  # a record of 1 MiB of text


def _chunk(first: int, n: int) -> pa.Table:
    """Rows `first..first+n`, keys descending as rows ascend, each row's text tagged with its row."""
    data = np.full(n * ROW_BYTES, ord("x"), np.uint8)
    for i in range(n):
        data[i * ROW_BYTES : i * ROW_BYTES + 8] = np.frombuffer(f"{first + i:08d}".encode(), np.uint8)
    offsets = np.arange(0, (n + 1) * ROW_BYTES, ROW_BYTES, dtype=np.int32)
    text = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))
    rows = range(first, first + n)
    return pa.table(
        {
            "key": pa.array([f"k{9999 - r:04d}" for r in rows]),
            "window_start": pa.array(list(rows), pa.int64()),
            "text": text,
        }
    )


def test_a_text_column_past_one_arrays_offsets_sorts_as_large_text() -> None:
    """2.2 GB of text in one column (two files' tables of 1.1 GB): Arrow's sort gathers a column
    into one array, whose 32-bit offsets overflow ("offset overflow while concatenating arrays");
    the read sorts it as `large_string`, every row's text unchanged, the small columns' types kept."""
    n = 1100
    t = pa.concat_tables([_chunk(0, n), _chunk(n, n)])
    assert t["text"].nbytes >= ONE_ARRAY_BYTES
    got = sorted_rows(t, KEYS)
    assert got.schema.field("text").type == pa.large_string()
    assert got.schema.field("key").type == pa.string() and got.schema.field("window_start").type == pa.int64()
    want = list(range(2 * n - 1, -1, -1))  # keys descend as rows ascend
    assert got["window_start"].to_pylist() == want
    tags = pc.utf8_slice_codeunits(got["text"], 0, 8).to_pylist()  # pyright: ignore[reportAttributeAccessIssue]
    assert tags == [f"{r:08d}" for r in want]
    assert pc.sum(pc.binary_length(got["text"])).as_py() == 2 * n * ROW_BYTES  # pyright: ignore[reportAttributeAccessIssue]


def test_results_of_ordinary_size_keep_their_types() -> None:
    t = pa.concat_tables([_chunk(0, 3), _chunk(3, 2)])
    got = sorted_rows(t, KEYS)
    assert got.schema == t.schema
    assert got["window_start"].to_pylist() == [4, 3, 2, 1, 0]
