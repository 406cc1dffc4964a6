"""Derived streams (DESIGN §6): a stage whose input is another pipeline's committed window.

A derived stream's records are the upstream window's result rows (`key`, `window_start`,
`window_end`, its aggregates) with event time `window_time` = window_end - 1 (Flink's); its
watermark is the upstream's committed W. A late firing upstream replaces a row, so the stage
must see the old row retracted and the new one inserted — for every aggregate, min, max and the
value aggregates included, which cannot subtract. This stage therefore keeps no window state:
each epoch it *recomputes* the windows that fire and the fired windows that an upstream change
touches, from the upstream's committed content (its partitions, as the upstream's manifest at
the synced epoch names them), with the window kernel's own aggregation (`bucket_epoch` over
those records, from empty state, every window firing), and replaces their rows. So a composed
result always equals the composition of the final upstream results, after any retry, restart,
rewind or late firing.

An epoch syncs every input to its upstream's latest committed epoch (a replay: to the recorded
one): its remap is `{input: upstream epoch}`, its manifest remembers the sha256 of every upstream
partition read (`Manifest.upstream`), so the next epoch knows which partitions changed. W is
the minimum over the inputs' committed watermarks. The recomputation runs in one Spark task that
reads the upstream's files itself (nothing is collected on the driver but the stage's results),
then commits through the same two-phase protocol as every epoch (checkpoint.py).

An upstream row the stage's checks refuse is a dead letter (`malformed: ...`), kept per upstream
partition (`Manifest.upstream_letters`) and found, as the partition's records are counted, by the
epoch that reads its content first (`Planned.fresh`): never twice, however often it is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from . import partitions, settings
from .checkpoint import Checkpoints, new_run_id, staged
from .content import apply_changes
from .errors import ObjectNotFound, WireInputError
from .faults import fault
from .handover import Handover, unpacked
from .manifest import Counts, FileRef, Manifest
from .objectstore import ObjectStore
from .outcome import Outcome
from .parquetio import parquet_bytes
from .recordtypes import (
    FieldTypes,
    empty_of,
    merge_numbers,
    numbers_table,
    numeric_fields,
    record_fields,
    typed_as_one,
)
from .results import output_schema, read_file
from .spec import WINDOW_TIME, Input, Pipeline, WindowSpec, find_pipeline, pipelines_dir
from .timeutil import INF, NEG_INF, now_ms

#: Records of a derived stream are checked as a pipeline's records are (ingest.py); their time is
#: a committed window's, so no ingestion time bounds it: this one is beyond every window end.
_FAR = INF // 2


@dataclass(frozen=True)
class Upstream:
    """A derived input and the pipeline and window it reads."""

    input: Input
    spec: Pipeline
    window: WindowSpec


def upstreams(spec: Pipeline, directory: Path | None = None) -> list[Upstream]:
    """The pipelines a pipeline's derived inputs read, from its own file's directory (else
    WIRE_PIPELINES); a missing pipeline or window, or a cycle, is one line naming it."""
    where = directory or (Path(spec.source).parent if spec.source else pipelines_dir())
    out = []
    for inp in spec.derived:
        assert inp.pipeline is not None and inp.output is not None
        try:
            up = find_pipeline(inp.pipeline, where)
        except WireInputError:
            raise WireInputError(
                f"inputs.{inp.name}.pipeline: no pipeline named {inp.pipeline!r} in {str(where)!r}"
            ) from None
        window = next((w for w in up.windows if w.name == inp.output), None)
        if window is None:
            raise WireInputError(
                f"inputs.{inp.name}.output: pipeline {inp.pipeline!r} has no window {inp.output!r}; choose one of: "
                + ", ".join(w.name for w in up.windows)
            )
        if cycle := find_cycle(spec, _lookup_in(where)):
            raise WireInputError(
                f"inputs: pipelines {spec.name!r}'s inputs form a cycle: {cycle}; a dataflow is acyclic"
            )
        out.append(Upstream(inp, up, window))
    return out


def _lookup_in(where: Path) -> Callable[[str], Pipeline | None]:
    def lookup(name: str) -> Pipeline | None:
        try:
            return find_pipeline(name, where)
        except WireInputError:
            return None  # a missing pipeline is reported where it is read, not as a cycle

    return lookup


def find_cycle(spec: Pipeline, lookup: Callable[[str], Pipeline | None]) -> str | None:
    """The first cycle through the derived inputs reachable from `spec` (`a -> b -> a`, the
    direction data flows), found by one depth-first walk; `lookup` resolves a pipeline's name
    (None: not there, so no cycle through it)."""
    todo = [(spec, [spec.name])]
    while todo:
        cur, path = todo.pop()
        for inp in cur.derived:
            name = inp.pipeline or ""
            if name in path:
                return " -> ".join([*path[path.index(name) :], name][::-1])
            up = lookup(name)
            if up is not None:
                todo.append((up, [*path, name]))
    return None


def check_graph(specs: list[Pipeline]) -> None:
    """The dataflow of a set of pipelines (a code location): every derived input names a
    pipeline of the set and one of its windows, and no pipeline depends on itself; one line
    naming the first that does not."""
    by_name = {s.name: s for s in specs}
    for spec in specs:
        for inp in spec.derived:
            up = by_name.get(inp.pipeline or "")
            if up is None:
                raise WireInputError(
                    f"pipeline {spec.name!r}: inputs.{inp.name}.pipeline names {inp.pipeline!r}, which no "
                    f"pipeline file declares ({spec.source})"
                )
            if not any(w.name == inp.output for w in up.windows):
                raise WireInputError(
                    f"pipeline {spec.name!r}: inputs.{inp.name}.output: pipeline {up.name!r} has no window "
                    f"{inp.output!r}; choose one of: " + ", ".join(w.name for w in up.windows)
                )
    for spec in specs:
        if cycle := find_cycle(spec, by_name.get):
            raise WireInputError(f"pipelines form a cycle: {cycle}; a dataflow is acyclic")


def record_spec(spec: Pipeline, inp: Input) -> Pipeline:
    """The pipeline as it reads derived input `inp`: time `window_time`, no id, the input's key
    and filter (its windows and derived fields are the pipeline's)."""
    return spec.for_input(inp)


# ---------------------------------------------------------------------------
# Planning: from manifests alone


@dataclass(frozen=True)
class Planned:
    epoch: int
    targets: dict[str, int]  # input -> the upstream's committed epoch it syncs to (0: none yet)
    refs: dict[str, dict[str, FileRef]]  # input -> upstream partition -> its file at that epoch
    watermarks: dict[str, int]  # input -> the upstream's W at that epoch
    w_prev: int
    w_new: int
    changed: list[tuple[int, int]]  # record-time ranges [lo, hi) whose upstream rows changed
    replay: tuple
    # the upstream files (keys) new or changed since the epoch before: the records an epoch
    # counts, and whose dead letters it finds (an upstream partition's content is read anew
    # by every epoch whose windows need it, but counted, and its dead letters kept, once)
    fresh: frozenset[str] = frozenset()

    def computed(self, start: pa.Array, end: pa.Array) -> pa.Array:
        """Which windows [start, end) the epoch (re)computes: the ones that fire now, and the
        fired ones that hold a changed upstream row."""
        fire = pc.and_(pc.less_equal(end, self.w_new), pc.greater(end, self.w_prev))  # pyright: ignore[reportAttributeAccessIssue]
        touched = pa.array([False] * len(start))
        for lo, hi in self.changed:
            touched = pc.or_(touched, pc.and_(pc.less(start, hi), pc.greater(end, lo)))  # pyright: ignore[reportAttributeAccessIssue]
        return pc.or_(fire, pc.and_(touched, pc.less_equal(end, self.w_new)))  # pyright: ignore[reportAttributeAccessIssue]


def plan_epoch(store: ObjectStore, spec: Pipeline, ups: list[Upstream], prev: Manifest | None) -> Planned | None:
    """The next epoch (None: every input is in sync with its upstream's latest commit)."""
    replay = tuple(prev.replay) if prev else ()
    if replay:
        targets = {u.input.name: int(replay[0]["remap"].get(u.input.name, 0)) for u in ups}
    else:
        targets = {}
        for u in ups:
            latest = Checkpoints(store, u.spec.name).committed()
            targets[u.input.name] = latest[-1] if latest else 0
        if prev is not None and targets == prev.remap:
            return None
        if prev is None and not any(targets.values()):
            return None
    before = prev.upstream if prev else {}
    w_prev = prev.watermark if prev else NEG_INF
    return plan_at(store, spec, ups, targets, before, w_prev, (prev.epoch if prev else 0) + 1, replay[1:])


def plan_at(
    store: ObjectStore,
    spec: Pipeline,
    ups: list[Upstream],
    targets: dict[str, int],
    before: dict[str, dict[str, str]],
    w_prev: int,
    epoch: int,
    replay: tuple = (),
) -> Planned:
    """Epoch `epoch` syncing each input to upstream epoch `targets[input]`, after an epoch that
    read the upstream partitions `before` (input -> partition -> sha256) and reached `w_prev`:
    the one rule for a live epoch, a replay after a rewind and a backfill's replay of the
    recorded timeline (computestage.replayed_epochs)."""
    refs, wms, changed, fresh = {}, {}, [], set()
    for u in ups:
        n = targets[u.input.name]
        m = _upstream_manifest(store, spec, u, n) if n else None
        refs[u.input.name] = dict(m.outputs.get(u.window.name, {})) if m else {}
        wms[u.input.name] = _upstream_watermark(u, m)
        was = before.get(u.input.name, {})
        now = {p: r.sha256 for p, r in refs[u.input.name].items()}
        for p in sorted(set(was) | set(now), key=int):
            if was.get(p) != now.get(p):  # new, changed or removed: its windows are recomputed
                changed.append((int(p), int(p) + u.spec.partition))
                if p in now:
                    fresh.add(refs[u.input.name][p].key)
    w_new = max(w_prev, min(wms.values()))
    return Planned(epoch, dict(targets), refs, wms, w_prev, w_new, changed, replay, frozenset(fresh))


def _upstream_watermark(u: Upstream, m: Manifest | None) -> int:
    """The watermark of what an input reads at upstream epoch `m`: the upstream's W, or for a
    computation's output its output watermark (min of W and its oldest pending timer)."""
    if m is None:
        return NEG_INF
    if u.window.type == "output":
        return m.output_watermark()
    return m.watermark


def _upstream_manifest(store: ObjectStore, spec: Pipeline, u: Upstream, n: int) -> Manifest:
    try:
        return Checkpoints(store, u.spec.name).load(n)
    except ObjectNotFound:
        raise WireInputError(
            f"pipeline {spec.name!r} needs epoch {n} of {u.spec.name!r}, which is not kept any more "
            "(garbage-collected); rewind it to a later epoch"
        ) from None


def predict(store: ObjectStore, spec: Pipeline, latest: Manifest | None) -> tuple[Planned, list[int]] | None:
    """The sensor's view of the next epoch: it, and the partitions it can make ready or change."""
    ups = upstreams(spec)
    plan = plan_epoch(store, spec, ups, latest)
    if plan is None:
        return None
    parts = set(became_ready(spec, plan, ups))
    parts |= {p for p in touched_partitions(spec, plan) if partitions.ready(spec, plan.w_new, p)}
    return plan, sorted(parts)


def touched_partitions(spec: Pipeline, plan: Planned) -> set[int]:
    """The partitions holding windows that the upstream changes of `plan` can touch: a window
    overlapping a changed record range [lo, hi) ends in (lo, hi + size]."""
    size = max(w.size for w in spec.windows)
    return {p for lo, hi in plan.changed for p in partitions.between(spec, lo, hi + size - 1)}


def became_ready(spec: Pipeline, plan: Planned, ups: list[Upstream]) -> list[int]:
    """The partitions a derived stage's epoch `plan` makes ready (partitions.became_ready), bounded
    by the newest and oldest record time its upstream partitions can hold: the one rule of the
    sensor (`predict`), a derived stage's commit and a computation stage's (computestage.py)."""
    starts = [(int(p), u.spec.partition) for u in ups for p, r in plan.refs[u.input.name].items() if r.rows]
    newest, oldest = (max(p + size - 1 for p, size in starts), min(p for p, _ in starts)) if starts else (NEG_INF, None)
    return partitions.became_ready(spec, plan.w_prev, plan.w_new, newest, oldest)


# ---------------------------------------------------------------------------
# Running


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
):
    """`engine.process` for a pipeline of derived streams: commit up to `max_epochs` epochs, each
    syncing the inputs to their upstreams' latest commits (or replaying recorded ones)."""
    from .sparksession import started_session

    del now, progress  # a derived stage's epochs depend on commits, not on clocks
    keep_epochs = settings.keep_epochs(spec, keep_epochs)
    ups = upstreams(spec)
    cp = Checkpoints(store, spec.name)
    out = Outcome.resume(cp)
    prev = out.manifest
    while len(out.committed) < max_epochs:
        plan = plan_epoch(store, spec, ups, prev)
        if plan is None:
            break
        computed = None
        if _needs_compute(plan):
            spark = started_session(spark)  # in the caller's thread (see `started_session`)
            computed = _compute(store, spec, ups, plan, spark, prev.join_numbers if prev else None)
        m = _commit(store, cp, spec, ups, prev, plan, computed, run_id or new_run_id())
        run_id = None
        out.took(m)
        prev = m
    out.publish(cp, keep_epochs)
    return out


