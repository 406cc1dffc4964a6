"""The commit protocol itself (DESIGN §3), without Spark: manifests built by hand over
staged files, on the real embedded S3 server.

    staging/<run>/...  ──prepare──▶  epochs/N/<run>.json  ──commit──▶  epochs/N/_COMMITTED
                                      (invisible)                        (readers follow it)
"""

from __future__ import annotations

import json
import time

import pytest

from commit_scenario import T0, hand_epoch, staging_runs, tumble_rows, write_pipeline
from wire_dagster import engine, results
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.errors import CommitConflict, CorruptManifest, ObjectNotFound
from wire_dagster.manifest import sha256
from wire_dagster.objectstore import ObjectStore

P0, P1, P2 = T0, T0 + 10_000, T0 + 20_000


@pytest.fixture
def spec(tmp_path):
    return write_pipeline(tmp_path, "cp")[0]


def test_prepared_manifests_never_change_what_readers_see(store: ObjectStore, spec) -> None:
    """An uncommitted manifest (prepare without commit) — for the next epoch or one further
    ahead — changes neither read_results, latest(), committed() nor the published output."""
    cp = Checkpoints(store, spec.name)
    assert results.read_results(store, spec, "tumble").num_rows == 0
    m1 = hand_epoch(cp, spec, 1, "run-a", {P0: [("k", P0, 1)]})
    cp.publish(m1)
    seen = (tumble_rows(store, spec), {i.key: i.etag for i in store.list(cp.root + "output/")})
    assert seen[0] == [("k", P0, 1)]
    hand_epoch(cp, spec, 2, "run-b", {P0: [("k", P0, 2)], P1: [("k", P1, 5)]}, carry=m1, commit=False)
    hand_epoch(cp, spec, 3, "run-c", {P2: [("x", P2, 9)]}, carry=m1, commit=False)
    assert cp.epochs() == [1, 2, 3] and cp.committed() == [1]
    assert cp.latest() == m1
    assert (tumble_rows(store, spec), {i.key: i.etag for i in store.list(cp.root + "output/")}) == seen
    # the rival's staged files exist, they are just not named by any committed manifest
    assert {"run-a", "run-b", "run-c"} <= staging_runs(store, spec)


def test_commit_marker_decides_one_winner(store: ObjectStore, spec) -> None:
    cp = Checkpoints(store, spec.name)
    m1 = hand_epoch(cp, spec, 1, "run-a", {P0: [("k", P0, 1)]})
    a = hand_epoch(cp, spec, 2, "run-win", {P0: [("k", P0, 2)]}, carry=m1)
    b = hand_epoch(cp, spec, 2, "run-lose", {P0: [("k", P0, 3)]}, carry=m1, commit=False)
    cp.commit(a)  # idempotent for the winner
    with pytest.raises(CommitConflict, match="run-win"):
        cp.commit(b)
    marker = cp.marker(2)
    assert marker is not None and marker.run_id == "run-win"
    assert cp.abort("run-win") == 0  # a committed run's staging is never collected
    assert cp.abort("run-lose") > 0
    assert "run-lose" not in staging_runs(store, spec)
    assert cp.verify(cp.load(2)) == []
    assert tumble_rows(store, spec) == [("k", P0, 2)]


def test_altered_manifest_is_refused(store: ObjectStore, spec) -> None:
    """The marker carries the manifest's sha256: a manifest changed after the commit is corrupt, not trusted."""
    cp = Checkpoints(store, spec.name)
    m = hand_epoch(cp, spec, 1, "run-a", {P0: [("k", P0, 1)]})
    key = cp.manifest_key(1, "run-a")
    body = json.loads(store.get(key))
    body["watermark"] += 1
    store.put(key, json.dumps(body).encode())
    with pytest.raises(CorruptManifest, match="checksum"):
        cp.latest()
    store.put(key, m.to_bytes())
    assert cp.latest() == m
    store.delete(key)
    with pytest.raises(ObjectNotFound):
        cp.load(1)


def test_publish_follows_the_latest_manifest_only(store: ObjectStore, spec) -> None:
    """Publishing an epoch that is no longer the latest does nothing; publishing the latest
    rewrites what differs and removes a partition it no longer names."""
    cp = Checkpoints(store, spec.name)
    m1 = hand_epoch(cp, spec, 1, "run-a", {P0: [("k", P0, 1)], P1: [("k", P1, 1)]})
    assert sorted(cp.publish(m1)) == sorted([cp.published_key("tumble", P0), cp.published_key("tumble", P1)])
    m2 = hand_epoch(cp, spec, 2, "run-b", {P0: [("k", P0, 2)]})  # P1 is not carried: it went away
    assert cp.publish(m1) == []
    assert sorted(cp.publish(m2)) == sorted([cp.published_key("tumble", P0), cp.published_key("tumble", P1)])
    got = {i.key: sha256(store.get(i.key)) for i in store.list(cp.root + "output/")}
    assert got == {cp.published_key("tumble", P0): m2.outputs["tumble"][str(P0)].sha256}
    assert cp.publish(m2) == []  # nothing differs any more


