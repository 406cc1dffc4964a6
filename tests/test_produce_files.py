"""`wire produce` reads its files range by range (flat memory in the file's size) and still
writes what the whole-file path wrote: the same chunks, byte for byte, for awkward JSON lines
and for Parquet files of many row groups; a file corrupt in a middle row group appends nothing,
alone or after a good file in the same command; and no file stays open after a produce."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import run_wire
from wire_dagster import ingest, streams
from wire_dagster.errors import WireInputError
from wire_dagster.events import ID
from wire_dagster.extract import read_chunk
from wire_dagster.ingest import InputFile, records_input
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import Pipeline, load_pipeline

ROOT = Path(__file__).resolve().parent.parent
CLICKS = ROOT / "pipelines" / "clicks.yaml"
CHUNK = 97  # rows per chunk: divides neither the row groups, the batches nor the line index's stride


@pytest.fixture(scope="module")
def spec() -> Pipeline:
    return load_pipeline(CLICKS)


def _jsonl_bytes(spec: Pipeline, n: int) -> bytes:
    """n lines of every awkward kind, in a cycle: a BOM, CRLF and LF endings, blank and
    whitespace-only lines, a lone CR, a line that starts with BOM bytes mid-file, bad JSON,
    and a last line with no newline that ends in a CR."""
    kinds = [
        lambda i: b'{"ts": %d, "user_id": "u%d", "event_id": "e%d", "amount": 1.5}\n' % (spec.start + i, i % 5, i),
        lambda i: b'{"ts": %d, "user_id": "u%d", "event_id": "e%d"}\r\n' % (spec.start + i, i % 3, i),
        lambda i: b"\n",
        lambda i: b"  \t\r\n",
        lambda i: b"\r\n",
        lambda i: b"\xef\xbb\xbf" + b'{"ts": %d, "user_id": "b", "event_id": "b%d"}\n' % (spec.start + i, i),
        lambda i: b'{"ts": "late?", "user_id": "x"}\n',
        lambda i: b"not json at all\r\n",
    ]
    body = b"".join(kinds[(i * 7 + i // 3) % len(kinds)](i) for i in range(n - 1))
    return b"\xef\xbb\xbf" + body + b'{"ts": %d, "user_id": "last", "event_id": "z"}\r' % spec.start


def _old_lines(data: bytes) -> pa.LargeBinaryArray:
    """The lines the whole-file path gave, in plain Python: the file's BOM dropped, split at each
    newline (no line after a final one), one trailing CR dropped from each line."""
    data = data[3:] if data.startswith(b"\xef\xbb\xbf") else data
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    return pa.array([p[:-1] if p.endswith(b"\r") else p for p in parts], pa.large_binary())


def _chunks(store: ObjectStore, spec: Pipeline, segment: str) -> list[tuple]:
    """A segment's chunks as written: their counts and times and their data and dead-letter objects' bytes."""
    out = []
    for m in streams.read_stream(store, spec.stream, {})[segment].chunks:
        data = store.get(m.data_key) if m.data_key else None
        dlq = store.get(m.dlq_key) if m.dlq_key else None
        out.append((m.seq, m.rows, m.malformed, m.min_t, m.max_t, m.format, data, dlq))
    return out


@pytest.mark.parametrize("stride", [5, ingest.LINE_STRIDE])
def test_jsonl_chunks_equal_the_whole_file_paths(
    store: ObjectStore, spec: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stride: int
) -> None:
    """The line index at a tiny stride (a read starts and ends mid-index) and at its own."""
    monkeypatch.setattr(ingest, "LINE_STRIDE", stride)
    data = _jsonl_bytes(spec, 1500)
    f = tmp_path / "awkward.jsonl"
    f.write_bytes(data)
    expected = _old_lines(data)
    assert len(expected) == 1500

    streams.produce(store, spec, f, segment="file", chunk_rows=CHUNK)
    old = InputFile(len(expected), lambda lo, hi: expected.slice(lo, hi - lo))
    streams.produce_input(store, spec, old, segment="whole", chunk_rows=CHUNK)

    got, want = _chunks(store, spec, "file"), _chunks(store, spec, "whole")
    assert len(want) == -(-1500 // CHUNK)
    assert sum(c[2] for c in want) > 0 and sum(c[1] for c in want) > 0  # both events and dead letters
    assert got == want


@pytest.mark.parametrize("batch", [40, ingest._BATCH])
def test_parquet_chunks_equal_the_whole_table_paths(
    store: ObjectStore, spec: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    """Row groups of 230 rows read in batches smaller and larger than a chunk; nulls make dead letters."""
    monkeypatch.setattr(ingest, "_BATCH", batch)
    n = 1500
    table = pa.table(
        {
            "ts": pa.array([None if i % 41 == 0 else spec.start + 3 * i for i in range(n)], pa.int64()),
            "user_id": pa.array([None if i % 53 == 0 else f"u{i % 7}" for i in range(n)]),
            "event_id": pa.array([f"e{i}" for i in range(n)]),
            "amount": pa.array([i / 4 for i in range(n)], pa.float64()),
        }
    )
    f = tmp_path / "groups.parquet"
    pq.write_table(table, f, row_group_size=230)
    assert pq.ParquetFile(f).metadata.num_row_groups == 7

    streams.produce(store, spec, f, segment="file", chunk_rows=CHUNK)
    streams.produce_input(store, spec, records_input(pq.read_table(f)), segment="whole", chunk_rows=CHUNK)

    got, want = _chunks(store, spec, "file"), _chunks(store, spec, "whole")
    assert len(want) == -(-n // CHUNK)
    assert sum(c[2] for c in want) > 0 and sum(c[1] for c in want) > 0
    assert got == want


def _corrupt_middle_row_group(path: Path) -> None:
    """Overwrite the first column chunk of the middle row group (page header and data) with
    0xff bytes; the footer stays valid, so the file opens and its first row groups decode."""
    md = pq.ParquetFile(path).metadata
    col = md.row_group(md.num_row_groups // 2).column(0)
    raw = bytearray(path.read_bytes())
    start = col.data_page_offset if col.dictionary_page_offset is None else col.dictionary_page_offset
    raw[start : start + col.total_compressed_size] = b"\xff" * col.total_compressed_size
    path.write_bytes(bytes(raw))


def _clicks_parquet(spec: Pipeline, path: Path, n: int) -> Path:
    table = pa.table(
        {
            "ts": pa.array([spec.start + i for i in range(n)], pa.int64()),
            "user_id": pa.array([f"u{i % 3}" for i in range(n)]),
            "event_id": pa.array([f"{path.stem}{i}" for i in range(n)]),
            "amount": pa.array([float(i) for i in range(n)]),
        }
    )
    pq.write_table(table, path, row_group_size=200)
    return path


def test_a_parquet_file_corrupt_in_a_middle_row_group_appends_nothing(
    store: ObjectStore, spec: Pipeline, cli_env: dict[str, str], tmp_path: Path
) -> None:
    bad = _clicks_parquet(spec, tmp_path / "bad.parquet", 1000)
    _corrupt_middle_row_group(bad)
    first = pq.ParquetFile(bad).read_row_group(0)  # the footer and the first row group still read,
    assert first.num_rows == 200
    with pytest.raises(Exception):  # noqa: B017  (pyarrow raises one of several kinds)
        pq.read_table(bad)  # but the whole file does not
    good = _clicks_parquet(spec, tmp_path / "good.parquet", 500)

    runs = {
        "alone": ["--file", str(bad), "--chunk-rows", "50"],
        "after a good file": ["--file", str(good), "-s", "a", "--file", str(bad), "-s", "b", "--chunk-rows", "50"],
    }
    for name, args in runs.items():
        p = run_wire(["produce", "--pipeline", "clicks", *args], cli_env, timeout=120)
        assert p.returncode == 2, f"{name}: exit {p.returncode}, {p.stderr!r}"
        assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, f"{name}: {p.stderr!r}"
        assert str(bad) in p.stderr and "not a readable Parquet file" in p.stderr, f"{name}: {p.stderr!r}"
        for seg in ("0", "a", "b"):
            assert not store.exists(streams.index_key(spec.stream, seg, 0)), (name, seg)
        assert list(store.list(streams.stream_prefix(spec.stream))) == [], name
    # The same command without the corrupt file appends: the test's command line is not the cause.
    run_wire(["produce", "--pipeline", "clicks", "--file", str(good), "--chunk-rows", "50"], cli_env, check=True)
    assert len(streams.read_stream(store, spec.stream, {})["0"].chunks) == 10


def _open_files_under(d: Path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed between the listing and the readlink (the listing's own fd)
            continue
        if target.startswith(str(d)):
            out.append(target)
    return out


def test_no_input_file_stays_open(store: ObjectStore, spec: Pipeline, tmp_path: Path) -> None:
    """After produce_files of several files on two segments (threads), and after a produce that
    fails on its second file, no descriptor of this process points at an input file."""
    d = tmp_path / "in"
    d.mkdir()
    files = [_clicks_parquet(spec, d / f"p{i}.parquet", 450) for i in range(3)]
    jl = d / "j.jsonl"
    jl.write_bytes(_jsonl_bytes(spec, 300))
    pairs = [(files[0], "a"), (jl, "b"), (files[1], "a"), (files[2], "b")]
    reports = streams.produce_files(store, spec, pairs, chunk_rows=CHUNK)
    assert [r.events + r.malformed for r in reports] == [450, 300, 450, 450]
    assert _open_files_under(d) == []

    bad = _clicks_parquet(spec, d / "bad.parquet", 1000)
    _corrupt_middle_row_group(bad)
    with pytest.raises(WireInputError, match="bad.parquet"):
        streams.produce_files(store, spec, [(files[0], "c"), (bad, "d")], chunk_rows=CHUNK)
    assert _open_files_under(d) == []
    assert set(streams.read_stream(store, spec.stream, {})) == {"a", "b"}


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_chunk_holds_at_most_chunk_bytes_of_records(store: ObjectStore, tmp_path: Path, kind: str) -> None:
    """Records of 0 B to 6 KB of text, then one of 40 KB, under `limits.chunk_bytes` of 20,000:
    each chunk is the longest run of records from where the last ended (and at most `chunk_rows`)
    whose bytes stay within the limit (JSON: each line's text; Parquet: each row's Arrow values,
    its text plus an even share of the other columns), the 40 KB record a chunk of its own;
    every record lands once, in order."""
    spec = load_pipeline(CLICKS).model_copy(update={"chunk_rows": 9, "chunk_bytes": 20_000})
    rnd = random.Random(7)
    texts = ["x" * rnd.choice([0, 10, 900, 3_000, 6_000]) for _ in range(60)] + ["y" * 40_000, "z"]
    rows = [{"ts": spec.start + i, "user_id": f"u{i % 3}", "event_id": f"e{i}", "note": t} for i, t in enumerate(texts)]
    f = tmp_path / f"big.{kind}"
    if kind == "jsonl":
        lines = [json.dumps(r).encode() for r in rows]
        f.write_bytes(b"\n".join(lines) + b"\n")
        sizes = [len(b) for b in lines]
    else:
        table = pa.Table.from_pylist(rows)
        pq.write_table(table, f)
        share = sum(-(-c.nbytes // table.num_rows) for c in table.columns if not pa.types.is_string(c.type))
        sizes = [share + len(r["user_id"]) + len(r["event_id"]) + len(r["note"]) for r in rows]
    want, lo = [], 0
    while lo < len(sizes):  # the cuts, by brute force
        hi = lo + 1
        while hi < len(sizes) and hi - lo < 9 and sum(sizes[lo : hi + 1]) <= 20_000:
            hi += 1
        want.append(hi - lo)
        lo = hi
    assert 1 in want and 9 in want and len(set(want)) > 2  # the 40 KB record alone; cuts by rows and by bytes

    streams.produce(store, spec, f, segment="s")
    chunks = streams.read_stream(store, spec.stream, {})["s"].chunks
    assert [c.rows + c.malformed for c in chunks] == want
    got = [i for c in chunks for i in read_chunk(store, spec, c)[ID].to_pylist()]
    assert got == [r["event_id"] for r in rows]


def test_end_within_reads_ranges_that_grow_only_as_far_as_the_bytes_need() -> None:
    """`InputFile.end_within` gives the brute-force cut, reading from `lo` ranges of at most a few
    times `max_bytes` (or the first chunk's probe of PROBE_ROWS records), never the `hi - lo`
    records up to `chunk_rows` at once, with or without the last chunk's length as its guess."""
    rnd = random.Random(3)
    lines = pa.array([b"x" * rnd.randint(0, 3_000) for _ in range(5_000)], pa.large_binary())
    asked: list[tuple[int, int]] = []

    def read(lo: int, hi: int) -> pa.LargeBinaryArray:
        asked.append((lo, hi))
        return lines.slice(lo, hi - lo)

    inp = InputFile(len(lines), read)
    sizes = [len(b) for b in lines.to_pylist()]
    lo, guess = 0, None
    while lo < len(lines):
        hi = min(lo + 1_000, len(lines))
        want = lo + 1
        while want < hi and sum(sizes[lo : want + 1]) <= 20_000:
            want += 1
        asked.clear()
        end = inp.end_within(lo, hi, 20_000, guess)
        assert end == want
        assert all(a == lo for a, _ in asked)
        assert all(sum(sizes[a:b]) <= 4 * 20_000 or b - a <= ingest.PROBE_ROWS for a, b in asked), asked
        lo, guess = end, end - lo
