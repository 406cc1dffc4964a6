"""Landing prefixes (DESIGN §4 Sources, issue 27 items 2-4): objects other tools write into the
bucket — here Kafka Connect's S3 sink layout, written with boto3 straight into the embedded
SeaweedFS — are adopted into the pipeline's stream exactly once and processed like produced
chunks; the window results equal a plain-Python batch over the records written once.

What the landing zone does, round by round (3 partitions, 8 objects of 15 records each,
records out of order within the 2 s bound):

    round 1   p0: o0 o1 o2          p1: o0 o1 o2               p2: o0 o1 o2
    round 2   p0: o3 o4 . o6        p1: o3 o4 o5(0 bytes)      p2: o3 o4.tmp
    round 3   p0: o5 (late flush,   p1: o5 (now written)       p2: o4.tmp -> o4 (renamed)
                  sorts before o6)      o6 (all malformed) o7      o5 o6 o7
              p0: o1 rewritten (another ETag): reported, not adopted again
              p0: o7
    close     adopt (rescan), seal, process to W = +inf
"""

from __future__ import annotations

import gzip
import io
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reference import assert_same_rows, batch
from wire_dagster import engine, landing, results
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.errors import WireInputError
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import field_column, pipeline_from_dict
from wire_dagster.streams import list_segments, read_stream
from wire_dagster.timeutil import INF

T0 = 1_767_225_600_000
TOPIC = "clicks"
PREFIX = f"topics/{TOPIC}/"
PER_OBJECT = 15
OBJECTS = 8
PARTS = 3


def pipeline(**over) -> dict:
    inp = {
        "name": "clicks",
        "landing": PREFIX,
        "segment_by": r"partition=(\d+)",
        "rescan": "0s",
        "time": "ts",
        "id": "eid",
        "key": "user",
    }
    inp.update(over)
    return {
        "name": "landed",
        "inputs": [inp],
        "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
        "lateness": {"allowed": "1h"},
        "partition": "1m",
        "start": "2026-01-01T00:00:00Z",
        "windows": [
            {"name": "per_5s", "type": "tumbling", "size": "5s", "aggregates": {"n": "count", "total": "sum(amount)"}},
            {"name": "sessions", "type": "session", "gap": "2s", "aggregates": {"n": "count", "top": "max(amount)"}},
        ],
    }


def kc_key(p: int, offset: int) -> str:
    """Kafka Connect's S3 sink: topics/<topic>/partition=<p>/<topic>+<p>+<first offset, 10 digits>.json"""
    return f"{PREFIX}partition={p}/{TOPIC}+{p}+{offset:010d}.json"


def records(rng: random.Random, p: int) -> list[list[dict]]:
    """Partition p's objects: records 250 ms apart, each moved back by up to 1.5 s (bound: 2 s)."""
    out = []
    for o in range(OBJECTS):
        objs = []
        for r in range(PER_OBJECT):
            i = o * PER_OBJECT + r
            objs.append(
                {
                    "ts": T0 + 10_000 + p * 37 + i * 250 - rng.randrange(1500),
                    "eid": f"p{p}-{i}",
                    "user": f"u{rng.randrange(5)}",
                    "amount": rng.randrange(100),
                }
            )
        out.append(objs)
    return out


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def put(store: ObjectStore, key: str, body: bytes) -> None:
    """As another tool writes: a plain boto3 PUT, not Wire's store."""
    store._client.put_object(Bucket=store.bucket, Key=key, Body=body)


def adopted_keys(store: ObjectStore, stream: str) -> list[str]:
    return [c.source["key"] for v in read_stream(store, stream, {}).values() for c in v.chunks if c.source]