@pytest.mark.parametrize("with_md5", [True, False], ids=["copied-in-the-store", "read-and-written"])
def test_publish_refuses_a_staged_file_altered_after_the_commit(store: ObjectStore, spec, with_md5: bool) -> None:
    """A staged file is published by a copy inside the store conditioned on the MD5 it was staged
    with (or, for a manifest with no MD5, read and checked against its sha256): altered after the
    commit, it is refused as corrupt and its published copy is not written."""
    cp = Checkpoints(store, spec.name)
    m = hand_epoch(cp, spec, 1, "run-a", {P0: [("k", P0, 1)], P1: [("k", P1, 1)]})
    if not with_md5:  # a manifest written before FileRef had an MD5
        m = m.model_copy(
            update={
                "outputs": {"tumble": {p: r.model_copy(update={"md5": None}) for p, r in m.outputs["tumble"].items()}}
            }
        )
    ref = m.outputs["tumble"][str(P1)]
    good = store.get(ref.key)
    store.put(ref.key, good + b"tampered")
    with pytest.raises(CorruptManifest, match=f"{ref.key} no longer matches"):
        cp._publish(m, None)
    assert not store.exists(cp.published_key("tumble", P1))
    store.put(ref.key, good)
    assert cp.published_key("tumble", P1) in cp._publish(m, None)
    for p in (P0, P1):
        assert sha256(store.get(cp.published_key("tumble", p))) == m.outputs["tumble"][str(p)].sha256


def test_partial_publish_removes_a_partition_left_empty(store: ObjectStore, spec) -> None:
    """Publishing only the partitions an epoch changed (what `process` and backfills do) also
    removes the published copy of a changed partition the new manifest no longer names (a
    retraction emptied it), and leaves every partition it was not asked about alone."""
    cp = Checkpoints(store, spec.name)
    m1 = hand_epoch(cp, spec, 1, "run-a", {P0: [("k", P0, 1)], P1: [("k", P1, 1)], P2: [("k", P2, 1)]})
    cp.publish(m1)
    m2 = hand_epoch(cp, spec, 2, "run-b", {P0: [("k", P0, 2)]})  # P1 and P2 went away; only P0, P1 reported changed
    wrote = cp.publish(m2, {"tumble": [P0, P1]})
    assert sorted(wrote) == sorted([cp.published_key("tumble", P0), cp.published_key("tumble", P1)])
    got = {i.key for i in store.list(cp.root + "output/")}
    assert got == {cp.published_key("tumble", P0), cp.published_key("tumble", P2)}  # P2: not asked about
    assert sorted(cp.publish(m2)) == [cp.published_key("tumble", P2)]  # a full publish converges


