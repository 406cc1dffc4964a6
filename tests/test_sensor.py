"""The watermark sensor (sensors/__init__.py over wire_dagster/planner.py), evaluated with
`dg.build_sensor_context(cursor=..., resources=...)` against the real embedded S3 server.

The pipeline: 1-minute partitions, bounded out-of-orderness B = 5 s, allowed
lateness L = 30 s, a tumbling 1m, a sliding 2m/1m and a session (gap 10 s) window.

    event time   0:00      1:00      2:00      3:00      4:00      5:00
    partitions   |---p0----|---p1----|---p2----|---p3----|---p4----|
    batch 1      a b a b a b a b a b a b a b a b a b a b a b a b a b a|     max_t = 4:30
    W_1 = 4:30 - B = 4:25: ready p0..p3 (end <= W), final p0..p2 (end + L <= W)
    late A (3:20)                               x                          p3: ready, not final
    late B (1:20)                 x                                        p1, p2: final

Expectations are computed here from the event times and the rules (W = max_t − B,
ready: W >= p_end, final: W >= p_end + L), not by the planner.
"""

from __future__ import annotations

import json
import random
import socket
import time
from pathlib import Path

import dagster as dg
import pytest
import yaml

from resources import ObjectStoreResource
from wire_dagster.spec import load_pipeline

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
S, M = 1000, 60_000
B, L, P = 5 * S, 30 * S, M

PIPELINE = {
    "name": "sens",
    "stream": "sens",
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "5s", "idle_timeout": "1h"},  # never idle during a test
    "lateness": {"allowed": "30s"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "windows": [
        {"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"n": "count", "total": "sum(amount)"}},
        {"name": "two_by_one", "type": "sliding", "size": "2m", "slide": "1m", "aggregates": {"n": "count"}},
        {"name": "sessions", "type": "session", "gap": "10s", "aggregates": {"n": "count"}},
    ],
    "dagster": {"sensor_interval": "2s"},
}


RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def key_of(p: int) -> str:
    """Run key `<pipeline>:e<epoch>:<partition start ISO>` without the project's formatter."""
    return f"2026-01-01T00:{(p - T0) // M:02d}:00.000Z"


def run_key(epoch: int, p: int, last: int | None = None) -> str:
    """One run per epoch: `sens:e<epoch>:<partition>`, or `...:<first>..<last>` for a range."""
    return f"sens:e{epoch}:{key_of(p)}" + (f"..{key_of(last)}" if last is not None and last != p else "")


def dagster_partition(p: int) -> str:
    return f"2026-01-01-00:{(p - T0) // M:02d}"


def ready(w: int, p: int) -> bool:
    return w >= p + P


def final(w: int, p: int) -> bool:
    return w >= p + P + L


def windows_of(t: int) -> list[tuple[int, int]]:
    """Every window of an event at t: tumbling 1m, sliding 2m every 1m, its one-event session."""
    tumbling = [(t - t % M, t - t % M + M)]
    sliding = [(s, s + 2 * M) for s in range(t - t % M - M, t + 1, M) if s <= t < s + 2 * M]
    session = [(t, t + 10 * S)]
    return tumbling + sliding + session


def partition_of(end: int) -> int:
    return T0 + (end - 1 - T0) // P * P


@pytest.fixture
def spec(tmp_path: Path):
    path = tmp_path / "pipelines" / "sens.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(PIPELINE))
    return load_pipeline(path)


@pytest.fixture
def sensor(spec):
    from definitions import build_definitions
    from sensors import sensor_name

    return build_definitions(pipelines=[spec]).resolve_sensor_def(sensor_name(spec))


def spec_and_sensor(tmp_path: Path, name: str, **changes):
    """A variant of PIPELINE (its own name and stream) written to a file, and its sensor."""
    from definitions import build_definitions
    from sensors import sensor_name

    path = tmp_path / "pipelines" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump({**PIPELINE, "name": name, "stream": name, **changes}))
    spec = load_pipeline(path)
    return spec, build_definitions(pipelines=[spec]).resolve_sensor_def(sensor_name(spec))


def store_resource(env: dict[str, str], endpoint: str | None = None) -> ObjectStoreResource:
    return ObjectStoreResource(
        endpoint=endpoint or env["WIRE_S3_ENDPOINT"],
        access_key=env["WIRE_S3_ACCESS_KEY"],
        secret_key=env["WIRE_S3_SECRET_KEY"],
        bucket=env["WIRE_S3_BUCKET"],
    )


