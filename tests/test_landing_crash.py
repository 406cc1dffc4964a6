"""kill -9 of a real `wire tick` while it adopts a landing prefix (issue 27): nothing is adopted
twice, nothing is lost.

    land 150 objects (3 partitions x 50, Kafka Connect names)
    repeat KILLS times:  wire tick ─▶ adopting … ✗ kill -9 (process group) once the segments
                                      hold a random number of adopted chunks (a random moment
                                      of the adoption: before a claim, between the object's
                                      data and its claim, after it)
                         check: every object at most once, every segment's chunks gapless
    then adopt what is left (in-process) and check: every object exactly once, the chunks'
    events are the records landed, each once

The claim of chunk N is a create-if-absent of its index, written after the chunk's data: a kill
before it leaves an unreferenced data file (counted, harmless), a kill after it a whole chunk.
WIRE_CRASH_SEEDS=n runs n seeds (test-long: 5).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import run_wire
from wire_dagster import landing
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import load_pipeline
from wire_dagster.streams import read_stream

NAME = "landkill"
PARTS, OBJECTS, PER_OBJECT = 3, 50, 5
KILLS = 2
T0 = 1_767_225_600_000 + 60_000


def seeds() -> list[int]:
    return list(range(int(os.environ.get("WIRE_CRASH_SEEDS", "1"))))


def kc_key(p: int, offset: int) -> str:
    return f"topics/clicks/partition={p}/clicks+{p}+{offset:010d}.json"


def wire_exe() -> str:
    import shutil
    import sys

    return shutil.which("wire", path=str(Path(sys.executable).parent)) or "wire"


def adopted(store: ObjectStore) -> list[tuple[str, int, str]]:
    """(segment, seq, object key) of every adopted chunk."""
    return [
        (seg, c.seq, c.source["key"])
        for seg, v in read_stream(store, "clicks", {}).items()
        for c in v.chunks
        if c.source
    ]


def check_at_most_once(store: ObjectStore) -> list[tuple[str, int, str]]:
    got = adopted(store)
    keys = [k for _, _, k in got]
    assert len(keys) == len(set(keys)), "an object adopted twice"
    for seg, v in read_stream(store, "clicks", {}).items():
        assert [c.seq for c in v.chunks] == list(range(len(v.chunks))), seg
    return got


@pytest.mark.parametrize("seed", seeds())
def test_wire_tick_killed_during_adoption_adopts_each_object_once(
    seed: int, store: ObjectStore, cli_env: dict[str, str], tmp_path: Path
) -> None:
    rng = random.Random(seed)
    d = tmp_path / "pipelines"
    d.mkdir()
    raw = {
        "name": NAME,
        "inputs": [
            {
                "name": "clicks",
                "landing": "topics/clicks/",
                "segment_by": r"partition=(\d+)",
                "time": "ts",
                "id": "eid",
                "key": "user",
            }
        ],
        "watermark": {"max_out_of_orderness": "1s"},
        "partition": "1m",
        "start": "2026-01-01T00:00:00Z",
        "windows": [{"name": "w", "type": "tumbling", "size": "10s", "aggregates": {"n": "count"}}],
    }
    (d / f"{NAME}.yaml").write_text(yaml.safe_dump(raw))
    spec = load_pipeline(d / f"{NAME}.yaml")
    env = {**cli_env, "WIRE_PIPELINES": str(d)}
    landed: dict[str, list[str]] = {}
    for p in range(PARTS):
        for o in range(OBJECTS):
            rows = [
                {"ts": T0 + (o * PER_OBJECT + r) * 100, "eid": f"{p}-{o}-{r}", "user": f"u{r}", "amount": 1}
                for r in range(PER_OBJECT)
            ]
            key = kc_key(p, o * PER_OBJECT)
            store._client.put_object(
                Bucket=store.bucket, Key=key, Body="".join(json.dumps(x) + "\n" for x in rows).encode()
            )
            landed[key] = [x["eid"] for x in rows]
    total = len(landed)
    kills = []
    for _ in range(KILLS):
        before = len(adopted(store))
        if before >= total - 1:
            break
        target = rng.randrange(before + 1, min(total, before + 60))
        p = subprocess.Popen(
            [wire_exe(), "tick", "--pipeline", NAME],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        t0 = time.monotonic()
        try:
            while len(adopted(store)) < target:  # polled: the tick adopts within seconds
                if p.poll() is not None:
                    out, err = p.communicate()
                    raise AssertionError(f"wire tick ended before the kill ({p.returncode}): {err[-2000:]}")
                assert time.monotonic() - t0 < 120, "wire tick adopted nothing in 120 s"
                time.sleep(0.02)
            os.killpg(p.pid, signal.SIGKILL)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        got = check_at_most_once(store)
        kills.append((target, len(got)))
    assert len(kills) >= 2 and all(n < total for _, n in kills), kills  # killed mid-adoption
    reps = landing.adopt(store, spec)
    got = check_at_most_once(store)
    assert sorted(k for _, _, k in got) == sorted(landed)
    assert sum(r.adopted for r in reps) == total - kills[-1][1]
    # the chunks' records are the landed records, each once
    from wire_dagster.extract import read_chunk

    eids = []
    for v in read_stream(store, "clicks", {}).values():
        for c in v.chunks:
            assert c.rows == PER_OBJECT and c.malformed == 0
            eids += read_chunk(store, spec, c)["_id"].to_pylist()
    assert sorted(eids) == sorted(e for es in landed.values() for e in es)
    data = [i.key for i in store.list("streams/clicks/segments/") if "/data/" in i.key]
    print(f"\nkills at {kills}; unreferenced data files left by the kills: {len(data) - total}")
    # `wire gc` collects what the kills left between writing a chunk and claiming it (none with
    # its default grace: they are younger than 10 minutes), and never a claimed chunk's file.
    gc = run_wire(["gc", "--pipeline", NAME], env, check=True)
    assert "stream clicks: deleted 0 unclaimed chunk files" in gc.stdout, gc.stdout
    gc = run_wire(["gc", "--pipeline", NAME, "--grace", "0"], env, check=True)
    assert f"stream clicks: deleted {len(data) - total} unclaimed chunk files" in gc.stdout, gc.stdout
    named = {c.data_key for v in read_stream(store, "clicks", {}).values() for c in v.chunks if c.data_key}
    assert sorted(i.key for i in store.list("streams/clicks/segments/") if "/data/" in i.key) == sorted(named)