def test_kafka_connect_objects_are_adopted_once_and_equal_the_batch(store: ObjectStore, spark) -> None:
    spec = pipeline_from_dict(pipeline())
    rng = random.Random(27)
    data = {p: records(rng, p) for p in range(PARTS)}
    written: dict[str, list[dict]] = {}  # key -> the records counted (the version adopted)

    def land(p: int, o: int, body: bytes | None = None, key: str | None = None) -> None:
        k = key or kc_key(p, o * PER_OBJECT)
        put(store, k, jsonl(data[p][o]) if body is None else body)
        if body is None and key is None:
            written[k] = data[p][o]

    def tick() -> None:
        landing.adopt(store, spec)
        engine.process(store, spec, spark, max_epochs=10)

    # round 1
    for p in range(PARTS):
        for o in range(3):
            land(p, o)
    tick()
    assert sorted(adopted_keys(store, "clicks")) == sorted(written)
    # round 2: a gap in p0 (o5 flushed late), an empty object, a temporary one
    for p, o in [(0, 3), (0, 4), (0, 6), (1, 3), (1, 4)]:
        land(p, o)
    put(store, kc_key(1, 5 * PER_OBJECT), b"")
    land(2, 3)
    tmp = kc_key(2, 4 * PER_OBJECT) + ".tmp"
    put(store, tmp, jsonl(data[2][4]))
    put(store, f"{PREFIX}partition=2/_temporary/0/{TOPIC}+2+0000000999.json", jsonl(data[2][4]))
    tick()
    assert kc_key(1, 5 * PER_OBJECT) not in adopted_keys(store, "clicks")
    assert not any("tmp" in k or "_temporary" in k for k in adopted_keys(store, "clicks"))
    # round 3
    land(0, 5)  # sorts before o6, adopted already: a late flush
    land(1, 5)  # the empty object, now with its records
    bad = kc_key(1, 6 * PER_OBJECT)
    put(store, bad, b'not json\n{"ts": "soon"}\n\x00\xff\n')  # every record malformed
    land(1, 7)
    store._client.copy_object(Bucket=store.bucket, Key=kc_key(2, 4 * PER_OBJECT), CopySource=f"{store.bucket}/{tmp}")
    store.delete(tmp)
    written[kc_key(2, 4 * PER_OBJECT)] = data[2][4]
    for o in (5, 6, 7):
        land(2, o)
    rewritten = kc_key(0, 1 * PER_OBJECT)
    put(store, rewritten, jsonl([dict(r, amount=r["amount"] + 1000, eid=r["eid"] + "x") for r in data[0][1]]))
    land(0, 7)
    tick()
    reports = landing.adopt(store, spec)  # a second rescan: the rewrite is reported once
    assert reports[0].changed == []
    # close: what landed is adopted, then the segments are sealed; W reaches +inf
    landing.adopt_and_close(store, spec)
    engine.process(store, spec, spark, max_epochs=20)

    keys = adopted_keys(store, "clicks")
    assert sorted(keys) == sorted([*written, bad])  # each final object once, the temporary ones never
    assert list_segments(store, "clicks") == ["0", "1", "2"]
    seg0 = [c.source["key"] for c in read_stream(store, "clicks", {})["0"].chunks if c.source]
    assert seg0 == [kc_key(0, o * PER_OBJECT) for o in (0, 1, 2, 3, 4, 6, 5, 7)]  # o5: late flush
    st = landing.landing_status(store, spec)[0]
    changed = [c["key"] for s in st["segments"] for c in s["changed"]]
    assert changed == [rewritten]
    m = Checkpoints(store, spec.name).latest()
    assert m is not None and m.watermark == INF
    t = m.totals
    n = sum(len(v) for v in written.values())
    assert (t.events_in, t.malformed, t.duplicate, t.filtered) == (n + 3, 3, 0, 0)  # the bad object: 3 lines
    assert t.balanced()
    events = [
        {"_t": r["ts"], "_key": r["user"], field_column("amount"): float(r["amount"])}
        for rows in written.values()
        for r in rows
    ]
    want = {w.name: [r for _, r in sorted(batch(spec, w, events).items())] for w in spec.windows}
    got = {w.name: results.read_results(store, spec, w.name).to_pylist() for w in spec.windows}
    assert_same_rows(spec, got, want)


