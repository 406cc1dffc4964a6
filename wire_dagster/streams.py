"""Streams on the object store (DESIGN §1): segments of gapless, immutable chunks.

Layout under the bucket::

    streams/<stream>/segments/<segment>/index/<seq:012d>.json   # the claim: chunk metadata
    streams/<stream>/segments/<segment>/data/<uuid>.parquet     # valid events, normalized
    streams/<stream>/segments/<segment>/data/<uuid>.dlq.parquet # malformed records of the chunk
    streams/<stream>/segments/<segment>/_SEALED                 # last sequence of a sealed segment
    streams/<stream>/_CLOSED                                    # the stream is closed: no new segment
    streams/<stream>/_STREAM.json                               # its time and id fields (first produce)

A chunk exists once its index object exists: data and dead letters are written
first under unique keys, then the index is created with create-if-absent, so two
producers never overwrite each other (the loser retries on the next sequence)
and a crash leaves at most an unreferenced data file, never a half-chunk (`wire gc` collects
those: `collect_orphans`).

A stream is shared (DESIGN §6): its chunks hold each record once, whole (events.RECORDS), with
the event time and id the stream declares once (`declare_stream`); every pipeline that reads it
makes its own events where it reads (extract.py).

This module is the stream's layout, claiming and reading; what a chunk holds is events.py,
how input records are checked is ingest.py.
"""

from __future__ import annotations

import io
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import ObjectExists, ObjectNotFound, WireInputError
from .events import EVENTS, ID, RAW, REC, RECORDS, ROW, TIME
from .ingest import InputFile, open_input
from .objectstore import ObjectStore
from .parquetio import parquet_bytes
from .spec import Pipeline, check_name
from .timeutil import now_ms


def stream_prefix(stream: str) -> str:
    return f"streams/{check_name(stream, 'stream')}/"


def segment_prefix(stream: str, segment: str) -> str:
    return f"{stream_prefix(stream)}segments/{check_name(segment, 'segment')}/"


def index_key(stream: str, segment: str, seq: int) -> str:
    return f"{segment_prefix(stream, segment)}index/{seq:012d}.json"


@dataclass(frozen=True)
class ChunkMeta:
    """One committed chunk: where its rows are and what the watermark needs to know."""

    stream: str
    segment: str
    seq: int
    data_key: str | None  # None when every record of the chunk was malformed
    dlq_key: str | None
    rows: int  # valid events
    malformed: int
    min_t: int | None
    max_t: int | None
    ingest_ms: int
    bytes: int
    format: int = EVENTS  # events.RECORDS for chunks of shared streams; EVENTS: one pipeline's events
    # An adopted object's (landing.py): its key, etag, size, last_modified_ms, and `hw`, the highest
    # key the segment had adopted with this chunk. None for a produced chunk.
    source: dict | None = None

    def to_json(self) -> dict:
        d = asdict(self)
        if d["source"] is None:
            del d["source"]  # a produced chunk's index, byte for byte as before
        return d

    @classmethod
    def from_json(cls, d: dict) -> ChunkMeta:
        return cls(**d)


@dataclass(frozen=True)
class ProduceReport:
    stream: str
    segment: str
    chunks: list[int]
    events: int
    malformed: int


# ---------------------------------------------------------------------------
# Appending


def _write_parquet(store: ObjectStore, key: str, table: pa.Table) -> int:
    data = parquet_bytes(table, distinct=(ID,))
    store.put(key, data)
    return len(data)


def last_seq(store: ObjectStore, stream: str, segment: str) -> int:
    """The highest claimed sequence of a segment, -1 if none (lists only the segment's index)."""
    last = -1
    for info in store.list(segment_prefix(stream, segment) + "index/"):
        last = max(last, int(info.key.rsplit("/", 1)[1].split(".")[0]))
    return last


def sealed_seq(store: ObjectStore, stream: str, segment: str) -> int | None:
    try:
        return int(json.loads(store.get(segment_prefix(stream, segment) + "_SEALED"))["last_seq"])
    except ObjectNotFound:
        return None


