"""Landing prefixes (DESIGN §4 Sources): objects other tools write into the bucket (Kafka Connect's
S3 sink, Firehose, Vector, an application with boto3), adopted into a stream exactly once.

```yaml
inputs:
  - name: clicks
    landing: topics/clicks/          # a prefix in the bucket
    segment_by: "partition=(\\d+)"   # optional: a regex on the name of a directory directly under
                                     #   the prefix; its group names the segment (default: one, "0")
    rescan: 5m                       # optional: how often a segment is listed whole (default 5m)
    time: ts
    id: event_id
    key: user_id
```

**Adoption is a copy, claimed like a produced chunk.** Each final object becomes the next chunk of
its segment: the object is read (JSON lines, gzip'd JSON lines or Parquet), checked as `wire produce
--stream` checks records (the stream's time and id; each pipeline's own checks happen where it
reads, extract.py), written as a RECORDS chunk, and the chunk's index is created with
create-if-absent (streams.py), recording the object's key, ETag, size and write time (`source`).
The index claim is the one exactly-once point, as for produced chunks: two adopters that race for
sequence N both try the same object there (both adopt in key order after the same last key); the
loser reads N back, finds its object (done) or another one (it reloads and goes on after it).
Exactly once, because an adopter claims N only knowing indices 0..N-1 (read, or claimed by itself)
and only for an object none of them holds: the incremental pass takes keys after the last `hw`,
the rescan checks all of them. A kill before the claim leaves at most an unreferenced data file;
after it, the object is adopted. One object is one chunk (`limits.chunk_rows` and `chunk_bytes` do not split it).
A copy, not a reference: the planner and the watermark work from chunk metadata alone (min/max
event time, rows), so adoption reads the object once anyway; by reference the executors would read
it a second time, in a format of their own, and a rewrite of the object after adoption would
change what an epoch replays. So: determinism and one reader path, for double storage.

**Incremental listing.** Each index also records `hw`, the highest key its segment has adopted.
An evaluation lists each segment after `hw` (S3's StartAfter, server side): when nothing
landed it costs one listing per segment (plus the segment's index listing), never a scan of the
prefix. Keys are adopted in byte order within a segment, as writers number them (Kafka Connect's
zero-padded offsets sort).

Back-pressure: an evaluation adopts at most MAX_OBJECTS_PER_SEGMENT objects per segment and
stops claiming after ADOPT_SECONDS; the next evaluation goes on (`wire close` loops until done).

**Late flushes and rewrites.** A key that lands sorting before `hw` (a writer whose names do not
sort, a late flush) is not seen by the incremental listing: every `rescan` (the last one's time
per segment in `streams/<s>/_LANDING.json`; always at `wire close`) the segment is listed whole,
before the incremental pass, and compared with what its chunks adopted: an unadopted final object
is adopted then (as the next chunk, out of key order: its events may be late, which the
watermark and lateness rules handle), and an adopted one whose ETag changed is reported, once per
new ETag, under `streams/<s>/segments/<seg>/changed/` (`wire status`, the sensor's observation),
never adopted again. A writer whose names do not sort therefore waits up to `rescan` for some
objects: set it low for such writers (each rescan is one full listing of the segment).

**Skipped until final**: a key with a path part starting with `_` or `.` (Hadoop's `_temporary/`,
`_SUCCESS`), or ending in `.tmp`, `.temp`, `.part`, `.inprogress`, `.crc`; an empty (0-byte)
object (adopted if it is later written with content). An object whose records are all malformed
is a chunk of dead letters; the segment goes on. Adoption stops at a sealed segment
(`wire close` adopts what landed, rescanning, then seals).

Ingestion time (PDP-26): an adopted chunk's `ingest_ms` is the object's write time
(LastModified, the writer-side clock), so `watermark: {clock: ingestion}` follows the objects'
write times.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import time
import uuid
import zlib
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import ObjectExists, ObjectNotFound
from .events import DLQ_SCHEMA, RECORDS, TIME
from .ingest import InputFile, _split_lines, parquet_to_lines
from .objectstore import ObjectStore
from .parquetio import parquet_bytes
from .spec import NAME_RE, Pipeline
from .streams import (
    ChunkMeta,
    _index_entries,
    declare_stream,
    index_key,
    is_closed,
    records_chunk,
    sealed_seq,
    segment_prefix,
    stream_prefix,
)
from .timeutil import NEG_INF, now_ms

DEFAULT_SEGMENT = "0"
DEFAULT_RESCAN_MS = 300_000
TEMP_SUFFIXES = (".tmp", ".temp", ".part", ".inprogress", ".crc")
#: Objects one evaluation adopts per segment at most (back-pressure: a sensor evaluation stays
#: short; the rest is adopted by the next one).
MAX_OBJECTS_PER_SEGMENT = 500
#: ... and for this long at most (Dagster's sensor evaluations time out after 60 s by default).
ADOPT_SECONDS = 20.0


def landing_readers(spec: Pipeline) -> list[Pipeline]:
    """How the pipeline reads each of its inputs that has a landing prefix (one per input)."""
    return [r for r in spec.readers.values() if r.landing]


def is_final(rel: str) -> bool:
    """Whether a key (relative to the landing prefix) names a final object, not a temporary one."""
    parts = rel.split("/")
    return not any(p.startswith(("_", ".")) for p in parts) and not rel.lower().endswith(TEMP_SUFFIXES)


# ---------------------------------------------------------------------------
# Listing


def discover(store: ObjectStore, reader: Pipeline) -> tuple[dict[str, str], list[str]]:
    """The segments of a landing prefix, {segment: listing prefix}, and the keys or directories
    that name none (directly under the prefix with segment_by set, a name the regex does not
    match or that is not a segment name, a second directory for one segment). One request."""
    landing = reader.landing
    assert landing is not None
    if not reader.segment_by:
        return {DEFAULT_SEGMENT: landing}, []
    rx = re.compile(reader.segment_by)
    segs: dict[str, str] = {}
    other: list[str] = []
    keys, prefixes = store.list_level(landing)
    other += keys
    for prefix in prefixes:
        name = prefix[len(landing) :].rstrip("/")
        m = rx.search(name) if is_final(name) else None
        seg = (m.group(1) if rx.groups else m.group(0)) if m else None
        if seg is None or not NAME_RE.match(seg) or seg in segs:
            other.append(prefix)
        else:
            segs[seg] = prefix
    return dict(sorted(segs.items())), sorted(other)


# ---------------------------------------------------------------------------
# Reading one object


def object_input(data: bytes, key: str) -> tuple[InputFile | None, str | None]:
    """A landed object's records as checked input (ingest.InputFile), or the reason it has none
    that can be read (a corrupt gzip or Parquet file: one dead letter)."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            return None, f"malformed: {key}: not a readable gzip file ({e.__class__.__name__})"
    if data[:4] == b"PAR1" or key.lower().endswith(".parquet"):
        try:
            table = pq.ParquetFile(io.BytesIO(data)).read()
        except Exception as e:  # pyarrow raises several kinds for a corrupt file
            return None, f"malformed: {key}: not a readable Parquet file ({e.__class__.__name__})"
        if table.num_rows == 0:
            return None, None
        return InputFile(
            table.num_rows,
            lambda lo, hi: parquet_to_lines(table.slice(lo, hi - lo)),
            lambda lo, hi: table.slice(lo, hi - lo),
        ), None
    if not data.strip(b"\xef\xbb\xbf \t\r\n"):
        return None, None
    lines = _split_lines(data)
    return InputFile(len(lines), lambda lo, hi: lines.slice(lo, hi - lo)), None


