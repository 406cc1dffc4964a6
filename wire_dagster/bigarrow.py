"""Columns past 2 GB: Arrow's string, binary and list arrays count their values' bytes with 32-bit
offsets, so one array holds less than ONE_ARRAY_BYTES. A table's column may be longer as chunks,
but whatever gathers it into one array (a sort, a take across chunks, `combine_chunks`) fails on
it ("offset overflow while concatenating arrays"). Records of 20-40 KB, 100,000 to a chunk, reach
that: benchmarks/big_records.py's 60,000 records of 40 KB stopped their pipeline on every retry.

These gather such a column as its large type (64-bit offsets) and hand it back as chunks of the
type it had; a column within one array's bytes is gathered as it always was.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: The bytes one Arrow array of string, binary or list values holds at most (32-bit offsets).
ONE_ARRAY_BYTES = (1 << 31) - 1
#: The bytes of each chunk `in_chunks` hands back: well within one array.
CHUNK_BYTES = 1 << 30


def large_type(t: pa.DataType) -> pa.DataType:
    """`t` with 64-bit offsets wherever it has 32-bit ones (`large_string` for `string`, ...)."""
    if pa.types.is_string(t):
        return pa.large_string()
    if pa.types.is_binary(t):
        return pa.large_binary()
    if pa.types.is_list(t):
        return pa.large_list(t.value_field.with_type(large_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(large_type(f.type)) for f in t])
    return t


def is_text(t: pa.DataType) -> bool:
    """A string or binary type, of either offset width."""
    return pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t)


def value_bytes(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each string or binary value's bytes (a null's: 0)."""
    return pc.fill_null(pc.binary_length(values), 0).to_numpy(zero_copy_only=False)  # pyright: ignore[reportAttributeAccessIssue]


def one_array(parts: list[pa.Array | pa.ChunkedArray], t: pa.DataType) -> pa.Array:
    """The values of `parts` (each of `t`, or of its large type) as one array: of type `t` while
    they fit one, else of its large type."""
    big = sum(p.nbytes for p in parts) >= ONE_ARRAY_BYTES
    want = large_type(t) if big else t
    chunks = [c.cast(want) for p in parts for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])]
    return pa.chunked_array(chunks, want).combine_chunks()


def gather(
    parts: list[pa.Array | pa.ChunkedArray], ix: pa.Array | pa.ChunkedArray | np.ndarray, t: pa.DataType
) -> pa.ChunkedArray:
    """The values at positions `ix` of `parts` laid end to end (each part of `t` or its large
    type), in `ix`'s order, as chunks of `t` (`in_chunks`). Taken chunk by chunk, no array of all
    the values built: a chunk every value of which is taken comes back as it is, no copy. For
    the 920,000 bids of NEXMark q7's pass-through (20 chunks, all taken) that saved its task
    0.25 s (1.57-1.70 s to 1.31-1.39 s), where gathering them into one array and taking from it
    (`one_array`) made two fresh copies; a take across the chunks themselves is slower still."""
    ix = np.asarray(ix if isinstance(ix, np.ndarray) else ix.to_numpy(), np.int64)
    order = None
    if ix.size > 1 and not (ix[1:] > ix[:-1]).all():
        order = np.argsort(ix, kind="stable")
        ix = ix[order]
    unique = order is None or bool((ix[1:] > ix[:-1]).all())  # ascending as given: unique already
    picked, lo = [], 0
    for c in (c for p in parts for c in (p.chunks if isinstance(p, pa.ChunkedArray) else [p])):
        hi = lo + len(c)
        a, b = np.searchsorted(ix, [lo, hi])
        if unique and b - a == len(c):
            picked.append(c)
        elif b > a:
            picked.append(c.take(pa.array(ix[a:b] - lo)))
        lo = hi
    if order is None and all(c.type == t for c in picked):
        return pa.chunked_array(picked, t)
    values = one_array(picked, t)
    if order is not None:  # back to `ix`'s own order
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        values = values.take(pa.array(inverse))
    return in_chunks(values, t)


def in_chunks(values: pa.Array | pa.ChunkedArray, t: pa.DataType) -> pa.ChunkedArray:
    """String or binary `values` of any size (of `t` or its large type) as chunks of `t`, each of
    at most CHUNK_BYTES of values (a single larger value in a chunk of its own)."""
    if values.type == t:
        return values if isinstance(values, pa.ChunkedArray) else pa.chunked_array([values], t)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()  # of the large type: one array holds them
    ends = np.cumsum(value_bytes(values), dtype=np.int64)
    cuts, lo = [], 0
    while lo < len(values):
        base = ends[lo - 1] if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, base + CHUNK_BYTES, side="right")))
        cuts.append((lo, hi))
        lo = hi
    # a slice is copied before its cast: the cast checks the slice's offsets into the whole
    # array's values, which pass 2 GB from the third GB on
    return pa.chunked_array([pa.concat_arrays([values.slice(lo, hi - lo)]).cast(t) for lo, hi in cuts], t)


def sorted_rows(t: pa.Table, keys: list[tuple[str, str]]) -> pa.Table:
    """`t.sort_by(keys)`, for tables of any size: a column of ONE_ARRAY_BYTES or more (2.1 GB of a
    window's text, read whole) is sorted as its large type, then handed back as chunks of its
    own type (`in_chunks`; a list or struct column stays large)."""
    wide = [f.name for f in t.schema if t[f.name].nbytes >= ONE_ARRAY_BYTES]
    if not wide:
        return t.sort_by(keys)
    s = t.cast(pa.schema([f.with_type(large_type(f.type)) if f.name in wide else f for f in t.schema])).sort_by(keys)
    for name in wide:
        f = t.schema.field(name)
        if pa.types.is_string(f.type) or pa.types.is_binary(f.type):
            s = s.set_column(s.schema.get_field_index(name), f, in_chunks(s[name].combine_chunks(), f.type))
    return s
