"""Property tests of the Spark window kernel.

1. Against the plain-Python reference (tests/reference.py), epoch by epoch: random
   events (few keys, times in a small range around 0, a numeric field that is
   sometimes null, a string field, a per-event session gap, ids with repeats),
   random epoch splits and random monotone watermarks that sometimes jump past
   the allowed lateness. Every epoch's emitted rows, dead letters, counts, window
   state and id memory must match, and so must the reader's final view.
2. Against DuckDB (a second, independent engine): for a closed stream read in one
   epoch (W: -inf -> +inf, nothing late) the results equal a plain batch GROUP BY —
   tumbling/sliding by arithmetic over unnested window starts, sessions by a
   gaps-and-islands query in which touching one-event windows merge.

WIRE_SEEDS sets the number of random scenarios per property (default 3; `make test-long` uses more).
"""

from __future__ import annotations

import math
import os
import random
from collections import Counter

import duckdb
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

import reference
from kernel_harness import (
    KernelRun,
    check_balance,
    dead_letter_keys,
    diff_rows,
    diff_views,
    event,
    events_table,
)
from wire_dagster.spec import pipeline_from_dict
from wire_dagster.timeutil import INF, NEG_INF

SEEDS = int(os.environ.get("WIRE_SEEDS", "3"))

WINDOWS = [
    # tumbling with an offset; every aggregate
    {
        "name": "tum",
        "type": "tumbling",
        "size": 10,
        "offset": 3,
        "aggregates": {
            "n": "count",
            "total": "sum(v)",
            "lo": "min(v)",
            "hi": "max(v)",
            "mean": "avg(v)",
            "users": "count_distinct(u)",
            "top_u": "arg_max(u, v)",
            "low_u": "arg_min(u, v)",
            "first_u": "first(u)",
            "last_v": "last(v)",
            "users_approx": "approx_count_distinct(u)",
            "median": "approx_quantile(v, 0.5)",
        },
    },
    # sliding with an offset (3 windows per event)
    {
        "name": "sl",
        "type": "sliding",
        "size": 12,
        "slide": 4,
        "offset": 1,
        "aggregates": {
            "n": "count",
            "mean": "avg(v)",
            "vals": "count_distinct(v)",
            "hi": "max(v)",
            "first_u": "first(u)",
            "top_u": "arg_max(u, v)",
            "vals_approx": "approx_count_distinct(v)",
            "p90": "approx_quantile(v, 0.9)",
        },
    },
    # session with a fixed gap
    {
        "name": "se",
        "type": "session",
        "gap": 5,
        "aggregates": {
            "n": "count",
            "total": "sum(v)",
            "hi": "max(v)",
            "users": "count_distinct(u)",
            "last_u": "last(u)",
            "low_u": "arg_min(u, v)",
            "lowest": "approx_quantile(v, 0)",
            "users_approx": "approx_count_distinct(u)",
        },
    },
    # session with a per-event gap field
    {
        "name": "sg",
        "type": "session",
        "gap": 4,
        "gap_field": "g",
        "aggregates": {"n": "count", "lo": "min(v)", "mean": "avg(v)", "q3": "approx_quantile(v, 0.75)"},
    },
]


def pipeline(lateness: int, with_id: bool = True):
    event_cfg = {"key": "k", "time": "t", **({"id": "id"} if with_id else {})}
    return pipeline_from_dict(
        {
            "name": "prop",
            "event": event_cfg,
            "lateness": {"allowed": lateness},
            "partition": 20,
            "start": "1970-01-01T00:00:00Z",
            "windows": WINDOWS,
        }
    )


def random_events(rnd: random.Random, spec, n: int, lo: int = -20, hi: int = 70, keys: str = "abc") -> list[dict]:
    """Events (arrival order = list order) without source positions yet."""
    out = []
    for _ in range(n):
        r = rnd.random()
        if r < 0.2:
            v = None
        elif r < 0.8:
            v = rnd.randint(-40, 40) / 4
        else:
            v = round(rnd.uniform(-1e6, 1e6), 3) + 0.0  # + 0.0: no -0.0
        out.append(
            event(
                spec,
                rnd.randint(lo, hi),
                rnd.choice(keys),
                f"e{rnd.randint(0, n + n // 4)}" if spec.id_field else None,
                v=v,
                u=rnd.choice([None, "x", "y", "z"]),
                g=rnd.choice([None, None, 1, 3, 9, 20]),
            )
        )
    return out


