"""A dataflow under `dagster dev` (issue 23): NEXMark's hot-items query as three pipelines —
bids per auction per sliding window (a raw stage), the maximum per window (derived), their join
keeping every tie (derived, two inputs) — loaded into the running code location. Producing the
bids makes the daemon's sensors run every stage on their own, in dataflow order; the asset graph
holds the edges of the dataflow; late bids (within the first stage's lateness) that change an
upstream partition make the sensors re-run the join's partition with new content (a new data
version); and the committed result equals the query's SQL in DuckDB over every bid.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from benchmarks.nexmark import Config, generate
from dagster_stack import SETTLE_TIMEOUT
from test_nexmark_queries import Q5
from wire_dagster.procgroup import wait_until

ROOT = Path(__file__).resolve().parent.parent
T1, M = 1_767_225_660_000, 60_000  # 2026-01-01T00:01:00Z, where the generator's bids start


def _produce(store, level, path: Path, rows: list[dict], schema: pa.Schema) -> None:
    from wire_dagster.streams import produce

    pq.write_table(pa.Table.from_pylist(rows, schema), path)
    produce(store, level, path, chunk_rows=1_000)


STAGES = ("q5_counts", "q5_max", "q5")


def test_the_sensors_run_a_three_stage_query_on_their_own(dagster_stack, tmp_path: Path) -> None:
    from sensors import sensor_name
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.spec import load_pipeline, stream_spec
    from wire_dagster.streams import close_stream
    from wire_dagster.timeutil import INF

    st = dagster_stack
    pdir = st.tmp / "pipelines"
    bodies = {}
    for stage in STAGES:
        body = yaml.safe_load((ROOT / "pipelines" / "nexmark" / f"{stage}.yaml").read_text())
        body["dagster"] = {"sensor_interval": "2s"}
        if stage == "q5_counts":
            body["lateness"] = {"allowed": "3m"}  # the late bids below count
        bodies[stage] = body
    # upstreams first, then one reload of the code location with all three (derived inputs must resolve)
    for stage in STAGES[:-1]:
        (pdir / f"{bodies[stage]['name']}.yaml").write_text(yaml.safe_dump(bodies[stage]))
    last = st.add_pipeline(bodies[STAGES[-1]])
    specs = {stage: load_pipeline(pdir / f"{bodies[stage]['name']}.yaml") for stage in STAGES}
    assert last.name == specs["q5"].name
    for spec in specs.values():
        assert st.sensor(sensor_name(spec)) is not None, spec.name

    # Lineage: the join depends on both derived inputs, the maximum on the counts.
    nodes = st.gql("{ assetNodes { assetKey { path } dependencyKeys { path } } }")["assetNodes"]
    deps = {"/".join(n["assetKey"]["path"]): {"/".join(d["path"]) for d in n["dependencyKeys"]} for n in nodes}
    assert {"nexmark_q5_counts/auction_bids", "nexmark_q5_max/max_bids"} <= deps["nexmark_q5/hot_items"], deps
    assert "nexmark_q5_counts/auction_bids" in deps["nexmark_q5_max/max_bids"], deps

    bids = generate(Config(events=6_000, keys=40, seed=2, segments=1, chunk_rows=1_000, ooo_group=50))["bids"]
    level = stream_spec("bids", "date_time", "bid_id", specs["q5_counts"])
    # The bids span 00:01:00-00:01:06; one more at 00:03:00 moves W past 00:02, so partition 00:01
    # of every stage is ready and materialized while the stream is still open.
    rows = bids.to_pylist()
    clock = {**rows[-1], "bid_id": 9_000_000, "auction": 999_999, "date_time": T1 + 2 * M}
    _produce(st.store, level, tmp_path / "bids.parquet", [*rows, clock], bids.schema)
    part = "2026-01-01-00:01"
    first = wait_until(
        lambda: st.materialization(["nexmark_q5", "hot_items"], part),
        SETTLE_TIMEOUT,
        "the join's partition 00:01 materialized by its sensor",
        st.alive,
    )
    # Late bids (within q5_counts' 3 minutes of lateness) for an auction that has a window's
    # maximum at 00:01:04: its count rises in every window holding them, and stays the maximum,
    # so the hot items of those windows change.
    con = duckdb.connect()
    con.register("bids", pa.Table.from_pylist([*rows, clock], bids.schema))
    hot = [r for r in con.sql(Q5).to_arrow_table().to_pylist() if r["starttime"] <= T1 + 4_000 < r["endtime"]]
    auction = int(hot[0]["auction"])
    late = [{**rows[0], "bid_id": 9_100_000 + i, "auction": auction, "date_time": T1 + 4_500} for i in range(5)]
    _produce(st.store, level, tmp_path / "late.parquet", late, bids.schema)
    wait_until(
        lambda: (
            (m := st.materialization(["nexmark_q5", "hot_items"], part)) is not None
            and m["tags"].get("dagster/data_version") != first["tags"].get("dagster/data_version")
        ),
        SETTLE_TIMEOUT,
        "the late bids upstream re-run the join's partition 00:01 with new content",
        st.alive,
    )
    close_stream(st.store, "bids")
    bids = pa.Table.from_pylist([*rows, clock, *late], bids.schema)

    def done() -> bool:
        m = {s: Checkpoints(st.store, specs[s].name).latest() for s in STAGES}
        if any(x is None or x.watermark < INF for x in m.values()):
            return False
        epochs = {"counts": m["q5_counts"].epoch, "top": m["q5_max"].epoch}  # pyright: ignore[reportOptionalMemberAccess]
        return m["q5"].remap == epochs  # pyright: ignore[reportOptionalMemberAccess]  (the join read the final upstreams)

    wait_until(done, SETTLE_TIMEOUT, "every stage of q5 committed its closed input", st.alive)

    from wire_dagster import results

    con = duckdb.connect()
    con.register("bids", bids)  # every bid produced: the clock and the late ones too
    cols = ("auction", "num", "starttime", "endtime")
    want = sorted(tuple(r[c] for c in cols) for r in con.sql(Q5).to_arrow_table().to_pylist())
    got = sorted(
        tuple(r[c] for c in cols) for r in results.read_results(st.store, specs["q5"], "hot_items").to_pylist()
    )
    assert got == want and len(got) >= 3
    # every stage was run by its own sensor, never by anything else
    for stage in STAGES:
        runs = st.runs({"wire/pipeline": specs[stage].name})
        assert runs and all(r["tags"].get("dagster/sensor_name") == sensor_name(specs[stage]) for r in runs), stage
