"""End to end through `dagster dev`: events land, the watermark sensor launches the runs,
the runs commit through Spark Connect, a backfill recomputes and keeps every data version.

The stack (tests/dagster_stack.py, fixture `dagster_stack`): the embedded S3 server, one
Spark Connect server, and `dagster dev` (webserver + daemon) with a project-local
DAGSTER_HOME whose QueuedRunCoordinator runs one run per pipeline at a time. The
fixture produces a closed stream and waits until the sensor's runs have materialized
every ready partition with the committed content's data version. Here:

1. the committed results equal a plain batch aggregation (closed stream, nothing late);
2. every partition holding a result was materialized by a run the sensor launched;
3. a backfill of those partitions, launched through GraphQL (`launchPartitionBackfill`),
   finishes, materializes every partition again, commits no new epoch, and leaves every
   partition's data_version unchanged (DESIGN §2 Determinism);
4. the pipeline's runs, sensor and backfill alike, never overlapped in time.
"""

from __future__ import annotations

import itertools

from dagster_stack import NAME, T0, M, partition_key, partition_ms, run_partitions
from reference import assert_same_rows, batch_of_clicks
from wire_dagster.procgroup import wait_until

BACKFILL_TIMEOUT = 360  # the backfill daemon wakes every 30 s; one run per contiguous range


def assert_not_overlapping(runs: list[dict]) -> None:
    done = sorted((r for r in runs if r["startTime"]), key=lambda r: r["startTime"])
    assert all(r["endTime"] for r in done), [r["runId"] for r in done if not r["endTime"]]
    for a, b in itertools.pairwise(done):
        assert b["startTime"] >= a["endTime"], (
            f"runs {a['runId']} ({a['startTime']:.2f}-{a['endTime']:.2f}) and {b['runId']} "
            f"({b['startTime']:.2f}-{b['endTime']:.2f}) of {NAME} overlapped"
        )


def test_sensor_runs_commit_and_backfill_keeps_data_versions(dagster_stack) -> None:
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.results import read_results

    st = dagster_stack
    spec, store = st.spec, st.store
    first = st.first_settle

    # 1. Committed results = batch aggregation.
    want = batch_of_clicks(spec, st.events)
    assert_same_rows(spec, {w.name: read_results(store, spec, w.name).to_pylist() for w in spec.windows}, want)

    # 2. The sensor launched the runs, and they covered every partition holding a result.
    runs = first["runs"]
    assert {r["tags"].get("dagster/sensor_name") for r in runs} == {f"{NAME}_watermark"}
    assert all(r["status"] == "SUCCESS" for r in runs)
    holding = {partition_key(T0 + (r["window_end"] - 1 - T0) // M * M) for rows in want.values() for r in rows}
    assert holding <= set(first["partitions"]), sorted(holding - set(first["partitions"]))
    assert len({r["tags"]["dagster/run_key"] for r in runs}) == len(runs)
    epoch_before = first["manifest"].epoch

    # 3. A backfill of those partitions through Dagster's GraphQL API.
    parts = first["partitions"]
    before = {
        w: {pk: m["tags"]["dagster/data_version"] for pk, m in mats.items()}
        for w, mats in first["materializations"].items()
    }
    assets = [{"path": [NAME, w.name]} for w in spec.windows] + [{"path": [NAME, "dead_letters"]}]
    d = st.gql(
        """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) { __typename
             ... on LaunchBackfillSuccess { backfillId } ... on Error { message } } }""",
        {
            "p": {
                "assetSelection": assets,
                "partitionNames": parts,
                "title": "e2e backfill",
                "tags": [{"key": "wire/pipeline", "value": NAME}],
            }
        },
    )
    res = d["launchPartitionBackfill"]
    assert res["__typename"] == "LaunchBackfillSuccess", res
    bid = res["backfillId"]

    def backfill_done():
        b = st.gql(
            """query($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
                      ... on PartitionBackfill { status } ... on Error { message } } }""",
            {"id": bid},
        )["partitionBackfillOrError"]
        assert b["__typename"] == "PartitionBackfill", b
        assert b["status"] not in ("FAILED", "CANCELED", "COMPLETED_FAILED", "FAILING"), (
            f"backfill {bid}: {b['status']}\n{st.procs[-1].tail(6000)}"
        )
        bruns = st.runs({"dagster/backfill": bid})
        if (
            b["status"] in ("COMPLETED", "COMPLETED_SUCCESS")
            and bruns
            and not any(r["status"] not in ("SUCCESS",) for r in bruns)
        ):
            return bruns
        return None

    bruns = wait_until(backfill_done, BACKFILL_TIMEOUT, f"backfill {bid} finishes", st.alive, every=2.0)
    # Single-run backfill policy: one run per contiguous range of the requested partitions, each
    # replaying the timeline once; together they cover exactly the requested partitions.
    covered = [pk for r in bruns for pk in run_partitions(r)]
    assert sorted(covered) == sorted(parts)
    idx = sorted(partition_ms(pk) for pk in parts)
    assert len(bruns) == 1 + sum(1 for a, b in itertools.pairwise(idx) if b != a + M), [r["tags"] for r in bruns]

    after = {w.name: st.latest_materializations(w.name, parts) for w in spec.windows}
    backfill_ids = {r["runId"] for r in bruns}
    for w in spec.windows:
        for pk in parts:
            m = after[w.name][pk]
            assert m["runId"] in backfill_ids, (w.name, pk, "latest materialization is not the backfill's")
            assert m["tags"]["dagster/data_version"] == before[w.name][pk], (w.name, pk)
    m = Checkpoints(store, NAME).latest()
    assert m is not None
    assert m.epoch == epoch_before, "the backfill reproduced the committed content: no new epoch"
    assert {w: {pk: before[w][pk] for pk in parts} for w in before} == {
        w.name: {pk: after[w.name][pk]["tags"]["dagster/data_version"] for pk in parts} for w in spec.windows
    }

    # 4. One run of the pipeline at a time (QueuedRunCoordinator tag limit), sensor and backfill runs alike.
    all_runs = st.runs()
    assert {r["runId"] for r in runs} | backfill_ids <= {r["runId"] for r in all_runs}
    assert_not_overlapping(all_runs)
