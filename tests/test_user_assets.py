"""Issue 25's "Done when": a user asset in the code location, under `dagster dev`, loads window
partitions through Wire's IO manager, re-runs on its own when a late event changes an upstream
partition, and its content equals the recomputed expectation.

The stack is the shared one (tests/dagster_stack.py, fixture `dagster_stack`). Its code location
loads the module WIRE_USER_ASSETS names (definitions.py); the test writes that module and a
pipeline of its own, `ua`, and reloads the location (Stack.add_user_assets):

    ua/per_minute (Wire, 1-minute partitions)  ──wire_io_manager──▶  ua_user/minute_totals
                                                                     (partitioned like it,
                                                                      AutomationCondition: eager
                                                                      on every partition, triggered
                                                                      by a changed data_version)

1. Events over 0:00-3:20 land (the stream stays open): W = 3:18 makes partitions 0:00, 0:01 and
   0:02 ready; Wire's sensor commits and reports them, and the user's automation sensor runs
   minute_totals for each, once. Their stored values (Dagster's fs IO manager, a pyarrow Table
   per partition) equal the per-user sums of the reference's per-minute rows.
2. A late event for 0:01 (within the allowed lateness) lands: Wire's sensor commits it and
   reports 0:01 with a new data_version; minute_totals 0:01 runs again on its own, once, with
   the new content; 0:00 and 0:02 are not run again.
"""

from __future__ import annotations

import json
import pickle
import time

from dagster_stack import ACTIVE, T0, M, partition_key
from reference import batch_of_clicks, same_value
from wire_dagster.procgroup import wait_until