def test_gc_keeps_last_k_and_every_file_they_name(store: ObjectStore, spec) -> None:
    """Six epochs, each adding a partition and carrying the older ones (so epoch 6 still names
    epoch 1's file); a loser's manifest in epoch 3; an orphan run that never committed; an
    attempt at epoch 7 still preparing. gc(keep=2, grace 0):

        epochs   1 2 3 4 | 5 6 | 7(preparing)
                 deleted | kept| kept
        staging  files named by 5 or 6 kept; other files of committed runs and the orphan deleted
    """
    cp = Checkpoints(store, spec.name)
    m = None
    for n in range(1, 7):
        if n == 3:
            hand_epoch(cp, spec, 3, "run-3-loser", {P0: [("z", P0, 1)]}, carry=m, commit=False)
        m = hand_epoch(cp, spec, n, f"run-{n}", {T0 + n * 10_000: [("k", T0 + n * 10_000, n)]}, carry=m)
    hand_epoch(cp, spec, 99, "run-orphan", {P0: [("z", P0, 1)]}, commit=False)
    store.delete(cp.manifest_key(99, "run-orphan"))  # only its staging is left
    preparing = hand_epoch(cp, spec, 7, "run-7", {P2: [("k", P2, 7)]}, carry=m, commit=False)
    kept_before = [cp.load(5), cp.load(6)]
    named = {f.key for k in kept_before for f in k.files()}
    assert any(f.epoch == 1 for f in kept_before[1].files())  # a file written by epoch 1 is still named

    committed_runs = {f"run-{n}" for n in range(1, 7)}

    def committed_staging() -> set[str]:
        return {i.key for i in store.list(cp.root + "staging/") if i.key.split("/")[3] in committed_runs}

    assert committed_staging() - named  # committed runs' files no kept epoch names: gc's to delete
    # young uncommitted staging survives a gc with the default grace; committed runs' unnamed files
    # go whatever their age (epoch 3's winner known from its marker, the others' from their one manifest)
    res = cp.gc(keep=2)
    assert {"run-orphan", "run-3-loser", "run-7"} <= staging_runs(store, spec)
    assert committed_staging() <= named
    assert res["epochs"] == 4 and cp.committed() == [5, 6]

    time.sleep(0.01)
    res = cp.gc(keep=2, grace_s=0, current_run="run-7")  # run-7 is the caller's own attempt in progress
    assert cp.committed() == [5, 6]
    assert set(cp.epochs()) == {5, 6, 7}  # 7: an attempt above the latest is never collected
    for k in (cp.load(5), cp.load(6)):
        assert cp.verify(k) == []
    left = {i.key for i in store.list(cp.root + "staging/")}
    assert named <= left
    assert staging_runs(store, spec) == {f.key.split("/")[3] for f in (cp.load(5).files() + cp.load(6).files())} | {
        "run-7"
    }
    assert "run-orphan" not in staging_runs(store, spec) and "run-3-loser" not in staging_runs(store, spec)
    # the preparing attempt can still commit, and readers then follow it
    cp.commit(preparing)
    latest = cp.latest()
    assert latest is not None and cp.verify(latest) == []
    rows = tumble_rows(store, spec)
    assert ("k", P2, 7) in rows and ("k", P2, 2) not in rows  # epoch 7 replaced partition P2 (epoch 2's)
    assert len(rows) == 6


def test_gc_killed_half_way_leaves_no_marker_without_its_manifest(store: ObjectStore, cli_env, tmp_path) -> None:
    """`wire gc` killed between deleting the old epochs' markers and their manifests (WIRE_FAULT=
    during-gc:2; each is one batch): every remaining marker still names a loadable manifest (the
    markers go first), readers are unaffected, and the next gc finishes the job."""
    from commit_scenario import assert_committed_sound, wire, write_pipeline

    spec, yml = write_pipeline(tmp_path, "cp")
    cp = Checkpoints(store, spec.name)
    m = None
    for n in range(1, 4):
        m = hand_epoch(cp, spec, n, f"run-{n}", {T0 + n * 10_000: [("k", T0 + n * 10_000, n)]}, carry=m)
    seen = tumble_rows(store, spec)
    wire(["gc", "--pipeline", yml, "--keep", "1"], dict(cli_env, WIRE_FAULT="during-gc:2"), expect_rc=86)
    assert cp.committed() == [3] and cp.epochs() == [1, 2, 3]  # epochs 1, 2: markers deleted, manifests not yet
    assert_committed_sound(store, spec)
    assert tumble_rows(store, spec) == seen
    wire(["gc", "--pipeline", yml, "--keep", "1"], cli_env)
    assert cp.committed() == [3] and cp.epochs() == [3]
    assert_committed_sound(store, spec)
    assert tumble_rows(store, spec) == seen


def test_a_run_with_nothing_pending_never_starts_spark(store: ObjectStore, spec) -> None:
    """What a Dagster run does when every epoch is committed already: it reports its partition
    from the manifest, and the Spark session (lazy, as the asset passes it) is never started."""
    from wire_dagster.runs import run_partition
    from wire_dagster.sparksession import LazySession

    cp = Checkpoints(store, spec.name)
    m1 = hand_epoch(cp, spec, 1, "run-a", {P0: [("k", P0, 1)]})

    def no_spark():
        raise AssertionError("a run with nothing pending started Spark")

    lazy = LazySession(no_spark)
    report, m = run_partition(store, spec, lazy, P0)
    assert not lazy.started
    assert m == m1 and report["epoch"] == 1
    with pytest.raises(AssertionError, match="nothing pending started Spark"):
        lazy.createDataFrame  # noqa: B018 - first use starts it