def closed_key(stream: str) -> str:
    return f"{stream_prefix(stream)}_CLOSED"


def _closed_error(stream: str, during: bool = False) -> WireInputError:
    when = "was closed during the append" if during else "is closed (wire close sealed its segments)"
    return WireInputError(
        f"stream {stream!r} {when}: its watermark is final (+inf) and never goes back, so its new "
        "events could only be late; produce to a new stream, or rewind its pipelines to an epoch before the close"
    )


def declaration_key(stream: str) -> str:
    return f"{stream_prefix(stream)}_STREAM.json"


def _declared(store: ObjectStore, stream: str) -> dict | None:
    try:
        return json.loads(store.get(declaration_key(stream)))
    except ObjectNotFound:
        return None


def _mismatch(spec: Pipeline, decl: dict) -> WireInputError:
    return WireInputError(
        f"pipeline {spec.name!r} reads stream {spec.stream!r} with time field {spec.time_field!r} and id "
        f"{spec.id_field!r}, but the stream's records have time field {decl.get('time')!r} and id "
        f"{decl.get('id')!r} (declared by its first produce); use the stream's own, or another stream"
    )


def declare_stream(store: ObjectStore, spec: Pipeline) -> None:
    """Declare the stream's time and id fields as `spec`'s (create-if-absent: the first producer
    declares them, for every reader); a pipeline with other ones is refused."""
    body = {"time": spec.time_field, "id": spec.id_field, "declared_ms": now_ms()}
    try:
        store.create_if_absent(declaration_key(spec.stream), json.dumps(body).encode())
    except ObjectExists:
        check_stream(store, spec)


def check_stream(store: ObjectStore, spec: Pipeline) -> None:
    """Refuse (one line naming both) a pipeline that reads a stream (each of its inputs') with
    another time or id field than the stream declares; a stream not yet declared accepts any."""
    for reader in spec.readers.values():
        decl = _declared(store, reader.stream)
        if decl is not None and (decl.get("time"), decl.get("id")) != (reader.time_field, reader.id_field):
            raise _mismatch(reader, decl)


def stream_fields(store: ObjectStore, stream: str) -> tuple[str, str | None] | None:
    """The (time, id) fields a stream declares; None for a stream not produced to yet."""
    decl = _declared(store, stream)
    return None if decl is None else (decl["time"], decl.get("id"))


def is_closed(store: ObjectStore, stream: str) -> bool:
    """Whether `wire close` closed the stream (its `_CLOSED` marker; a stream closed by a Wire
    without the marker has only its seals, which refuse its existing segments)."""
    return store.exists(closed_key(stream))


