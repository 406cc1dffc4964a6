"""What Dagster's GraphQL API (what the UI reads) says of a pipeline under `dagster dev`
(issue 25 items 2-4), on the e2e stack of tests/dagster_stack.py after the sensor's runs:

1. Lineage and freshness: the stream has an external asset (`streams/<stream>`, not
   materializable, unpartitioned) upstream of every window and of the dead letters, reported
   by the run that committed its chunks (its chunks per segment, sealed); the stream and every
   window expose a freshness policy (`internalFreshnessPolicy`: max_watermark_lag + one
   partition) and a freshness status.
2. Per-partition metadata of a window: the partition's own rows (= the committed file's),
   the window's rows, `dagster/uri` of the published copy, the column schema.
3. Checks per partition: every check evaluation of the sensor's runs carries the partition it
   is for, with a description; every partition a run reported has its evaluations; no
   evaluation is "skipped"; every check can run on its own.
4. "Execute all" (a run of the checks alone, launched as the UI launches it): succeeds,
   commits nothing and materializes nothing, evaluates every partition holding results, plus one
   summary per check for the run; nothing skipped.
"""

from __future__ import annotations

import io

import pyarrow.parquet as pq

from dagster_stack import NAME, partition_key, partition_ms
from wire_dagster.procgroup import wait_until

RUN_TIMEOUT = 240  # queued, then a run process of its own on a loaded machine
FINISHED = ("SUCCEEDED", "FAILED")


