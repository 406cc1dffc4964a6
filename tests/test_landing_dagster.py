"""Under `dagster dev` (the shared stack, tests/dagster_stack.py), objects landing in a prefix
are processed by the sensor on its own (issue 27 item 4):

    boto3 PUTs Kafka-Connect objects ─▶ the daemon's sensor tick adopts them (observation of
    streams/<stream>: objects, bytes, segment watermarks) and requests runs ─▶ the runs commit
    ─▶ more objects land ─▶ … ─▶ the test closes the stream (adopt + seal, as `wire close`)
    ─▶ the sensor's runs reach W = +inf; results = the batch over the records

No `wire tick` and no `wire produce` anywhere: the bucket and the daemon only.
"""

from __future__ import annotations

import copy
import json
import random

from dagster_stack import METADATA_FIELDS, PIPELINE, T0, metadata_values
from reference import assert_same_rows, batch_of_clicks
from wire_dagster import landing
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.procgroup import wait_until
from wire_dagster.timeutil import INF

SETTLE = 300  # the daemon ticks every 2 s; each run attaches to the stack's Spark Connect server


def test_dagster_dev_adopts_and_processes_landed_objects_on_its_own(dagster_stack) -> None:
    st = dagster_stack
    raw = copy.deepcopy(PIPELINE)
    del raw["stream"], raw["event"]
    raw["name"] = "landed_e2e"
    raw["inputs"] = [
        {
            "name": "landed_e2e",
            "landing": "topics/landed/",
            "segment_by": r"partition=(\d+)",
            "time": "ts",
            "id": "eid",
            "key": "user",
        }
    ]
    rng = random.Random(5)
    events: list[dict] = []

    def land(p: int, o: int) -> None:
        rows = [
            {
                "user": f"u{rng.randrange(3)}",
                "ts": max(T0, T0 + (o * 10 + r) * 1000 + p * 7 - rng.randrange(2500)),
                "eid": f"{p}-{o}-{r}",
                "amount": rng.randrange(10),
            }
            for r in range(10)
        ]
        events.extend(rows)
        body = "".join(json.dumps(x) + "\n" for x in rows).encode()
        key = f"topics/landed/partition={p}/landed+{p}+{o * 10:010d}.json"
        st.store._client.put_object(Bucket=st.store.bucket, Key=key, Body=body)

    for p in range(2):
        for o in range(3):
            land(p, o)
    spec = st.add_pipeline(raw)
    cp = Checkpoints(st.store, spec.name)

    def counted(n: int):
        def cond():
            m = cp.latest()
            return m if m is not None and m.totals.events_in >= n else None

        return cond

    wait_until(counted(len(events)), SETTLE, "the sensor adopted and committed the first objects", st.alive)
    for p in range(2):
        for o in range(3, 6):
            land(p, o)
    wait_until(counted(len(events)), SETTLE, "the sensor adopted and committed the later objects", st.alive)
    landing.adopt_and_close(st.store, spec)

    def closed():
        m = cp.latest()
        runs = st.runs({"wire/pipeline": spec.name})
        busy = any(r["status"] not in ("SUCCESS", "FAILURE", "CANCELED") for r in runs)
        return m if m is not None and m.watermark == INF and not busy else None

    m = wait_until(closed, SETTLE, "the closed landing stream committed to W = +inf", st.alive)
    runs = st.runs({"wire/pipeline": spec.name})
    assert runs and all(r["status"] == "SUCCESS" for r in runs), [(r["runId"], r["status"]) for r in runs]
    assert {r["tags"].get("dagster/sensor_name") for r in runs} == {"landed_e2e_watermark"}
    assert m.totals.events_in == len(events) and m.totals.balanced()
    from wire_dagster.results import read_results

    got = {w.name: read_results(st.store, spec, w.name).to_pylist() for w in spec.windows}
    assert_same_rows(spec, got, batch_of_clicks(spec, events))
    # the stream asset's observations: every object adopted, reported by the sensor's ticks
    d = st.gql(
        """query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { __typename ... on Asset {
             assetObservations { timestamp metadataEntries { """
        + METADATA_FIELDS
        + """ } } } } }""",
        {"k": {"path": ["streams", "landed_e2e"]}},
    )["assetOrError"]
    assert d["__typename"] == "Asset", d
    obs: list[dict] = [metadata_values(o["metadataEntries"]) for o in d["assetObservations"]]
    assert sum(int(o["objects_adopted"]) for o in obs) == 12  # all by the sensor: the close found none new
    assert all(sorted(o["segment_watermarks"]) == ["0", "1"] for o in obs)
