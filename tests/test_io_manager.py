"""Wire's IO manager (resources/io_manager.py) and the example user assets (examples/clicks_assets.py)
over the real embedded S3 server and a really committed `clicks` pipeline (pipelines/clicks.yaml).

Twenty minutes of clicks by three users on 2026-01-01 (four 5-minute partitions and the next,
where the open sessions end) are produced and the stream closed, so every window is final and
equals a plain batch aggregation (tests/reference.py). The expectations below are computed
from that reference and a partition rule written here (a result belongs to the partition
holding `window_end - 1`), never from what Wire committed.

1. The IO manager, called with `dg.build_input_context`: one partition, a range of three,
   and an input with no partition (everything committed) equal the reference's rows; a span
   list with a gap (`read_window(spans=...)`) too.
2. `dg.materialize` of the pipeline's own multi-asset with the example assets: the Wire run
   commits the stream and reports its partition (no IO manager writes a window: no
   HANDLED_OUTPUT for them), the example's partitioned asset receives that partition's rows
   as a pyarrow Table, the one with a `TimeWindowPartitionMapping(start_offset=-2)` the rows
   of three partitions, and the unpartitioned one every partition's, as pandas.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest

from reference import batch_of_clicks, same_value

PROJECT = Path(__file__).resolve().parent.parent
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, the clicks pipeline's start
M = 60_000
P = 5 * M  # clicks.yaml's partition


def make_events() -> list[dict]:
    """u1 clicks every 5 s for 20 minutes (one long session), u2 in three bursts, u3 every 47 s
    (a session per click: gap 30 s); in time order, unique ids, nothing late."""
    evs = [{"user_id": "u1", "ts": T0 + i * 5_000, "amount": i % 7} for i in range(240)]
    evs += [{"user_id": "u2", "ts": T0 + 120_000 + i * 4_000, "amount": 2 + i % 3} for i in range(16)]
    evs += [{"user_id": "u2", "ts": T0 + 510_000 + i * 10_000, "amount": 9} for i in range(3)]
    evs += [{"user_id": "u2", "ts": T0 + 840_000 + i * 6_000, "amount": i % 4} for i in range(21)]
    evs += [{"user_id": "u3", "ts": T0 + 10_000 + i * 47_000, "amount": 1 + i % 2} for i in range(25)]
    evs.sort(key=lambda e: (e["ts"], e["user_id"]))
    for i, e in enumerate(evs):
        e["event_id"] = f"c{i}"
    return evs


def partition_of(window_end: int) -> int:
    return T0 + (window_end - 1 - T0) // P * P


def key_of(p: int) -> str:
    return datetime.fromtimestamp(p / 1000, tz=UTC).strftime("%Y-%m-%d-%H:%M")


def expected(spec, window: str, parts: set[int] | None = None) -> list[dict]:
    """The reference's rows of `window` whose partition is in `parts` (all if None), by key and start."""
    ref = batch_of_clicks(spec, [{"user": e["user_id"], "ts": e["ts"], "amount": e["amount"]} for e in make_events()])
    rows = [r for r in ref[window] if parts is None or partition_of(r["window_end"]) in parts]
    return sorted(rows, key=lambda r: (r["key"], r["window_start"], r["window_end"]))


def _ms(v) -> int:
    return int(v.timestamp() * 1000)


def assert_rows(spec, window: str, table: pa.Table, want: list[dict]) -> None:
    got = table.to_pylist()
    assert table.schema.field("window_start").type == pa.timestamp("ms", tz="UTC")
    assert [(r["key"], _ms(r["window_start"]), _ms(r["window_end"])) for r in got] == [
        (r["key"], r["window_start"], r["window_end"]) for r in want
    ], window
    for g, x in zip(got, want, strict=True):
        for a in spec.window(window).aggregates:
            assert same_value(g[a.name], x[a.name]), (window, a.name, g, x)


