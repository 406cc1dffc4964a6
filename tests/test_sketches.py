"""The sketch aggregates (DESIGN §4, issue 23 item 4): approx_count_distinct (HLL) and
approx_quantile (t-digest), Apache DataSketches sketches carried as window state (sketches.py).

Checked against exact values computed here in plain Python: HLL's documented relative error
(lg_k = 12), and for the t-digest (k = 400), which has no documented bound, the measured one
with a margin (`TDIGEST_EPS`) — the rank of the returned value in the exact sorted data must lie
within it of q. The distinct count must not depend on how the events are split into epochs or
ordered (HLL's registers are a max over the items; the merge always reports the registers'
composite estimate). Both sketches are deterministic: the same epochs computed twice give the
same state bytes and results (a rerun commits the same bytes), past the t-digest's exact size.
Small windows, where both sketches are exact, are compared with the reference by
tests/test_kernel_property.py; here too, and the t-digest's exact size (`TDIGEST_EXACT_N`) is
checked at its boundary.

WIRE_SKETCH_EVENTS sets the number of events (default 30,000). The one-task Spark path and a
larger accuracy matrix are checked too when WIRE_SEEDS is above its default 3 (`make test-long`).
"""

from __future__ import annotations

import bisect
import json
import os
import random

import numpy as np
import pyarrow as pa
import pytest

from kernel_harness import KernelRun, check_balance, events_table
from wire_dagster.aggregates import exact_quantile
from wire_dagster.bucketkernel import bucket_epoch, side_table
from wire_dagster.errors import WireInputError
from wire_dagster.events import ERR, ID, RAW, ROW, TIME
from wire_dagster.extract import pipeline_events
from wire_dagster.sketches import HLL_LG_K, TDIGEST_EXACT_N, TDIGEST_K, _ds, tdigest_merge, tdigest_quantile
from wire_dagster.spec import Aggregate, pipeline_from_dict
from wire_dagster.timeutil import INF, NEG_INF

ds = _ds()

N = int(os.environ.get("WIRE_SKETCH_EVENTS", "30000"))
LONG = int(os.environ.get("WIRE_SEEDS", "3")) > 3
QS = (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0)
#: t-digest (k = 400): the returned value's normalized rank is within this of q. DataSketches
#: documents no bound; measured: at most 1.0 % on continuous data, 1.6 % on heavily tied data
#: (sketches.py), so 2 % leaves a margin.
TDIGEST_EPS = 0.02
#: HLL: the relative error of a unioned sketch at 3 standard deviations (99.7 %).
HLL_REL = abs(ds.hll_sketch(HLL_LG_K).get_rel_err(True, True, HLL_LG_K, 3))


def spec_of():
    quantiles = {f"q{int(q * 100)}": f"approx_quantile(v, {q})" for q in QS}
    aggs = {"n": "count", "users": "approx_count_distinct(u)", "exact_users": "count_distinct(u)", **quantiles}
    return pipeline_from_dict(
        {
            "name": "sk",
            "event": {"key": "k", "time": "t"},
            "partition": 1000,
            "start": "1970-01-01T00:00:00Z",
            "windows": [
                {"name": "tum", "type": "tumbling", "size": 1000, "aggregates": aggs},
                {"name": "sl", "type": "sliding", "size": 1000, "slide": 500, "aggregates": aggs},
                {"name": "se", "type": "session", "gap": 50, "aggregates": aggs},
            ],
        }
    )


def draw(spec, n: int, seed: int) -> list[dict]:
    """Two keys; values of three shapes (many repeats, a wide spread, nulls); users with repeats."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        r = rnd.random()
        v = None if r < 0.05 else (rnd.randint(0, 50) / 2 if r < 0.3 else round(rnd.lognormvariate(0, 3), 6))
        key = rnd.choice("ab")
        t, u = rnd.randrange(2000), f"u{rnd.randrange(n // 3)}"
        out.append({"_t": t, "_key": key, "_id": None, "_row": i, "_seg": "0", "_seq": 0, "f_v": v, "f_u": u})
    return out


def epochs_of(spec, evs: list[dict], cuts: list[int], states: list | None = None) -> dict[str, list[dict]]:
    """The rows `bucket_epoch` fires over `evs` cut into epochs at `cuts`, W = -inf until the last
    (+inf); each epoch's window state (rows per window) is appended to `states` if given."""
    bounds = [0, *cuts, len(evs)]
    side = side_table(spec, {}, None)
    rows: dict[str, list[dict]] = {}
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        last = i == len(bounds) - 2
        out = bucket_epoch(spec, events_table(spec, evs[a:b]), side, NEG_INF, INF if last else NEG_INF)
        side = side_table(spec, {w.name: out.get(("state", w.name)) for w in spec.windows}, None)
        if states is not None:
            states.append({w.name: _rows(out.get(("state", w.name))) for w in spec.windows})
        for w in spec.windows:
            t = out.get(("out", w.name))
            rows.setdefault(w.name, []).extend(t.to_pylist() if t is not None else [])
    return rows


