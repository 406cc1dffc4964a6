"""Readers (DESIGN §3): committed results only, found by following the latest committed manifest.

A reader never lists staging or published copies: what the latest commit marker's manifest
names is the content, whatever an uncommitted attempt or a half-done publish left in the store.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from .aggregates import OUTPUT_TYPES
from .bigarrow import sorted_rows
from .checkpoint import Checkpoints
from .manifest import FileRef
from .objectstore import ObjectStore
from .spec import Pipeline
from .streams import iter_dead_letters, landed_key, read_stream


def read_file(store: ObjectStore, ref: FileRef | None) -> pa.Table | None:
    """The table of a staged file a manifest names (None for none)."""
    if ref is None:
        return None
    return pq.read_table(io.BytesIO(store.get(ref.key)))


def result_files(store: ObjectStore, spec: Pipeline, window: str, partitions: list[int] | None = None) -> list[FileRef]:
    """The staged files holding the committed content of a window (optionally some partitions)."""
    spec.window(window)
    m = Checkpoints(store, spec.name).latest()
    if m is None:
        return []
    parts = m.outputs.get(window, {})
    keys = sorted(parts, key=int)
    if partitions is not None:
        keys = [k for k in keys if int(k) in set(partitions)]
    return [parts[k] for k in keys]


def read_results(store: ObjectStore, spec: Pipeline, window: str, partitions: list[int] | None = None) -> pa.Table:
    """The committed results of a window: the latest version of each window, retractions applied."""
    refs = result_files(store, spec, window, partitions)
    tables = [read_file(store, r) for r in refs]
    tables = [t for t in tables if t is not None and t.num_rows]
    if not tables:
        return empty_output(spec, window)
    return sorted_rows(pa.concat_tables(tables), [("key", "ascending"), ("window_start", "ascending")])


def empty_output(spec: Pipeline, window: str) -> pa.Table:
    """A window's results with no row."""
    return output_schema(spec, window).empty_table()


def output_schema(spec: Pipeline, window: str) -> pa.Schema:
    """A window's result columns and types (without a table: `empty_table` imports pandas, ~0.2 s
    of every process that loads the Dagster definitions, whose assets describe these columns)."""
    w = spec.window(window)
    fields = [pa.field("key", pa.string()), pa.field("window_start", pa.int64()), pa.field("window_end", pa.int64())]
    arrow = {"BIGINT": pa.int64(), "STRING": pa.string()}
    for a in w.aggregates:
        fields.append(pa.field(a.name, arrow.get(OUTPUT_TYPES.get(a.func, ""), pa.float64())))
    # a join's columns are typed as its inputs' are; with no row at all, as text
    fields += [pa.field(c.name, pa.string()) for c in w.select]
    if w.type == "output":  # a computation's records (computestage.py): their id and fields (JSON)
        fields += [pa.field("id", pa.string()), pa.field("record", pa.string())]
    return pa.schema(fields)


def read_dead_letters(store: ObjectStore, spec: Pipeline) -> list[dict]:
    """Every dead letter: malformed records of the stream, late and duplicate events of committed epochs."""
    views = {prefix: read_stream(store, reader.stream, {}) for prefix, reader in spec.readers.items()}
    out: list[dict] = [
        dict(d, segment=prefix + d["segment"], window=None, epoch=None)
        for prefix, reader in spec.readers.items()
        for d in iter_dead_letters(store, reader.stream, views[prefix])
    ]
    # an adopted chunk's landed object, by the (remap) segment and chunk a dead letter names
    landed = {
        (prefix + seg, c.seq): landed_key(c)
        for prefix, vs in views.items()
        for seg, view in vs.items()
        for c in view.chunks
        if c.source
    }
    m = Checkpoints(store, spec.name).latest()
    # a derived input's: its stream is the window it reads (`pipeline.window`), its segment the
    # input, its chunk the upstream partition
    read = {i.name: f"{i.pipeline}.{i.output}" for i in spec.derived}
    refs = [(spec.stream, ref) for ref in m.dead_letters] if m else []
    refs += [(read.get(i, i), ref) for i, parts in (m.upstream_letters.items() if m else []) for ref in parts.values()]
    for stream, ref in refs:
        for r in pq.read_table(io.BytesIO(store.get(ref.key))).to_pylist():
            out.append(
                {
                    "reason": r["reason"],
                    "record": r["event"],
                    "stream": stream,
                    "segment": r["segment"],
                    "chunk": r["chunk"],
                    "row": r["row"],
                    "window": r["window"],
                    "epoch": r["epoch"],
                    "object": landed.get((r["segment"], r["chunk"])),
                }
            )
    return out
