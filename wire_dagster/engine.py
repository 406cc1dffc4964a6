"""Running a pipeline: one epoch = read → watermark → Spark kernel → stage → prepare → commit → publish.

Data flows one way (DESIGN §5): stream chunks → reader (offsets, watermark) →
Spark kernel (windows, lateness, state) → staging → manifest → commit marker →
committed results → readers (results.py). Each function here is what a Dagster asset, the
CLI and the tests call; none of them imports Dagster.

A backlog's epochs are planned from chunk metadata (`reclock.plan_job`) and, as far as
they fit one task together, computed by one Spark job (`kernel.run_epochs`);
each is then staged, prepared and committed on its own, in order, while the
next job computes.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import partitions, reclock, settings
from .checkpoint import Checkpoints, new_run_id, staged
from .content import apply_changes
from .errors import ObjectStoreError, WireError
from .faults import fault, pause
from .kernel import EpochResult, Stored, epoch_chunks, run_epoch, run_epochs
from .manifest import Counts, FileRef, Manifest
from .objectstore import ObjectStore
from .outcome import Outcome
from .parquetio import parquet_bytes
from .results import read_file
from .sparksession import started_session
from .spec import Pipeline
from .streams import ChunkMeta, check_stream, read_inputs
from .timeutil import NEG_INF, now_ms

ROW_ID = ["key", "window_start", "window_end"]


def _stored(store: ObjectStore, ref: FileRef | None) -> Stored | None:
    """A staged file for the executors to read (None when absent or empty)."""
    return Stored(store.fs_options(), store.bucket, ref.key) if ref is not None and ref.rows else None


def _min_start(store: ObjectStore, ref: FileRef | None) -> int | None:
    """The earliest window start of a state file: its `start` column only, on the driver."""
    if ref is None or not ref.rows:
        return None
    starts = pq.read_table(io.BytesIO(store.get(ref.key)), columns=["start"])["start"]
    return pc.min(starts).as_py()  # pyright: ignore[reportAttributeAccessIssue]  generated at import


def process(
    store: ObjectStore,
    spec: Pipeline,
    spark=None,
    *,
    max_epochs: int = 1,
    run_id: str | None = None,
    now: int | None = None,
    keep_epochs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Outcome:
    """Commit up to `max_epochs` new epochs of the pipeline (none if nothing changed).

    Restart-safe: it starts from the last committed epoch, repairs published output
    that differs from it, and ignores every uncommitted attempt. Once the epochs are
    committed, the partitions they changed are published and garbage collection keeps
    the last `keep_epochs` committed epochs (default: `settings.keep_epochs`) — once
    per call, not per epoch: a backlog's intermediate outputs are never published (if
    the call fails half-way, the next one's self-correction publishes what is committed).
    """
    if spec.computations:  # user code per key (MillWheel computations)
        from .computestage import process as process_computations

        kw = {"max_epochs": max_epochs, "run_id": run_id, "now": now, "keep_epochs": keep_epochs}
        return process_computations(store, spec, spark, progress=progress, **kw)
    if spec.derived:  # a stage over other pipelines' windows: recomputed, not streamed
        from .derived import process as process_derived

        return process_derived(
            store, spec, spark, max_epochs=max_epochs, run_id=run_id, now=now, keep_epochs=keep_epochs
        )
    keep_epochs = settings.keep_epochs(spec, keep_epochs)
    check_stream(store, spec)
    cp = Checkpoints(store, spec.name)
    out = Outcome.resume(cp)
    prev = out.manifest
    # A job's epochs are committed while the next job computes: it is planned from the last epoch
    # the first computed (the stream listed again), whose state and id memory are staged first for
    # its executors to read. The commits' round trips to the store and merges overlap the Spark task;
    # one job runs at a time, and the epochs commit in order, each with the manifest it has alone.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wire-next-job") as ahead:
        batch = reclock.plan_job(
            store, spec, reclock.from_manifest(prev), _Carry.of(prev).rows, now, max_epochs, progress
        )
        if batch:  # the session is created here, in the caller's thread (see `started_session`)
            spark = started_session(spark)
        pending = ahead.submit(_compute, store, spec, spark, _Carry.of(prev), batch) if batch else None
        while pending is not None:
            results = pending.result()
            done, pending = batch[: len(results)], None
            ids = []
            for _ in done:  # the call's first epoch keeps the given run id
                ids.append(run_id or new_run_id())
                run_id = None
            left = max_epochs - len(out.committed) - len(done)
            carry: _Carry | None = None
            nxt = (
                reclock.plan_job(store, spec, done[-1].after(), _result_rows(results[-1]), now, left, progress)
                if left > 0
                else []
            )
            if nxt:
                carry = _stage_carry(cp, ids[-1], done[-1].epoch, results[-1])
                pending = ahead.submit(_compute, store, spec, spark, carry, nxt)
            try:
                for i, (plan, res) in enumerate(zip(done, results, strict=True)):
                    m = _commit_epoch(store, cp, spec, prev, ids[i], plan, res, carry if i == len(done) - 1 else None)
                    out.took(m)
                    prev = m
            except BaseException:
                if pending is not None:  # the next job's epochs are never committed: its Spark job ends first
                    pending.exception()
                raise
            batch = nxt
    out.publish(cp, keep_epochs)
    offsets = prev.remap if prev else {}
    out.pending = sum(len(v.chunks) for v in read_inputs(store, spec, offsets).values())
    return out


def _result_rows(res: EpochResult) -> int:
    """The rows of window state and id memory a computed epoch leaves (`_Carry.rows` once staged)."""
    return sum(r.state.num_rows for r in res.windows.values()) + (res.ids.num_rows if res.ids is not None else 0)


@dataclass(frozen=True)
class _Carry:
    """An epoch's window state and id memory as staged files: what its manifest names, and what
    the next Spark job's executors read (they can hold millions of open windows)."""

    state: dict[str, FileRef]
    ids: FileRef | None

    @classmethod
    def of(cls, prev: Manifest | None) -> _Carry:
        return cls(dict(prev.state), prev.ids) if prev else cls({}, None)

    @property
    def rows(self) -> int:
        """Rows the next epoch carries in: every window's state and the id memory."""
        return sum(r.rows for r in self.state.values()) + (self.ids.rows if self.ids else 0)


