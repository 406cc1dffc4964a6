"""The sketch aggregates (DESIGN §4): `approx_count_distinct(f)` and `approx_quantile(f, q)`,
kept as Apache DataSketches sketches (the `datasketches` package) whose serialized bytes are the
window's partial, carried in window state and merged across epochs, key buckets and panes.

=========================  ================================================================
approx_count_distinct(f)   HLL (`hll_sketch`, lg_k = 12, HLL_8): relative standard error
                           1.04 / sqrt(2^12) = 1.6 % (3.3 % at 2 standard deviations, the
                           package's `get_rel_err(unioned=True, lg_k=12, 2)`); exact below a few
                           hundred distinct values (its coupon list). At most ~4 KB a window.
approx_quantile(f, q)      t-digest (`tdigest_double`, k = 400): exact while the window holds at
                           most 315 values (`TDIGEST_EXACT_N`: every centroid one value), then
                           an interpolation between centroids. DataSketches documents no error
                           bound for it; measured (tests/test_sketches.py) the normalized rank
                           of the returned value is within 1.0 % of q on continuous data and
                           within 1.6 % on heavily tied data, whatever the epoch split. At
                           most ~8.5 KB a window (measured up to 10^6 values).
=========================  ================================================================

What an aggregate reads is what the exact ones read: approx_count_distinct the text of the
field's non-null values (as count_distinct does), approx_quantile the non-null numbers of the
field (as sum does: a value outside the domain of `aggregates` is a malformed dead letter).

Determinism (DESIGN §2.1):

- HLL: every merge goes through an `hll_union` of at least two sketches (a lone sketch is merged
  with itself, which changes no register), so the result is always the union's "out of order"
  form, whose estimate is the composite estimator of the registers alone, not the HIP estimator
  that depends on the order of updates. A register is the max over the items hashed into it, so
  the estimate is a function of the multiset of values, whatever the epoch split or the order
  (tests/test_sketches.py checks it). The values of one merge are updated in sorted order and the
  carried sketches merged in sorted order, so one merge's bytes are a function of its inputs.
- t-digest: no randomness (unlike KLL, whose compactions draw random bits from a clock-seeded
  generator Python cannot seed, so that a rerun could commit another value): the same sequence
  of updates and merges gives the same centroids and the same serialized bytes. The values of one
  merge are updated in sorted order and the carried sketches merged in sorted order, so one
  merge's bytes, and the epoch's, are a function of the epoch's inputs and carried state: a
  rerun commits identical bytes (tests/test_sketches.py checks it). The value can depend on the
  epoch split (within the error above); a retry, rewind or backfill replays the same split, so
  reproduces it.

Both sketches are thus deterministic (DESIGN §2): a retry, rewind or backfill of an epoch
reproduces the committed bytes.

The t-digest's quantile convention (DataSketches' `tdigest::get_quantile`, in
apache/datasketches-cpp tdigest/include/tdigest_impl.hpp):
while every centroid holds one value, the q-quantile of n values is the (floor(q * n) + 1)-th
smallest, capped at the n-th (q = 0: the smallest, q = 1: the largest); `aggregates.exact_quantile`
computes it over the exact data. Measured with the pinned package (tests/test_sketches.py): this
holds, after any split into parts and merges, while the window holds at most `TDIGEST_EXACT_N`
values; past that the middle centroids merge and the result is interpolated (not necessarily a
value of the window).

DuckDB runs the window kernel (bucketkernel.py): the epoch's values of a window are gathered with
`list()` and the carried sketches with another, and the scalar UDFs below (Arrow-vectorised:
one call per DuckDB vector of windows) update and merge them; `register` installs them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa


def _ds() -> Any:
    """The datasketches module (its names come from a compiled module the type checker cannot see)."""
    import datasketches

    return datasketches


HLL_LG_K = 12
TDIGEST_K = 400
#: The most values a t-digest of TDIGEST_K holds exactly (measured; see the module doc).
TDIGEST_EXACT_N = 315

MERGE_FUNCS = {"approx_count_distinct": "wire_hll_merge", "approx_quantile": "wire_tdigest_merge"}
#: The type of one event's value of a sketch aggregate, in the kernel (DuckDB).
VALUE_TYPES = {"approx_count_distinct": "VARCHAR", "approx_quantile": "DOUBLE"}


def hll_merge(sketches: list[bytes], values: list[str]) -> bytes | None:
    """The HLL sketch of `values` merged with the serialized `sketches` (None: nothing at all)."""
    ds = _ds()
    if not sketches and not values:
        return None
    parts = [ds.hll_sketch.deserialize(b) for b in sorted(sketches)]
    if values:
        s = ds.hll_sketch(HLL_LG_K, ds.HLL_8)
        for v in sorted(set(values)):
            s.update(v)
        parts.append(s)
    u = ds.hll_union(HLL_LG_K)
    for p in parts:
        u.update(p)
    if len(parts) == 1:  # the union of two: its estimate is the registers' (see the module doc)
        u.update(parts[0])
    return u.get_result(ds.HLL_8).serialize_compact()


def tdigest_merge(sketches: list[bytes], values: np.ndarray) -> bytes | None:
    """The t-digest of `values` (float64) merged with the serialized `sketches`, in canonical order
    (values sorted, then the sketches sorted by their bytes): a function of its inputs."""
    ds = _ds()
    if not sketches and not len(values):
        return None
    s = ds.tdigest_double(TDIGEST_K)
    if len(values):
        s.update(np.sort(np.asarray(values, dtype=np.float64)))
    for b in sorted(sketches):
        s.merge(ds.tdigest_double.deserialize(b))
    return s.serialize()


def hll_estimate(b: bytes | None) -> int:
    """The distinct count a serialized HLL sketch estimates (0 for none)."""
    ds = _ds()
    return 0 if b is None else round(ds.hll_sketch.deserialize(b).get_estimate())


def tdigest_quantile(b: bytes | None, q: float) -> float | None:
    """The q-quantile of a serialized t-digest (None for none): exact, by the convention of the
    module doc, while it holds at most TDIGEST_EXACT_N values; interpolated past that."""
    ds = _ds()
    return None if b is None else float(ds.tdigest_double.deserialize(b).get_quantile(q))


# ---- DuckDB scalar UDFs (Arrow-vectorised) ---------------------------------


def _lists(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """The offsets (from 0) and flat values of a list array; a null list is an empty one."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    lists: pa.ListArray = arr  # DuckDB passes a list array
    lengths = lists.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return offsets, lists.flatten()