@pytest.fixture
def clicks(store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The clicks pipeline (pipelines/clicks.yaml) with this test's events produced and its stream
    closed (nothing committed yet); the example module importable."""
    from wire_dagster.spec import load_pipeline
    from wire_dagster.streams import close_stream, produce

    monkeypatch.setenv("WIRE_PIPELINES", str(PROJECT / "pipelines"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster-home"))  # the run's chart goes there
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.syspath_prepend(str(PROJECT))
    spec = load_pipeline(PROJECT / "pipelines" / "clicks.yaml")
    f = tmp_path / "clicks.jsonl"
    evs = make_events()
    f.write_text("".join(json.dumps(e) + "\n" for e in evs))
    rep = produce(store, spec, f, segment="0")
    assert rep.events == len(evs) and rep.malformed == 0
    close_stream(store, spec)
    return spec


def _store_resource(store):
    from resources import ObjectStoreResource

    c = store.cfg
    return ObjectStoreResource(endpoint=c.endpoint, access_key=c.access_key, secret_key=c.secret_key, bucket=c.bucket)


def test_io_manager_loads_a_partition_a_range_and_everything(store, spark, clicks) -> None:
    from assets.keys import window_key
    from assets.partitions import partitions_def
    from resources import WireIOManager
    from wire_dagster import engine
    from wire_dagster.errors import WireInputError
    from wire_dagster.load import read_window

    spec = clicks
    with pytest.raises(WireInputError, match="no committed epoch"):
        read_window(store, spec.name, "sessions")
    out = engine.process(store, spec, spark, max_epochs=10)
    assert out.committed and out.pending == 0
    pdef = partitions_def(spec)
    parts = [T0 + i * P for i in range(5)]
    with dg.build_resources({"io": WireIOManager(store=_store_resource(store))}) as res:
        io = res.io
        for w in spec.windows:
            key = window_key(spec, w.name)
            # One partition (the second), then three (a range, as a TimeWindowPartitionMapping maps).
            for lo, hi in ((1, 1), (1, 3)):
                ctx = dg.build_input_context(
                    asset_key=key,
                    asset_partitions_def=pdef,
                    asset_partition_key_range=dg.PartitionKeyRange(key_of(parts[lo]), key_of(parts[hi])),
                )
                want = expected(spec, w.name, set(parts[lo : hi + 1]))
                assert want, (w.name, lo, hi, "the events put rows in every partition")
                assert_rows(spec, w.name, io.load_input(ctx), want)
            # No partition asked for: every committed partition (one table).
            assert_rows(spec, w.name, io.load_input(dg.build_input_context(asset_key=key)), expected(spec, w.name))
            # Spans with a gap: partitions 0 and 2.
            gap = read_window(store, spec.name, w.name, spans=[(parts[0], parts[1]), (parts[2], parts[3])])
            assert_rows(spec, w.name, gap, expected(spec, w.name, {parts[0], parts[2]}))
        # Annotated `pyspark.sql.DataFrame`: the same rows in the run's Spark session.
        from pyspark.sql import DataFrame as SparkFrame

        from resources.io_manager import _as

        table = io.load_input(dg.build_input_context(asset_key=window_key(spec, "sessions")))
        sdf = _as(table, SparkFrame, "sessions")
        assert isinstance(sdf, SparkFrame) and sdf.columns == table.column_names
        assert_rows(spec, "sessions", sdf.toArrow().cast(table.schema), expected(spec, "sessions"))
        # Annotated `polars.DataFrame`: the same rows, zero-copy from Arrow where Polars can.
        import polars

        pdf = _as(table, polars.DataFrame, "sessions")
        assert isinstance(pdf, polars.DataFrame) and pdf.columns == table.column_names
        assert_rows(spec, "sessions", pdf.to_arrow().cast(table.schema), expected(spec, "sessions"))
        # A partition with no result: an empty table with the window's columns.
        ctx = dg.build_input_context(
            asset_key=window_key(spec, "sessions"),
            asset_partitions_def=pdef,
            asset_partition_key_range=dg.PartitionKeyRange(key_of(T0 + 20 * P), key_of(T0 + 20 * P)),
        )
        empty = io.load_input(ctx)
        assert empty.num_rows == 0 and empty.column_names == ["key", "window_start", "window_end", "events", "total"]
        # The IO manager never writes a window.
        io.handle_output(dg.build_output_context(asset_key=window_key(spec, "sessions")), None)
        with pytest.raises(dg.DagsterInvariantViolationError, match="only loads"):
            io.handle_output(dg.build_output_context(asset_key=window_key(spec, "sessions")), pa.table({"a": [1]}))


def test_example_assets_load_windows_in_a_dagster_run(store, spark, clicks) -> None:
    import pandas as pd

    from assets import build_assets
    from resources import IO_MANAGER_KEY, SparkResource, WireIOManager

    example = pytest.importorskip("examples.clicks_assets")
    spec = clicks
    wire = build_assets(spec)
    store_res = _store_resource(store)
    resources = {
        "wire_store": store_res,
        "wire_spark": SparkResource(master="local[2]"),
        IO_MANAGER_KEY: WireIOManager(store=store_res),
    }
    p3 = T0 + 3 * P
    # One run: Wire's multi-asset commits the closed stream and reports partition 00:15; the example's
    # assets of that partition load it (user_totals) and it with the two before it (busiest_minute_15m).
    res = dg.materialize(
        [wire, example.user_totals, example.busiest_minute_15m], partition_key=key_of(p3), resources=resources
    )
    assert res.success
    # Wire's step reports its windows without a value: no IO manager handles them; the example's do.
    handled = {e.step_key for e in res.all_events if e.event_type_value == "HANDLED_OUTPUT"}
    assert handled == {"clicks_example__user_totals", "clicks_example__busiest_minute_15m"}, handled
    loaded = [e for e in res.all_events if e.event_type_value == "LOADED_INPUT"]
    assert len(loaded) == 2 and {getattr(e.event_specific_data, "manager_key", None) for e in loaded} == {
        IO_MANAGER_KEY
    }
    mats = {(m.asset_key.to_user_string(), m.partition) for m in res.asset_materializations_for_node(wire.op.name)}
    assert mats >= {(f"clicks/{w.name}", key_of(p3)) for w in spec.windows}, mats

    per_minute = expected(spec, "clicks_per_minute", {p3})
    totals: dict[str, list[float]] = {}
    for r in per_minute:
        t = totals.setdefault(r["key"], [0, 0.0])
        t[0] += r["events"]
        t[1] += float(r["total"])
    got = res.asset_value(example.user_totals.key).to_pylist()
    assert [g["key"] for g in got] == sorted(totals)
    for g in got:
        assert g["events_sum"] == totals[g["key"]][0] and same_value(g["total_sum"], totals[g["key"]][1]), g

    by_minute: dict[int, int] = {}
    for r in expected(spec, "clicks_per_minute", {p3 - 2 * P, p3 - P, p3}):
        by_minute[r["window_start"]] = by_minute.get(r["window_start"], 0) + r["events"]
    assert len(by_minute) == 15
    top = sorted(by_minute.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    got = res.asset_value(example.busiest_minute_15m.key).to_pylist()
    assert [(_ms(g["window_start"]), g["events_sum"]) for g in got] == top

    # An unpartitioned asset: every committed partition of `sessions`, as a pandas DataFrame.
    res = dg.materialize([wire, example.long_sessions], selection=[example.long_sessions], resources=resources)
    assert res.success
    df = res.asset_value(example.long_sessions.key)
    assert isinstance(df, pd.DataFrame)
    want = [r for r in expected(spec, "sessions") if r["events"] >= 10]
    assert len({partition_of(r["window_end"]) for r in want}) >= 2, "long sessions end in several partitions"
    assert_rows(spec, "sessions", pa.Table.from_pandas(df, preserve_index=False), want)