def draw_scenario(rnd: random.Random):
    """(spec, [(events, w_new)]): events arrive up to 40 ms after their time, split into 2-4
    epochs (chunk i of one or two segments), under monotone watermarks that mostly trail
    the newest event, sometimes jump far past every window, and sometimes end at +inf."""
    spec = pipeline(rnd.choice([0, 10, 25, 25]))
    evs = random_events(rnd, spec, rnd.randint(6, 30), lo=-10, hi=40, keys="ab")
    evs.sort(key=lambda e: e["_t"] + rnd.uniform(0, 40))
    k = rnd.randint(2, 4)
    cuts = sorted(rnd.randint(0, len(evs)) for _ in range(k - 1))
    groups = [evs[a:b] for a, b in zip([0, *cuts], [*cuts, len(evs)], strict=True)]
    epochs, w, hi = [], NEG_INF, -20
    for i, g in enumerate(groups):
        rows: Counter = Counter()
        for e in g:
            e["_seg"], e["_seq"] = rnd.choice("01"), i
            e["_row"] = rows[e["_seg"]]
            rows[e["_seg"]] += 1
        hi = max([hi] + [e["_t"] for e in g])
        move = rnd.random()
        if i == len(groups) - 1 and move < 0.3:
            w = INF
        elif move < 0.1:
            pass  # W does not move
        elif move < 0.75:
            w = max(w, hi - rnd.randint(0, 12))
        elif move < 0.9:
            w = max(w, rnd.randint(-25, 60))
        else:
            w = max(w, hi + 40)  # far past every window and its lateness
        epochs.append((g, w))
    return spec, epochs


FEATURES = ("late firing", "retraction", "late dead letter", "duplicate", "purge")


def features(spec, epochs) -> set[str]:
    """What a scenario exercises, found by running the (cheap) reference on it."""
    ref, seen = reference.RefState(), set()
    for events, w in epochs:
        w_prev, before = ref.watermark, {n: len(s) for n, s in ref.windows.items()}
        out = reference.run_epoch(spec, ref, events, w)
        for name, rows in out.items():
            seen |= {
                "retraction" if r["retract"] else "late firing"
                for r in rows
                if r["retract"] or r["window_end"] <= w_prev
            }
            if before.get(name, 0) and len(ref.windows[name]) < before[name]:
                seen.add("purge")
    seen |= {"late dead letter" for d in ref.dead if d[0] == "late"} | {
        "duplicate" for d in ref.dead if d[0] == "duplicate"
    }
    return seen


def scenario(seed: int, tries: int = 40):
    """A random scenario that exercises as many FEATURES as one of `tries` draws can:
    Spark epochs are expensive, so each example should be a rich one."""
    rnd = random.Random(seed)
    best, best_n = None, -1
    for _ in range(tries):
        spec, epochs = draw_scenario(rnd)
        n = len(features(spec, [(list(map(dict, g)), w) for g, w in epochs]))
        if n > best_n:
            best, best_n = (spec, epochs), n
        if n == len(FEATURES):
            break
    assert best is not None, "tries >= 1"
    return best


def _sketch_matches(func: str, sketch: bytes | None, exact) -> bool:
    """A sketch partial against the reference's exact values: windows this small are held
    exactly by both sketches (HLL's coupon list, the t-digest's one-value centroids up to
    TDIGEST_EXACT_N values), so the t-digest holds their count, extremes and quantiles."""
    from wire_dagster.aggregates import exact_quantile
    from wire_dagster.sketches import TDIGEST_EXACT_N, _ds, hll_estimate, tdigest_quantile

    ds = _ds()
    if func == "approx_count_distinct":
        return hll_estimate(sketch) == len(exact)
    if sketch is None:
        return not exact
    assert len(exact) <= TDIGEST_EXACT_N, "the property tests' windows are small"
    td = ds.tdigest_double.deserialize(sketch)
    return (
        td.get_total_weight() == len(exact)
        and (td.get_min_value(), td.get_max_value()) == (min(exact), max(exact))
        and all(tdigest_quantile(sketch, q) == exact_quantile(exact, q) for q in (0.1, 0.25, 0.5, 0.75, 0.9))
    )