def evaluate(sensor, env: dict[str, str], cursor: str | None, endpoint: str | None = None) -> dg.SensorResult:
    """One evaluation from `cursor`, on an instance of its own (no cursor shared with another
    evaluation, no run of an earlier one: each is a first look at the stream)."""
    with (
        dg.DagsterInstance.ephemeral() as instance,
        dg.build_sensor_context(
            instance=instance, cursor=cursor, resources={"wire_store": store_resource(env, endpoint)}
        ) as ctx,
    ):
        result = sensor(ctx)
    assert isinstance(result, dg.SensorResult), f"the sensor returned {result!r}, not a SensorResult"
    return result


def cursor_epoch(result: dg.SensorResult) -> int:
    assert result.cursor is not None, "the sensor always returns a cursor"
    return json.loads(result.cursor)["epoch"]


def requests(result: dg.SensorResult) -> list[dg.RunRequest]:
    return list(result.run_requests or [])


def keys(result: dg.SensorResult) -> list[str | None]:
    return [r.run_key for r in requests(result)]


def covered(result: dg.SensorResult) -> list[tuple[int, str]]:
    """(epoch, Dagster partition key) of every partition the requested runs report: a run's
    own partition, or each one of its range (Dagster's single-run backfill tags)."""
    out = []
    for r in requests(result):
        n = int(r.tags["wire/epoch"])
        if r.partition_key is not None:
            assert "dagster/asset_partition_range_start" not in r.tags
            out.append((n, r.partition_key))
        else:
            lo, hi = r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"]
            ps = [dagster_partition(T0 + k * M) for k in range(60)]
            out += [(n, p) for p in ps[ps.index(lo) : ps.index(hi) + 1]]
    return out


def produce_events(store, spec, tmp: Path, name: str, events: list[dict]) -> None:
    from wire_dagster.streams import produce

    f = tmp / f"{name}.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    rep = produce(store, spec, f, segment="0")
    assert rep.events == len(events) and rep.malformed == 0


def batch1() -> list[dict]:
    """Two users, one event every 6 s from 0:00 to 4:30, shuffled within 4 s (< B: nothing late)."""
    rng = random.Random(3)
    evs = [{"eid": f"b{i}", "user": "ab"[i % 2], "ts": T0 + i * 6 * S, "amount": i % 7} for i in range(46)]
    assert max(e["ts"] for e in evs) == T0 + 270 * S
    evs.sort(key=lambda e: e["ts"] + rng.randrange(0, 4 * S))
    return evs


def test_no_data_no_requests(spec, sensor, store, s3_env):
    first = evaluate(sensor, s3_env, None)
    assert keys(first) == []
    assert cursor_epoch(first) == 0
    again = evaluate(sensor, s3_env, first.cursor)
    assert keys(again) == [] and again.cursor == first.cursor