def _merge_udf(kind: str):
    def merge(sketches, values):
        so, sflat = _lists(sketches)
        vo, vflat = _lists(values)
        sk = sflat.to_pylist()
        vals = vflat.to_numpy(zero_copy_only=False) if kind == "tdigest" else vflat.to_pylist()
        out = []
        for i in range(len(so) - 1):
            mine = [b for b in sk[so[i] : so[i + 1]] if b is not None]
            v = vals[vo[i] : vo[i + 1]]
            out.append(tdigest_merge(mine, v) if kind == "tdigest" else hll_merge(mine, v))
        return pa.array(out, pa.binary())

    return merge


def _hll_estimate_udf(sketches):
    return pa.array([hll_estimate(b) for b in sketches.to_pylist()], pa.int64())


def _tdigest_quantile_udf(sketches, qs):
    return pa.array(
        [tdigest_quantile(b, q) for b, q in zip(sketches.to_pylist(), qs.to_pylist(), strict=True)], pa.float64()
    )


def register(con) -> None:
    """Install the sketch UDFs on DuckDB connection `con`: `wire_hll_merge(BLOB[], VARCHAR[])`,
    `wire_tdigest_merge(BLOB[], DOUBLE[])` -> BLOB, `wire_hll_estimate(BLOB)` -> BIGINT,
    `wire_tdigest_quantile(BLOB, DOUBLE)` -> DOUBLE."""
    udfs = [
        ("wire_hll_merge", _merge_udf("hll"), ["BLOB[]", "VARCHAR[]"], "BLOB"),
        ("wire_tdigest_merge", _merge_udf("tdigest"), ["BLOB[]", "DOUBLE[]"], "BLOB"),
        ("wire_hll_estimate", _hll_estimate_udf, ["BLOB"], "BIGINT"),
        ("wire_tdigest_quantile", _tdigest_quantile_udf, ["BLOB", "DOUBLE"], "DOUBLE"),
    ]
    for name, fn, params, ret in udfs:
        con.create_function(
            name, fn, [con.dtype(p) for p in params], con.dtype(ret), type="arrow", null_handling="special"
        )