def append_chunk(
    store: ObjectStore,
    spec: Pipeline,
    segment: str,
    good: pa.Table,
    dlq: pa.Table,
    seq_hint: int | None = None,
    check_sealed: bool = True,
) -> ChunkMeta:
    """Write the chunk's files, then claim the next free sequence with create-if-absent (from
    `seq_hint`, the sequence after this producer's last chunk, else after the segment's last).

    A segment sealed before the claim is an error either way (checked after it); `check_sealed`
    also checks before anything is written, and refuses a closed stream. A producer's later
    chunks skip that first check: its previous chunk was checked after its claim, a moment
    before. A closed stream seals every segment it has, so only a new segment's first chunk can
    slip past a concurrent close: that claim checks the stream's `_CLOSED` marker after it."""
    import pyarrow.compute as pc

    seg_prefix = segment_prefix(spec.stream, segment)
    if check_sealed:
        if is_closed(store, spec.stream):
            raise _closed_error(spec.stream)
        if sealed_seq(store, spec.stream, segment) is not None:
            raise WireInputError(
                f"--segment: segment {segment!r} of stream {spec.stream!r} is sealed; use another segment"
            )
    uid = uuid.uuid4().hex
    data_key = dlq_key = None
    size = 0
    if good.num_rows:
        data_key = f"{seg_prefix}data/{uid}.parquet"
        size += _write_parquet(store, data_key, good)
    if dlq.num_rows:
        dlq_key = f"{seg_prefix}data/{uid}.dlq.parquet"
        size += _write_parquet(store, dlq_key, dlq)
    mm = pc.min_max(good[TIME]) if good.num_rows else None  # pyright: ignore[reportAttributeAccessIssue]  generated at import
    fmt = RECORDS if (RAW in good.column_names or REC in good.column_names) else EVENTS
    seq = seq_hint if seq_hint is not None else last_seq(store, spec.stream, segment) + 1
    while True:
        meta = ChunkMeta(
            stream=spec.stream,
            segment=segment,
            seq=seq,
            data_key=data_key,
            dlq_key=dlq_key,
            rows=good.num_rows,
            malformed=dlq.num_rows,
            min_t=mm["min"].as_py() if mm else None,
            max_t=mm["max"].as_py() if mm else None,
            ingest_ms=now_ms(),
            bytes=size,
            format=fmt,
        )
        try:
            store.create_if_absent(index_key(spec.stream, segment, seq), json.dumps(meta.to_json()).encode())
        except ObjectExists:
            seq += 1  # a concurrent producer took this sequence: take the next one
            continue
        sealed = sealed_seq(store, spec.stream, segment)
        if sealed is not None and seq > sealed:
            raise WireInputError(f"--segment: segment {segment!r} was sealed during the append; chunk {seq} is ignored")
        if seq == 0 and sealed is None and is_closed(store, spec.stream):
            # A segment begun as the stream closed: sealed here, so the stream stays closed
            # (W = +inf); the chunk's events are read as late, and so dead letters.
            seal_segment(store, spec.stream, segment, seq)
            raise _closed_error(spec.stream, during=True)
        return meta