def _rows(t: pa.Table | None) -> list[dict]:
    return [] if t is None else t.to_pylist()


def exact(spec, evs: list[dict]) -> dict[str, dict[tuple, tuple[set, list]]]:
    """Per window: the distinct users and the sorted values of each (key, start, end), by plain Python."""
    from reference import batch

    by_key: dict = {}
    for x in sorted(evs, key=lambda x: x["_t"]):
        by_key.setdefault(x["_key"], []).append(x)
    times = {k: [x["_t"] for x in xs] for k, xs in by_key.items()}
    out = {}
    for w in spec.windows:
        counted = w.model_copy(update={"aggregates": (Aggregate(name="n", func="count"),)})
        ids = batch(spec, counted, evs).keys()  # the windows and sessions
        per = {}
        for key, s, e in ids:
            last = e if w.type != "session" else e - w.gap + 1  # a session ends `gap` past its last event
            mine = by_key[key][bisect.bisect_left(times[key], s) : bisect.bisect_left(times[key], last)]
            per[(key, s, e)] = ({x["f_u"] for x in mine}, sorted(x["f_v"] for x in mine if x["f_v"] is not None))
        out[w.name] = per
    return out


def rank_distance(values: list[float], x: float, q: float) -> float:
    """How far q lies from the normalized ranks x takes in `values` (sorted): [#<x, #<=x] / n."""
    lo, hi = bisect.bisect_left(values, x) / len(values), bisect.bisect_right(values, x) / len(values)
    return 0.0 if lo <= q <= hi else min(abs(q - lo), abs(q - hi))


def check_within_bounds(spec, rows: dict[str, list[dict]], want: dict) -> float:
    """Every result within its sketch's bound of the exact one; the largest quantile rank error."""
    worst = 0.0
    for w in spec.windows:
        got = {(r["key"], r["window_start"], r["window_end"]): r for r in rows[w.name]}
        assert set(got) == set(want[w.name]), w.name
        for ident, (users, values) in want[w.name].items():
            r = got[ident]
            assert r["exact_users"] == len(users)
            assert abs(r["users"] - len(users)) <= HLL_REL * len(users) + 1, (w.name, ident, r["users"], len(users))
            for q in QS:
                x = r[f"q{int(q * 100)}"]
                assert values[0] <= x <= values[-1], (w.name, ident, q, x)  # an interpolation at most
                if len(values) <= TDIGEST_EXACT_N:
                    assert x == exact_quantile(values, q), (w.name, ident, q, x)
                worst = max(worst, rank_distance(values, x, q))
                assert rank_distance(values, x, q) <= TDIGEST_EPS, (w.name, ident, q, rank_distance(values, x, q))
    return worst