def records_chunk_of(rows: pa.Table) -> pa.Table:
    """Upstream result rows as a RECORDS chunk (events.py): each row a record, its time
    `window_time`, no id, its position its row; so a derived stream is read as a raw one
    (extract.py: the input's filter, the pipeline's fields, key and checks)."""
    from .events import ID, REC, ROW, TIME

    arrays = [c.combine_chunks() for c in rows.columns]
    return pa.table(
        {
            TIME: rows[WINDOW_TIME],
            ID: pa.nulls(rows.num_rows, pa.string()),
            ROW: pa.array(range(rows.num_rows), pa.int64()),
            REC: pa.StructArray.from_arrays(arrays, fields=list(rows.schema)),
        }
    )


def recompute(
    store: ObjectStore, spec: Pipeline, spark, partitions_: list[int]
) -> dict[str, dict[int, pa.Table | None]]:
    """The content of `partitions_` for every window, computed again from the upstream content
    the latest epoch read (its remap's upstream epochs): what `backfill.backfill` compares with
    the committed content, so that the same upstream content reproduces the same bytes."""
    from .sparksession import started_session

    contents: dict[str, dict[int, pa.Table | None]] = {w.name: dict.fromkeys(partitions_) for w in spec.windows}
    latest = Checkpoints(store, spec.name).latest()
    if latest is None or not partitions_:
        return contents
    ups = upstreams(spec)
    refs, wms = {}, {}
    for u in ups:
        n = int(latest.remap.get(u.input.name, 0))
        m = _upstream_manifest(store, spec, u, n) if n else None
        refs[u.input.name] = dict(m.outputs.get(u.window.name, {})) if m else {}
        wms[u.input.name] = _upstream_watermark(u, m)
    # every window of the partitions asked (they overlap the partitions' time) that W has passed
    ranges = [(p, p + spec.partition) for p in sorted(set(partitions_))]
    plan = Planned(latest.epoch, dict(latest.remap), refs, wms, latest.watermark, latest.watermark, ranges, ())
    rows = _compute(store, spec, ups, plan, started_session(spark), latest.join_numbers).rows
    for w in spec.windows:
        for p in contents[w.name]:
            mine = _in_partition(spec, rows.get(w.name), p)
            contents[w.name][p] = apply_changes(None, mine) if mine is not None and mine.num_rows else None
    return contents