# ---------------------------------------------------------------------------
# Adoption


@dataclass
class SegmentReport:
    """What one evaluation did in one segment of a landing prefix."""

    segment: str
    chunks: int = 0  # chunks the segment has (adopted objects, all evaluations)
    adopted: int = 0  # objects adopted now
    bytes: int = 0  # their size
    events: int = 0
    malformed: int = 0
    late_flushes: int = 0  # adopted now although their key sorts before the segment's hw
    skipped: int = 0  # temporary or empty objects seen (not adopted)
    changed: list[str] = field(default_factory=list)  # keys rewritten after adoption (newly reported)
    hw: str | None = None
    max_t: int | None = None  # newest event time adopted in the segment (all evaluations)
    last_write_ms: int | None = None  # newest object write time adopted (the ingestion clock)
    sealed: bool = False
    rescanned: bool = False
    after_close: int = 0  # objects adopted as a close sealed the segment: past its seal, never read


@dataclass
class AdoptReport:
    """One evaluation of one landing input: its stream, prefix and segments."""

    stream: str
    landing: str
    segments: dict[str, SegmentReport] = field(default_factory=dict)
    unsegmented: list[str] = field(default_factory=list)

    @property
    def adopted(self) -> int:
        return sum(s.adopted for s in self.segments.values())

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.segments.values())

    @property
    def changed(self) -> list[str]:
        return [k for s in self.segments.values() for k in s.changed]