def produce(
    store: ObjectStore,
    spec: Pipeline,
    path: Path,
    segment: str = "0",
    chunk_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ProduceReport:
    """Append the events of a JSONL or Parquet file to the pipeline's stream as chunks.

    Malformed records become dead letters of the chunk that holds their input
    range; bad input files (missing, unreadable, empty, corrupt) raise WireInputError
    before anything is written. The file is read a chunk at a time (`ingest.open_input`).
    """
    with open_input(Path(path)) as inp:
        return produce_input(store, spec, inp, segment, chunk_rows, progress)


def produce_input(
    store: ObjectStore,
    spec: Pipeline,
    inp: InputFile,
    segment: str = "0",
    chunk_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ProduceReport:
    """Append checked input (a file's, `ingest.open_input`, or records in memory,
    `ingest.records_input`) to the pipeline's stream as chunks: the one path of `wire produce`
    and `wire_dagster.produce`."""
    check_name(segment, "--segment")
    declare_stream(store, spec)
    return _append_input(store, spec, inp, segment, chunk_rows, progress)


def producer_spec(store: ObjectStore, stream: str, directory: Path) -> Pipeline:
    """What records produced to `stream` by name are checked against (`wire produce --stream`):
    its declared time and id (else those of the pipelines in `directory` that read it, which must
    agree), with the limits of its first reader there."""
    from .spec import readers_of, stream_spec

    readers = readers_of(stream, directory)
    declared = stream_fields(store, stream)
    if declared is None:
        kinds = {(r.time_field, r.id_field) for r in readers}
        if not kinds:
            raise WireInputError(
                f"--stream: stream {stream!r} is new and no pipeline in {str(directory)!r} reads it, "
                "so its time field is unknown; produce with --pipeline P once, or add a pipeline that reads it"
            )
        if len(kinds) > 1:
            raise WireInputError(
                f"--stream: the pipelines reading {stream!r} disagree on its time and id fields "
                f"({sorted(kinds, key=str)}); a stream has one of each"
            )
        declared = kinds.pop()
    return stream_spec(stream, declared[0], declared[1], readers[0] if readers else None)


def produce_files(
    store: ObjectStore,
    spec: Pipeline,
    files: list[tuple[Path, str]],
    chunk_rows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[ProduceReport]:
    """`produce` for several (file, segment) pairs in one call, one report per pair in their order.

    Every file is opened, and so checked, before anything is written: one bad file appends
    nothing. Checking a file is a pass over it that keeps only its row count (and a line index),
    so memory stays flat in the files' sizes; each file is read again as it is appended, and
    closed after it. The segments are appended side by side, one thread each (each waits mostly
    on the store); the files of one segment in their order.
    """
    for _, seg in files:
        check_name(seg, "--segment")
    with ExitStack() as opened:  # each file closed at the end, whatever happens
        inputs = [opened.enter_context(open_input(Path(p))) for p, _ in files]
        declare_stream(store, spec)
        total = sum(i.rows for i in inputs)
        done = [0] * len(files)
        lock = threading.Lock()

        def file_progress(i: int) -> Callable[[int, int], None]:
            def cb(rows: int, _total: int) -> None:
                with lock:
                    done[i] = rows
                    if progress:
                        progress(sum(done), total)

            return cb

        by_segment: dict[str, list[int]] = {}
        for i, (_, seg) in enumerate(files):
            by_segment.setdefault(seg, []).append(i)

        def one_segment(seg: str) -> list[tuple[int, ProduceReport]]:
            return [
                (i, _append_input(store, spec, inputs[i], seg, chunk_rows, file_progress(i))) for i in by_segment[seg]
            ]

        reports: list[ProduceReport | None] = [None] * len(files)
        with ThreadPoolExecutor(max_workers=len(by_segment)) as pool:
            for done_pairs in pool.map(one_segment, by_segment):
                for i, rep in done_pairs:
                    reports[i] = rep
        return [r for r in reports if r is not None]


def _append_input(
    store: ObjectStore,
    spec: Pipeline,
    inp: InputFile,
    segment: str,
    chunk_rows: int | None,
    progress: Callable[[int, int], None] | None,
) -> ProduceReport:
    ingest = now_ms()  # one upper time bound for the whole file
    n = chunk_rows or spec.chunk_rows
    metas: list[ChunkMeta] = []

    def done(meta: ChunkMeta, end: int) -> None:
        metas.append(meta)
        if progress:
            progress(end, inp.rows)

    # One chunk of input at a time: memory is about two chunks (and what `inp` reads ahead: one
    # Parquet batch or a few JSON lines), whatever the file's length. A chunk is `n` records, or
    # fewer when their bytes pass `spec.chunk_bytes` (one chunk is the least a Spark task of an
    # epoch reads: 60,000 records of 40 KB in one chunk took a Python worker past 12 GB).
    # While a chunk is written and claimed (in order, by one uploader thread), the next one is
    # validated; the sequence after the previous claim is tried first (no listing per chunk).
    with ThreadPoolExecutor(max_workers=1) as uploader:
        in_flight, lo, last = None, 0, None
        while lo < inp.rows:
            hi = inp.end_within(lo, min(lo + n, inp.rows), spec.chunk_bytes, last)
            last = hi - lo
            # The records that pass `spec`'s checks (a pipeline's: `wire produce --pipeline`; a stream's
            # own, time and id only: `--stream`), kept whole for every reader; rows relative to the chunk.
            good, dlq = inp.normalize(spec, lo, hi, ingest)
            good = records_chunk(inp, good, lo, hi)
            if in_flight is not None:
                done(in_flight.result(), lo)
            hint = metas[-1].seq + 1 if metas else None
            in_flight = uploader.submit(append_chunk, store, spec, segment, good, dlq, hint, check_sealed=not metas)
            lo = hi
        if in_flight is not None:
            done(in_flight.result(), lo)
    return ProduceReport(
        spec.stream, segment, [m.seq for m in metas], sum(m.rows for m in metas), sum(m.malformed for m in metas)
    )


def records_chunk(inp: InputFile, good: pa.Table, lo: int, hi: int) -> pa.Table:
    """A RECORDS chunk (events.py) of input records `[lo, hi)` that passed the stream's checks
    (`good`: their time, id and row): each record as given, a JSON line or its Parquet columns."""
    at = good[ROW].combine_chunks()
    cols = {TIME: good[TIME], ID: good[ID], ROW: good[ROW]}
    if inp.table is not None:
        t = inp.table(lo, hi).take(at)
        arrays = [c.combine_chunks() for c in t.columns]
        cols[REC] = pa.StructArray.from_arrays(arrays, fields=list(t.schema))
    else:
        cols[RAW] = inp.lines(lo, hi).take(at)
    return pa.table(cols)


def close_stream(store: ObjectStore, stream: Pipeline | str) -> dict[str, int]:
    """Close a stream (a pipeline's, or one named): its `_CLOSED` marker first (from then on no
    producer starts a segment), then seal every segment: no more chunks. Idempotent: a sealed
    segment keeps its seal."""
    name = stream if isinstance(stream, str) else stream.stream
    try:
        store.create_if_absent(closed_key(name), json.dumps({"closed_ms": now_ms()}).encode())
    except ObjectExists:
        pass  # closed before: the seals below are idempotent too
    return {seg: seal_segment(store, name, seg, last_seq(store, name, seg)) for seg in list_segments(store, name)}


def seal_segment(store: ObjectStore, stream: str, segment: str, last: int) -> int:
    """Seal a segment after chunk `last` (create-if-absent); the seal it has, if it had one."""
    try:
        store.create_if_absent(segment_prefix(stream, segment) + "_SEALED", json.dumps({"last_seq": last}).encode())
        return last
    except ObjectExists:
        sealed = sealed_seq(store, stream, segment)
        assert sealed is not None  # a seal is never deleted
        return sealed


# ---------------------------------------------------------------------------
# Reading


def list_segments(store: ObjectStore, stream: str) -> list[str]:
    prefix = stream_prefix(stream) + "segments/"
    return sorted(p[len(prefix) :].rstrip("/") for p in store.list_prefixes(prefix))


@dataclass(frozen=True)
class SegmentView:
    """What a reader sees of a segment beyond an offset: its new chunks and its seal."""

    segment: str
    chunks: list[ChunkMeta]
    sealed_at: int | None  # last sequence if sealed
    # The place of an input of several that has no segment yet and is not closed (`read_inputs`):
    # the pipeline's W waits for it (DESIGN §6: W is the minimum over the inputs).
    missing: bool = False


#: Chunk index objects read in this process, by (endpoint, bucket, key, ETag): a claimed chunk's
#: index never changes, and the listing's ETag names its content, so a reader of the stream (the
#: sensor, then the run in one `wire tick`; a backlog's jobs) reads each one once.
_INDEX_CACHE: OrderedDict[tuple[str, str, str, str], ChunkMeta] = OrderedDict()
_INDEX_CACHE_MAX = 100_000
_INDEX_LOCK = threading.Lock()
INDEX_READ_THREADS = 8  # index objects fetched side by side (each a small GET)


def _index_entries(store: ObjectStore, infos: list) -> list[ChunkMeta]:
    """The chunks of index objects `infos` (listing entries), from the cache or the store."""
    where = (store.cfg.endpoint, store.bucket)
    with _INDEX_LOCK:
        hits = {i.key: _INDEX_CACHE.get((*where, i.key, i.etag)) for i in infos if i.etag}
    missing = [i for i in infos if hits.get(i.key) is None]
    if missing:

        def read(info) -> ChunkMeta:
            return ChunkMeta.from_json(json.loads(store.get(info.key)))

        with ThreadPoolExecutor(max_workers=min(INDEX_READ_THREADS, len(missing))) as pool:
            fetched = dict(zip((i.key for i in missing), pool.map(read, missing), strict=True))
        with _INDEX_LOCK:
            for i in missing:
                if i.etag:
                    _INDEX_CACHE[(*where, i.key, i.etag)] = fetched[i.key]
            while len(_INDEX_CACHE) > _INDEX_CACHE_MAX:
                _INDEX_CACHE.popitem(last=False)
        hits.update(fetched)
    return [m for m in (hits[i.key] for i in infos) if m is not None]


def read_stream(store: ObjectStore, stream: str, offsets: dict[str, int]) -> dict[str, SegmentView]:
    """New chunks of every segment after the offset vector (next sequence to read).

    Lists only each segment's index after its offset (start-after), never the bucket.
    Stops at the first gap so the offset vector stays gapless. Index objects already read
    by this process are not read again (`_INDEX_CACHE`); the others are read side by side.
    """
    views = {}
    for seg in list_segments(store, stream):
        start = offsets.get(seg, 0)
        after = index_key(stream, seg, start - 1) if start > 0 else None
        sealed = sealed_seq(store, stream, seg)
        taken = []
        expect = start
        for info in store.list(segment_prefix(stream, seg) + "index/", start_after=after):
            seq = int(info.key.rsplit("/", 1)[1].split(".")[0])
            if seq != expect or (sealed is not None and seq > sealed):
                break
            taken.append(info)
            expect += 1
        views[seg] = SegmentView(seg, _index_entries(store, taken), sealed)
    return views


def views_from(views: dict[str, SegmentView], offsets: dict[str, int]) -> dict[str, SegmentView]:
    """One reading of the stream (`read_stream`) seen from later offsets: each segment's chunks
    from its new offset on, its seal as read — what `read_stream` at those offsets returns if
    nothing was appended since, without listing the store again."""
    return {
        seg: SegmentView(seg, [c for c in v.chunks if c.seq >= offsets.get(seg, 0)], v.sealed_at, v.missing)
        for seg, v in views.items()
    }


def read_inputs(store: ObjectStore, spec: Pipeline, offsets: dict[str, int]) -> dict[str, SegmentView]:
    """`read_stream` of every input of the pipeline from its offset vector: for a pipeline of one
    input, its stream's segments; for several, each input's segments named `<input>.<segment>`
    (their chunks too), and, for an input with no segment yet that is not closed, a `missing`
    view named `<input>.` that holds the pipeline's watermark back until it has one."""
    if not spec.inputs:
        return read_stream(store, spec.stream, offsets)
    out: dict[str, SegmentView] = {}
    for prefix, reader in spec.readers.items():
        own = {s[len(prefix) :]: o for s, o in offsets.items() if s.startswith(prefix)}
        views = read_stream(store, reader.stream, own)
        if not views and not is_closed(store, reader.stream):
            out[prefix] = SegmentView(prefix, [], None, missing=True)
        for seg, v in views.items():
            q = prefix + seg
            out[q] = SegmentView(q, [replace(c, segment=q) for c in v.chunks], v.sealed_at)
    return out


def collect_orphans(store: ObjectStore, stream: str, grace_s: float = 600.0) -> int:
    """Delete the chunk files no chunk's index names, as a `wire produce` or an adoption killed
    between writing a chunk's files and claiming its index leaves them (the claim is the commit);
    only files older than `grace_s`, since a running producer claims its files seconds after
    writing them. Returns how many went."""
    named = {k for v in read_stream(store, stream, {}).values() for c in v.chunks for k in (c.data_key, c.dlq_key) if k}
    cutoff = now_ms() - int(grace_s * 1000)
    doomed = [
        i.key
        for i in store.list(stream_prefix(stream) + "segments/")
        if "/data/" in i.key and i.key not in named and i.last_modified_ms < cutoff
    ]
    return store.delete_many(doomed)


def iter_dead_letters(store: ObjectStore, stream: str, views: dict[str, SegmentView] | None = None) -> Iterator[dict]:
    """Malformed records of every chunk, with their source position (and, for a chunk adopted
    from a landing prefix, the landed object's key: `object`). `views`: the stream as
    `read_stream(store, stream, {})` gives it, if the caller has it."""
    for seg, view in (views if views is not None else read_stream(store, stream, {})).items():
        for c in view.chunks:
            if not c.dlq_key:
                continue
            t = pq.read_table(io.BytesIO(store.get(c.dlq_key)))
            for r in t.to_pylist():
                yield {
                    "reason": r["reason"],
                    "record": r["record"],
                    "stream": stream,
                    "segment": seg,
                    "chunk": c.seq,
                    "row": r["row"],
                    "object": landed_key(c),
                }


def landed_key(chunk: ChunkMeta) -> str | None:
    """The key of the landed object a chunk was adopted from (landing.py); None for a produced one."""
    return (chunk.source or {}).get("key")