def _needs_compute(plan: Planned) -> bool:
    return plan.w_new > plan.w_prev or bool(plan.changed)


def _files(spec: Pipeline, ups: list[Upstream], plan: Planned) -> list[tuple[str, int, str]]:
    """(input, partition, key) of the upstream files holding records of the windows computed."""
    size = max(w.size for w in spec.windows)
    wanted = (
        [(plan.w_prev - size if plan.w_prev > NEG_INF else NEG_INF, plan.w_new)] if plan.w_new > plan.w_prev else []
    )
    wanted += [(lo - size, hi + size) for lo, hi in plan.changed]
    out = []
    for u in ups:
        for p, ref in sorted(plan.refs[u.input.name].items(), key=lambda x: int(x[0])):
            lo, hi = int(p), int(p) + u.spec.partition
            if ref.rows and any(lo < b and a < hi for a, b in wanted):
                out.append((u.input.name, lo, ref.key))
    return out


def _blocks(spec: Pipeline, ups: list[Upstream], files: list[tuple[str, int, str]], per: int) -> list[Block]:
    """The recomputation split by event time: blocks [lo, hi) tiling the time axis (the first
    from -inf, the last to +inf), cut at upstream partition starts so that each block owns at
    most `per` files. A block computes the windows whose `window_end - 1` it holds, from the
    files overlapping [lo - the longest window, hi) (a window's records lie within it), and
    counts the records of the files it owns (those starting in it): each file is counted once."""
    starts = sorted({p for _, p, _ in files})
    cuts = starts[per::per]  # a block starts at every per-th distinct upstream partition start
    bounds = [NEG_INF, *cuts, INF]
    size = max(w.size for w in spec.windows)
    span = {u.input.name: u.spec.partition for u in ups}
    out = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        reads = [f for f in files if f[1] < hi and (lo <= NEG_INF or f[1] + span[f[0]] > lo - size)]
        owns = [f[2] for f in reads if lo <= f[1] < hi]
        if reads:
            out.append(Block(lo, hi, reads, owns))
    return out


