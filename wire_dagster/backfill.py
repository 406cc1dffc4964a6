"""Backfills: recompute partitions from the recorded remap (DESIGN §2 Determinism).

A backfill replays the pipeline's committed timeline — the same chunks in the
same epochs with the same recorded watermarks — through the Spark kernel with
the current code, and rebuilds the content of the requested partitions. If it
equals what is committed (same code, same input) nothing new is committed and
the data version stays; if it differs (the code or configuration changed), the
new content is committed as a new epoch through the two-phase protocol.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from . import engine
from .checkpoint import Checkpoints, new_run_id
from .errors import CommitConflict, ObjectNotFound, WireInputError
from .manifest import Counts, Manifest, Step, sha256
from .objectstore import ObjectStore
from .parquetio import parquet_bytes
from .partitions import between as partitions_between
from .partitions import starts as partition_starts
from .reclock import job_length
from .sparksession import started_session
from .spec import Pipeline
from .streams import read_inputs, views_from
from .timeutil import NEG_INF, iso, now_ms


def timeline(cp: Checkpoints, latest: Manifest) -> list[Step]:
    """The processing epochs that led to `latest`, oldest first (see `Checkpoints.timeline`)."""
    try:
        return cp.timeline(latest.epoch)
    except ObjectNotFound as e:
        raise WireInputError(
            f"cannot recompute {cp.pipeline}: a manifest of its timeline is gone ({e}); "
            "it was deleted without the compacted timeline garbage collection saves"
        ) from None


def recompute(
    store: ObjectStore, spec: Pipeline, spark, partitions: list[int], progress=None
) -> dict[str, dict[int, pa.Table | None]]:
    """The content of `partitions` for every window, rebuilt by replaying the timeline through the
    engine's own epoch computation (`engine.compute`, its epochs grouped into Spark jobs by
    `reclock.job_length` as a backlog's are): the recorded epochs' chunks and watermarks, the
    window state and id memory carried from each epoch to the next in memory."""
    cp = Checkpoints(store, spec.name)
    latest = cp.latest()
    contents: dict[str, dict[int, pa.Table | None]] = {w.name: {p: None for p in partitions} for w in spec.windows}
    if latest is None:
        return contents
    steps = timeline(cp, latest)
    epochs, offsets, w_prev = [], {}, NEG_INF
    listed = read_inputs(store, spec, {})  # one listing; each epoch sees it from its offsets
    for st in steps:  # each recorded epoch: the chunks between its predecessor's offsets and its own
        views = views_from(listed, offsets)
        chunks = [c for s in sorted(views) for c in views[s].chunks if c.seq < st.remap.get(s, 0)]
        epochs.append((chunks, w_prev, st.watermark))
        offsets, w_prev = st.remap, st.watermark
    state: dict[str, pa.Table | None] = {w.name: None for w in spec.windows}
    ids: pa.Table | None = None
    wanted = pa.array(sorted(set(partitions)), pa.int64())
    spark = started_session(spark) if epochs else spark
    done = 0
    if progress:
        progress(0, len(steps))
    while done < len(epochs):
        carried = sum(t.num_rows for t in state.values() if t is not None) + (ids.num_rows if ids is not None else 0)
        job = epochs[done : done + job_length([c for c, _, _ in epochs[done:]], carried)]
        for res in engine.compute(store, spec, spark, dict(state), ids, carried, job, steps[done].epoch):
            for w in spec.windows:
                rows = res.windows[w.name].outputs
                if rows.num_rows:
                    ps = partition_starts(spec, rows["window_end"])
                    mine = pc.is_in(ps, value_set=wanted)  # pyright: ignore[reportAttributeAccessIssue]  generated at import
                    rows, ps = rows.filter(mine), ps.filter(mine)
                    for p in ps.unique().to_pylist():  # only the partitions this epoch touched
                        sel = rows.filter(pc.equal(ps, p))  # pyright: ignore[reportAttributeAccessIssue]  generated at import
                        contents[w.name][p] = engine.apply_changes(contents[w.name][p], sel)
                state[w.name] = res.windows[w.name].state
            ids = res.ids
            done += 1
            if progress:
                progress(done, len(steps))
    return contents


def committed_partitions(m: Manifest | None) -> list[int]:
    """Partitions holding committed results in any window of manifest `m`, in order."""
    return sorted({int(p) for parts in (m.outputs.values() if m else []) for p in parts})


def select_partitions(store: ObjectStore, spec: Pipeline, lo: int | None = None, hi: int | None = None) -> list[int]:
    """What `wire backfill` recomputes: every partition from the first to the last partition with
    committed results that overlaps the event-time range [lo, hi) (None: unbounded), gaps included
    (a Dagster partition range is contiguous). Raises WireInputError when none qualifies."""
    if lo is not None and hi is not None and lo > hi:
        raise WireInputError(f"--from {iso(lo)} is after --to {iso(hi)}")
    m = Checkpoints(store, spec.name).latest()
    held = committed_partitions(m)
    if lo is not None:
        held = [p for p in held if p + spec.partition > lo]
    if hi is not None:
        held = [p for p in held if p < hi]
    if not held:
        if m is None:
            raise WireInputError(
                f"backfill {spec.name}: nothing is committed yet; run `wire tick --pipeline {spec.name}` first"
            )
        span = f"[{iso(lo) if lo is not None else '-inf'}, {iso(hi) if hi is not None else '+inf'})"
        raise WireInputError(f"backfill {spec.name}: no partition with committed results in {span}")
    return partitions_between(spec, held[0], held[-1])


def backfill(store: ObjectStore, spec: Pipeline, spark, partitions: list[int], progress=None) -> Manifest | None:
    """Recompute partitions; commit them as a new epoch only where the content changed.

    Returns the new epoch's manifest, or None when the recomputation reproduced
    the committed content exactly.
    """
    cp = Checkpoints(store, spec.name)
    for _attempt in range(3):
        latest = cp.latest()
        if latest is None:
            return None
        if spec.computations:  # user computations (over any input): their timeline replayed
            from .computestage import recompute as recompute_computations

            contents = recompute_computations(store, spec, spark, partitions, progress)
        elif spec.derived:  # a stage over derived streams: from the upstream content it read
            from .derived import recompute as recompute_derived

            contents = recompute_derived(store, spec, spark, partitions)
        else:
            contents = recompute(store, spec, spark, partitions, progress)
        run_id = new_run_id()
        outputs = {w: dict(p) for w, p in latest.outputs.items()}
        changed: dict[str, list[int]] = {}
        for w, parts in contents.items():
            for p, table in parts.items():
                old = outputs.get(w, {}).get(str(p))
                if table is None or table.num_rows == 0:
                    if old is not None:
                        outputs[w].pop(str(p))
                        changed.setdefault(w, []).append(p)
                    continue
                data = parquet_bytes(table)
                if old is not None and old.sha256 == sha256(data):
                    continue
                ref = cp.stage(run_id, f"out/{w}/{p}.parquet", data, table.num_rows, latest.epoch + 1)
                outputs.setdefault(w, {})[str(p)] = ref
                changed.setdefault(w, []).append(p)
        if not changed:
            return None
        m = latest.model_copy(
            update={
                "epoch": latest.epoch + 1,
                "previous": latest.epoch,
                "run_id": run_id,
                "kind": "backfill",
                "rewound_to": None,
                "fingerprint": spec.fingerprint(),
                "config": spec.model_dump(mode="json", exclude={"source"}),
                "prev_watermark": latest.watermark,
                "chunks": {},
                "outputs": outputs,
                "changed": changed,
                "counts": Counts(),
                "created_ms": now_ms(),
            }
        )
        cp.prepare(m)
        try:
            cp.commit(m)
        except CommitConflict:
            cp.abort(run_id)
            continue
        cp.publish(m, changed)  # also removes the published copy of a partition left empty
        return m
    raise CommitConflict(f"backfill of {spec.name}: lost the commit race three times; retry")
