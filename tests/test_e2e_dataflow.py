"""A dataflow under `dagster dev` (issue 23): NEXMark's hot-items query as three pipelines —
bids per auction per sliding window (a raw stage), the maximum per window (derived), their join
keeping every tie (derived, two inputs) — loaded into the running code location. Producing the
bids makes the daemon's sensors run every stage on their own, in dataflow order; the asset graph
holds the edges of the dataflow; and the committed result equals the query's SQL in DuckDB.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import yaml

from benchmarks.nexmark import Config, generate
from dagster_stack import SETTLE_TIMEOUT
from test_nexmark_queries import Q5
from wire_dagster.procgroup import wait_until

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("q5_counts", "q5_max", "q5")


def test_the_sensors_run_a_three_stage_query_on_their_own(dagster_stack, tmp_path: Path) -> None:
    from sensors import sensor_name
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.spec import load_pipeline, stream_spec
    from wire_dagster.streams import close_stream, produce
    from wire_dagster.timeutil import INF

    st = dagster_stack
    pdir = st.tmp / "pipelines"
    bodies = {}
    for stage in STAGES:
        body = yaml.safe_load((ROOT / "pipelines" / "nexmark" / f"{stage}.yaml").read_text())
        body["dagster"] = {"sensor_interval": "2s"}
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
    f = tmp_path / "bids.parquet"
    pq.write_table(bids, f)
    produce(st.store, stream_spec("bids", "date_time", "bid_id", specs["q5_counts"]), f, chunk_rows=1_000)
    close_stream(st.store, "bids")

    def done() -> bool:
        m = {s: Checkpoints(st.store, specs[s].name).latest() for s in STAGES}
        if any(x is None or x.watermark < INF for x in m.values()):
            return False
        epochs = {"counts": m["q5_counts"].epoch, "top": m["q5_max"].epoch}  # pyright: ignore[reportOptionalMemberAccess]
        return m["q5"].remap == epochs  # pyright: ignore[reportOptionalMemberAccess]  (the join read the final upstreams)

    wait_until(done, SETTLE_TIMEOUT, "every stage of q5 committed its closed input", st.alive)

    from wire_dagster import results

    con = duckdb.connect()
    con.register("bids", bids)
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