def _stage_carry(cp: Checkpoints, run_id: str, epoch: int, res: EpochResult) -> _Carry:
    """Stage a computed epoch's window state and id memory (state side by side)."""

    def stage_state(name: str) -> FileRef:
        t = res.windows[name].state
        return cp.stage(run_id, f"state/{name}.parquet", parquet_bytes(t), t.num_rows, epoch)

    st_refs = {}
    with staged(stage_state, list(res.windows)) as refs:
        for name, ref in zip(res.windows, refs, strict=True):
            st_refs[name] = ref
            fault("during-state-snapshot")
    ids_ref = (
        cp.stage(run_id, "ids.parquet", parquet_bytes(res.ids, distinct=("id",)), res.ids.num_rows, epoch)
        if res.ids is not None
        else None
    )
    return _Carry(st_refs, ids_ref)


def _store_down(store: ObjectStore, epoch: int) -> ObjectStoreError | None:
    """After a Spark failure: the typed error if the object store is what failed, else None."""
    try:
        store.ping()
    except ObjectStoreError as down:
        return ObjectStoreError(
            f"epoch {epoch}: Spark could not read the stream because the object store at "
            f"{store.cfg.endpoint} is unreachable ({down}); nothing was committed, run again once it is back"
        )
    return None


def _compute(store, spec: Pipeline, spark, carry: _Carry, batch: list[reclock.Planned]) -> list[EpochResult]:
    """`compute` of a planned job, from `carry` (staged files the executors read)."""
    state = {w.name: _stored(store, carry.state.get(w.name)) for w in spec.windows}
    epochs = [(p.chunks, p.w_prev, p.clock.watermark) for p in batch]
    return compute(store, spec, spark, state, _stored(store, carry.ids), carry.rows, epochs, batch[0].epoch)


def compute(
    store: ObjectStore,
    spec: Pipeline,
    spark,
    state: dict[str, pa.Table | Stored | None],
    ids: pa.Table | Stored | None,
    carried_rows: int,
    epochs: list[tuple[list[ChunkMeta], int, int]],
    first_epoch: int,
) -> list[EpochResult]:
    """One Spark job over consecutive epochs, each (its chunks, W before, W after), from the carried
    window state and id memory (`carried_rows` rows; Arrow tables, or staged files the executors
    read): one task for all of them when they fit one worker (`reclock.job_length` chose them),
    else the key-bucket plan of the one epoch. Returns the results of a prefix of `epochs` (at least
    the first: `kernel.run_epochs` stops at its result bound). `spark` is a started session. The
    engine's epochs and a backfill's replay of the timeline both compute through here."""
    events = [epoch_chunks(store.fs_options(), store.bucket, spec, chunks) for chunks, _, _ in epochs]
    pause("before-spark")
    try:
        if len(epochs) == 1 and not reclock.one_task(epochs[0][0], carried_rows):
            _, w_prev, w_new = epochs[0]
            return [run_epoch(spark, spec, events[0], state, ids, w_prev, w_new, store=store)]
        inputs = [(ev, w_prev, w_new) for ev, (_, w_prev, w_new) in zip(events, epochs, strict=True)]
        return run_epochs(spark, spec, inputs, state, ids, store)
    except WireError:
        raise
    except Exception:  # Spark wraps executor I/O errors in its own exceptions
        down = _store_down(store, first_epoch)
        if down is not None:
            raise down from None
        raise


