"""The per-bucket kernel (DuckDB over Arrow, no Spark) against the plain-Python reference.

`bucketkernel.bucket_epoch` computes one key bucket's windows; Spark only de-duplicates ids
and distributes buckets. Here the same random scenarios as tests/test_kernel_property.py
are run without Spark, more of them (no Spark job), twice: all keys in one
bucket, and one bucket per key — the results must not depend on how keys are bucketed.
The events given to it carry the reference's duplicates flagged, as Spark flags them; or, as
in the kernel's single-task path (one bucket holds the whole epoch), no flags: it finds the
repeated ids itself.
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pyarrow as pa
import pytest

import reference
from kernel_harness import diff_rows, events_table
from test_kernel_property import compare_state, draw_scenario
from wire_dagster.bucketkernel import DUP, bucket_epoch, pack, side_table, state_schema, unpack
from wire_dagster.kernel import IDS

SEEDS = 5 * int(os.environ.get("WIRE_SEEDS", "3"))


def empty_state(spec) -> dict[str, pa.Table]:
    return {w.name: state_schema(w).empty_table() for w in spec.windows}


def by_key(t: pa.Table, col: str) -> dict:
    keys = t[col].to_pylist()
    return {k: t.take([i for i, x in enumerate(keys) if x == k]) for k in dict.fromkeys(keys)}


def run_buckets(spec, events: pa.Table, side: pa.Table, w_prev: int, w_new: int, split: bool) -> dict:
    """bucket_epoch over one bucket, or one per key; the buckets' tables gathered as the driver does
    (through `pack`/`unpack`, the bytes Spark carries)."""
    if not split:
        packed = [pack(bucket_epoch(spec, events, side, w_prev, w_new))]
    else:
        ev_k, side_k = by_key(events, "_key"), by_key(side, "key")
        packed = [pack({})]
        for k in dict.fromkeys(list(ev_k) + list(side_k)):
            packed.append(
                pack(
                    bucket_epoch(spec, ev_k.get(k, events.slice(0, 0)), side_k.get(k, side.slice(0, 0)), w_prev, w_new)
                )
            )
    tables = unpack(pa.concat_tables(packed))[0]
    return {k: pa.concat_tables(v, promote_options="permissive") for k, v in tables.items()}


@pytest.mark.parametrize(
    "split,flagged_by_spark,sql_sweep",
    [(False, True, False), (True, True, False), (False, False, False), (False, True, True)],
    ids=["one bucket", "bucket per key", "whole epoch flags its duplicates", "sessions swept by SQL"],
)
def test_bucket_kernel_equals_reference(split, flagged_by_spark, sql_sweep, monkeypatch):
    if sql_sweep:  # the path `session_groups` leaves to SQL (null bounds, offsets that could overflow)
        monkeypatch.setattr("wire_dagster.bucketkernel.session_groups", lambda u: None)
    checked = Counter()
    for seed in range(SEEDS):
        spec, epochs = draw_scenario(random.Random(seed))
        ref = reference.RefState()
        state, ids = empty_state(spec), IDS.empty_table()
        for i, (events, w_new) in enumerate(epochs, start=1):
            w_prev, n_dead = ref.watermark, len(ref.dead)
            want = reference.run_epoch(spec, ref, [dict(e) for e in events], w_new)
            w_new = ref.watermark
            dup = {(e["_seg"], e["_seq"], e["_row"]) for reason, _, e in ref.dead[n_dead:] if reason == "duplicate"}
            flagged = events_table(spec, events)
            if flagged_by_spark:
                flagged = flagged.append_column(
                    DUP, pa.array([(e["_seg"], e["_seq"], e["_row"]) in dup for e in events], pa.bool_())
                )
            out = run_buckets(spec, flagged, side_table(spec, state, ids), w_prev, w_new, split)
            where = f"seed {seed} epoch {i}"
            problems = []
            n = sum(out[("n", "")]["n"].to_pylist()) if ("n", "") in out else 0
            if n != len(events):
                problems.append(f"{where}: {n} events counted, {len(events)} given")
            got_dup = {tuple(r.values()) for r in out[("dup", "")].to_pylist()} if ("dup", "") in out else set()
            if got_dup != dup:
                problems.append(f"{where} duplicates: kernel {sorted(got_dup)}, reference {sorted(dup)}")
            for w in spec.windows:
                got = out.get(("out", w.name))
                problems += diff_rows(got.to_pylist() if got else [], want[w.name], f"{where} {w.name} emitted")
                late = out.get(("late", w.name))
                got_late = Counter(tuple(r.values()) for r in late.to_pylist()) if late else Counter()
                want_late = Counter(
                    (e["_seg"], e["_seq"], e["_row"])
                    for reason, name, e in ref.dead[n_dead:]
                    if reason == "late" and name == w.name
                )
                if got_late != want_late:
                    problems.append(f"{where} {w.name} late: kernel {sorted(got_late)}, reference {sorted(want_late)}")
                state[w.name] = out.get(("state", w.name), state[w.name].slice(0, 0)).cast(state[w.name].schema)
                checked["retraction"] += any(r["retract"] for r in want[w.name])
            problems += [f"{where} {p}" for p in compare_state(spec, state, ref.windows)]
            ids = out.get(("ids", ""), IDS.empty_table()).cast(IDS)
            got_ids = {r["id"]: (r["expires"], r["key"], r["t"]) for r in ids.to_pylist()}
            if got_ids != ref.ids:
                problems.append(
                    f"{where} id memory: kernel {sorted(got_ids.items())}, reference {sorted(ref.ids.items())}"
                )
            assert not problems, "\n".join(problems)
            checked["late"] += bool(want_late)
            checked["duplicate"] += bool(dup)
    # The scenarios did exercise what the kernel must get right.
    assert all(checked[k] for k in ("retraction", "late", "duplicate")), checked


def _sql_session_groups(u: pa.Table) -> pa.Array:
    """The sweep as SQL (what `session_groups` replaces): two window functions per key."""
    import duckdb

    con = duckdb.connect()
    con.register("u", u)
    return con.sql("""
        WITH s1 AS (
            SELECT *, row_number() OVER () AS _i,
                   max("end") OVER (PARTITION BY key ORDER BY start, "end"
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS _pmax
            FROM u
        )
        SELECT _i, sum(CASE WHEN _pmax IS NULL OR start > _pmax THEN 1 ELSE 0 END)
                   OVER (PARTITION BY key ORDER BY start, "end"
                         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS _grp
        FROM s1 ORDER BY _i
    """).to_arrow_table()["_grp"]


def _partition(keys: list, grp: list) -> set[frozenset[int]]:
    """Rows grouped by (key, group): the sessions as sets of row numbers, whatever their numbering."""
    out: dict = {}
    for i, (k, g) in enumerate(zip(keys, grp, strict=True)):
        out.setdefault((k, g), set()).add(i)
    return {frozenset(v) for v in out.values()}


@pytest.mark.parametrize("seed", range(30))
def test_session_groups_are_the_sql_sweeps(seed):
    """Random pieces (ties, touching and nested intervals, null keys, long state sessions): the same
    sessions as the SQL sweep."""
    from wire_dagster.bucketkernel import session_groups

    rng = random.Random(seed)
    n = rng.choice([1, 2, 7, 200, 2000])
    keys = [
        rng.choice([None, "a", "b", "é", ""]) if rng.random() < 0.3 else f"k{rng.randrange(1 + n // 20)}"
        for _ in range(n)
    ]
    starts = [rng.randrange(-5_000, 50_000) for _ in range(n)]
    ends = [s + rng.choice([1, 10, 100, 1000, 30_000]) for s in starts]
    u = pa.table(
        {"key": pa.array(keys, pa.string()), "start": pa.array(starts, pa.int64()), "end": pa.array(ends, pa.int64())}
    )
    grp = session_groups(u)
    assert grp is not None
    assert _partition(keys, grp.to_pylist()) == _partition(keys, _sql_session_groups(u).to_pylist())


def test_session_groups_leave_what_could_overflow_or_is_null_to_sql():
    from wire_dagster.bucketkernel import session_groups

    wide = pa.table(
        {
            "key": pa.array(["a", "b", "c", "d"]),
            "start": pa.array([-(2**61), 0, 5, 9], pa.int64()),
            "end": pa.array([2**61, 1, 6, 10], pa.int64()),
        }
    )
    assert session_groups(wide) is None
    nulls = pa.table(
        {"key": pa.array(["a", "a"]), "start": pa.array([1, None], pa.int64()), "end": pa.array([2, 3], pa.int64())}
    )
    assert session_groups(nulls) is None
    empty = pa.table(
        {"key": pa.array([], pa.string()), "start": pa.array([], pa.int64()), "end": pa.array([], pa.int64())}
    )
    groups = session_groups(empty)
    assert groups is not None and groups.to_pylist() == []


def test_a_table_past_pack_bytes_is_packed_as_slices_that_unpack_to_it(monkeypatch):
    """A table bigger than PACK_BYTES goes as several packed rows (one Arrow or Spark binary value
    holds less than 2 GB): `unpack` gives its slices in order, together the table, row for row."""
    import wire_dagster.bucketkernel as bk

    rnd = random.Random(5)
    big = pa.table(
        {"k": [f"k{i}" for i in range(1000)], "text": [rnd.randbytes(rnd.randint(0, 300)) for _ in range(1000)]}
    )
    small = pa.table({"n": [7]})
    monkeypatch.setattr(bk, "PACK_BYTES", 10_000)
    packed = pack({("produced", ""): big, ("n", ""): small}, epoch=1)
    kinds = packed["kind"].to_pylist()
    assert kinds.count("produced") >= big.nbytes // 10_000 and kinds.count("n") == 1
    assert max(len(b) for b in packed["data"].to_pylist()) < 3 * 10_000  # no slice far past the bound
    out = unpack(packed, 2)[1]
    assert pa.concat_tables(out[("produced", "")]).equals(big) and out[("n", "")] == [small]