def test_formats_gzip_parquet_and_ingestion_clock(store: ObjectStore, spark) -> None:
    """JSON lines, gzip'd JSON lines and Parquet objects in one segment (no segment_by: one,
    "0"); a corrupt gzip object is one dead letter; in ingestion-time mode (PDP-26) the segment's
    watermark follows the objects' write times, not their events."""
    raw = pipeline(landing="firehose/clicks/", rescan="1h")
    del raw["inputs"][0]["segment_by"]
    raw["watermark"] = {"clock": "ingestion", "max_event_time_lag": "1s", "idle_timeout": "1h"}
    spec = pipeline_from_dict(raw)
    rows = [{"ts": T0 + i * 100, "eid": f"e{i}", "user": f"u{i % 3}", "amount": i} for i in range(60)]
    put(store, "firehose/clicks/2026/01/01/00/a.json", jsonl(rows[:20]))
    put(store, "firehose/clicks/2026/01/01/00/b.json.gz", gzip.compress(jsonl(rows[20:40])))
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows[40:]), buf)
    put(store, "firehose/clicks/2026/01/01/01/c.parquet", buf.getvalue())
    put(store, "firehose/clicks/2026/01/01/01/d.json.gz", b"\x1f\x8bnot really gzip")
    rep = landing.adopt(store, spec)[0]
    assert (rep.adopted, rep.segments["0"].events, rep.segments["0"].malformed) == (4, 60, 1)
    chunks = read_stream(store, "clicks", {})["0"].chunks
    heads = {c.source["key"]: c.source for c in chunks if c.source}
    for c in chunks:
        assert c.source is not None and c.ingest_ms == c.source["last_modified_ms"]  # the writer-side clock
    engine.process(store, spec, spark, max_epochs=5)
    m = Checkpoints(store, spec.name).latest()
    assert m is not None
    newest_write = max(s["last_modified_ms"] for s in heads.values())
    # W follows the write times (now, 2026-11), far past the events' time (2026-01-01)
    assert m.watermark == newest_write - 1000
    assert m.totals.events_in == 61 and m.totals.malformed == 1


def test_an_idle_tick_lists_once_per_segment_whatever_the_backlog(store: ObjectStore, monkeypatch) -> None:
    """Listing is incremental (start-after the segment's last adopted key): the requests of an
    evaluation when nothing landed do not grow with the objects already adopted."""
    spec = pipeline_from_dict(pipeline(rescan="1h"))
    monkeypatch.setattr(landing, "MAX_OBJECTS_PER_SEGMENT", 40)  # back-pressure: 40 per evaluation
    for p in range(2):
        for o in range(60):
            put(store, kc_key(p, o), jsonl([{"ts": T0 + o, "eid": f"{p}-{o}", "user": "u", "amount": 1}]))
    calls: list[str] = []
    store._client.meta.events.register("before-send.s3", lambda request, **kw: calls.append(request.method))

    def requests_of_adopt() -> tuple[int, int]:
        calls.clear()
        n = sum(r.adopted for r in landing.adopt(store, spec))
        return n, len(calls)

    assert requests_of_adopt()[0] == 80  # 40 per segment, the rest next time
    assert requests_of_adopt()[0] == 40
    idle = [requests_of_adopt() for _ in range(3)]
    assert all(n == 0 for n, _ in idle)
    # one LIST for the segments, the rescan record (GET), the stream's _CLOSED (HEAD); per
    # segment: its seal (GET), its index after the last known chunk (LIST), the landing after
    # its last adopted key (LIST)
    assert [c for _, c in idle] == [3 + 3 * 2] * 3, idle
    print(f"\nidle evaluation: {idle[0][1]} requests for 2 segments")
    for p in range(2):
        for o in range(60, 200):
            put(store, kc_key(p, o), jsonl([{"ts": T0 + o, "eid": f"{p}-{o}", "user": "u", "amount": 1}]))
    while requests_of_adopt()[0]:
        pass
    assert len(adopted_keys(store, "clicks")) == 400
    assert requests_of_adopt() == (0, 3 + 3 * 2)  # 3 times the objects adopted: the same requests
    for p in range(2):
        for o in range(200, 240):
            put(store, kc_key(p, o), jsonl([{"ts": T0 + o, "eid": f"{p}-{o}", "user": "u", "amount": 1}]))
    (closed,) = landing.adopt_and_close(store, spec)  # more than one evaluation's budget: all of it
    assert closed.adopted == 80 and len(adopted_keys(store, "clicks")) == 480