def _commit_epoch(
    store,
    cp: Checkpoints,
    spec: Pipeline,
    prev: Manifest | None,
    run_id: str,
    plan: reclock.Planned,
    res: EpochResult,
    carry: _Carry | None = None,
) -> Manifest:
    """Stage a computed epoch's outputs, state and dead letters (state and id memory unless
    `carry` staged them already, under `run_id`), then prepare and commit its manifest."""
    epoch, chunks, clock, w_prev = plan.epoch, plan.chunks, plan.clock, plan.w_prev
    replay = list(prev.replay) if prev else []
    fault("before-staging")
    outputs: dict[str, dict[str, FileRef]] = {w: dict(p) for w, p in (prev.outputs.items() if prev else [])}
    changed: dict[str, list[int]] = {w.name: [] for w in spec.windows}
    touched = []  # (window, partition, its rows of the epoch)
    for w in spec.windows:
        r = res.windows[w.name]
        outputs.setdefault(w.name, {})
        if r.outputs.num_rows:
            pstart = partitions.starts(spec, r.outputs["window_end"])
            for p in sorted(pstart.unique().to_pylist()):
                touched.append((w.name, p, r.outputs.filter(pc.equal(pstart, p))))  # pyright: ignore[reportAttributeAccessIssue]  generated at import

    def stage_partition(job) -> tuple[str, int, FileRef | None, FileRef]:
        """A touched partition's new content (its committed file merged with the epoch's rows), staged."""
        name, p, rows = job
        prior = outputs[name].get(str(p))
        new = apply_changes(read_file(store, prior), rows)
        return name, p, prior, cp.stage(run_id, f"out/{name}/{p}.parquet", parquet_bytes(new), new.num_rows, epoch)

    # Partitions (and state files) are staged side by side: reads, merges, Parquet encoding and
    # uploads release the GIL. Results are taken in order, so the manifest is the same.
    with staged(stage_partition, touched) as done:
        for i, (name, p, prior, ref) in enumerate(done):
            if i == 0:
                fault("mid-staging")
            if prior is None or prior.sha256 != ref.sha256:
                changed[name].append(p)
            outputs[name][str(p)] = ref
        # partitions that became ready in this epoch are "changed" too, even if empty
        # lo_t only bounds a first finite watermark: read the state's starts only then.
        state_starts = (
            [_min_start(store, prev.state.get(w.name)) for w in spec.windows] if prev and w_prev <= NEG_INF else []
        )
        lo_t = min(
            [c.min_t for c in chunks if c.min_t is not None] + [t for t in state_starts if t is not None], default=None
        )
        became_ready = partitions.became_ready(spec, w_prev, clock.watermark, clock.max_t, lo_t)
        for w in spec.windows:
            changed[w.name] = sorted(set(changed[w.name]) | set(became_ready))
        fault("after-staging")
    carry = carry or _stage_carry(cp, run_id, epoch, res)
    st_refs, ids_ref = carry.state, carry.ids
    dls = cp.stage_dead_letters(run_id, epoch, res.dead_letters, list(prev.dead_letters) if prev else [])
    # produce's `malformed:` and the kernel's `error:` letters
    malformed = sum(c.malformed for c in chunks) + res.errors
    counts = Counts(
        events_in=res.events + malformed + res.filtered,
        malformed=malformed,
        duplicate=res.duplicate,
        filtered=res.filtered,
        counted={w: r.counted for w, r in res.windows.items()},
        late={w: r.late for w, r in res.windows.items()},
        other={w: r.other for w, r in res.windows.items() if r.other},
    )
    manifest = Manifest(
        pipeline=spec.name,
        epoch=epoch,
        previous=prev.epoch if prev else None,
        run_id=run_id,
        kind="process",
        fingerprint=spec.fingerprint(),
        config=spec.model_dump(mode="json", exclude={"source"}),
        **plan.manifest_fields(),
        outputs=outputs,
        changed={w: ps for w, ps in changed.items() if ps},
        state=st_refs,
        ids=ids_ref,
        dead_letters=dls,
        counts=counts,
        totals=(prev.totals if prev else Counts()).add(counts),
        replay=replay[1:],
        created_ms=now_ms(),
    )
    return cp.prepare_and_commit(manifest)