def compare_state(spec, kernel_state: dict, ref_state: dict) -> list[str]:
    """Open windows and their partials: counts exact, sums/extremes close, distinct sets by size,
    sketches by what they hold."""
    out = []
    for w in spec.windows:
        got = {(r["key"], r["start"], r["end"]): r for r in kernel_state[w.name].to_pylist()}
        want = ref_state.get(w.name, {})
        if set(got) != set(want):
            only_k, only_r = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            out.append(f"{w.name} state: kernel-only {only_k}, reference-only {only_r}")
            continue
        for k, p in want.items():
            for c, v in p.items():
                if c.endswith("_best"):  # a value aggregate: the kernel keeps the chosen value as `_v`
                    g = got[k][c[: -len("_best")] + "_v"]
                    ok = g == (v[1] if v is not None else None)
                    if not ok:
                        out.append(f"{w.name} state {k} {c}: kernel {g!r}, reference {v!r}")
                    continue
                if c.endswith("_exact"):  # a sketch aggregate: the kernel keeps the sketch as `_sk`
                    name = c[len("p_") : -len("_exact")]
                    func = next(a.func for a in w.aggregates if a.name == name)
                    g = got[k][f"p_{name}_sk"]
                    if not _sketch_matches(func, g, v):
                        out.append(f"{w.name} state {k} {c}: kernel sketch of {g!r}, reference {v!r}")
                    continue
                g = got[k][c]
                if c.endswith("_set"):
                    ok = len(g) == len(v)
                elif c.endswith("_s"):  # the kernel's sum of no values is null, the reference's 0
                    ok = math.isclose(float(g if g is not None else 0), float(v), rel_tol=1e-12, abs_tol=1e-9)
                else:
                    ok = g == v
                if not ok:
                    out.append(f"{w.name} state {k} {c}: kernel {g!r}, reference {v!r}")
    return out


@settings(
    max_examples=SEEDS,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),  # pyright: ignore[reportArgumentType]  HealthCheckMeta.__iter__ is untyped
)
@given(seed=st.integers(0, 2**32 - 1))
@pytest.mark.parametrize("single_task", [False, True], ids=["key buckets", "single task"])
def test_kernel_equals_reference(spark, single_task, seed):
    spec, epochs = scenario(seed)
    shape = [(len(g), w) for g, w in epochs]
    note(f"lateness={spec.allowed_lateness} epochs={shape} features={sorted(features(spec, epochs))}")
    run, ref = KernelRun(spec, single_task=single_task), reference.RefState()
    for i, (events, w_new) in enumerate(epochs, start=1):
        rows = [(e["_t"], e["_key"], e["_id"], e["_seg"], e["_seq"], e["_row"]) for e in events]
        note(f"epoch {i}: W {run.watermark} -> {w_new}; events {rows}")
        n_dead, before = len(ref.dead), {w: dict(c) for w, c in ref.window_counts.items()}
        dup_before = ref.counts["duplicate"]
        res = run.epoch(spark, events, w_new)
        want = reference.run_epoch(spec, ref, events, w_new)
        problems = check_balance(spec, res)
        for w in spec.windows:
            problems += diff_rows(res.windows[w.name].outputs.to_pylist(), want[w.name], f"epoch {i} {w.name} emitted")
            wc, b = ref.window_counts[w.name], before.get(w.name, {"counted": 0, "late": 0})
            r = res.windows[w.name]
            if (r.counted, r.late) != (wc["counted"] - b["counted"], wc["late"] - b["late"]):
                ref_counts = (wc["counted"] - b["counted"], wc["late"] - b["late"])
                problems.append(
                    f"epoch {i} {w.name}: kernel counted/late {(r.counted, r.late)}, reference {ref_counts}"
                )
        if res.duplicate != ref.counts["duplicate"] - dup_before:
            problems.append(
                f"epoch {i}: kernel duplicates {res.duplicate}, reference {ref.counts['duplicate'] - dup_before}"
            )
        want_dead = Counter((reason, w, e["_seg"], e["_seq"], e["_row"]) for reason, w, e in ref.dead[n_dead:])
        if dead_letter_keys(res) != want_dead:
            got_dead = dead_letter_keys(res)
            problems.append(
                f"epoch {i} dead letters: kernel-only {got_dead - want_dead}, reference-only {want_dead - got_dead}"
            )
        problems += [f"epoch {i} {p}" for p in compare_state(spec, run.state, ref.windows)]
        id_rows = run.ids.to_pylist() if run.ids is not None else []  # None: no id memory
        got_ids = {r["id"]: (r["expires"], r["key"], r["t"]) for r in id_rows}
        if got_ids != ref.ids:
            problems.append(
                f"epoch {i} id memory: kernel {sorted(got_ids.items())} reference {sorted(ref.ids.items())}"
            )
        assert not problems, "\n".join(problems)
    for w in spec.windows:
        assert not diff_views(run.view.get(w.name, {}), ref.view.get(w.name, {}), f"final view {w.name}")
    if run.watermark == INF:
        assert all(run.state[w.name].num_rows == 0 for w in spec.windows)