def test_lineage_freshness_metadata_and_checks_per_partition(dagster_stack) -> None:
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.status import partition_range

    st = dagster_stack
    spec, store = st.spec, st.store
    m = Checkpoints(store, NAME).latest()
    assert m is not None
    parts = st.first_settle["partitions"]
    windows = [w.name for w in spec.windows]
    fail_s = (spec.orchestration.max_watermark_lag + spec.partition) // 1000

    # 1. The stream's asset: upstream of every asset of the pipeline, fresh-or-not, reported.
    stream = st.asset_node(["streams", spec.stream])
    assert not stream["isMaterializable"] and not stream["isPartitioned"], stream
    assert {tuple(k["path"]) for k in stream["dependedByKeys"]} == {(NAME, w) for w in [*windows, "dead_letters"]}
    assert stream["internalFreshnessPolicy"] == {
        "__typename": "TimeWindowFreshnessPolicy",
        "failWindowSeconds": fail_s,
        "warnWindowSeconds": None,
    }
    # Dagster's freshness daemon (every 5 s under wire dev, devstack.DEV_ENV) evaluates the
    # policies: the stream and every window were materialized within their window by the runs.
    for path in (["streams", spec.stream], *([NAME, w] for w in windows)):
        wait_until(
            lambda path=path: st.asset_node(path)["freshnessStatusInfo"]["freshnessStatus"] == "HEALTHY",
            60,
            f"the freshness daemon finds {'/'.join(path)} fresh",
            every=1.0,
        )
    reported = st.materialization(["streams", spec.stream], None)
    assert reported is not None and reported["meta"]["reported_by"] == NAME
    assert reported["meta"]["segments"] == {
        s: {
            "chunks": r.next_seq,
            "sealed": True,
            "newest_event_ms": r.max_t,
            "last_chunk_ms": r.last_ingest,
        }
        for s, r in m.segments.items()
    }
    for w in windows:
        node = st.asset_node([NAME, w])
        assert ["streams", spec.stream] in [k["path"] for k in node["dependencyKeys"]]
        assert node["internalFreshnessPolicy"]["failWindowSeconds"] == fail_s
        assert node["freshnessStatusInfo"] is not None
        checks = node["assetChecksOrError"]["checks"]
        assert [(c["name"], c["canExecuteIndividually"]) for c in checks] == [("partition_complete", "CAN_EXECUTE")]
        assert checks[0]["description"]

    # 2. A partition's own metadata.
    pk = partition_key(min(int(p) for p in m.outputs["per_minute"]))
    ref = m.outputs["per_minute"][str(partition_ms(pk))]
    meta = st.materialization([NAME, "per_minute"], pk)
    assert meta is not None
    md = meta["meta"]
    assert md["rows"] == md["dagster/partition_row_count"] == ref.rows
    assert md["dagster/row_count"] == sum(r.rows for r in m.outputs["per_minute"].values())
    published = Checkpoints(store, NAME).published_key("per_minute", partition_ms(pk))
    assert md["dagster/uri"] == f"s3://{store.bucket}/{published}" and store.head(published) is not None
    schema = md["dagster/column_schema"]
    file = pq.read_schema(io.BytesIO(store.get(published)))
    assert isinstance(schema, list) and [c["name"] for c in schema] == file.names
    assert [c["type"] for c in schema] == [str(t) for t in file.types]
    counts = md["writer_epoch_counts"]
    assert isinstance(counts, dict) and counts["epoch"] == ref.epoch

    # ... and the stream's growth leaves no partition "unsynced" (single and range runs alike).
    for pk in parts:
        d = st.gql(
            """query($k: AssetKeyInput!, $p: String!) { assetNodeOrError(assetKey: $k) { ... on AssetNode {
                 staleStatus(partition: $p) staleCauses(partition: $p) { reason dependency { path } } } } }""",
            {"k": {"path": [NAME, "per_minute"]}, "p": pk},
        )["assetNodeOrError"]
        assert d["staleStatus"] == "FRESH", (pk, d["staleCauses"])

    # 3. Every evaluation of the sensor's runs is for a partition, with a reason; nothing skipped.
    sensor_runs = {r["runId"] for r in st.first_settle["runs"]}
    keys = [([NAME, w], "partition_complete") for w in windows] + [
        ([NAME, "dead_letters"], c) for c in ("watermark_lag", "conservation", "dead_letter_rate")
    ]
    for path, check in keys:
        execs = [e for e in st.check_executions(path, check) if e["runId"] in sensor_runs]
        assert execs, (path, check)
        assert all(e["status"] in FINISHED for e in execs), [(e["partition"], e["status"]) for e in execs]
        assert all(e["partition"] and e["evaluation"]["partition"] == e["partition"] for e in execs), (path, check)
        assert all(e["evaluation"]["description"] for e in execs), (path, check)
        assert {e["partition"] for e in execs} == set(parts), (path, check)

    # 4. "Execute all": the checks alone, as the UI launches them (no asset, no partition).
    def latest_runs() -> dict[str, str]:
        out = {}
        for pk in parts:
            mat = st.materialization([NAME, "per_minute"], pk)
            assert mat is not None, pk
            out[pk] = mat["runId"]
        return out

    before = latest_runs()
    rid = st.launch_checks(f"{NAME}_job", keys)
    status = wait_until(
        lambda: (s := st.run_status(rid)) in ("SUCCESS", "FAILURE", "CANCELED") and s,
        RUN_TIMEOUT,
        f"checks-only run {rid} finishes",
        st.alive,
        every=2.0,
    )
    assert status == "SUCCESS", st.procs[-1].tail(4000)
    m2 = Checkpoints(store, NAME).latest()
    assert m2 is not None and m2.epoch == m.epoch, "a run of checks alone commits nothing"
    assert latest_runs() == before, "a run of checks alone materializes nothing"
    holding = sorted(partition_key(p) for p in partition_range(spec, m))
    for path, check in keys:
        execs = [e for e in st.check_executions(path, check) if e["runId"] == rid]
        assert all(e["status"] in FINISHED for e in execs), [(e["partition"], e["status"]) for e in execs]
        assert sorted(e["partition"] for e in execs if e["partition"]) == holding, (path, check)
        (summary,) = [e for e in execs if not e["partition"]]
        assert summary["evaluation"]["description"], (path, check)