@dataclass
class _Seg:
    """A segment's adoption state, from its last index: next sequence and cumulative source info."""

    next_seq: int
    hw: str | None
    max_t: int | None
    last_write: int | None


def _index_keys(store: ObjectStore, stream: str, segment: str):
    return list(store.list(segment_prefix(stream, segment) + "index/"))


def _state_of(metas: list[ChunkMeta]) -> _Seg:
    """The state after chunks `metas` (the segment's, in order): the last adopted chunk's
    cumulative source info (a chunk `wire produce` appended to the segment has none)."""
    if not metas:
        return _Seg(0, None, None, None)
    src = next((m.source for m in reversed(metas) if m.source), None) or {}
    return _Seg(metas[-1].seq + 1, src.get("hw"), src.get("seg_max_t"), src.get("seg_last_write"))


#: The last state read of each segment in this process, by (endpoint, bucket, stream, segment): an
#: index object never changes and sequences are gapless, so the next reading lists the index
#: after it only (S3 StartAfter): one request when nothing was adopted since.
_KNOWN: dict[tuple[str, str, str, str], _Seg] = {}


def _state(store: ObjectStore, stream: str, segment: str) -> _Seg:
    """The segment's state from its last index object (one listing, one GET at most)."""
    where = (store.cfg.endpoint, store.bucket, stream, segment)
    known = _KNOWN.get(where)
    if known is not None and known.next_seq > 0:
        infos = store.list_from(
            segment_prefix(stream, segment) + "index/", index_key(stream, segment, known.next_seq - 1)
        )
        if not infos:
            return known
    else:
        infos = _index_keys(store, stream, segment)
        if not infos:
            return _Seg(0, None, None, None)
    last = _index_entries(store, infos[-1:])[0]
    if last.source is None:  # produced into a landing segment: find the last adopted chunk
        st = _state_of(_index_entries(store, _index_keys(store, stream, segment)))
    else:
        st = _state_of([last])
    _KNOWN[where] = st
    return st


def _adopted(store: ObjectStore, stream: str, segment: str) -> tuple[dict[str, str], _Seg]:
    """Every object the segment adopted, {key: ETag}, and its state (reads all its index objects,
    cached per process by ETag: a rescan)."""
    metas = _index_entries(store, _index_keys(store, stream, segment))
    return {m.source["key"]: m.source["etag"] for m in metas if m.source}, _state_of(metas)


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)


