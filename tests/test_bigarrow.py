"""Columns past one Arrow array's 2 GB (bigarrow.py): sorted, gathered and handed back whole."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import wire_dagster.bigarrow as ba
from wire_dagster.bigarrow import ONE_ARRAY_BYTES, in_chunks, one_array, sorted_rows

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


def test_a_text_column_past_one_arrays_offsets_sorts_and_keeps_its_type() -> None:
    """2.2 GB of text in one column (two files' tables of 1.1 GB), as `results.read_results` reads
    a window whole: Arrow's sort gathers a column into one array, whose 32-bit offsets overflow
    ("offset overflow while concatenating arrays"); sorted as `large_string`, it comes back as
    chunks of `string`, every row's text unchanged."""
    n = 1100
    t = pa.concat_tables([_chunk(0, n), _chunk(n, n)])
    assert t["text"].nbytes >= ONE_ARRAY_BYTES
    got = sorted_rows(t, KEYS)
    assert got.schema == t.schema and all(c.nbytes < ONE_ARRAY_BYTES for c in got["text"].chunks)
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


def test_one_array_then_in_chunks_round_trip_with_chunks_of_the_bound(monkeypatch) -> None:
    """`one_array` gathers parts of `string` and `large_string`; `in_chunks` cuts values back into
    chunks of at most CHUNK_BYTES (a longer value alone), nulls kept, order kept."""
    monkeypatch.setattr(ba, "CHUNK_BYTES", 10)
    a = pa.chunked_array([pa.array(["abc", None, "defgh"]), pa.array(["ij"])])
    b = pa.array(["0123456789012", "", "x"], pa.large_string())
    one = one_array([a, b], pa.string())
    assert one.type == pa.string() and one.to_pylist() == ["abc", None, "defgh", "ij", "0123456789012", "", "x"]
    got = in_chunks(pa.chunked_array([one.slice(0, 3), one.slice(3)]).cast(pa.large_string()), pa.string())
    assert got.type == pa.string() and got.to_pylist() == one.to_pylist()
    assert [c.to_pylist() for c in got.chunks] == [["abc", None, "defgh", "ij"], ["0123456789012"], ["", "x"]]


def test_an_output_partition_is_merged_through_sorted_rows(monkeypatch) -> None:
    """`computestage.merge_output` (an output partition's committed records plus an epoch's, every
    epoch) sorts through `sorted_rows`: with the bounds lowered to a few bytes, its record texts
    come back as `in_chunks`' chunks of `string`, in order. At c180226 a 2.3 GB partition of 40 KB
    records (benchmarks/big_records.py --spacing-ms 1) overflowed there on every run."""
    from wire_dagster.computestage import OUTPUT_SCHEMA, merge_output

    monkeypatch.setattr(ba, "ONE_ARRAY_BYTES", 50)
    monkeypatch.setattr(ba, "CHUNK_BYTES", 30)

    def rows(ids: list[int]) -> pa.Table:
        return pa.Table.from_pylist(
            [
                {"key": f"k{i % 3}", "window_start": i, "window_end": i + 1, "id": f"i{i}", "record": "r" * 10}
                for i in ids
            ],
            OUTPUT_SCHEMA,
        )

    got = merge_output(rows([5, 1, 3]), rows([4, 0, 2]))
    assert got.schema == OUTPUT_SCHEMA and got["record"].num_chunks > 1
    assert got["id"].to_pylist() == ["i0", "i3", "i1", "i4", "i2", "i5"]


def test_gather_takes_any_positions_and_hands_whole_chunks_back_uncopied(monkeypatch) -> None:
    """`gather` against indexing the values laid end to end: ascending, unordered, repeated and no
    positions, over chunks of `string` and `large_string`; a chunk every value of which is taken
    (positions ascending) comes back as the same buffers; past the bound, chunks of `string`."""
    a = pa.chunked_array([pa.array(["abc", None, "defgh"]), pa.array(["ij", "k"])])
    b = pa.array(["0123456789012", "", "x"], pa.large_string())
    flat = a.to_pylist() + b.to_pylist()
    rng = np.random.default_rng(7)
    cases = [list(range(8)), [0, 1, 2, 4, 7], [6, 0, 3, 3, 5], [], [2], list(rng.permutation(8))]
    cases += [sorted(rng.choice(8, 5, replace=False).tolist()) for _ in range(5)]
    for ix in cases:
        got = ba.gather([a, b], pa.array(ix, pa.int64()), pa.string())
        assert got.type == pa.string() and got.to_pylist() == [flat[i] for i in ix], ix
    whole = ba.gather([a, b], np.array([0, 1, 2, 4]), pa.string())
    assert whole.chunks[0].buffers()[2].address == a.chunks[0].buffers()[2].address
    monkeypatch.setattr(ba, "ONE_ARRAY_BYTES", 10)
    monkeypatch.setattr(ba, "CHUNK_BYTES", 10)
    got = ba.gather([a, b], np.array([7, 5, 0, 2]), pa.string())
    assert got.type == pa.string() and got.to_pylist() == ["x", "0123456789012", "abc", "defgh"]
    assert all(c.nbytes < 40 for c in got.chunks)
