"""Races for the commit marker, zombie writers and late publishers (DESIGN §2 invariant 2, §3 fencing).

run A ──stage──prepare──┐
run B ──stage──prepare──┼─▶ create epochs/N/_COMMITTED (If-None-Match: *) ─▶ one winner
run C ──stage──prepare──┘                                                   the rest: CommitConflict,
                                                                             staging collected
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from commit_scenario import (
    P_STEP,
    T0,
    assert_all,
    assert_committed_sound,
    batch_lines,
    batch_malformed,
    expect,
    hand_epoch,
    make_batches,
    produce_batch,
    published,
    staging_runs,
    subprocess_env,
    tumble_rows,
    tuned,
    wait_for,
    wanted_published,
    wire_exe,
    write_pipeline,
)
from wire_dagster import engine
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.errors import CommitConflict
from wire_dagster.objectstore import ObjectStore


@pytest.fixture
def fast_spark(spark):
    """The session's Spark tuned for tiny epochs while the test runs (commit_scenario.tuned)."""
    with tuned(spark) as s:
        yield s


P0, P1 = T0, T0 + P_STEP


@pytest.fixture
def spec(tmp_path):
    return write_pipeline(tmp_path, "race")[0]


def test_marker_races(store: ObjectStore, spec) -> None:
    """20 epochs, each raced by 2-4 writers (threads, each with its own client) that staged
    distinct content and prepared distinct manifests, then create the marker at the same
    moment: exactly one commit per epoch, the others get CommitConflict and their staging is
    collected; readers see exactly the winner's rows."""
    rng = random.Random(5)
    cp = Checkpoints(store, spec.name)
    writers = [Checkpoints(ObjectStore(store.cfg), spec.name) for _ in range(4)]  # one client per writer
    prev = None
    for epoch in range(1, 21):
        n = rng.randint(2, 4)
        barrier = threading.Barrier(n, timeout=60)
        outcome: dict[int, str] = {}
        manifests = {}

        def contend(
            i: int, epoch: int = epoch, prev=prev, barrier=barrier, outcome=outcome, manifests=manifests
        ) -> None:
            mine = writers[i]
            m = hand_epoch(
                mine, spec, epoch, f"e{epoch}-w{i}", {P0: [("k", P0, epoch * 10 + i)]}, carry=prev, commit=False
            )
            manifests[i] = m
            barrier.wait()
            try:
                mine.commit(m)
                outcome[i] = "won"
            except CommitConflict:
                mine.abort(m.run_id)
                outcome[i] = "lost"

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert sorted(outcome.values()) == ["lost"] * (n - 1) + ["won"], outcome
        (w,) = [i for i, o in outcome.items() if o == "won"]
        marker = cp.marker(epoch)
        assert marker is not None and marker.run_id == f"e{epoch}-w{w}"
        assert cp.committed()[-1] == epoch and cp.latest() == manifests[w]
        assert tumble_rows(store, spec) == [("k", P0, epoch * 10 + w)]
        runs = staging_runs(store, spec)
        assert f"e{epoch}-w{w}" in runs and not any(f"e{epoch}-w{i}" in runs for i in outcome if i != w)
        prev = manifests[w]
    assert cp.committed() == list(range(1, 21))
    assert_committed_sound(store, spec)


def test_zombie_writer_is_fenced(store: ObjectStore, spec) -> None:
    """A writer prepared epoch 2, paused, and resumes after 2 and 3 were committed by others:
    its commit fails with CommitConflict, reads do not change, its staging is collected.
    The same after garbage collection removed the overtaken epoch's marker (keep=1): a free
    marker slot below the latest epoch must not let the zombie in."""
    cp = Checkpoints(store, spec.name)
    m1 = hand_epoch(cp, spec, 1, "run-1", {P0: [("k", P0, 1)]})
    zombie = hand_epoch(cp, spec, 2, "zombie", {P0: [("k", P0, 666)]}, carry=m1, commit=False)
    m2 = hand_epoch(cp, spec, 2, "run-2", {P0: [("k", P0, 2)]}, carry=m1)
    m3 = hand_epoch(cp, spec, 3, "run-3", {P1: [("k", P1, 3)]}, carry=m2)
    seen = tumble_rows(store, spec)
    with pytest.raises(CommitConflict):
        Checkpoints(ObjectStore(store.cfg), spec.name).commit(zombie)
    assert cp.abort("zombie") > 0 and "zombie" not in staging_runs(store, spec)
    marker = cp.marker(2)
    assert marker is not None
    assert (marker.run_id, cp.latest(), tumble_rows(store, spec)) == ("run-2", m3, seen)

    zombie4 = hand_epoch(cp, spec, 4, "zombie4", {P0: [("k", P0, 666)]}, carry=m3, commit=False)
    m = m3
    for n in (4, 5, 6):
        m = hand_epoch(cp, spec, n, f"run-{n}", {P1: [("k", P1, n)]}, carry=m)
        cp.gc(keep=1)
    assert cp.committed() == [6] and cp.marker(4) is None  # epoch 4's marker is gone: its slot is free
    seen = tumble_rows(store, spec)
    with pytest.raises(CommitConflict, match="epoch 6 is already committed"):
        cp.commit(zombie4)
    assert cp.marker(4) is None and cp.committed() == [6]
    assert cp.abort("zombie4") > 0 and "zombie4" not in staging_runs(store, spec)
    assert tumble_rows(store, spec) == seen
    assert_committed_sound(store, spec)