def test_two_adopters_at_once_adopt_each_object_once(store: ObjectStore) -> None:
    """Two evaluators racing (the daemon's sensor and a `wire tick`): every object once."""
    from concurrent.futures import ThreadPoolExecutor

    spec = pipeline_from_dict(pipeline())
    for p in range(2):
        for o in range(30):
            put(store, kc_key(p, o), jsonl([{"ts": T0 + o, "eid": f"{p}-{o}", "user": "u", "amount": 1}]))
    with ThreadPoolExecutor(4) as pool:
        reps = list(pool.map(lambda _: landing.adopt(store, spec, rescan=True), range(4)))
    keys = adopted_keys(store, "clicks")
    assert sorted(keys) == sorted(kc_key(p, o) for p in range(2) for o in range(30))
    assert sum(r.adopted for rs in reps for r in rs) == 60  # each claimed by one of them
    for seg, view in read_stream(store, "clicks", {}).items():
        assert [c.seq for c in view.chunks] == list(range(30)), seg


def test_landing_mistakes_are_one_line() -> None:
    for over, match in [
        ({"landing": "/abs/"}, "relative key prefix"),
        ({"landing": "streams/x/"}, "Wire's own"),
        ({"segment_by": "partition=("}, "bad regex"),
        ({"segment_by": "(a)(b)"}, "use one"),
        ({"landing": None, "segment_by": "x"}, "apply to a landing prefix"),
    ]:
        raw = pipeline(**over)
        if over.get("landing", 1) is None:
            del raw["inputs"][0]["landing"]
        with pytest.raises(WireInputError, match=match):
            pipeline_from_dict(raw)


def test_wire_tick_adopts_close_adopts_first_and_status_shows_adoption(
    store: ObjectStore, cli_env, spark_remote, tmp_path
) -> None:
    """`wire tick` adopts (its sensor evaluation) and records the stream asset's observation in the
    instance, as the daemon does; `wire close` of a landing stream adopts what landed (a rescan)
    before sealing; `wire status` shows per segment the objects adopted and those rewritten after
    adoption."""
    import dagster as dg
    import yaml

    from conftest import run_wire

    d = tmp_path / "pipelines"
    d.mkdir()
    (d / "landed.yaml").write_text(yaml.safe_dump(pipeline(rescan="1h")))
    home = tmp_path / "dagster-home"
    # The run attaches to the session's Spark Connect server when there is one, else boots local[2].
    env = {**cli_env, "WIRE_PIPELINES": str(d), "DAGSTER_HOME": str(home), "WIRE_SPARK_MASTER": "local[2]"}
    env.pop("WIRE_SPARK_REMOTE", None)
    if spark_remote:
        env["WIRE_SPARK_REMOTE"] = spark_remote
    for o in range(4):
        put(store, kc_key(o % 2, o), jsonl([{"ts": T0 + 10_000 + o, "eid": f"e{o}", "user": "u", "amount": o}]))
    spec = pipeline_from_dict(pipeline(rescan="1h"))
    tick = run_wire(["tick", "--pipeline", "landed"], env, timeout=600)
    assert tick.returncode == 0 and ": SUCCESS" in tick.stdout, tick.stderr[-3000:]  # the first epoch's run
    assert len(adopted_keys(store, "clicks")) == 4
    with dg.DagsterInstance.from_config(str(home)) as inst:
        (rec,) = inst.fetch_observations(dg.AssetKey(["streams", "clicks"]), limit=10).records
        md = rec.asset_observation.metadata if rec.asset_observation else {}
        assert md["objects_adopted"].value == 4
    put(store, kc_key(0, 0), jsonl([{"ts": T0 + 10_000, "eid": "e0", "user": "u", "amount": 99}]))  # rewritten
    put(store, kc_key(1, 1000), jsonl([{"ts": T0 + 10_000, "eid": "e9", "user": "u", "amount": 9}]))  # new
    close = run_wire(["close", "--pipeline", "landed"], env, check=True)
    assert "adopted 1 objects from topics/clicks/ before closing" in close.stdout
    assert "sealed 2 segments of clicks" in close.stdout
    st = run_wire(["status", "--pipeline", "landed"], env, check=True).stdout
    assert "segment 0: 2 objects adopted" in st and "segment 1: 3 objects adopted" in st
    assert f"rewritten after adoption (not read again): {kc_key(0, 0)}" in st
    put(store, kc_key(1, 2000), b"{}\n")  # after the close: never adopted
    assert landing.adopt(store, spec)[0].adopted == 0
    bad = run_wire(["close", "--pipeline", str(d / "nope.yaml")], env)
    assert bad.returncode == 2