PIPE = "ua"
AUTOMATION = "ua_user_automation"
USER_KEY = ["ua_user", "minute_totals"]
PIPELINE = {
    "name": PIPE,
    "stream": PIPE,
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
    "lateness": {"allowed": "10m"},
    "partition": "1m",
    "start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 / 1000)),
    "limits": {"max_future": "10m"},
    "windows": [
        {"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"n": "count", "total": "sum(amount)"}}
    ],
    "dagster": {"sensor_interval": "2s"},
}
# The user's module, as a user writes one (README, "Using a window in your own asset").
SOURCE = f'''"""The stack's user assets (tests/test_user_assets.py)."""

import dagster as dg
import pyarrow as pa

from assets import wire_window

per_minute = wire_window("{PIPE}", "per_minute")

ON_WINDOW_CHANGE = (
    dg.AutomationCondition.eager()
    .without(dg.AutomationCondition.in_latest_time_window())
    .replace(
        "any_deps_updated",
        dg.AutomationCondition.any_deps_match(dg.AutomationCondition.data_version_changed()).with_label(
            "any_deps_data_version_changed"
        ),
    )
)


@dg.asset(
    key={USER_KEY!r},
    partitions_def=per_minute.partitions_def,
    ins={{"rows": dg.AssetIn(key=per_minute.key)}},
    automation_condition=ON_WINDOW_CHANGE,
)
def minute_totals(rows: pa.Table) -> pa.Table:
    return rows.group_by("key").aggregate([("n", "sum"), ("total", "sum")]).sort_by("key")


automation = dg.AutomationConditionSensorDefinition(
    "{AUTOMATION}",
    target=dg.AssetSelection.assets(minute_totals),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=2,
    emit_backfills=False,
)
'''
PARTS = [T0 + i * M for i in range(3)]  # the partitions the first events make ready
LATE = {"user": "a", "ts": T0 + 90_500, "amount": 100, "eid": "late-1"}  # in 0:01, after W = 3:18
ROUND_TIMEOUT = 150
QUIET_S = 8  # automation ticks (every 2 s) that must launch nothing more at the end


def first_events() -> list[dict]:
    """Two users over 0:00-3:20, in time order: W = 3:20 - 2 s."""
    evs = [{"user": "a", "ts": T0 + i * 5_000, "amount": i % 6} for i in range(41)]
    evs += [{"user": "b", "ts": T0 + 3_000 + i * 7_000, "amount": 2 + i % 3} for i in range(28)]
    evs.sort(key=lambda e: (e["ts"], e["user"]))
    for i, e in enumerate(evs):
        e["eid"] = f"e{i}"
    return evs


def expected(spec, events: list[dict]) -> dict[str, list[tuple[str, int, float]]]:
    """Partition key -> minute_totals' rows (key, n, total), from the reference's per-minute rows."""
    out: dict[str, dict[str, list]] = {partition_key(p): {} for p in PARTS}
    for r in batch_of_clicks(spec, events)["per_minute"]:
        pk = partition_key(T0 + (r["window_end"] - 1 - T0) // M * M)  # the partition holding end - 1
        if pk in out:
            acc = out[pk].setdefault(r["key"], [0, 0.0])
            acc[0] += r["n"]
            acc[1] += float(r["total"])
    return {pk: [(k, v[0], v[1]) for k, v in sorted(rows.items())] for pk, rows in out.items()}


def same_content(got: dict[str, list[dict]], want: dict[str, list[tuple[str, int, float]]]) -> bool:
    return set(got) == set(want) and all(
        [(r["key"], r["n_sum"]) for r in got[pk]] == [(k, n) for k, n, _ in want[pk]]
        and all(same_value(r["total_sum"], t) for r, (_, _, t) in zip(got[pk], want[pk], strict=True))
        for pk in want
    )


def materializations(st) -> dict[str, list[dict]]:
    """Partition key -> every materialization of the user's asset (runId, timestamp), oldest first."""
    d = st.gql(
        """query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { __typename ... on Asset {
             assetMaterializations { partition runId timestamp } } } }""",
        {"k": {"path": USER_KEY}},
    )["assetOrError"]
    assert d["__typename"] == "Asset", f"the user's asset is not in the code location: {d}"
    out: dict[str, list[dict]] = {}
    for m in sorted(d["assetMaterializations"], key=lambda m: float(m["timestamp"])):
        out.setdefault(m["partition"], []).append(m)
    return out


def window_versions(st) -> dict[str, str]:
    """Partition key -> the data version of the latest materialization of Wire's ua/per_minute."""
    d = st.gql(
        """query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { __typename ... on Asset {
             assetMaterializations { partition timestamp tags { key value } } } } }""",
        {"k": {"path": [PIPE, "per_minute"]}},
    )["assetOrError"]
    assert d["__typename"] == "Asset", d
    out = {}
    for m in sorted(d["assetMaterializations"], key=lambda m: float(m["timestamp"])):
        out[m["partition"]] = {t["key"]: t["value"] for t in m["tags"]}.get("dagster/data_version")
    return out


def stored(st, pk: str) -> list[dict] | None:
    """The user's asset's value for partition `pk`, as Dagster's default (fs) IO manager stored it."""
    path = st.home / "storage" / USER_KEY[0] / USER_KEY[1] / pk
    return pickle.loads(path.read_bytes()).to_pylist() if path.exists() else None


def produce(st, spec, events: list[dict], name: str) -> None:
    from wire_dagster.streams import produce as wire_produce

    f = st.tmp / f"{name}.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    rep = wire_produce(st.store, spec, f, segment="0")
    assert rep.events == len(events) and rep.malformed == 0


def test_user_asset_reruns_on_its_own_when_a_late_event_changes_its_partition(dagster_stack) -> None:
    st = dagster_stack
    t0 = time.monotonic()
    spec = st.add_user_assets(PIPELINE, SOURCE)
    assert st.sensor(AUTOMATION) is not None, "the user module's automation sensor is not in the code location"
    t_loaded = time.monotonic()

    def failed() -> None:
        runs = st.runs({"wire/pipeline": PIPE}) + st.runs({"dagster/sensor_name": AUTOMATION})
        bad = [r["runId"] for r in runs if r["status"] in ("FAILURE", "CANCELED")]
        assert not bad, f"runs failed: {bad}\ndagster dev log tail:\n{st.procs[-1].tail(6000)}"

    def settled(events: list[dict], counts: dict[str, int]):
        """When minute_totals was materialized `counts` times per partition, with the content the
        reference gives for `events`, and no run of the pipeline or the user's asset is in flight."""
        failed()
        mats = materializations(st)
        if {pk: len(mats.get(pk, [])) for pk in counts} != counts:
            return None
        runs = st.runs({"wire/pipeline": PIPE}) + st.runs({"dagster/sensor_name": AUTOMATION})
        if any(r["status"] in ACTIVE for r in runs):
            return None
        got = {pk: v for pk in counts if (v := stored(st, pk)) is not None}
        if not same_content(got, expected(spec, events)):
            return None
        return mats

    # 1. The first events: each ready partition of minute_totals materializes once.
    events = first_events()
    produce(st, spec, events, "first")
    once = {partition_key(p): 1 for p in PARTS}
    first = wait_until(lambda: settled(events, once), ROUND_TIMEOUT, "minute_totals of 0:00-0:02", st.alive, every=1.0)
    t_first = time.monotonic()
    versions = window_versions(st)

    # 2. A late event changes partition 0:01 of the window: minute_totals 0:01 runs again, alone.
    produce(st, spec, [LATE], "late")
    events = [*events, LATE]
    again = {**once, partition_key(PARTS[1]): 2}
    second = wait_until(
        lambda: settled(events, again), ROUND_TIMEOUT, "minute_totals 0:01 run again", st.alive, every=1.0
    )
    t_second = time.monotonic()
    time.sleep(QUIET_S)  # a few more automation ticks: nothing more may run
    assert materializations(st) == second
    assert settled(events, again) is not None

    # Every run of the user's asset came from its automation condition, one per materialization.
    runs = st.runs({"dagster/sensor_name": AUTOMATION})
    assert all(r["tags"].get("dagster/from_automation_condition") == "true" for r in runs), [r["tags"] for r in runs]
    assert {m["runId"] for ms in second.values() for m in ms} <= {r["runId"] for r in runs}
    assert len(runs) == 4, [(r["runId"], r["tags"].get("dagster/partition")) for r in runs]
    rerun = second[partition_key(PARTS[1])][-1]
    assert rerun["runId"] not in {m["runId"] for ms in first.values() for m in ms}
    # What triggered it: the window's partition 0:01 has a new data version, 0:00 and 0:02 do not.
    now = window_versions(st)
    changed = {pk for pk in once if now.get(pk) != versions.get(pk)}
    assert changed == {partition_key(PARTS[1])}, (versions, now)
    print(
        f"user assets: reload {t_loaded - t0:.1f} s, first round {t_first - t_loaded:.1f} s, "
        f"late-event re-run {t_second - t_first:.1f} s, total {time.monotonic() - t0:.1f} s"
    )