def test_sketches_are_within_their_bounds_and_distinct_counts_do_not_depend_on_the_split():
    spec = spec_of()
    evs = draw(spec, N, seed=7)
    want = exact(spec, evs)
    assert max(len(v) for per in want.values() for _, v in per.values()) > 10 * TDIGEST_K  # centroids merge
    assert max(len(u) for per in want.values() for u, _ in per.values()) > 3000  # HLL is past its coupon list
    one = epochs_of(spec, evs, [])
    check_within_bounds(spec, one, want)
    rnd = random.Random(1)
    shuffled = evs[:]
    rnd.shuffle(shuffled)
    for split, order in (([N // 3, N // 2], evs), (sorted(rnd.sample(range(N), 6)), shuffled)):
        rows = epochs_of(spec, order, split)
        check_within_bounds(spec, rows, want)
        for w in spec.windows:  # HLL: the same estimate, whatever the split and the order
            a = {(r["key"], r["window_start"]): r["users"] for r in one[w.name]}
            b = {(r["key"], r["window_start"]): r["users"] for r in rows[w.name]}
            assert a == b, w.name


def test_small_windows_are_exact():
    """Up to TDIGEST_EXACT_N values (t-digest) and a few hundred distinct ones (HLL's coupons) the
    sketches are exact: the quantile is the (floor(q * n) + 1)-th smallest value (at most the
    n-th), the distinct count the count."""
    spec = spec_of()
    evs = draw(spec, 300, seed=3)
    want = exact(spec, evs)
    rows = epochs_of(spec, evs, [100, 200])
    for w in spec.windows:
        for r in rows[w.name]:
            users, values = want[w.name][(r["key"], r["window_start"], r["window_end"])]
            assert r["users"] == len(users)
            for q in QS:
                assert r[f"q{int(q * 100)}"] == exact_quantile(values, q), (q, values)


def test_kernel_paths_through_spark(spark):
    """The Spark paths (key buckets; one task too under LONG) carry the sketches through state
    across epochs: the results (distinct counts and quantiles) equal the ones computed without
    Spark over the same epochs, and are within the bounds. (The property tests run both paths, with small windows.)"""
    spec = spec_of()
    evs = draw(spec, 4000, seed=11)
    for i, e in enumerate(evs):
        e["_seg"], e["_seq"], e["_row"] = "0", i // 2000, i % 2000
    want = exact(spec, evs)
    direct = epochs_of(spec, evs, [2000])
    for single in (False, True) if LONG else (False,):
        run = KernelRun(spec, single_task=single)
        for j in range(2):
            res = run.epoch(spark, evs[j * 2000 : (j + 1) * 2000], INF if j == 1 else NEG_INF)
            assert not check_balance(spec, res)
        rows = {name: list(view.values()) for name, view in run.view.items()}
        check_within_bounds(spec, rows, want)
        for w in spec.windows:  # the same epochs: the same sketches, so the same results, as direct
            a = {(r["key"], r["window_start"]): {**r, "retract": None} for r in direct[w.name]}
            assert a == {(r["key"], r["window_start"]): {**r, "retract": None} for r in rows[w.name]}, w.name


def test_a_non_numeric_quantile_value_is_a_malformed_dead_letter():
    """approx_quantile reads numbers as sum does: text, NaN or a value beyond 2^53 is malformed."""
    spec = pipeline_from_dict(
        {
            "name": "sk",
            "event": {"key": "k", "time": "t"},
            "partition": 1000,
            "start": "1970-01-01T00:00:00Z",
            "windows": [
                {"name": "w", "type": "tumbling", "size": 1000, "aggregates": {"p": "approx_quantile(v, 0.5)"}}
            ],
        }
    )
    recs = [{"t": 1, "k": "a", "v": 2.5}, {"t": 2, "k": "a", "v": "abc"}, {"t": 3, "k": "a", "v": None}]
    chunk = pa.table(
        {
            TIME: pa.array([1, 2, 3], pa.int64()),
            ID: pa.nulls(3, pa.string()),
            ROW: pa.array([0, 1, 2], pa.int64()),
            RAW: pa.array([json.dumps(r).encode() for r in recs], pa.large_binary()),
        }
    )
    errs = pipeline_events(spec, chunk, 10_000)[ERR].to_pylist()
    assert errs[0] is None and errs[2] is None  # a number, and a null (no value: not counted)
    assert errs[1] is not None and errs[1].startswith("malformed:") and "v" in errs[1], errs


@pytest.mark.parametrize(
    "aggs,why",
    [
        ({"p": "approx_quantile(v)"}, "approx_quantile needs a q between 0 and 1 (got no q)"),
        ({"p": "approx_quantile(v, 1.5)"}, "approx_quantile needs a q between 0 and 1 (got q 1.5)"),
        ({"p": "approx_quantile(v, -0.1)"}, "approx_quantile needs a q between 0 and 1 (got q -0.1)"),
        ({"p": "approx_quantile(v, half)"}, "approx_quantile needs a q between 0 and 1 (got q half)"),
        ({"p": "approx_quantile"}, "approx_quantile needs a field name"),
        ({"d": "approx_count_distinct(u, v)"}, "approx_count_distinct takes one field"),
        ({"d": "approx_count_distinct"}, "approx_count_distinct needs a field name"),
    ],
)
def test_bad_sketch_aggregates_are_one_line_errors(aggs, why):
    raw = {
        "name": "sk",
        "event": {"key": "k", "time": "t"},
        "partition": 1000,
        "windows": [{"name": "w", "type": "tumbling", "size": 1000, "aggregates": aggs}],
    }
    with pytest.raises(WireInputError) as e:
        pipeline_from_dict(raw)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_the_engine_commits_sketch_results_and_readers_get_numbers(store, spark, tmp_path):
    """The real path: produced chunks in S3, two epochs (the sketches carried in committed window
    state), the stream closed; `wire read`'s reader returns BIGINT and DOUBLE columns whose values
    are within the bounds of the exact ones, and the counts balance."""
    from wire_dagster import engine, results, streams

    spec = pipeline_from_dict(
        {
            "name": "skp",
            "event": {"key": "user", "time": "ts", "id": "event_id"},
            "watermark": {"max_out_of_orderness": "1s"},
            "lateness": {"allowed": "1m"},
            "partition": "1m",
            "start": "2026-01-01T00:00:00Z",
            "windows": [
                {
                    "name": "per_min",
                    "type": "tumbling",
                    "size": "1m",
                    "aggregates": {"pages": "approx_count_distinct(page)", "p50": "approx_quantile(amount, 0.5)"},
                }
            ],
        }
    )
    t0, rnd = 1_767_225_600_000, random.Random(5)
    recs = [
        {
            "ts": t0 + rnd.randrange(120_000),
            "user": rnd.choice("ab"),
            "event_id": f"e{i}",
            "page": f"p{rnd.randrange(2000)}",
            "amount": round(rnd.expovariate(0.1), 3),
        }
        for i in range(6000)
    ]
    for part, name in ((recs[:3000], "a"), (recs[3000:], "b")):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in part))
        streams.produce(store, spec, path)
        engine.process(store, spec, spark)
    streams.close_stream(store, spec)
    m = engine.process(store, spec, spark).manifest
    assert m is not None and m.epoch >= 3 and m.watermark == INF and m.totals.balanced()
    got = results.read_results(store, spec, "per_min")
    assert str(got.schema.field("pages").type) == "int64" and str(got.schema.field("p50").type) == "double"
    want: dict[tuple, tuple[set, list]] = {}
    for r in recs:
        start = t0 + (r["ts"] - t0) // 60_000 * 60_000
        users, values = want.setdefault((r["user"], start), (set(), []))
        users.add(r["page"])
        values.append(r["amount"])
    assert {(r["key"], r["window_start"]) for r in got.to_pylist()} == set(want)
    for r in got.to_pylist():
        pages, values = want[(r["key"], r["window_start"])]
        assert isinstance(r["pages"], int) and isinstance(r["p50"], float)
        assert abs(r["pages"] - len(pages)) <= HLL_REL * len(pages) + 1, (r, len(pages))
        assert rank_distance(sorted(values), r["p50"], 0.5) <= TDIGEST_EPS, r


def test_a_rerun_of_the_same_epochs_gives_identical_state_bytes_and_results():
    """Determinism (DESIGN §2): the same events cut into the same epochs, computed twice, give
    byte-identical window state (the serialized sketches) after every epoch and identical results,
    with windows far past the t-digest's exact size (KLL, clock-seeded, failed this)."""
    spec = spec_of()
    evs = draw(spec, 6000, seed=13)
    want = exact(spec, evs)
    assert max(len(v) for per in want.values() for _, v in per.values()) > 2 * TDIGEST_K
    cuts = [1500, 2600, 4000]
    runs = []
    for _ in range(2):
        states: list = []
        rows = epochs_of(spec, evs, cuts, states)
        runs.append((rows, states))
    (rows_a, states_a), (rows_b, states_b) = runs
    sketches = [r[c] for st in states_a for t in st.values() for r in t for c in r if c.endswith("_sk") and r[c]]
    assert any(len(b) > 4000 for b in sketches)  # sketches past their exact size are in state
    assert states_a == states_b
    assert rows_a == rows_b
    check_within_bounds(spec, rows_a, want)


def _carry(parts: list[np.ndarray], fanin: int) -> bytes | None:
    """A window's sketch over epochs `parts`, as the kernel merges it: each epoch's values split in
    `fanin` (panes, key buckets) into sketches, merged with the carried one."""
    carried = None
    for ep in parts:
        pieces = [tdigest_merge([], p) for p in np.array_split(ep, fanin) if len(p)]
        carried = tdigest_merge([*(b for b in pieces if b), *([carried] if carried else [])], np.array([]))
    return carried


def test_the_exact_size_holds_after_any_split_and_ends_there():
    """TDIGEST_EXACT_N values are held exactly (the (floor(q n) + 1)-th smallest, for every q on
    a fine grid) whatever the split into epochs and parts; one more value is not (the middle
    centroids merge): the boundary sketches.py states, for the pinned package."""
    rnd = random.Random(4)
    n = TDIGEST_EXACT_N
    qs = sorted({0.0, 1.0, *(j / n for j in range(n + 1)), *((j + f) / n for j in range(n) for f in (0.25, 0.5, 0.75))})
    for trial in range(4):
        vals = [float(rnd.randint(0, 60)) if trial % 2 else rnd.lognormvariate(0, 3) for _ in range(n)]
        cuts = sorted(rnd.sample(range(1, n), trial * 2))
        parts = [np.array(vals[a:b]) for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
        b = _carry(parts, 1 + trial % 3)
        assert [tdigest_quantile(b, q) for q in qs] == [exact_quantile(vals, q) for q in qs], trial
    over = [float(i) for i in range(n + 1)]
    b = tdigest_merge([], np.array(over))
    assert [tdigest_quantile(b, q) for q in qs] != [exact_quantile(over, q) for q in qs]
    assert tdigest_quantile(tdigest_merge([], np.arange(1.0, 6.0)), 0.15) == 1.0  # floor(0.75) + 1: the 1st


def test_quantiles_of_large_windows_are_within_the_measured_bound():
    """The t-digest's rank error over whole windows of several shapes (continuous, heavy ties,
    sorted arrival), merged as the kernel does across epochs and parts, stays within TDIGEST_EPS
    of q at the tails and in the middle. LONG: larger windows and more splits."""
    rng = np.random.default_rng(17)
    shapes = {
        "uniform": lambda n: rng.random(n),
        "lognormal": lambda n: rng.lognormal(0, 3, n),
        "ties": lambda n: rng.integers(0, 50, n) / 2,
        "sorted": lambda n: np.sort(rng.lognormal(0, 3, n)),
    }
    sizes = (3_000, 20_000, 200_000) if LONG else (3_000, 20_000)
    splits = ((1, 1), (7, 1), (7, 4), (50, 3), (500, 1)) if LONG else ((1, 1), (7, 4), (50, 3))
    qs = (0.0, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0)
    worst = 0.0
    for shape, draw_values in shapes.items():
        for n in sizes:
            vals = draw_values(n)
            exact_sorted = sorted(vals.tolist())
            for epochs, fanin in splits:
                b = _carry(np.array_split(vals, epochs), fanin)
                assert b is not None and ds.tdigest_double.deserialize(b).get_total_weight() == n
                for q in qs:
                    x = tdigest_quantile(b, q)
                    assert x is not None and exact_sorted[0] <= x <= exact_sorted[-1]
                    e = rank_distance(exact_sorted, x, q)
                    worst = max(worst, e)
                    assert e <= TDIGEST_EPS, (shape, n, epochs, fanin, q, e)
    assert 0 < worst, "the windows are past the exact size"
    assert tdigest_quantile(_carry([np.array([2.5])], 1), 0.5) == 2.5
    assert tdigest_merge([], np.array([])) is None
    print(f"t-digest k={TDIGEST_K}: worst rank error {100 * worst:.2f} %")


def test_the_asset_metadata_describes_a_quantile_with_its_q():
    """Dagster's column descriptions and window description write approx_quantile with its q."""
    from assets.metadata import window_description
    from wire_dagster.assetview import output_columns

    spec = spec_of()
    about = {name: text for name, _, text in output_columns(spec, "tum")}
    assert about["q0"] == "approx_quantile(v, 0)" and about["q99"] == "approx_quantile(v, 0.99)"
    assert about["q100"] == "approx_quantile(v, 1)" and about["users"] == "approx_count_distinct(u)"
    assert "q50=approx_quantile(v, 0.5), q90=approx_quantile(v, 0.9)" in window_description(spec.window("tum"))