def _claim(store: ObjectStore, reader: Pipeline, segment: str, info, st: _Seg) -> tuple[str, ChunkMeta | None]:
    """Adopt object `info` as chunk `st.next_seq`: ("won", meta), ("same", None) if a rival adopted
    this object there, ("other", None) if the sequence holds another object, ("gone", None) if the
    object disappeared or is empty."""
    got = store.get_with_info(info.key)
    if got is None or not got[0]:
        return "gone", None
    data, etag, written = got
    inp, unreadable = object_input(data, info.key)
    stream = reader.stream
    level = reader.stream_level()
    if inp is not None:
        good, dlq = inp.normalize(level, 0, inp.rows, written)
        good = records_chunk(inp, good, 0, inp.rows)
    else:
        good = pa.table({TIME: pa.array([], pa.int64())})
        dlq = DLQ_SCHEMA.empty_table()
        if unreadable:
            dlq = pa.table({"row": [0], "reason": [unreadable], "record": [None]}, schema=DLQ_SCHEMA)
        else:  # empty once decoded (a gzip of nothing, a Parquet file of no rows): nothing to adopt
            return "gone", None
    seg_prefix = segment_prefix(stream, segment)
    uid = uuid.uuid4().hex
    data_key = dlq_key = None
    size = 0
    if good.num_rows:
        data_key = f"{seg_prefix}data/{uid}.parquet"
        body = parquet_bytes(good, distinct=("_id",))
        store.put(data_key, body)
        size += len(body)
    if dlq.num_rows:
        dlq_key = f"{seg_prefix}data/{uid}.dlq.parquet"
        body = parquet_bytes(dlq, distinct=("_id",))
        store.put(dlq_key, body)
        size += len(body)
    lo = hi = None
    if good.num_rows:
        import pyarrow.compute as pc

        mm = pc.min_max(good[TIME])  # pyright: ignore[reportAttributeAccessIssue]  generated at import
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
    source = {
        "key": info.key,
        "etag": etag,
        "size": len(data),
        "last_modified_ms": written,
        "hw": info.key if st.hw is None or info.key > st.hw else st.hw,
        "seg_max_t": _max(st.max_t, hi),
        "seg_last_write": _max(st.last_write, written),
    }
    meta = ChunkMeta(
        stream=stream,
        segment=segment,
        seq=st.next_seq,
        data_key=data_key,
        dlq_key=dlq_key,
        rows=good.num_rows,
        malformed=dlq.num_rows,
        min_t=lo,
        max_t=hi,
        ingest_ms=written,
        bytes=size,
        format=RECORDS,
        source=source,
    )
    try:
        store.create_if_absent(index_key(stream, segment, st.next_seq), json.dumps(meta.to_json()).encode())
        return "won", meta
    except ObjectExists:
        store.delete_many([k for k in (data_key, dlq_key) if k])  # ours, never referenced
        theirs = ChunkMeta.from_json(json.loads(store.get(index_key(stream, segment, st.next_seq))))
        return ("same" if theirs.source and theirs.source.get("key") == info.key else "other"), None


def _rescan_key(stream: str) -> str:
    return f"{stream_prefix(stream)}_LANDING.json"


def _changed_key(stream: str, segment: str, key: str, etag: str) -> str:
    return f"{segment_prefix(stream, segment)}changed/{hashlib.sha1(key.encode()).hexdigest()[:20]}-{etag}.json"


def adopt(
    store: ObjectStore, spec: Pipeline, *, rescan: bool | None = None, now: int | None = None
) -> list[AdoptReport]:
    """Adopt what landed under the pipeline's landing prefixes (none: nothing, no request).

    `rescan`: True lists every segment whole (late flushes, rewrites), False never, None when
    the input's `rescan` interval has passed since the last one (kept in `_LANDING.json`)."""
    reports = []
    for reader in landing_readers(spec):
        reports.append(adopt_input(store, reader, rescan=rescan, now=now))
    return reports


def adopt_input(
    store: ObjectStore, reader: Pipeline, *, rescan: bool | None = None, now: int | None = None
) -> AdoptReport:
    """`adopt` for one input (`reader`: the pipeline as it reads it, with its landing prefix)."""
    assert reader.landing is not None
    now = now_ms() if now is None else now
    stream = reader.stream
    report = AdoptReport(stream, reader.landing)
    segs, report.unsegmented = discover(store, reader)
    if not segs:
        return report
    interval = reader.rescan if reader.rescan is not None else DEFAULT_RESCAN_MS
    last_rescan: dict[str, int] = {}
    if rescan is None:
        try:
            last_rescan = json.loads(store.get(_rescan_key(stream))).get("rescan_ms", {})
        except ObjectNotFound:
            last_rescan = {}
    declared = [False]

    def declare() -> None:
        if not declared[0]:
            declare_stream(store, reader)
            declared[0] = True

    closed = None
    rescanned = {}
    deadline = time.monotonic() + ADOPT_SECONDS
    for seg, listing in segs.items():
        rep = report.segments[seg] = SegmentReport(seg)
        if sealed_seq(store, stream, seg) is not None:
            rep.sealed = True
            continue
        if closed is None:
            closed = is_closed(store, stream)
        if closed:  # a segment begun after the close would be sealed empty at once: not started
            rep.sealed = True
            continue
        due = rescan if rescan is not None else now - last_rescan.get(seg, NEG_INF) >= interval
        if due:  # first: the older objects it finds go before the newer ones
            _rescan(store, reader, seg, listing, rep, declare, deadline)
            rescanned[seg] = now
        _adopt_new(store, reader, seg, listing, rep, declare, deadline)
        if rep.adopted:  # a `wire close` that sealed the segment meanwhile: chunks past its seal are not read
            sealed = sealed_seq(store, stream, seg)
            rep.after_close = max(0, rep.chunks - 1 - sealed) if sealed is not None else 0
    if rescanned and rescan is None:
        store.put(_rescan_key(stream), json.dumps({"rescan_ms": {**last_rescan, **rescanned}}).encode())
    return report