@dataclass(frozen=True)
class Block:
    lo: int
    hi: int
    reads: list[tuple[str, int, str]]  # (input, upstream partition, key)
    owns: list[str]  # the keys whose records this block counts


def _compute(
    store: ObjectStore, spec: Pipeline, ups: list[Upstream], plan: Planned, spark, numbers: FieldTypes | None = None
) -> Computed:
    """The computed windows' rows, per window, from Spark tasks that read the upstream files
    (their records as the pipeline reads them) and aggregate them with the kernel's code; one
    task per block of event time (`_blocks`), one task in all for a few files.

    A join's fields are typed over every record the stage has read (`numbers`: the fields read
    as numbers by earlier epochs, then every task's of this one): a task whose records of a field
    are all text where the join needs a number (`JoinTypeError`) is run again with the types the
    other tasks found; only a field no record ever held a number for is the one-line error."""
    from pyspark.sql.types import LongType, StructField, StructType

    from .bucketkernel import SEG, SEQ, bucket_epoch, pack, packed_type, side_table
    from .events import ERR, FILTERED, KEY, ROW, TIME, chunk_schema
    from .expand import is_generated
    from .extract import pipeline_events
    from .kernel import _fs, _read_key

    passed = {u.input.name for u in ups if is_generated(u.spec)}  # a raw input read through s__i
    computed_inputs = {u.input.name for u in ups if u.window.type == "output"} - passed
    blocks = _blocks(spec, ups, _files(spec, ups, plan), settings.derived_block_files())
    readers = {u.input.name: record_spec(spec, u.input) for u in ups}
    for name in passed:  # their records carry the stage's fields already (set where they were read)
        readers[name] = readers[name].model_copy(update={"fields": ()})
    opts, bucket = store.fs_options(), store.bucket
    schema = chunk_schema(spec).append(pa.field(SEG, pa.string())).append(pa.field(SEQ, pa.int64()))

    aggregating = spec.model_copy(update={"windows": tuple(w for w in spec.windows if w.type != "join")})
    joins = [w for w in spec.windows if w.type == "join"]
    joins_only = bool(joins) and not aggregating.windows  # a raw input's records need no event columns

    known = dict(numbers or {})
    # each task's rows through Spark up to its share of the driver's room, the rest through the store
    handover = Handover.of_results(store, spec.name)
    handover = handover.share(len(blocks))

    def task(batches):
        for b in batches:  # the driving rows: block numbers
            for i in b.column("id").to_pylist():
                yield from block_rows(i, blocks[i], known)

    def block_rows(i: int, block: Block, known: FieldTypes):
        fs = _fs(opts)
        parts = []
        counted = malformed = filtered = 0  # of the fresh files the block owns
        letters = []
        records: dict[str, list[pa.Table]] = {}  # input -> its rows as read (for joins): columns + _key, _t
        for name, p, key in block.reads:
            t = _read_key(fs, bucket, key, None, [])
            chunk = None
            counts = key in block.owns and key in plan.fresh
            if name in passed and joins_only:
                # Records the generated pipeline accepted with this input's checks, key and filter
                # (expand.py): each is an event as it is, at its time, under its key; only their
                # columns are needed, not a second reading of every line (extract.py).
                counted += t.num_rows if counts else 0
                time = pc.subtract(t["window_end"], 1)  # pyright: ignore[reportAttributeAccessIssue]
                fields = _record_fields(t["record"]).append_column(WINDOW_TIME, time)
                records.setdefault(name, []).append(
                    fields.append_column(JOIN_KEY, t["key"]).append_column(JOIN_T, time)
                )
                continue
            if name in passed:  # a raw input's records, as the raw stream holds them
                t, chunk = passed_records(t)
            else:
                if name in computed_inputs:  # a computation's records: their fields as columns
                    t = record_columns(t)
                t = t.append_column(WINDOW_TIME, pc.subtract(t["window_end"], 1))  # pyright: ignore[reportAttributeAccessIssue]
            ev = pipeline_events(readers[name], chunk if chunk is not None else records_chunk_of(t), _FAR)
            good = ev.filter(pc.is_null(ev[ERR]))  # pyright: ignore[reportAttributeAccessIssue]
            if counts:
                aside = ev.filter(pc.is_valid(ev[ERR]))  # pyright: ignore[reportAttributeAccessIssue]
                bad = aside.filter(pc.not_equal(aside[ERR], FILTERED))  # pyright: ignore[reportAttributeAccessIssue]
                counted += good.num_rows
                malformed += bad.num_rows
                filtered += aside.num_rows - bad.num_rows
                if bad.num_rows:
                    letters.append(_letters(bad, name, p))
            if joins:
                rows = t.take(good[ROW]).append_column(JOIN_KEY, good[KEY]).append_column(JOIN_T, good[TIME])
                records.setdefault(name, []).append(rows)
            good = good.append_column(SEG, pa.repeat(pa.scalar(f"{name}.{p}"), good.num_rows))
            parts.append(good.append_column(SEQ, pa.repeat(pa.scalar(0, pa.int64()), good.num_rows)))
        events = (
            pa.concat_tables([x.select(schema.names).cast(schema) for x in parts]) if parts else schema.empty_table()
        )
        out = (
            bucket_epoch(aggregating, events, side_table(aggregating, {}, None), NEG_INF, INF)
            if aggregating.windows
            else {}
        )
        numeric = numeric_fields(records, skip=(JOIN_KEY, JOIN_T, WINDOW_TIME))
        try:
            for w in joins:
                out[("out", w.name)] = join_rows(w, records, known)
        except JoinTypeError as e:  # the block again, with the types the other tasks find
            yield from pack({("unbound", ""): pa.table({"block": [i], "why": [str(e)]})}).to_batches()
            return
        n = (counted, malformed, filtered)
        keep = {("n", ""): pa.table({c: pa.array([v], pa.int64()) for c, v in zip(_COUNTS, n, strict=True)})}
        if numeric:
            keep[("numbers", "")] = numbers_table(numeric)
        if letters:
            keep[("dead", "")] = pa.concat_tables(letters)
        for w in spec.windows:
            rows = out.get(("out", w.name))
            if rows is not None and rows.num_rows:
                last = pc.subtract(rows["window_end"], 1)  # pyright: ignore[reportAttributeAccessIssue]
                mine = pc.and_(pc.greater_equal(last, block.lo), pc.less(last, block.hi))  # pyright: ignore[reportAttributeAccessIssue]
                keep[("out", w.name)] = rows.filter(
                    pc.and_(mine, plan.computed(rows["window_start"], rows["window_end"]))  # pyright: ignore[reportAttributeAccessIssue]
                )
        yield from handover(pack(keep)).to_batches()

    if not blocks:
        return Computed({}, (0, 0, 0), {}, known)

    def run(which: list[int]) -> dict[tuple[str, str], list[pa.Table]]:
        """One Spark task per block of `which`."""
        if which == list(range(len(blocks))):
            ids = spark.range(0, len(blocks), 1, len(blocks))
        else:
            # the type made here, as every Spark type of Wire's (a DDL string: a round trip on Connect)
            ids = spark.createDataFrame([(i,) for i in which], StructType([StructField("id", LongType())]))
            ids = ids.repartition(len(which))
        return unpacked(store, ids.mapInArrow(task, packed_type()).toArrow())[0]

    tables = run(list(range(len(blocks))))
    for t in tables.get(("numbers", ""), []):
        known = merge_numbers(known, t)
    unbound = tables.pop(("unbound", ""), [])
    if unbound:  # those blocks again, knowing what every task read as numbers
        again = run(sorted(t["block"][0].as_py() for t in unbound))
        if ("unbound", "") in again:
            raise WireInputError(again[("unbound", "")][0]["why"][0].as_py())
        for k, v in again.items():
            tables.setdefault(k, []).extend(v)
    ns = tables.get(("n", ""), [])
    found = tuple(sum(t[c][0].as_py() for t in ns) for c in _COUNTS)
    by_part: dict[tuple[str, int], list[pa.Table]] = {}
    for t in tables.get(("dead", ""), []):
        by_part.setdefault((t["segment"][0].as_py(), t["chunk"][0].as_py()), []).append(t)
    rows = {}
    for w in spec.windows:
        schema = output_schema(spec, w.name).append(pa.field("retract", pa.bool_()))
        got = tables.get(("out", w.name), [])
        if w.type != "join":  # a join's columns keep their inputs' types
            got = [t.select(schema.names).cast(schema) for t in got]
        if got:  # a join's from several tasks: typed as one (its columns' types are the records')
            rows[w.name] = typed_as_one(got)
    letters = {k: pa.concat_tables(v) for k, v in by_part.items()}
    return Computed(rows, (found[0], found[1], found[2]), letters, known)