def test_the_sensor_adopts_then_plans_and_observes_the_stream_asset(
    store: ObjectStore, s3_env, tmp_path, monkeypatch
) -> None:
    """The watermark sensor adopts before planning (so `wire tick`, which evaluates it, does too),
    requests the runs the adopted chunks make ready, and reports an observation of the stream
    asset: objects adopted, bytes, segment watermarks; an idle evaluation reports none."""
    import dagster as dg

    from definitions import build_definitions
    from resources import ObjectStoreResource
    from sensors import sensor_name

    spec = pipeline_from_dict(pipeline(rescan="1h"))
    sensor = build_definitions(pipelines=[spec]).resolve_sensor_def(sensor_name(spec))
    res = ObjectStoreResource(
        endpoint=s3_env["WIRE_S3_ENDPOINT"],
        access_key=s3_env["WIRE_S3_ACCESS_KEY"],
        secret_key=s3_env["WIRE_S3_SECRET_KEY"],
        bucket=s3_env["WIRE_S3_BUCKET"],
    )
    body = {}
    for p in range(2):
        rows = [{"ts": T0 + 10_000 + i * 1000, "eid": f"{p}-{i}", "user": "u", "amount": 1} for i in range(90)]
        body[p] = jsonl(rows)
        put(store, kc_key(p, 0), body[p])

    def evaluate() -> dg.SensorResult:
        with (
            dg.DagsterInstance.ephemeral() as instance,
            dg.build_sensor_context(instance=instance, resources={"wire_store": res}) as ctx,
        ):
            result = sensor(ctx)
        assert isinstance(result, dg.SensorResult)
        return result

    first = evaluate()
    assert first.run_requests  # the adopted minute is ready (W = newest event - 2 s)
    (obs,) = first.asset_events or []
    assert isinstance(obs, dg.AssetObservation) and obs.asset_key == dg.AssetKey(["streams", "clicks"])
    md = {k: v.value for k, v in obs.metadata.items()}
    assert md["objects_adopted"] == 2 and md["bytes_adopted"] == len(body[0]) + len(body[1])
    assert md["events"] == 180 and md["chunks"] == {"0": 1, "1": 1}
    assert md["segment_watermarks"] == {"0": "2026-01-01T00:01:37.000Z", "1": "2026-01-01T00:01:37.000Z"}
    assert not evaluate().asset_events  # nothing landed since: no observation
    # The requests of an idle evaluation (for BENCHMARKS.md): the adoption's, and the whole
    # sensor's (adoption, the planner's reading of the stream and of the pipeline's epochs).
    from collections import Counter

    from wire_dagster.objectstore import ObjectStore as Store

    counts: Counter = Counter()
    call = Store._call

    def counting(self, op, key, fn, **kw):
        counts[op] += 1
        return call(self, op, key, fn, **kw)

    monkeypatch.setattr(Store, "_call", counting)
    landing.adopt(store, spec)
    adoption = dict(counts)
    counts.clear()
    evaluate()  # nothing committed (no run here): it plans the same epoch again
    print(f"\nidle evaluation, 2 segments: adoption {adoption}; whole sensor {dict(counts)}")
    assert sum(adoption.values()) == 9