def test_ready_partitions_commit_and_late_data(spec, sensor, store, s3_env, spark, tmp_path):
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.engine import process

    events = batch1()
    produce_events(store, spec, tmp_path, "batch1", events)

    # (b) W passes the ends of p0..p3: exactly those are requested, for epoch 1.
    w1 = max(e["ts"] for e in events) - B
    expected = [T0 + k * P for k in range(10) if ready(w1, T0 + k * P)]
    assert expected == [T0 + k * M for k in range(4)]
    r1 = evaluate(sensor, s3_env, None)
    # one run for the epoch, over the range of its ready partitions
    assert keys(r1) == [run_key(1, expected[0], expected[-1])]
    assert covered(r1) == [(1, dagster_partition(p)) for p in expected]
    assert {r.tags["wire/epoch"] for r in requests(r1)} == {"1"}
    assert {r.tags["wire/pipeline"] for r in requests(r1)} == {"sens"}
    # (c) no run has committed: the cursor stays at epoch 0, and a second evaluation asks for the same runs.
    assert cursor_epoch(r1) == 0
    r1b = evaluate(sensor, s3_env, r1.cursor)
    assert keys(r1b) == keys(r1) and r1b.cursor == r1.cursor

    out = process(store, spec, spark, max_epochs=5)
    assert out.committed == [1], out.committed
    assert out.manifest is not None and out.manifest.watermark == w1
    # (c) after the commit: the cursor moves to epoch 1; the run requested before reports what epoch 1
    # changed, so nothing is asked for again.
    r2 = evaluate(sensor, s3_env, r1.cursor)
    assert cursor_epoch(r2) == 1
    assert keys(r2) == []
    # Without that plan in the cursor (a schedule, or a sensor whose request differed), the committed
    # epoch's ready partitions are requested, under the run key the plan had (Dagster deduplicates it).
    r2b = evaluate(sensor, s3_env, json.dumps({"epoch": 0}))
    assert keys(r2b) == keys(r1)
    assert {r.tags["wire/reason"] for r in requests(r2b)} == {"committed"}
    r3 = evaluate(sensor, s3_env, r2.cursor)
    assert keys(r3) == [] and r3.cursor == r2.cursor

    # (d) late data. A at 3:20 (its own key: no session merges) counts toward its tumbling and sliding
    # windows (end + L > W_1) and so changes p3 (ready, not final); its session [3:20, 3:30) is past
    # its lateness. B at 1:20: every window of it (in p1 and p2, both final) is past its lateness.
    late_a = {"eid": "la", "user": "late-a", "ts": T0 + 200 * S, "amount": 1}
    late_b = {"eid": "lb", "user": "late-b", "ts": T0 + 80 * S, "amount": 1}
    names = ["per_minute", "two_by_one", "two_by_one", "sessions"]  # the order windows_of returns them in
    changed_by, counted, late = {}, dict.fromkeys(names, 0), dict.fromkeys(names, 0)
    for e in (late_a, late_b):
        wins = windows_of(e["ts"])
        counting = [(n, end) for n, (_, end) in zip(names, wins, strict=True) if end + L > w1]
        changed_by[e["eid"]] = sorted({partition_of(end) for _, end in counting if ready(w1, partition_of(end))})
        for n in set(names):
            counted[n] += any(m == n for m, _ in counting)
            late[n] += not any(m == n for m, _ in counting)
    assert changed_by == {"la": [T0 + 3 * M], "lb": []}
    assert all(final(w1, partition_of(end)) for _, end in windows_of(late_b["ts"]))
    produce_events(store, spec, tmp_path, "late_a", [late_a])
    produce_events(store, spec, tmp_path, "late_b", [late_b])
    r4 = evaluate(sensor, s3_env, r3.cursor)
    assert keys(r4) == [run_key(2, p) for p in changed_by["la"]]
    assert {r.tags["wire/reason"] for r in requests(r4)} == {"late"}
    assert cursor_epoch(r4) == 1
    assert not any(dagster_partition(T0 + k * M) in [r.partition_key for r in requests(r4)] for k in (0, 1, 2))

    out = process(store, spec, spark, max_epochs=5)
    assert out.committed == [2]
    m2 = Checkpoints(store, spec.name).load(2)
    # The engine agrees: what counts and what is late, and only p3 of the ready partitions changed.
    assert (m2.counts.counted, m2.counts.late) == (counted, late)
    assert counted == {"per_minute": 1, "two_by_one": 1, "sessions": 0}
    assert {p for ps in m2.changed.values() for p in ps if ready(m2.watermark, p)} == {T0 + 3 * M}
    r5 = evaluate(sensor, s3_env, r4.cursor)
    assert cursor_epoch(r5) == 2
    assert keys(r5) == []  # the late-data run covers what epoch 2 changed
    assert keys(evaluate(sensor, s3_env, r3.cursor)) == keys(r4)  # and is what is asked for without the plan


