"""Crash matrix: a `wire process` (or `wire rewind`) subprocess killed at every named fault
point (wire_dagster.faults.POINTS), then a plain restart (DESIGN §2 invariants 1-3, §3).

The scenario (tests/commit_scenario.py): one pipeline with a tumbling, a sliding
and a session window, two segments, batch 1 committed as epoch 1, batch 2 (late,
retried, duplicate and malformed input) produced; the crashed process was
processing batch 2 as epoch 2:

    batch 1 ──process──▶ epoch 1 (committed)
    batch 2 ──process──▶ ✗ exit 86 at <point>      (checked: readers see a whole epoch)
            ──process──▶ epoch 2 (restart)          (checked: equal to the reference)

Right after the crash, readers see exactly the last committed epoch (1, or 2 when
the crash came after the marker), and every committed marker names an intact
manifest. After the restart the results, counts, dead letters and watermark equal
the reference run with the same epoch splits, and the published output is exactly
what the latest committed manifest names. The run that commits epoch 2 must commit
the same bytes whatever the fault point (determinism, invariant 1).

Batch 1's epoch is computed once per seed in this process and copied into each
test's bucket; the crashed and restarted processes attach to one Spark Connect
server (`spark_remote`), or boot local Spark each if it is unavailable.
WIRE_CRASH_SEEDS=n runs n seeds (default 1).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from commit_scenario import (
    Expected,
    assert_all,
    assert_committed_sound,
    assert_counts,
    assert_published,
    assert_results,
    batch_lines,
    batch_malformed,
    copy_bucket,
    expect,
    make_batches,
    output_hashes,
    produce_batch,
    seeds,
    subprocess_env,
    tuned,
    wire,
    write_pipeline,
)
from wire_dagster import engine
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.faults import POINTS
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import Pipeline


@pytest.fixture
def fast_spark(spark):
    """The session's Spark tuned for tiny epochs while the test runs (commit_scenario.tuned)."""
    with tuned(spark) as s:
        yield s


#: Fault points after which epoch 2 is already committed (the marker exists).
COMMITTED = {"after-marker", "during-publish", "during-gc"}
#: `during-gc:2`: killed after the collected epoch's marker is deleted, before its manifest is.
FAULT_SPEC = {"during-gc": "during-gc:2"}


@dataclass
class Template:
    store: ObjectStore  # a bucket holding: batch 1 committed as epoch 1, batch 2 produced
    spec: Pipeline
    yaml: Path
    after1: Expected
    after2: Expected
    stream_malformed: int


@pytest.fixture(scope="module")
def template(s3_server, spark, tmp_path_factory):
    cache: dict[int, Template] = {}

    def get(seed: int) -> Template:
        if seed not in cache:
            d = tmp_path_factory.mktemp(f"crash-seed{seed}")
            spec, path = write_pipeline(d, "crash")
            st = ObjectStore(replace(s3_server, bucket="tpl-" + uuid.uuid4().hex[:10]))
            st.ensure_bucket()
            b = make_batches(seed, 2)
            s1 = produce_batch(st, spec, d, b[0], 0)
            with tuned(spark):
                assert engine.process(st, spec, spark, max_epochs=10).committed == [1]
            s2 = produce_batch(st, spec, d, b[1], 1)
            e1 = expect(st, spec, [s1], batch_lines(b[0]), batch_malformed(b[0]))
            e2 = expect(
                st, spec, [s1, s2], batch_lines(b[0]) + batch_lines(b[1]), batch_malformed(b[0]) + batch_malformed(b[1])
            )
            # the scenario has what the matrix needs: late (counted and dead), duplicate and malformed input in epoch 2
            c = e2.state.window_counts
            assert all(c[w.name]["late"] > 0 for w in spec.windows), c
            assert e2.state.counts["duplicate"] >= 2 and e2.malformed >= 2
            assert any(r == "late" for r, _, e in e2.state.dead) and e2.watermarks[1] > e2.watermarks[0]
            cache[seed] = Template(st, spec, path, e1, e2, e2.malformed)
        return cache[seed]

    return get


_FINAL: dict[int, dict] = {}


@pytest.mark.parametrize("seed", seeds())
@pytest.mark.parametrize("point", POINTS)
def test_crash_then_restart(
    point: str, seed: int, template, store: ObjectStore, cli_env, spark_remote, fast_spark
) -> None:
    tpl = template(seed)
    spec, yml = tpl.spec, str(tpl.yaml)
    copy_bucket(tpl.store, store)
    cp = Checkpoints(store, spec.name)
    env = subprocess_env(cli_env, spark_remote)
    assert_results(store, spec, tpl.after1)

    if point == "during-rewind":
        assert engine.process(store, spec, fast_spark).committed == [2]
        crash_args = ["rewind", "--pipeline", yml, "--epoch", "1"]
    else:
        crash_args = ["process", "--pipeline", yml]
    crash_env = dict(env, WIRE_FAULT=FAULT_SPEC.get(point, point))
    if point == "during-gc":
        crash_env["WIRE_KEEP_EPOCHS"] = "1"  # committing epoch 2 collects epoch 1
    before = cp.latest()
    p = wire(crash_args, crash_env, expect_rc=86)  # 86: the fault point was reached and the process died there
    assert "Traceback" not in p.stderr

    # Right after the crash: readers see one whole committed epoch, never part of one.
    committed = point in COMMITTED or point == "during-rewind"
    now = tpl.after2 if committed else tpl.after1
    m = cp.latest()
    assert m is not None
    assert m.epoch == (2 if committed else 1)
    if not committed:
        assert m == before
        assert_published(store, spec)  # the published copies were not touched
    assert_results(store, spec, now)
    assert_counts(store, spec, now, stream_malformed=tpl.stream_malformed)
    assert_committed_sound(store, spec)
    if point == "during-gc":
        assert cp.committed() == [2] and cp.epochs() == [1, 2]  # epoch 1: marker gone, manifest left

    # The plain restart.
    if point == "during-rewind":
        wire(["rewind", "--pipeline", yml, "--epoch", "1"], env)
        r = cp.latest()
        assert r is not None
        assert (r.epoch, r.kind, r.rewound_to, r.watermark) == (3, "rewind", 1, tpl.after1.watermarks[-1])
        assert_results(store, spec, tpl.after1)
    out = wire(["process", "--pipeline", yml], env)
    final = assert_all(store, spec, tpl.after2)
    if point in ("after-marker", "during-publish"):
        assert "self-correction rewrote" in out.stdout  # the restart published what the crash did not
    if point in COMMITTED:
        assert "nothing new; last epoch 2" in out.stdout
    else:
        assert final.epoch == (4 if point == "during-rewind" else 2)
        assert final.chunks == {s: [q[0], q[-1]] for s, q in tpl.after2.splits[1].items()}

    # Nothing the crashed attempt staged is named by a committed manifest; GC with no
    # grace collects it, and afterwards every staged file belongs to a kept manifest.
    named = {f.key for n in cp.committed() for f in cp.load(n).files()}
    cp.gc(keep=10, grace_s=0)
    left = {i.key for i in store.list(f"{cp.root}staging/")}
    assert left <= named
    assert_committed_sound(store, spec)
    if point == "during-gc":
        assert cp.epochs() == [2]

    # Determinism: every fault point leads to the same committed bytes.
    hashes = output_hashes(final)
    assert _FINAL.setdefault(seed, hashes) == hashes