def _count(rep: SegmentReport, info, meta: ChunkMeta) -> None:
    rep.adopted += 1
    rep.bytes += info.size
    rep.events += meta.rows
    rep.malformed += meta.malformed


def _finish(store: ObjectStore, stream: str, rep: SegmentReport, st: _Seg) -> None:
    _KNOWN[(store.cfg.endpoint, store.bucket, stream, rep.segment)] = st
    rep.chunks, rep.hw, rep.max_t, rep.last_write_ms = st.next_seq, st.hw, st.max_t, st.last_write


def _advance(st: _Seg, meta: ChunkMeta) -> _Seg:
    src = meta.source or {}
    return _Seg(meta.seq + 1, src.get("hw"), src.get("seg_max_t"), src.get("seg_last_write"))


def _adopt_new(
    store: ObjectStore, reader: Pipeline, seg: str, listing: str, rep: SegmentReport, declare, deadline: float
) -> None:
    """The incremental pass: the final objects after the segment's hw, in key order."""
    stream = reader.stream
    st = _state(store, stream, seg)
    todo = store.list_from(listing, st.hw, limit=MAX_OBJECTS_PER_SEGMENT)
    budget = MAX_OBJECTS_PER_SEGMENT
    while todo and budget > 0 and time.monotonic() < deadline:
        info = todo.pop(0)
        if not is_final(info.key[len(listing) :]) or info.size == 0:
            rep.skipped += 1
            continue
        declare()
        outcome, meta = _claim(store, reader, seg, info, st)
        if outcome == "won":
            assert meta is not None
            _count(rep, info, meta)
            st = _advance(st, meta)
            budget -= 1
        elif outcome == "gone":
            rep.skipped += 1
        else:  # a rival adopted this object (or another) at this sequence: go on after what it did
            st = _state(store, stream, seg)
            todo = [i for i in todo if st.hw is None or i.key > st.hw]
    _finish(store, stream, rep, st)


def _rescan(
    store: ObjectStore, reader: Pipeline, seg: str, listing: str, rep: SegmentReport, declare, deadline: float
) -> None:
    """The whole listing of the segment against what it adopted: late flushes adopted, rewrites
    reported (once per new ETag)."""
    stream = reader.stream
    rep.rescanned = True
    adopted, st = _adopted(store, stream, seg)
    budget = MAX_OBJECTS_PER_SEGMENT
    for info in store.list_from(listing):
        rel = info.key[len(listing) :]
        if not is_final(rel) or info.size == 0:
            continue
        if info.key in adopted:
            if info.etag != adopted[info.key]:
                body = {"key": info.key, "adopted_etag": adopted[info.key], "etag": info.etag, "size": info.size}
                body["last_modified_ms"] = info.last_modified_ms
                try:
                    store.create_if_absent(_changed_key(stream, seg, info.key, info.etag), json.dumps(body).encode())
                    rep.changed.append(info.key)
                except ObjectExists:
                    pass  # reported before
            continue
        if st.hw is None or info.key > st.hw or budget <= 0 or time.monotonic() >= deadline:
            continue  # after hw: the incremental pass adopts it, in key order (and over budget: later)
        while True:
            declare()
            outcome, meta = _claim(store, reader, seg, info, st)
            if outcome == "won":
                assert meta is not None
                _count(rep, info, meta)
                rep.late_flushes += 1
                budget -= 1
                st = _advance(st, meta)
                adopted[info.key] = meta.source["etag"] if meta.source else info.etag
            elif outcome in ("same", "other"):  # a rival's chunk at that sequence: did it adopt this one?
                adopted, st = _adopted(store, stream, seg)
                if info.key not in adopted:
                    continue
            break
    _finish(store, stream, rep, st)