_COUNTS = ("counted", "malformed", "filtered")


@dataclass(frozen=True)
class Computed:
    """What an epoch's recomputation gives: the computed windows' rows, and of the upstream files
    new or changed since the epoch before (`Planned.fresh`) the records counted, malformed and
    filtered, and the dead letters (`kernel.DEAD_LETTER`) of each, by (input, upstream partition);
    and the fields a join has read as numbers."""

    rows: dict[str, pa.Table]
    counts: tuple[int, int, int]
    letters: dict[tuple[str, int], pa.Table]
    numbers: FieldTypes  # the joins' fields read as numbers, by this epoch and those before


def _letters(bad: pa.Table, name: str, p: int) -> pa.Table:
    """Dead letters of the records of upstream partition `p` of input `name` that the stage
    cannot read (`bad`: extract.pipeline_events' rows with a reason): each with its reason, its
    record's text, its time, and its place: segment = the input, chunk = the upstream partition,
    row = its row there (the partition's rows in their committed order)."""
    from .events import ERR, ROW, SRC, TIME
    from .kernel import DEAD_LETTER

    n = bad.num_rows
    return pa.table(
        {
            "reason": bad[ERR],
            "window": pa.nulls(n, pa.string()),
            "event": bad[SRC],
            "event_time": bad[TIME],
            "segment": pa.repeat(pa.scalar(name), n),
            "chunk": pa.repeat(pa.scalar(p, pa.int64()), n),
            "row": bad[ROW],
        },
        schema=DEAD_LETTER,
    )