def test_nested_keys_are_listed_incrementally_in_key_order(store: ObjectStore) -> None:
    """Firehose-like keys (prefix/YYYY/MM/DD/HH/name): the listing after the last adopted key
    (StartAfter, here on SeaweedFS, which lists by path component) finds the later hours and the
    later names of the same hour, with no rescan."""
    raw = pipeline(landing="firehose/clicks/", rescan="1h")
    del raw["inputs"][0]["segment_by"]
    spec = pipeline_from_dict(raw)
    landing.adopt(store, spec, rescan=False)  # nothing yet

    def row(i: int) -> bytes:
        return jsonl([{"ts": T0 + 10_000 + i, "eid": f"e{i}", "user": "u", "amount": i}])

    first = ["firehose/clicks/2026/01/01/00/a-1.json", "firehose/clicks/2026/01/01/00/a-2.json"]
    later = [
        "firehose/clicks/2026/01/01/00/a-3.json",
        "firehose/clicks/2026/01/01/00/a-3.json.d/x.json",  # a "directory" named like a key
        "firehose/clicks/2026/01/01/01/a-1.json",
        "firehose/clicks/2026/01/02/00/a-1.json",
        "firehose/clicks/2026/01/01/00/a-30.json",
    ]
    for i, k in enumerate(first):
        put(store, k, row(i))
    assert landing.adopt(store, spec, rescan=False)[0].adopted == 2
    for i, k in enumerate(later):
        put(store, k, row(10 + i))
    assert landing.adopt(store, spec, rescan=False)[0].adopted == len(later)
    assert [c.source["key"] for c in read_stream(store, "clicks", {})["0"].chunks if c.source] == sorted(
        first
    ) + sorted(later)


def test_a_landing_input_in_a_union_with_a_produced_stream(store: ObjectStore, spark, tmp_path) -> None:
    """Inputs of several kinds: a landing prefix and a produced stream; the remap names the
    landing input's segments `<input>.<segment>`; both count, once."""
    from wire_dagster import streams
    from wire_dagster.spec import stream_spec

    raw = pipeline(rescan="1h")
    raw["inputs"].append({"name": "app", "stream": "app", "time": "ts", "id": "eid", "key": "user"})
    spec = pipeline_from_dict(raw)
    web = [{"ts": T0 + 10_000 + i * 100, "eid": f"w{i}", "user": f"u{i % 3}", "amount": i} for i in range(40)]
    app = [{"ts": T0 + 10_000 + i * 150, "eid": f"a{i}", "user": f"u{i % 4}", "amount": 2 * i} for i in range(30)]
    put(store, kc_key(0, 0), jsonl(web[:20]))
    put(store, kc_key(1, 0), jsonl(web[20:]))
    (tmp_path / "app.jsonl").write_bytes(jsonl(app))
    streams.produce(store, stream_spec("app", "ts", "eid"), tmp_path / "app.jsonl")
    streams.close_stream(store, "app")
    landing.adopt_and_close(store, spec)
    engine.process(store, spec, spark, max_epochs=5)
    m = Checkpoints(store, spec.name).latest()
    assert m is not None and m.watermark == INF and m.remap == {"app.0": 1, "clicks.0": 1, "clicks.1": 1}
    assert m.totals.events_in == 70 and m.totals.balanced()
    events = [{"_t": r["ts"], "_key": r["user"], field_column("amount"): float(r["amount"])} for r in web + app]
    want = {w.name: [r for _, r in sorted(batch(spec, w, events).items())] for w in spec.windows}
    assert_same_rows(spec, {w.name: results.read_results(store, spec, w.name).to_pylist() for w in spec.windows}, want)