def test_unreachable_store_raises(spec, sensor, s3_env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    from wire_dagster.errors import ObjectStoreError

    with pytest.raises(Exception) as ei:
        evaluate(sensor, s3_env, None, endpoint=f"http://127.0.0.1:{port}")
    chain, e = [], ei.value
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__
    # (a SkipReason or an empty result would have failed `evaluate`'s SensorResult check instead)
    assert any(isinstance(x, ObjectStoreError) for x in chain), f"expected an ObjectStoreError, got {chain!r}"


def test_partitions_longer_than_an_epoch_still_progress(tmp_path, store, s3_env, spark):
    """10-minute partitions, one 2-minute chunk per epoch: no epoch alone makes a partition
    ready. The sensor must still request a run for every pending epoch (reporting the newest
    ready partition, or the first), so the watermark reaches the partition end; it used to
    request nothing, forever."""
    from wire_dagster.engine import process
    from wire_dagster.planner import parse_cursor

    hourly, sens = spec_and_sensor(tmp_path, "hourly", partition="10m", limits={"max_chunks_per_epoch": 1})
    # 7 chunks of 2 minutes each: event time 00:00 .. 00:14, one event every 10 s
    for k in range(7):
        produce_events(
            store,
            hourly,
            tmp_path,
            f"c{k}",
            [{"eid": f"e{k}-{i}", "user": "u", "ts": T0 + k * 2 * M + i * 10 * S, "amount": 1} for i in range(12)],
        )
    cursor, seen = None, []
    for n in range(1, 8):
        r = evaluate(sens, s3_env, cursor)
        reqs = requests(r)
        assert reqs, f"epoch {n}: chunks are pending and the sensor requested nothing"
        # one run for the backlog: epochs n..7
        assert [q.tags["wire/epoch"] for q in reqs] == [f"{n}-7" if n < 7 else "7"], (n, keys(r))
        seen += [(n, q.partition_key, q.tags["wire/reason"]) for q in reqs]
        # what the requested run does, here one epoch at a time: commit the next epoch
        assert process(store, hourly, spark, max_epochs=1).committed == [n]
        cursor = r.cursor
    assert seen[0][:2] == (1, "2026-01-01-00:00") and "progress" in seen[0][2]  # reported before it is ready
    # W passed 00:10 in some epoch: from then on the hour was requested as ready
    assert any(p == "2026-01-01-00:00" and "ready" in why.split(",") for _, p, why in seen), seen
    r = evaluate(sens, s3_env, cursor)
    assert parse_cursor(r.cursor) == 7 and not [
        q for q in requests(r) if "progress" in q.tags["wire/reason"].split(",")
    ]


def test_a_backlog_is_requested_in_one_evaluation(tmp_path, store, s3_env, spark):
    """Four chunks pending, one chunk per epoch: the next run commits all four epochs, so one
    evaluation requests one run for all of them, over the partitions they make ready; once they
    are committed the sensor asks for nothing more (a tick that follows launches no run). It used
    to predict only the next epoch, so a second tick was needed, and then one run per epoch.

        chunk k = minute k, events at :00 .. :50     W_k = k:50 - B = k:45
        epoch 1 (chunk 0)  W 0:45   nothing ready: progress run for p0
        epoch 2 (chunk 1)  W 1:45   p0 ready
        epoch 3 (chunk 2)  W 2:45   p1 ready
        epoch 4 (chunk 3)  W 3:45   p2 ready
    """
    from wire_dagster.engine import process

    spec, sens = spec_and_sensor(tmp_path, "backlog", limits={"max_chunks_per_epoch": 1})
    for k in range(4):
        produce_events(
            store,
            spec,
            tmp_path,
            f"c{k}",
            [{"eid": f"e{k}-{i}", "user": "u", "ts": T0 + k * M + i * 10 * S, "amount": 1} for i in range(6)],
        )
    want, w_prev = [], None
    for n in range(1, 5):
        w = T0 + (n - 1) * M + 50 * S - B
        now_ready = [
            p for p in (T0 + j * M for j in range(5)) if ready(w, p) and (w_prev is None or not ready(w_prev, p))
        ]
        want += [(n, dagster_partition(p), "ready") for p in now_ready] or [(n, dagster_partition(T0), "progress")]
        w_prev = w
    r1 = evaluate(sens, s3_env, None)
    ps = sorted({p for _, p, _ in want})
    [rr] = requests(r1)
    assert rr.tags["wire/epoch"] == "1-4" and set(rr.tags["wire/reason"].split(",")) == {why for _, _, why in want}
    assert (rr.tags[RANGE_START], rr.tags[RANGE_END]) == (ps[0], ps[-1])
    assert rr.run_key == f"backlog:e1-4:{key_of(T0)}..{key_of(T0 + 2 * M)}"
    assert process(store, spec, spark, max_epochs=100).committed == [1, 2, 3, 4]
    r2 = evaluate(sens, s3_env, r1.cursor)
    assert cursor_epoch(r2) == 4 and keys(r2) == []


def test_one_run_per_epoch_over_its_partition_range():
    """The planner's requests become one run per epoch, from its first to its last partition
    (partitions in between are ready too: W is monotonic), with every reason it had."""
    from wire_dagster.planner import Request, spans

    reqs = [
        Request(1, T0, "ready"),
        Request(1, T0 + 2 * M, "late"),
        Request(2, T0 + 3 * M, "ready"),
        Request(1, T0 + M, "ready"),
    ]
    got = [(s.epoch, s.first, s.last, s.reasons, s.run_key("sens")) for s in spans(reqs)]
    assert got == [
        (1, T0, T0 + 2 * M, ("late", "ready"), run_key(1, T0, T0 + 2 * M)),
        (2, T0 + 3 * M, T0 + 3 * M, ("ready",), run_key(2, T0 + 3 * M)),
    ]
    assert run_key(1, T0, T0 + 2 * M) == "sens:e1:2026-01-01T00:00:00.000Z..2026-01-01T00:02:00.000Z"
    # Epochs from `pending_from` on are the backlog the next run commits: one run for all of them.
    backlog = reqs + [Request(3, T0 + 4 * M, "ready")]
    got = [(s.epochs, s.first, s.last, s.run_key("sens")) for s in spans(backlog, pending_from=2)]
    assert got == [
        ("1", T0, T0 + 2 * M, run_key(1, T0, T0 + 2 * M)),
        ("2-3", T0 + 3 * M, T0 + 4 * M, "sens:e2-3:2026-01-01T00:03:00.000Z..2026-01-01T00:04:00.000Z"),
    ]


def test_failed_run_keys_get_their_next_attempt_after_a_back_off() -> None:
    """A request whose run key failed gets `<key>#2` (then #3 ...) once `retry_delay` has passed
    since the failure (at once for `wire tick`); a key whose attempt is queued, running or done
    keeps that attempt; the runs of other sensors do not count."""
    from dagster._core.test_utils import create_run_for_test

    from assets.keys import RUN_KEY_TAG, SENSOR_NAME_TAG
    from sensors import BY_TICK, retry_delay, retry_keys

    S = dg.DagsterRunStatus
    with dg.DagsterInstance.ephemeral() as inst:

        def run(key: str, status, sensor: str = "s") -> None:
            create_run_for_test(inst, status=status, tags={RUN_KEY_TAG: key, SENSOR_NAME_TAG: sensor})

        def keys(now: float) -> list[str | None]:
            reqs = [dg.RunRequest(run_key=k, tags={"x": "1"}) for k in ("a", "b", "c", "d")]
            return [r.run_key for r in retry_keys(inst, "s", reqs, now=now)]

        run("a", S.FAILURE)  # a failed: #2 after the back-off
        run("b", S.FAILURE)
        run("b#2", S.STARTED)  # b's second attempt is running: b#2 (the daemon skips it)
        run("c", S.SUCCESS)  # c ran: c
        run("d", S.FAILURE, sensor="other")  # another sensor's run: d is new to this one
        now = time.time()
        assert keys(now) == ["b#2", "c", "d"]  # a held back: it failed a moment ago
        assert keys(now + retry_delay(1) + 1) == ["a#2", "b#2", "c", "d"]
        token = BY_TICK.set(True)
        try:
            assert keys(now) == ["a#2", "b#2", "c", "d"]
        finally:
            BY_TICK.reset(token)
        run("a#2", S.CANCELED)  # a canceled attempt counts as failed
        assert keys(now + retry_delay(2) + 1)[0] == "a#3"
    assert [retry_delay(n) for n in (1, 2, 3, 8, 20)] == [5.0, 10.0, 20.0, 300.0, 300.0]


def test_the_cursor_is_shared_and_a_failed_backlog_plan_is_forgotten() -> None:
    """The daemon and `wire tick` read the newer of their cursors (the later epoch); a cursor's
    planned backlog run is dropped once that run failed, so the epochs it committed before failing
    are requested (and reported) as committed epochs."""
    from dagster._core.test_utils import create_run_for_test

    from assets.keys import RUN_KEY_TAG, SENSOR_NAME_TAG
    from sensors import forget_failed_plan, save_cursor, shared_cursor
    from wire_dagster.spec import pipeline_from_dict

    spec = pipeline_from_dict(PIPELINE | {"name": "shared"})
    old = json.dumps({"epoch": 2})
    new = json.dumps({"epoch": 5, "planned": {"key": "k", "to": 7, "first": 0, "last": 60_000}})
    with dg.DagsterInstance.ephemeral() as inst:
        assert shared_cursor(spec, inst, None) is None and shared_cursor(spec, inst, old) == old
        save_cursor(spec, inst, new)
        assert shared_cursor(spec, inst, None) == new and shared_cursor(spec, inst, old) == new
        save_cursor(spec, inst, old)
        assert shared_cursor(spec, inst, new) == new

        assert forget_failed_plan(inst, "s", new) == new  # no run of k yet
        create_run_for_test(inst, status=dg.DagsterRunStatus.FAILURE, tags={RUN_KEY_TAG: "k", SENSOR_NAME_TAG: "s"})
        assert json.loads(forget_failed_plan(inst, "s", new) or "") == {"epoch": 5}
        create_run_for_test(inst, status=dg.DagsterRunStatus.STARTED, tags={RUN_KEY_TAG: "k#2", SENSOR_NAME_TAG: "s"})
        assert forget_failed_plan(inst, "s", new) == new  # its retry is running: it reports them