# ---------------------------------------------------------------------------
# Closed stream = batch, checked by DuckDB


def duckdb_batch(spec, events: list[dict]) -> dict[str, list[dict]]:
    """Batch results per window, by SQL over the deduplicated events."""
    con = duckdb.connect()
    con.register("raw", events_table(spec, events))
    # the first copy of an id in read order (segment, chunk, row) counts
    dedup = "QUALIFY row_number() OVER (PARTITION BY _id ORDER BY _seg, _seq, _row) = 1" if spec.id_field else ""
    con.execute(
        "CREATE TEMP TABLE ev AS SELECT _t AS t, _key AS k, f_v AS v, f_u AS u, f_g AS g, _seg, _seq, _row "
        f"FROM raw {dedup}"
    )
    position = "_seg {d}, _seq {d}, _row {d}"
    sql_agg = {
        "count": lambda a: "count(*)",
        "sum": lambda a: f"sum({a.field})",
        "min": lambda a: f"min({a.field})",
        "max": lambda a: f"max({a.field})",
        "avg": lambda a: f"avg({a.field})",
        "count_distinct": lambda a: f"count(DISTINCT {a.field})",
        # exact here (the windows are small): the distinct count, and the (floor(q * n) + 1)-th
        # smallest value, at most the n-th (aggregates.exact_quantile, the t-digest's), by SQL
        "approx_count_distinct": lambda a: f"count(DISTINCT {a.field})",
        "approx_quantile": lambda a: (
            f"list_sort(list({a.field}) FILTER (WHERE {a.field} IS NOT NULL))"
            f"[least(count({a.field}), floor({a.q!r}::DOUBLE * count({a.field})) + 1)::BIGINT]"
        ),
        # the value aggregates: the field's text at the extreme `by` (ties: the smallest text), or
        # at the first (last) event by time, then (segment, chunk, row), among those with a value
        "arg_max": lambda a: (
            f"first(CAST({a.field} AS VARCHAR) ORDER BY {a.by} DESC, CAST({a.field} AS VARCHAR) "
            f"NULLS LAST) FILTER (WHERE {a.by} IS NOT NULL)"
        ),
        "arg_min": lambda a: (
            f"first(CAST({a.field} AS VARCHAR) ORDER BY {a.by} ASC, CAST({a.field} AS VARCHAR) "
            f"NULLS LAST) FILTER (WHERE {a.by} IS NOT NULL)"
        ),
        "first": lambda a: (
            f"first(CAST({a.field} AS VARCHAR) ORDER BY t, {position.format(d='ASC')}) "
            f"FILTER (WHERE {a.field} IS NOT NULL)"
        ),
        "last": lambda a: (
            f"first(CAST({a.field} AS VARCHAR) ORDER BY t DESC, {position.format(d='DESC')}) "
            f"FILTER (WHERE {a.field} IS NOT NULL)"
        ),
    }
    out = {}
    for w in spec.windows:
        aggs = ", ".join(f"{sql_agg[a.func](a)} AS {a.name}" for a in w.aggregates)
        if w.type != "session":
            # the newest window holding t starts at t - ((t - offset) mod slide); the others slide back
            sql = f"""
                SELECT k AS key, s AS window_start, s + {w.size} AS window_end, {aggs}
                FROM (SELECT *, t - (((t - {w.offset}) % {w.slide}) + {w.slide}) % {w.slide} - i * {w.slide} AS s
                      FROM ev CROSS JOIN range(0, {w.size // w.slide}) AS r(i))
                GROUP BY k, s"""
        else:
            gap = f"CASE WHEN g > 0 THEN g ELSE {w.gap} END" if w.gap_field else str(w.gap)
            sql = f"""
                WITH p AS (SELECT *, t AS s, t + {gap} AS e FROM ev),
                q AS (SELECT *, max(e) OVER (PARTITION BY k ORDER BY s, e
                                             ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach FROM p),
                r AS (SELECT *, sum(CASE WHEN reach IS NULL OR s > reach THEN 1 ELSE 0 END)
                                OVER (PARTITION BY k ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS island FROM q)
                SELECT k AS key, min(s) AS window_start, max(e) AS window_end, {aggs}
                FROM r GROUP BY k, island"""
        out[w.name] = con.sql(sql).to_arrow_table().to_pylist()
    con.close()
    return out