def test_objects_adopted_as_the_stream_closes_are_reported(store: ObjectStore, monkeypatch) -> None:
    """A `wire close` that seals a segment while an evaluation adopts: the chunks past the seal
    are never read (W is already +inf), and the objects they hold are reported, not lost quietly."""
    from wire_dagster.streams import close_stream

    spec = pipeline_from_dict(pipeline(rescan="1h"))
    for o in range(4):
        put(store, kc_key(0, o), jsonl([{"ts": T0 + 10_000 + o, "eid": f"e{o}", "user": "u", "amount": o}]))
    claim = landing._claim
    calls = []

    def claim_then_close(*a, **kw):
        out = claim(*a, **kw)
        calls.append(out[0])
        if len(calls) == 2:
            close_stream(store, "clicks")  # sealed after chunk 1
        return out

    monkeypatch.setattr(landing, "_claim", claim_then_close)
    (rep,) = landing.adopt(store, spec)
    assert rep.adopted == 4 and rep.segments["0"].after_close == 2
    (st,) = landing.landing_status(store, spec)
    assert st["segments"][0]["after_close"] == [kc_key(0, 2), kc_key(0, 3)]
    assert landing.observation(spec, rep)["adopted_after_close"] == 2


def test_dead_letters_name_the_landed_object(store: ObjectStore, spark) -> None:
    """A dead letter of a record adopted from a landing prefix names the object it came from
    (`object`), whether the stream refused it at adoption (no time) or the pipeline's epoch did
    (no key, a duplicate id, too late); `wire dlq`'s table shows the column."""
    from rich.console import Console

    from wire_dagster.status import dead_letter_table

    raw = pipeline()
    raw["lateness"] = {"allowed": "0s"}
    spec = pipeline_from_dict(raw)
    first, second = kc_key(0, 0), kc_key(0, 10)
    put(store, first, jsonl([{"ts": T0 + 10_000, "eid": "e1", "user": "u", "amount": 1}]))
    put(store, kc_key(1, 0), jsonl([{"ts": T0 + 60_000, "eid": "e2", "user": "u", "amount": 1}]))
    landing.adopt(store, spec)
    engine.process(store, spec, spark, max_epochs=5)
    bad = [
        {"eid": "e3", "user": "u", "amount": 1},  # no time: the stream's dead letter
        {"ts": T0 + 20_000, "eid": "e4", "amount": 1},  # no key: the pipeline's
        {"ts": T0 + 30_000, "eid": "e1", "user": "u", "amount": 1},  # e1 again
        {"ts": T0 + 1_000, "eid": "e5", "user": "u", "amount": 1},  # behind W (58 s) by more than 0 s
        {"ts": T0 + 59_000, "eid": "e6", "user": "u", "amount": 1},  # fine
    ]
    put(store, second, jsonl(bad))
    put(store, kc_key(1, 10), jsonl([{"ts": T0 + 120_000, "eid": "e7", "user": "u", "amount": 1}]))
    landing.adopt(store, spec)
    engine.process(store, spec, spark, max_epochs=5)
    dl = results.read_dead_letters(store, spec)
    reasons = sorted({(d["row"], d["reason"].split(":")[0]) for d in dl})
    assert reasons == [(0, "malformed"), (1, "malformed"), (2, "duplicate"), (3, "late")], dl
    assert {d["object"] for d in dl} == {second}, dl
    text = Console(width=160, record=True, file=io.StringIO())
    text.print(dead_letter_table("landed", dl))
    shown = text.export_text()
    assert "object" in shown and second[-20:] in shown, shown
