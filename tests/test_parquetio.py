"""Wire's Parquet writer: every type reads back unchanged, with the encodings it promises."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wire_dagster.parquetio import parquet_bytes


def _table(n: int) -> pa.Table:
    return pa.table(
        {
            "_t": pa.array([1_767_225_600_000 + 37 * i for i in range(n)], pa.int64()),
            "_row": pa.array(list(range(n)), pa.int64()),
            "small": pa.array([i % 7 - 3 if i % 11 else None for i in range(n)], pa.int32()),
            "u": pa.array([2**63 + i for i in range(n)], pa.uint64()),
            "_key": pa.array([f"k{i % 5}" if i % 13 else None for i in range(n)], pa.string()),
            "_id": pa.array([f"e-{i}" for i in range(n)], pa.string()),
            "raw": pa.array([bytes([i % 256]) * (i % 4) for i in range(n)], pa.large_binary()),
            "f": pa.array([i / 3 if i % 5 else None for i in range(n)], pa.float64()),
            "b": pa.array([i % 2 == 0 for i in range(n)], pa.bool_()),
            "cat": pa.array([f"c{i % 3}" for i in range(n)], pa.string()).dictionary_encode(),
            "lst": pa.array([[i, i + 1] if i % 3 else [] for i in range(n)], pa.list_(pa.int64())),
            "st": pa.array(
                [{"a": i, "s": str(i)} for i in range(n)], pa.struct([("a", pa.int64()), ("s", pa.string())])
            ),
        }
    )


@pytest.mark.parametrize("n", [0, 1, 5_000])
def test_every_type_reads_back_unchanged(n):
    t = _table(n)
    back = pq.read_table(pa.BufferReader(parquet_bytes(t, distinct=("_id",))))
    assert back.schema == t.schema
    assert back.equals(t)


def _encodings(data: bytes) -> dict[str, set[str]]:
    md = pq.ParquetFile(pa.BufferReader(data)).metadata
    out: dict[str, set[str]] = {}
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            col = md.row_group(g).column(c)
            out.setdefault(col.path_in_schema, set()).update(col.encodings)
    return out


def test_integers_are_delta_strings_dictionary_distinct_strings_delta_length():
    enc = _encodings(parquet_bytes(_table(5_000), distinct=("_id",)))
    for c in ("_t", "_row", "small", "u"):
        assert "DELTA_BINARY_PACKED" in enc[c] and "RLE_DICTIONARY" not in enc[c], (c, enc[c])
    for c in ("_key", "raw", "cat"):
        assert "RLE_DICTIONARY" in enc[c], (c, enc[c])
    assert "DELTA_LENGTH_BYTE_ARRAY" in enc["_id"] and "RLE_DICTIONARY" not in enc["_id"]
    assert "RLE_DICTIONARY" not in enc["f"]
    # Without `distinct`, the id column is a string column like any other.
    assert "RLE_DICTIONARY" in _encodings(parquet_bytes(_table(5_000)))["_id"]


def test_same_table_same_bytes():
    # Staged results are compared by content hash (data versions): the writer is deterministic.
    t = _table(2_000)
    assert parquet_bytes(t, distinct=("_id",)) == parquet_bytes(t, distinct=("_id",))