@settings(
    max_examples=SEEDS,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),  # pyright: ignore[reportArgumentType]  HealthCheckMeta.__iter__ is untyped
)
@given(seed=st.integers(0, 2**32 - 1), with_id=st.booleans())
def test_closed_stream_equals_duckdb_batch(spark, seed, with_id):
    rnd = random.Random(seed)
    spec = pipeline(rnd.choice([0, 6]), with_id=with_id)
    events = random_events(rnd, spec, rnd.randint(1, 40), keys=rnd.choice(["a", "ab", "abc"]))
    for i, e in enumerate(events):
        e["_seg"], e["_seq"], e["_row"] = str(i % 2), 0, i // 2
    run = KernelRun(spec)
    res = run.epoch(spark, events, INF)
    assert not check_balance(spec, res)
    assert all(r.late == 0 for r in res.windows.values())
    want = duckdb_batch(spec, events)
    for w in spec.windows:
        got = res.windows[w.name].outputs.to_pylist()
        assert not any(r["retract"] for r in got)
        problems = diff_rows(got, want[w.name], f"{w.name} vs duckdb")
        assert not problems, "\n".join(problems)
        assert run.state[w.name].num_rows == 0  # W = +inf purges everything


def test_duckdb_batch_is_not_vacuous():
    """The batch reference itself, on a hand-checked example (sessions touch at exactly `gap`)."""
    spec = pipeline(0)
    evs = [
        event(spec, 0, "a", "1", v=1.0, u="x", row=0),
        event(spec, 5, "a", "2", v=3.0, u="x", row=1),  # exactly gap 5 after: one `se` session [0, 10)
        event(spec, 11, "a", "3", v=None, u="y", row=2),  # 1 ms past the end: a new session
        event(spec, 11, "a", "3", v=9.0, u="z", row=3),  # repeated id: not counted
        event(spec, -1, "b", "4", v=2.0, g=20, row=4),
    ]
    got = duckdb_batch(spec, evs)
    se = {(r["key"], r["window_start"], r["window_end"]): (r["n"], r["total"], r["users"]) for r in got["se"]}
    assert se == {("a", 0, 10): (2, 4.0, 1), ("a", 11, 16): (1, None, 1), ("b", -1, 4): (1, 2.0, 0)}
    sg = {(r["key"], r["window_start"], r["window_end"]) for r in got["sg"]}
    assert sg == {("a", 0, 4), ("a", 5, 9), ("a", 11, 15), ("b", -1, 19)}  # default gap 4: 0 and 5 are apart
    # tumbling size 10 offset 3: -1 in [-7, 3); 0 in [-7, 3); 5 in [3, 13); 11 in [3, 13)
    tum = {(r["key"], r["window_start"]): r["n"] for r in got["tum"]}
    assert tum == {("a", -7): 1, ("a", 3): 2, ("b", -7): 1}
    # sliding 12/4 offset 1: t=-1 is in [-11, 1), [-7, 5), [-3, 9)
    assert {r["window_start"] for r in got["sl"] if r["key"] == "b"} == {-11, -7, -3}