def record_columns(rows: pa.Table) -> pa.Table:
    """An output's rows with each record's top-level fields as columns, as a join reads a raw
    input's records (`_record_fields`: JSON types, ISO-8601 text staying text, a field of several
    JSON types typed as a stream's JSON lines type it: numbers win, its other values null; a field
    that clashes with a row column is left in `record`): what a derived stream of a computation's
    output reads, so its windows aggregate the records' fields. One record's odd value so costs
    that value, never the other records' fields."""
    if not rows.num_rows:
        return rows
    fields = _record_fields(rows["record"])
    for name in fields.column_names:
        if name not in rows.column_names:
            rows = rows.append_column(name, fields[name])
    return rows


JOIN_KEY, JOIN_T = "__wire_key", "__wire_t"  # a record's key and event time, beside its columns


def passed_records(rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The `records` output of a pipeline generated for a stage's raw input (expand.py) as the
    raw records themselves, at their event time (a record produced at t is the row [t, t + 1)):

    - as a RECORDS chunk of JSON lines (events.py), each record's line with its `window_time`,
      so the stage's windows read them as the window engine reads a stream's JSON lines (the
      same types, checks and reasons, record by record: extract.py);
    - as a table of the records' fields and `window_time`, the columns a join selects from:
      values keep their JSON types (text stays text, where the JSON reader would make ISO-8601
      text a timestamp); a field whose values have several JSON types is typed as a stream's
      JSON lines are (recordtypes.py: numbers win, the other values null).

    The output's own columns (key, window, id, record) are not the record's: a raw field may
    bear one of their names (NEXMark's `id`)."""
    import numpy as np

    from .events import ID, RAW, ROW, TIME

    time = pc.subtract(rows["window_end"], 1)  # pyright: ignore[reportAttributeAccessIssue]
    texts = rows["record"]
    # each line: `{"window_time":<t>` then the record's text less its `{` (`,` first unless it is `{}`)
    empty = pc.equal(pc.utf8_trim_whitespace(texts), "{}")  # pyright: ignore[reportAttributeAccessIssue]
    rest = pc.if_else(empty, "}", pc.binary_join_element_wise(",", pc.utf8_slice_codeunits(texts, 1), ""))  # pyright: ignore[reportAttributeAccessIssue]
    lines = pc.binary_join_element_wise(f'{{"{WINDOW_TIME}":', pc.cast(time, pa.string()), rest, "")  # pyright: ignore[reportAttributeAccessIssue]
    chunk = pa.table(
        {
            TIME: time,
            ID: pa.nulls(rows.num_rows, pa.string()),
            ROW: pa.array(np.arange(rows.num_rows, dtype=np.int64)),
            RAW: lines.cast(pa.large_binary()),
        }
    )
    return _record_fields(texts).append_column(WINDOW_TIME, time), chunk


def _record_fields(texts: pa.ChunkedArray) -> pa.Table:
    """Records' texts as columns (recordtypes.record_fields), without a `window_time` of theirs."""
    fields = record_fields(texts)
    return fields.drop_columns([c for c in fields.column_names if c == WINDOW_TIME])


class JoinTypeError(WireInputError):
    """A join's expression does not bind to its records' types (a field read as text)."""


def join_rows(w: WindowSpec, records: dict[str, list[pa.Table]], numbers: FieldTypes | None = None) -> pa.Table:
    """A windowed join (DESIGN §4): every pair of a `left` and a `right` record with equal keys
    (null keys equal) in the same tumbling or sliding window for which `where` holds, as the `select`
    columns, with `key`, `window_start`, `window_end` and `retract` (false). DuckDB, over the
    records of the windows computed (the caller keeps those)."""
    import duckdb

    from .duck import duckdb_connection
    from .sqlexpr import expression_columns, quote_sides

    con = duckdb_connection()
    names = {"left": "__wire_left", "right": "__wire_right"}
    # the record fields each side's `select` and `where` name: one no record read has is null
    named: dict[str, set[str]] = {"left": set(), "right": set()}
    for c in w.select:
        named[c.side].add(c.column)
    for ref in expression_columns(quote_sides(w.where), f"windows.{w.name}.where") if w.where else ():
        side, _, field = ref.partition(".")
        if side in named and field:
            named[side].add(field.split(".")[0])
    registered = []
    try:
        for side, inp in (("left", w.left), ("right", w.right)):
            parts = records.get(inp or "", [])
            if not parts:
                return pa.table({"key": pa.array([], pa.string())}).append_column("retract", pa.array([], pa.bool_()))
            typed = (numbers or {}).get(inp or "", {})
            if typed:  # fields read as numbers elsewhere are numbers here too (numbers win)
                parts = [empty_of(typed), *parts]
            t = typed_as_one(parts)
            for field in sorted(named[side] - set(t.column_names)):
                t = t.append_column(field, pa.nulls(t.num_rows))
            con.register(names[side], t)
            registered.append(names[side])
        # the start of the last window holding a record (windows.assign), and each window's start
        last = f"{JOIN_T} - ((({JOIN_T} - {w.offset}) % {w.slide}) + {w.slide}) % {w.slide}"
        starts = f"UNNEST(range({last} - {w.size - w.slide}, {last} + 1, {w.slide}))"
        cols = ", ".join(f'"{c.side}"."{c.column}" AS "{c.name}"' for c in w.select)
        cond = f" AND ({quote_sides(w.where)})" if w.where else ""
        sql = f"""
            WITH l AS (SELECT *, {starts} AS __ws FROM {names["left"]}),
                 r AS (SELECT *, {starts} AS __ws FROM {names["right"]})
            SELECT "left".{JOIN_KEY} AS key, "left".__ws AS window_start, "left".__ws + {w.size} AS window_end,
                   {cols}, FALSE AS retract
            FROM l AS "left" JOIN r AS "right"
              ON "left".{JOIN_KEY} IS NOT DISTINCT FROM "right".{JOIN_KEY} AND "left".__ws = "right".__ws{cond}"""
        try:
            return con.sql(sql).to_arrow_table()
        except duckdb.Error as e:
            # A field none of whose records holds a number (of those this task read, unless the
            # stage read numbers there elsewhere: `numbers`) is text (recordtypes.py: numbers win
            # where there are any), which `where` or `select` may not take. The caller runs the
            # task again with the types its other tasks read, or tells this line.
            first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
            raise JoinTypeError(
                f"join {w.name}: {first}; a field whose records hold no number reads as text: "
                f"give it one type in the stage's fields (as amount: TRY_CAST(amount AS DOUBLE)), then wire backfill "
                f"the stage"
            ) from None
    finally:
        for n in registered:
            con.unregister(n)


def _commit(
    store: ObjectStore,
    cp: Checkpoints,
    spec: Pipeline,
    ups: list[Upstream],
    prev: Manifest | None,
    plan: Planned,
    computed: Computed | None,
    run_id: str,
) -> Manifest:
    """Replace the computed windows' rows in the partitions they touch (retracting those that no
    longer have a row), stage the partitions that changed and the dead letters of the upstream
    partitions read anew, then prepare and commit the manifest."""
    got = computed if computed is not None else Computed({}, (0, 0, 0), {}, prev.join_numbers if prev else {})
    rows_by = got.rows
    fault("before-staging")
    outputs = {w: dict(p) for w, p in (prev.outputs.items() if prev else [])}
    changed: dict[str, list[int]] = {}
    jobs = []  # (window, partition, the epoch's rows of the window, the partition's committed file)
    for w in spec.windows:
        outputs.setdefault(w.name, {})
        new = rows_by.get(w.name)
        touched: set[int] = set()
        if new is not None and new.num_rows:
            touched |= set(partitions.starts(spec, new["window_end"]).to_pylist())
        touched |= {p for p in touched_partitions(spec, plan) if str(p) in outputs[w.name]}
        jobs += [(w.name, p, new, outputs[w.name].get(str(p))) for p in sorted(touched)]

    def stage_partition(job) -> tuple[str, int, FileRef | None, FileRef | None]:
        """A touched partition's new content staged (its committed rows, the epoch's, the rows
        the epoch retracts), or None when the epoch changes none of its rows."""
        name, p, new, prior = job
        old = read_file(store, prior)
        mine = _in_partition(spec, new, p)
        gone = _retracted(plan, old, mine) if old is not None else None
        parts = [t for t in (mine, gone) if t is not None and t.num_rows]
        if not parts:
            return name, p, prior, None
        content = apply_changes(old, pa.concat_tables(parts))
        return (
            name,
            p,
            prior,
            cp.stage(run_id, f"out/{name}/{p}.parquet", parquet_bytes(content), content.num_rows, plan.epoch),
        )

    with staged(stage_partition, jobs) as done:  # side by side; in order, so the same manifest
        for name, p, prior, ref in done:
            if ref is None:
                continue
            fault("mid-staging")
            if prior is None or prior.sha256 != ref.sha256:
                outputs[name][str(p)] = ref
                changed.setdefault(name, []).append(p)
    ready = set(became_ready(spec, plan, ups))  # changed too, even if empty; windows in order
    changed = {w.name: sorted(set(changed.get(w.name, [])) | ready) for w in spec.windows if ready or w.name in changed}
    letters = _stage_letters(cp, run_id, plan, prev, got.letters)
    fault("after-staging")
    n, malformed, filtered = got.counts
    counts = Counts(
        events_in=n + malformed + filtered,
        malformed=malformed,
        filtered=filtered,
        counted={w.name: n for w in spec.windows},
        late={w.name: 0 for w in spec.windows},
    )
    manifest = Manifest(
        pipeline=spec.name,
        epoch=plan.epoch,
        previous=prev.epoch if prev else None,
        run_id=run_id,
        kind="process",
        fingerprint=spec.fingerprint(),
        config=spec.model_dump(mode="json", exclude={"source"}),
        remap=plan.targets,
        segments={},
        segment_watermarks=plan.watermarks,
        decisions={},
        watermark=plan.w_new,
        prev_watermark=plan.w_prev,
        outputs=outputs,
        changed={w: sorted(ps) for w, ps in changed.items() if ps},
        dead_letters=list(prev.dead_letters) if prev else [],
        counts=counts,
        totals=(prev.totals if prev else Counts()).add(counts),
        replay=list(plan.replay),
        upstream={name: {p: r.sha256 for p, r in refs.items()} for name, refs in plan.refs.items()},
        upstream_letters=letters,
        join_numbers=got.numbers,
        created_ms=now_ms(),
    )
    return cp.prepare_and_commit(manifest)


def _stage_letters(
    cp: Checkpoints, run_id: str, plan: Planned, prev: Manifest | None, found: dict[tuple[str, int], pa.Table]
) -> dict[str, dict[str, FileRef]]:
    """The dead letters of every upstream partition as the epoch leaves them: those of a partition
    it read anew (`found`) staged, one file each; a partition's earlier letters kept while its
    content is the one they were found in (so a recomputation never repeats them, and a late
    firing upstream replaces them)."""
    out: dict[str, dict[str, FileRef]] = {}
    for name, parts in prev.upstream_letters.items() if prev else []:
        refs = plan.refs.get(name, {})
        kept = {p: f for p, f in parts.items() if p in refs and refs[p].key not in plan.fresh}
        if kept:
            out[name] = kept
    for (name, p), t in sorted(found.items()):
        t = t.append_column("epoch", pa.array([plan.epoch] * t.num_rows, pa.int64()))
        ref = cp.stage(run_id, f"dead_letters/{name}/{p}.parquet", parquet_bytes(t), t.num_rows, plan.epoch)
        out.setdefault(name, {})[str(p)] = ref
    return out


def _in_partition(spec: Pipeline, rows: pa.Table | None, p: int) -> pa.Table | None:
    if rows is None or not rows.num_rows:
        return None
    return rows.filter(pc.equal(partitions.starts(spec, rows["window_end"]), p))  # pyright: ignore[reportAttributeAccessIssue]


def _retracted(plan: Planned, old: pa.Table, new: pa.Table | None) -> pa.Table | None:
    """Retractions of the old rows of computed windows that the computation no longer gives."""
    if not old.num_rows:
        return None
    mine = old.filter(plan.computed(old["window_start"], old["window_end"]))
    if not mine.num_rows:
        return None
    kept = set()
    if new is not None:
        kept = set(zip(*(new[c].to_pylist() for c in ("key", "window_start", "window_end")), strict=True))
    ident = zip(*(mine[c].to_pylist() for c in ("key", "window_start", "window_end")), strict=True)
    gone = mine.filter(pa.array([i not in kept for i in ident]))
    if not gone.num_rows:
        return None
    return gone.append_column("retract", pa.array([True] * gone.num_rows))
