"""`input:` on a window (DESIGN §4 dataflow forms): in a pipeline of several inputs, a window
that names an input aggregates the records of that input only; one that names none reads all.

The kernel (both Spark paths) against the plain-Python reference (tests/reference.py, which
filters a window's events by the input their segment `<input>.<segment>` belongs to): random
events of two inputs over random epochs and watermarks (late events included); every epoch's
rows, counts and dead letters, and the reader's final view, must match. Per window the counts
balance with the events of the inputs it does not read: in = counted + late + other + duplicate.

WIRE_SEEDS / 5 sets the number of random scenarios (default 1; `make test-long`'s WIRE_SEEDS=25: 5).
"""

from __future__ import annotations

import os
import random
from collections import Counter

import pyarrow as pa
import pytest

import reference
from kernel_harness import KernelRun, check_balance, dead_letter_keys, diff_rows, diff_views, event
from wire_dagster.errors import WireInputError
from wire_dagster.spec import pipeline_from_dict
from wire_dagster.timeutil import INF, NEG_INF

RAW = {
    "name": "two",
    "inputs": [
        {"name": "web", "stream": "web", "time": "ts", "id": "eid", "key": "user"},
        {"name": "app", "stream": "app", "time": "at", "id": "event", "key": "uid"},
    ],
    "lateness": {"allowed": 10},
    "partition": 20,
    "start": "1970-01-01T00:00:00Z",
    "windows": [
        {
            "name": "web_only",
            "type": "tumbling",
            "size": 10,
            "input": "web",
            "aggregates": {"n": "count", "total": "sum(amount)", "d": "approx_count_distinct(amount)"},
        },
        {"name": "both", "type": "sliding", "size": 10, "slide": 5, "aggregates": {"n": "count", "hi": "max(amount)"}},
        {
            "name": "app_sessions",
            "type": "session",
            "gap": 4,
            "input": "app",
            "aggregates": {"n": "count", "med": "approx_quantile(amount, 0.5)"},
        },
    ],
}


def scenario(seed: int):
    spec = pipeline_from_dict(RAW)
    rnd = random.Random(seed)
    evs = []
    for i in range(rnd.randint(40, 80)):
        seg = rnd.choice(["web.0", "app.0", "app.1"])
        # ids are unique per input (`<input>:<id>`, as kernel.Chunks qualifies them); web repeats some
        eid = f"web:e{rnd.randint(0, 60)}" if seg == "web.0" else f"app:{i}"
        amount = rnd.choice([None, 1.0, 2.5, rnd.randint(-9, 9) / 2])
        evs.append(event(spec, rnd.randint(0, 60), rnd.choice("ab"), eid, seg=seg, row=i, amount=amount))
    evs.sort(key=lambda e: e["_t"] + rnd.uniform(0, 30))
    cuts = sorted(rnd.sample(range(1, len(evs)), 2))
    epochs, w = [], NEG_INF
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(evs)], strict=True)):
        group = evs[a:b]
        rows: Counter = Counter()
        for e in group:
            e["_seq"], e["_row"] = i, rows[e["_seg"]]
            rows[e["_seg"]] += 1
        w = INF if i == 2 else max(w, max(e["_t"] for e in group) - rnd.randint(0, 15))
        epochs.append((group, w))
    return spec, epochs