class _SlowPublisher:
    """An ObjectStore whose first write under output/ first lets `rival` run (the zombie pauses there)."""

    def __init__(self, inner: ObjectStore, rival) -> None:
        self._inner, self._rival = inner, rival

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _first_write(self, key: str) -> None:
        if "/output/" in key and self._rival is not None:
            rival, self._rival = self._rival, None
            rival()

    def put(self, key: str, data: bytes) -> str:
        self._first_write(key)
        return self._inner.put(key, data)

    def copy(self, src: str, dst: str, if_match: str) -> bool:  # how a staged file is published
        self._first_write(dst)
        return self._inner.copy(src, dst, if_match)


def test_late_publisher_cannot_leave_older_output(store: ObjectStore, spec) -> None:
    """Run A committed epoch 1 and starts publishing; before its first write, run B commits and
    publishes epoch 2 (a new value for P0, a new partition P1). A's stale write must not stay:
    the published output ends equal to epoch 2's manifest. Publishing epoch 1 afterwards does nothing."""
    cp = Checkpoints(store, spec.name)
    m1 = hand_epoch(cp, spec, 1, "run-a", {P0: [("k", P0, 1)]})
    done = {}

    def rival() -> None:
        done["m2"] = hand_epoch(cp, spec, 2, "run-b", {P0: [("k", P0, 2)], P1: [("k", P1, 2)]}, carry=m1)
        cp.publish(done["m2"])

    Checkpoints(_SlowPublisher(store, rival), spec.name).publish(m1)  # pyright: ignore[reportArgumentType]  an ObjectStore by delegation
    assert "m2" in done
    assert published(store, spec) == wanted_published(store, spec, done["m2"])
    assert cp.publish(m1) == []
    assert published(store, spec) == wanted_published(store, spec, done["m2"])


def _race(store: ObjectStore, spec, spark, n: int, monkeypatch, keep: int) -> list[str]:
    """n threads run engine.process at once; each waits at a barrier right before its commit
    marker, so all of them computed the same epoch and create the marker together."""
    barrier = threading.Barrier(n, timeout=300)
    real = Checkpoints.commit

    def commit(self, manifest):
        if manifest.kind == "process":
            barrier.wait()
        return real(self, manifest)

    monkeypatch.setattr(Checkpoints, "commit", commit)
    outcome: list[str] = []

    def run() -> None:
        try:
            out = engine.process(ObjectStore(store.cfg), spec, spark, keep_epochs=keep)
            outcome.append(f"committed {out.committed}")
        except CommitConflict:
            outcome.append("conflict")
        except Exception as e:
            outcome.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    monkeypatch.setattr(Checkpoints, "commit", real)
    return sorted(outcome)


def test_concurrent_runs_and_a_real_zombie(
    store: ObjectStore, cli_env, spark_remote, fast_spark, tmp_path: Path, monkeypatch
) -> None:
    """Three epochs, each raced by 2-3 threads running the real engine.process on the shared
    Spark session (keep_epochs=1), while a real `wire process` that prepared epoch 1 is held
    right before its commit marker; it is released after epoch 2 committed (and garbage
    collection removed epoch 1's marker). Exactly one commit per epoch; losers and the zombie
    get CommitConflict and their staging is collected; the results equal the reference."""
    spec, yml = write_pipeline(tmp_path, "race")
    cp = Checkpoints(store, spec.name)
    batches = make_batches(3, 3)
    splits = [produce_batch(store, spec, tmp_path, batches[0], 0)]
    pause = tmp_path / "pause"
    pause.mkdir()
    env = subprocess_env(cli_env, spark_remote, WIRE_PAUSE="before-marker", WIRE_PAUSE_DIR=str(pause))
    zombie = subprocess.Popen(
        [wire_exe(), "process", "--pipeline", str(yml), "--max-epochs", "1"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        wait_for(lambda: (pause / "before-marker.paused").exists(), 600, zombie, "zombie prepared epoch 1")
        zombie_runs = staging_runs(store, spec)
        assert len(zombie_runs) == 1 and cp.epochs() == [1] and cp.committed() == []
        for k, n in enumerate((2, 3, 2)):
            if k:
                splits.append(produce_batch(store, spec, tmp_path, batches[k], k))
            outcome = _race(store, spec, fast_spark, n, monkeypatch, keep=1)
            assert outcome == [f"committed [{k + 1}]"] + ["conflict"] * (n - 1), outcome
            assert cp.committed() == [k + 1]
            m = cp.latest()
            assert m is not None
            named = {f.key.split("/")[3] for f in m.files()}
            assert staging_runs(store, spec) <= named | zombie_runs  # every loser's staging is collected
            if k == 1:
                (pause / "before-marker.go").touch()
                _, err = zombie.communicate(timeout=300)
                assert zombie.returncode == 1 and "CommitConflict" in err, err[-2000:]
                assert cp.committed() == [2] and cp.marker(1) is None
                assert not staging_runs(store, spec) & zombie_runs
                assert_committed_sound(store, spec)
    finally:
        if zombie.poll() is None:
            os.killpg(zombie.pid, signal.SIGKILL)
            zombie.wait(timeout=30)
    lines = sum(batch_lines(b) for b in batches)
    exp = expect(store, spec, splits, lines, sum(batch_malformed(b) for b in batches))
    assert_all(store, spec, exp)