def adopt_and_close(store: ObjectStore, spec: Pipeline, stream: str | None = None) -> list[AdoptReport]:
    """`wire close` of a stream with a landing prefix: adopt everything that landed (a rescan:
    late flushes too), then close it (streams.close_stream). Objects landing after this are not
    adopted (a closed stream's W is +inf: they could only be late)."""
    from .streams import close_stream

    reports = []
    for reader in landing_readers(spec):
        if stream is not None and reader.stream != stream:
            continue
        rep = adopt_input(store, reader, rescan=True)
        while True:  # an evaluation adopts a bounded number: until one finds nothing left
            more = adopt_input(store, reader, rescan=True)
            if not more.adopted:
                break
            for seg, s in more.segments.items():
                r = rep.segments.setdefault(seg, SegmentReport(seg))
                r.adopted, r.bytes, r.events = r.adopted + s.adopted, r.bytes + s.bytes, r.events + s.events
                r.malformed, r.late_flushes = r.malformed + s.malformed, r.late_flushes + s.late_flushes
                r.chunks, r.hw, r.max_t, r.last_write_ms = s.chunks, s.hw, s.max_t, s.last_write_ms
        close_stream(store, reader.stream)
        reports.append(rep)
    return reports


# ---------------------------------------------------------------------------
# Status


def landing_status(store: ObjectStore, spec: Pipeline) -> list[dict]:
    """Per landing input and segment: chunks adopted, bytes of the objects, the last adopted key,
    and the objects reported rewritten after adoption (`wire status`)."""
    out = []
    for reader in landing_readers(spec):
        segs, other = discover(store, reader)
        rows = []
        for seg in segs:
            infos = _index_keys(store, reader.stream, seg)
            metas = _index_entries(store, infos)
            changed = [
                json.loads(store.get(i.key)) for i in store.list(segment_prefix(reader.stream, seg) + "changed/")
            ]
            src = [m.source for m in metas if m.source]
            sealed = sealed_seq(store, reader.stream, seg)
            rows.append(
                {
                    "segment": seg,
                    "objects": len(src),
                    "bytes": sum(s["size"] for s in src),
                    "events": sum(m.rows for m in metas),
                    "malformed": sum(m.malformed for m in metas),
                    "last_key": src[-1]["hw"] if src else None,
                    "max_event_time_ms": src[-1]["seg_max_t"] if src else None,
                    "last_write_ms": src[-1]["seg_last_write"] if src else None,
                    "changed": changed,
                    # objects adopted as the stream closed: past the seal, never read
                    "after_close": [
                        m.source["key"] for m in metas if m.source and sealed is not None and m.seq > sealed
                    ],
                }
            )
        out.append({"stream": reader.stream, "landing": reader.landing, "segments": rows, "unsegmented": other})
    return out


def segment_watermarks(reader: Pipeline, rep: AdoptReport) -> dict[str, int]:
    """Each segment's watermark by what it adopted (all evaluations): its newest event time minus
    the bound, or, in ingestion-time mode, its newest object write time minus the lag (PDP-26)."""
    from .watermark import SegmentClock, segment_watermark

    out = {}
    for seg, s in rep.segments.items():
        clock = SegmentClock(
            max_t=s.max_t if s.max_t is not None else NEG_INF,
            last_ingest=s.last_write_ms if s.last_write_ms is not None else NEG_INF,
        )
        out[seg] = segment_watermark(reader, clock)
    return out


def observation(spec: Pipeline, rep: AdoptReport) -> dict:
    """What the stream asset's observation reports of one evaluation (assets/streams.py)."""
    from .timeutil import iso

    reader = next(r for r in landing_readers(spec) if r.stream == rep.stream)
    return {
        "landing": rep.landing,
        "objects_adopted": rep.adopted,
        "bytes_adopted": rep.bytes,
        "events": sum(s.events for s in rep.segments.values()),
        "malformed": sum(s.malformed for s in rep.segments.values()),
        "late_flushes": sum(s.late_flushes for s in rep.segments.values()),
        "rewritten_after_adoption": rep.changed,
        "chunks": {seg: s.chunks for seg, s in rep.segments.items()},
        "segment_watermarks": {seg: iso(w) for seg, w in segment_watermarks(reader, rep).items()},
        "unsegmented": rep.unsegmented,
        "adopted_after_close": sum(s.after_close for s in rep.segments.values()),
    }