@pytest.mark.parametrize("single_task", [False, True], ids=["key buckets", "single task"])
@pytest.mark.parametrize("seed", range(1, 1 + max(1, int(os.environ.get("WIRE_SEEDS", "3")) // 5)))
def test_a_window_with_input_reads_that_input_only(spark, single_task, seed):
    spec, epochs = scenario(seed)
    run, ref = KernelRun(spec, single_task=single_task), reference.RefState()
    others = Counter()
    for i, (events, w_new) in enumerate(epochs, start=1):
        before = {w: dict(c) for w, c in ref.window_counts.items()}
        n_dead = len(ref.dead)
        res = run.epoch(spark, events, w_new)
        want = reference.run_epoch(spec, ref, events, w_new)
        problems = check_balance(spec, res)
        for w in spec.windows:
            problems += diff_rows(res.windows[w.name].outputs.to_pylist(), want[w.name], f"epoch {i} {w.name}")
            r, wc = res.windows[w.name], ref.window_counts[w.name]
            b = before.get(w.name, {"counted": 0, "late": 0, "other": 0})
            if (r.counted, r.late, r.other) != tuple(wc[k] - b[k] for k in ("counted", "late", "other")):
                problems.append(f"epoch {i} {w.name}: kernel {(r.counted, r.late, r.other)}, reference {wc} - {b}")
            others[w.name] += r.other
        want_dead = Counter((reason, w, e["_seg"], e["_seq"], e["_row"]) for reason, w, e in ref.dead[n_dead:])
        if dead_letter_keys(res) != want_dead:
            problems.append(f"epoch {i} dead letters: kernel {dead_letter_keys(res)}, reference {want_dead}")
        assert not problems, "\n".join(problems)
    for w in spec.windows:
        assert not diff_views(run.view.get(w.name, {}), ref.view.get(w.name, {}), f"final view {w.name}")
    # not vacuous: the input windows did leave the other input's events out, the union window none
    assert others["web_only"] > 0 and others["app_sessions"] > 0 and others["both"] == 0
    web = sum(1 for g, _ in epochs for e in g if e["_seg"].startswith("web."))
    assert 0 < web < sum(len(g) for g, _ in epochs)


def test_batch_of_the_union_and_of_each_input():
    """The reference itself, by hand: a window with `input: web` over a closed stream counts the
    web events only (the plain batch of that input), the union window counts all."""
    spec = pipeline_from_dict(RAW)
    evs = [
        event(spec, 1, "a", "web:1", seg="web.0", row=0, amount=1.0),
        event(spec, 2, "a", "app:1", seg="app.0", row=0, amount=5.0),
        event(spec, 3, "a", "app:2", seg="app.1", row=0, amount=7.0),
    ]
    ref = reference.RefState()
    out = reference.run_epoch(spec, ref, evs, INF)
    assert [(r["window_start"], r["n"], r["total"]) for r in out["web_only"]] == [(0, 1, 1.0)]
    assert {(r["window_start"], r["n"]) for r in out["both"]} == {(-5, 3), (0, 3)}
    # the median of (5, 7): the (floor(0.5 * 2) + 1)-th smallest, as the t-digest returns it
    assert [(r["window_start"], r["window_end"], r["n"], r["med"]) for r in out["app_sessions"]] == [(2, 7, 2, 7.0)]


@pytest.mark.parametrize(
    "change,why",
    [
        ({"input": "mobile"}, "windows.web_only.input: no input named 'mobile'; choose one of: web, app"),
        ({"input": "Web!"}, "windows.web_only.input: bad name"),
    ],
)
def test_bad_window_input_is_a_one_line_error(change, why):
    raw = {**RAW, "windows": [{**RAW["windows"][0], **change}]}
    with pytest.raises(WireInputError) as e:
        pipeline_from_dict(raw)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_input_of_a_single_stream_pipeline_is_its_stream():
    """A pipeline of one input (stream + event) may name it: the stream's name; another is refused."""
    base = {
        "name": "one",
        "stream": "clicks",
        "event": {"time": "t", "key": "k"},
        "partition": 10,
        "windows": [{"name": "w", "type": "tumbling", "size": 10, "input": "clicks", "aggregates": {"n": "count"}}],
    }
    assert pipeline_from_dict(base).windows[0].input == "clicks"
    base["windows"][0]["input"] = "views"
    with pytest.raises(WireInputError, match="no input named 'views'; choose one of: clicks"):
        pipeline_from_dict(base)


def test_a_window_over_derived_inputs_reads_its_input_only():
    """A stage over derived streams recomputes its windows with `bucket_epoch` over the upstream
    rows, each under segment `<input>.<partition>` (derived.py): a window with `input:` reads its own."""
    from wire_dagster.bucketkernel import bucket_epoch, side_table
    from wire_dagster.events import chunk_schema

    spec = pipeline_from_dict(
        {
            "name": "stage",
            "inputs": [
                {"name": "ups", "pipeline": "p1", "output": "w", "key": "key"},
                {"name": "downs", "pipeline": "p2", "output": "w", "key": "key"},
            ],
            "partition": 20,
            "start": "1970-01-01T00:00:00Z",
            "windows": [
                {"name": "up", "type": "tumbling", "size": 10, "input": "ups", "aggregates": {"s": "sum(n)"}},
                {"name": "all", "type": "tumbling", "size": 10, "aggregates": {"s": "sum(n)"}},
            ],
        }
    )
    rows = [("ups.0", 1, 2.0), ("downs.0", 2, 5.0), ("ups.0", 3, 7.0)]
    evs = [event(spec, t, "k", None, seg=seg, row=i, n=n) for i, (seg, t, n) in enumerate(rows)]
    schema = chunk_schema(spec).append(pa.field("_seg", pa.string())).append(pa.field("_seq", pa.int64()))
    table = pa.Table.from_pylist([{c: e.get(c) for c in schema.names} for e in evs], schema=schema)
    out = bucket_epoch(spec, table, side_table(spec, {}, None), NEG_INF, INF)
    assert [(r["window_start"], r["s"]) for r in out[("out", "up")].to_pylist()] == [(0, 9.0)]
    assert [(r["window_start"], r["s"]) for r in out[("out", "all")].to_pylist()] == [(0, 14.0)]


def test_the_engine_commits_input_windows_equal_to_the_batch_of_their_input(store, spark, tmp_path, cli_env):
    """The real path (S3 chunks of two streams, engine.process): a window with `input: web` equals
    the plain batch of web's events, the union window the batch of both; per window the manifest
    counts the events of its input as counted (the other input's are in no per-window count yet)."""
    import json

    from reference import assert_same_rows, batch
    from wire_dagster import engine, results, streams
    from wire_dagster.spec import field_column, stream_spec

    t0 = 1_767_225_600_000
    raw = {
        "name": "two_e2e",
        "inputs": [
            {"name": "web", "stream": "web", "time": "ts", "id": "eid", "key": "user"},
            {"name": "app", "stream": "app", "time": "at", "id": "event", "key": "uid"},
        ],
        "watermark": {"max_out_of_orderness": "1s", "idle_timeout": "1h"},
        "partition": "1m",
        "start": "2026-01-01T00:00:00Z",
        "windows": [
            {"name": "web_10s", "type": "tumbling", "size": "10s", "input": "web", "aggregates": {"n": "count"}},
            {"name": "all_10s", "type": "tumbling", "size": "10s", "aggregates": {"n": "count", "s": "sum(amount)"}},
            {"name": "app_s", "type": "session", "gap": "3s", "input": "app", "aggregates": {"top": "max(amount)"}},
        ],
    }
    spec = pipeline_from_dict(raw)
    rnd = random.Random(4)
    web = [{"ts": t0 + rnd.randrange(60_000), "eid": f"e{i}", "user": f"u{i % 5}", "amount": i % 7} for i in range(200)]
    app = [
        {"at": t0 + rnd.randrange(60_000), "event": f"e{i}", "uid": f"u{i % 3}", "amount": i % 4} for i in range(150)
    ]
    for name, rows, time_f, id_f in (("web", web, "ts", "eid"), ("app", app, "at", "event")):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        streams.produce(store, stream_spec(name, time_f, id_f), path)
        streams.close_stream(store, name)
    m = engine.process(store, spec, spark, max_epochs=10).manifest
    assert m is not None and m.watermark == INF
    ev_web = [{"_t": e["ts"], "_key": e["user"], field_column("amount"): float(e["amount"])} for e in web]
    ev_app = [{"_t": a["at"], "_key": a["uid"], field_column("amount"): float(a["amount"])} for a in app]
    reads = {"web_10s": ev_web, "all_10s": ev_web + ev_app, "app_s": ev_app}
    want = {w.name: [r for _, r in sorted(batch(spec, w, reads[w.name]).items())] for w in spec.windows}
    got = {w.name: results.read_results(store, spec, w.name).to_pylist() for w in spec.windows}
    assert_same_rows(spec, got, want)
    t = m.totals
    assert t.events_in == len(web) + len(app) and t.late == {"web_10s": 0, "all_10s": 0, "app_s": 0}
    assert t.counted == {"web_10s": len(web), "all_10s": len(web) + len(app), "app_s": len(app)}
    # Conservation per window: the events of the input a window does not read are `other`.
    assert t.other == {"web_10s": len(app), "app_s": len(web)} and t.balanced()
    # ... and `wire status` shows them in a column of their own, and says the sum balances.
    import yaml

    from conftest import run_wire

    (tmp_path / "two_e2e.yaml").write_text(yaml.safe_dump(raw))
    st = run_wire(["status", "--pipeline", str(tmp_path / "two_e2e.yaml")], cli_env, check=True).stdout
    head = next(line for line in st.splitlines() if "counted" in line and "window" in line)
    assert [c.strip() for c in head.split("┃")[1:6]] == ["window", "type", "counted", "late", "other"], st
    cells = {r.split("│")[1].strip(): [c.strip() for c in r.split("│")[2:6]] for r in st.splitlines() if "│" in r}
    assert cells["web_10s"] == ["tumbling", str(len(web)), "0", str(len(app))], st
    assert cells["all_10s"] == ["tumbling", str(len(web) + len(app)), "0", "0"], st
    assert "= counted + late + other (per window)" in st and "(balanced)" in st, st


def test_a_derived_stage_with_input_windows_and_sketches_equals_the_composition(store, spark, tmp_path):
    """A stage over two derived inputs (two windows of one upstream pipeline): a window with
    `input: ones` computes its sketches (exact at this size) over that input's rows only, one
    without `input:` counts the rows of both; equal to plain Python over the final upstream rows."""
    import json

    import yaml

    from wire_dagster import engine, results, streams
    from wire_dagster.aggregates import exact_quantile
    from wire_dagster.spec import load_pipeline, stream_spec

    t0 = 1_767_225_600_000
    common = {"watermark": {"max_out_of_orderness": "1s"}, "partition": "1m", "start": "2026-01-01T00:00:00Z"}
    up = {
        "name": "up_in",
        "stream": "clicks_in",
        "event": {"key": "user", "time": "ts", "id": "eid"},
        "windows": [
            {"name": "per_1s", "type": "tumbling", "size": "1s", "aggregates": {"n": "count"}},
            {"name": "per_2s", "type": "tumbling", "size": "2s", "aggregates": {"n": "count"}},
        ],
    }
    down = {
        "name": "down_in",
        "inputs": [
            {"name": "ones", "pipeline": "up_in", "output": "per_1s", "key": "key"},
            {"name": "twos", "pipeline": "up_in", "output": "per_2s", "key": "key"},
        ],
        "windows": [
            {
                "name": "ones_10s",
                "type": "tumbling",
                "size": "10s",
                "input": "ones",
                "aggregates": {"med": "approx_quantile(n, 0.5)", "wins": "approx_count_distinct(window_start)"},
            },
            {"name": "rows_10s", "type": "tumbling", "size": "10s", "aggregates": {"rows": "count"}},
        ],
    }
    for body in (up, down):
        (tmp_path / f"{body['name']}.yaml").write_text(yaml.safe_dump({**body, **common}))
    up_spec, down_spec = (load_pipeline(tmp_path / f"{n}.yaml") for n in ("up_in", "down_in"))
    rnd = random.Random(8)
    evs = [{"ts": t0 + rnd.randrange(30_000), "eid": f"e{i}", "user": f"u{rnd.randrange(3)}"} for i in range(400)]
    path = tmp_path / "clicks.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in evs))
    streams.produce(store, stream_spec("clicks_in", "ts", "eid", up_spec), path)
    streams.close_stream(store, "clicks_in")
    while engine.process(store, up_spec, spark, max_epochs=10).committed:
        pass
    while engine.process(store, down_spec, spark, max_epochs=10).committed:
        pass
    ones = results.read_results(store, up_spec, "per_1s").to_pylist()
    twos = results.read_results(store, up_spec, "per_2s").to_pylist()
    want_ones: dict[tuple, list] = {}
    for r in ones:  # a row's event time is its window_end - 1
        want_ones.setdefault((r["key"], (r["window_end"] - 1 - t0) // 10_000 * 10_000 + t0), []).append(r)
    got = {(r["key"], r["window_start"]): r for r in results.read_results(store, down_spec, "ones_10s").to_pylist()}
    assert set(got) == set(want_ones)
    for ident, rows in want_ones.items():
        assert got[ident]["med"] == exact_quantile([float(r["n"]) for r in rows], 0.5)
        assert got[ident]["wins"] == len({r["window_start"] for r in rows})
    counts: Counter = Counter((r["key"], (r["window_end"] - 1 - t0) // 10_000 * 10_000 + t0) for r in ones + twos)
    rows_10s = results.read_results(store, down_spec, "rows_10s").to_pylist()
    assert {(r["key"], r["window_start"]): r["rows"] for r in rows_10s} == dict(counts)