def test_watermark_chart_is_redrawn_only_when_the_committed_epochs_change(store: ObjectStore, spec, tmp_path) -> None:
    """The runs of one backlog report the same committed epochs: with `reuse` the chart drawn for
    them is returned as it is; a new commit (or another bucket) draws it again."""
    from wire_dagster.status import plot_watermarks

    cp = Checkpoints(store, spec.name)
    m1 = hand_epoch(cp, spec, 1, "run-a", {P0: [("k", P0, 1)]})
    path = tmp_path / "charts" / "lag.png"
    first = plot_watermarks(store, spec, path, reuse=True).read_bytes()
    assert first.startswith(b"\x89PNG")
    path.write_bytes(first + b"marker")  # what reuse returns is the file as it is
    assert plot_watermarks(store, spec, path, reuse=True).read_bytes() == first + b"marker"
    assert plot_watermarks(store, spec, path).read_bytes() == first  # without reuse: drawn
    hand_epoch(cp, spec, 2, "run-b", {P0: [("k", P0, 2)]}, carry=m1)
    assert plot_watermarks(store, spec, path, reuse=True).read_bytes() != first
    assert not list(path.parent.glob(".*.tmp"))


def test_charts_drawn_side_by_side_equal_one_drawn_alone_without_pyplot(
    store: ObjectStore, spec, tmp_path, monkeypatch
) -> None:
    """The chart is a Figure of its own, never pyplot's (whose global figures and backend are the
    user's process's, and not for threads): with pyplot's import made to fail it is drawn, and
    eight drawn on four threads at once are byte for byte the one drawn alone."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from wire_dagster.status import plot_watermarks

    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # `import matplotlib.pyplot` fails
    hand_epoch(Checkpoints(store, spec.name), spec, 1, "run-a", {P0: [("k", P0, 1)], P1: [("k", P1, 2)]})
    alone = plot_watermarks(store, spec, tmp_path / "alone.png").read_bytes()
    with ThreadPoolExecutor(max_workers=4) as pool:
        drawn = list(pool.map(lambda i: plot_watermarks(store, spec, tmp_path / f"t{i}.png").read_bytes(), range(8)))
    assert alone.startswith(b"\x89PNG") and all(d == alone for d in drawn)


def test_published_copies_are_checked_from_one_listing(store: ObjectStore, spec, monkeypatch) -> None:
    """A run checks every published copy against the committed manifest; an unchanged copy is
    recognised by its ETag (the MD5 the manifest recorded) without reading it back."""
    cp = Checkpoints(store, spec.name)
    m1 = hand_epoch(cp, spec, 1, "run-a", {P0: [("k", P0, 1)], P1: [("k", P1, 2)]})
    assert len(cp.publish(m1)) == 2
    read = []
    real_get, real_head = store.get, store.head
    monkeypatch.setattr(store, "get", lambda key: read.append(key) or real_get(key))
    monkeypatch.setattr(store, "head", lambda key: read.append(key) or real_head(key))
    assert cp.publish(m1) == []
    assert not [k for k in read if "/output/" in k], read


def test_apply_changes_is_upsert_then_delete_then_sort() -> None:
    """A partition's new content (engine.apply_changes) against a plain dictionary: old rows by
    window identity, updates replace them, retractions remove them; sorted by (key, start, end)
    with null keys last. Random tables with null keys, empty sides and retractions."""
    import random

    import pyarrow as pa

    schema = pa.schema(
        [
            ("key", pa.string()),
            ("window_start", pa.int64()),
            ("window_end", pa.int64()),
            ("n", pa.int64()),
            ("x", pa.float64()),
        ]
    )
    idents = [(k, s * 10, s * 10 + 10) for k in (None, "a", "b", "é", "B", "") for s in range(6)]

    def rows(r: random.Random, n: int) -> list[tuple]:
        return [(*i, r.randrange(5), r.choice([None, 1.5, -2.0])) for i in r.sample(idents, n)]

    for seed in range(200):
        r = random.Random(seed)
        old_rows, ch_rows = (None if r.random() < 0.2 else rows(r, r.randrange(20))), rows(r, r.randrange(20))
        retract = [r.random() < 0.3 for _ in ch_rows]
        old = (
            None
            if old_rows is None
            else pa.Table.from_pylist([dict(zip(schema.names, x, strict=True)) for x in old_rows], schema=schema)
        )
        changes = pa.Table.from_pylist([dict(zip(schema.names, x, strict=True)) for x in ch_rows], schema=schema)
        changes = changes.append_column("retract", pa.array(retract, pa.bool_()))
        want = {x[:3]: x for x in old_rows or []}
        for x, gone in zip(ch_rows, retract, strict=True):
            want.pop(x[:3], None)
            if not gone:
                want[x[:3]] = x
        expected = sorted(
            want.values(), key=lambda x: (x[0] is None, x[0].encode() if x[0] is not None else b"", x[1], x[2])
        )
        got = engine.apply_changes(old, changes)
        assert got.schema == schema
        assert [tuple(d.values()) for d in got.to_pylist()] == expected, seed
