"""The Spark window kernel: one epoch of event-time processing, distributed by Spark.

Given the chunks of epoch N, the window state and id memory after N-1, and the
watermarks `W_{N-1}` and `W_N`, it computes (DESIGN §1):

- per window: the results that fire or re-fire in N (``W_{N-1} < end <= W_N``,
  or ``end <= W_N`` and changed in N), the retractions of fired sessions that
  merged away, and the new state (windows with ``end + lateness > W_N``);
- dead letters: ``late`` (per window: the event counts toward none of its
  windows, i.e. every one has ``end + lateness <= W_{N-1}``), ``duplicate``, and
  ``error: <why>`` for an event the windows cannot process (a chunk written by hand
  or by an older producer, past produce's checks: `bucketkernel.event_errors`), set
  aside before anything else so that the epoch commits the rest;
- the counts that must balance: ``in = counted + late + duplicate`` per window, where
  ``in`` is the events the windows saw (`EpochResult.events`); the errors are counted
  apart (`EpochResult.errors`, which the engine counts as malformed).

Events, and the window state and id memory carried from N-1, are read from the
object store on the executors (pyarrow's S3 filesystem), in one of two plans with
the same results:

- one task (an epoch small enough for one worker: `settings.single_task_rows`):
  a one-row DataFrame drives a `mapInArrow` task that reads the chunks and the
  carried rows itself and computes every window with DuckDB (`bucketkernel`);
- key buckets: Spark reads the chunks in parallel, de-duplicates ids over the whole
  epoch, then shuffles events and carried rows by key bucket; each bucket's windows
  are computed by the same DuckDB code in a Python worker (`applyInArrow`).

Only results, the new state and dead letters — bounded by window state, not by
input — come back to the driver, as Arrow tables, which stages them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from .aggregates import output_ddl, partial_columns, state_ddl
from .bucketkernel import (
    DUP,
    IDS_SCHEMA,
    IDS_W,
    SEG,
    SEQ,
    bucket_epoch,
    error_reasons,
    pack,
    packed_type,
    side_column,
    side_table,
    unpack,
)
from .events import ERR, ID, KEY, RECORDS, ROW, SRC, TIME, chunk_schema
from .extract import pipeline_events, read_schema
from .handover import Handover, unpacked
from .objectstore import ObjectStore
from .sparkconf import session_cores
from .spec import INPUT_SEP, Pipeline, WindowSpec, field_column
from .streams import ChunkMeta

_FS_CACHE: dict = {}
READ_THREADS = 8  # objects of the store fetched at once by the task that holds a whole epoch
#: A job of several epochs stops after the epoch whose packed results reach this (LZ4 Arrow IPC;
#: a 500 K-event epoch of three windows packs ~40 MB): what the driver receives at once stays
#: within it plus one epoch's results; the epochs not computed are the next job's.
JOB_RESULT_BYTES = 32 << 20


def _fs(opts: dict):
    from .objectstore import arrow_fs_from_options

    k = tuple(sorted(opts.items()))
    if k not in _FS_CACHE:
        _FS_CACHE[k] = arrow_fs_from_options(opts)
    return _FS_CACHE[k]


def _read_key(
    fs, bucket: str, key: str, schema: pa.Schema | None, extra: list[tuple[str, pa.DataType, object]]
) -> pa.Table:
    """One Parquet object of the store as `schema` (its columns, in its types), with constant
    `extra` columns (name, type, value) appended.

    The file is opened and read directly (a chunk: 6.0 instead of 8.5 ms, 4.3 instead of 6.7 ms
    of CPU, against `pq.read_table`, whose dataset discovery asks the store about the path first);
    only a file whose columns are not `schema`'s goes through `pq.read_table(schema=...)`."""
    import pyarrow.parquet as pq

    path = f"{bucket}/{key}"
    with fs.open_input_file(path) as f:
        t = pq.ParquetFile(f).read()
    if schema is not None and t.schema != schema:
        t = t.cast(schema) if t.schema.names == schema.names else pq.read_table(path, filesystem=fs, schema=schema)
    for n, typ, v in extra:
        t = t.append_column(pa.field(n, typ), pa.repeat(pa.scalar(v, typ), t.num_rows))
    return t


def read_parquet_keys(
    spark,
    fs_options: dict,
    bucket: str,
    keys: list[tuple],
    schema: pa.Schema,
    extra: list[tuple[str, pa.DataType]],
):
    """A DataFrame of the Parquet objects `keys` (tuples of key + extra column values),
    read in parallel on the executors with pyarrow's S3 filesystem."""
    from pyspark.sql.pandas.types import from_arrow_schema

    out_schema = pa.schema(list(schema) + [pa.field(n, t) for n, t in extra])

    def read(batches):
        fs = _fs(fs_options)
        for b in batches:
            for row in b.to_pylist():
                t = _read_key(fs, bucket, row["k"], schema, [(n, typ, row[n]) for n, typ in extra])
                yield from t.select(out_schema.names).cast(out_schema).to_batches(max_chunksize=65536)

    return _keys_frame(spark, keys, [("k", pa.string()), *extra]).mapInArrow(read, from_arrow_schema(out_schema))


def _keys_frame(spark, keys: list[tuple], columns: list[tuple[str, pa.DataType]]):
    """A DataFrame of `keys` rows (the objects to read), spread over the session's parallelism.
    Its columns are integers (BIGINT) or text, typed here (a DDL string costs Spark Connect a
    round trip to the server)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    typed = from_arrow_schema(
        pa.schema([(n, pa.int64() if pa.types.is_integer(t) else pa.string()) for n, t in columns])
    )
    kdf = spark.createDataFrame([tuple(k) for k in keys], typed)
    parts = max(1, min(len(keys), 2 * session_cores(spark)))
    return kdf.repartition(parts)


@dataclass(frozen=True)
class Chunks:
    """An epoch's chunks in the store, read by the executors (never by the driver) as the
    pipeline's events (`extract.read_schema`: its event columns, ERR and SRC) with their
    segment and sequence (SEG, SEQ)."""

    fs_options: dict = field(repr=False)  # carries the store's credentials: never printed
    bucket: str
    # (data key, segment, sequence, ingestion time, format) of each chunk with records
    keys: tuple[tuple[str, str, int, int, int], ...]
    spec: Pipeline  # the pipeline reading them

    @property
    def schema(self) -> pa.Schema:
        return read_schema(self.spec).append(pa.field(SEG, pa.string())).append(pa.field(SEQ, pa.int64()))

    def read(self, fs, key: str, seg: str, seq: int, ingest_ms: int, fmt: int) -> pa.Table:
        """One chunk as the pipeline's events: a RECORDS chunk's records through `extract`; an
        EVENTS chunk's events as stored, with the reasons `event_errors` finds."""
        reader = self.spec.reader_of(seg)  # the input the chunk belongs to: its key, filter, fields
        if fmt == RECORDS:
            t = pipeline_events(reader, _read_key(fs, self.bucket, key, None, []), ingest_ms)
        else:
            t = _read_key(fs, self.bucket, key, chunk_schema(reader), [])
            t = t.append_column(ERR, error_reasons(reader, t)).append_column(SRC, pa.nulls(t.num_rows, pa.string()))
        if self.spec.inputs:  # ids are unique per stream: an input's are its own (`<input>:<id>`)
            name = seg.split(INPUT_SEP, 1)[0]
            qualified = pc.binary_join_element_wise(pa.scalar(name + ":"), t[ID], "")  # pyright: ignore[reportAttributeAccessIssue]  generated at import
            t = t.set_column(t.schema.get_field_index(ID), ID, qualified)
        t = t.append_column(SEG, pa.repeat(pa.scalar(seg, pa.string()), t.num_rows))
        t = t.append_column(SEQ, pa.repeat(pa.scalar(seq, pa.int64()), t.num_rows))
        return t.select(self.schema.names).cast(self.schema)

    def frame(self, spark):
        """The events as a DataFrame, the chunks read in parallel on the executors."""
        from pyspark.sql.pandas.types import from_arrow_schema

        opts, me = self.fs_options, self

        def read(batches):
            fs = _fs(opts)
            for b in batches:
                for r in b.to_pylist():
                    t = me.read(fs, r["k"], r["seg"], r["seq"], r["ingest"], r["fmt"])
                    yield from t.to_batches(max_chunksize=65536)

        cols = [
            ("k", pa.string()),
            ("seg", pa.string()),
            ("seq", pa.int64()),
            ("ingest", pa.int64()),
            ("fmt", pa.int64()),
        ]
        return _keys_frame(spark, list(self.keys), cols).mapInArrow(read, from_arrow_schema(self.schema))

    def table(self, pool=None) -> pa.Table:
        """The events as one Arrow table, read here (in the task that holds the whole epoch),
        the chunks side by side when a thread `pool` is given (each read waits on the store)."""
        fs = _fs(self.fs_options)
        parts = (
            list(pool.map(lambda c: self.read(fs, *c), self.keys)) if pool else [self.read(fs, *c) for c in self.keys]
        )
        return pa.concat_tables(parts) if parts else self.schema.empty_table()


def epoch_chunks(fs_options: dict, bucket: str, spec: Pipeline, chunks: list[ChunkMeta]) -> Chunks:
    keys = tuple((c.data_key, c.segment, c.seq, c.ingest_ms, c.format) for c in chunks if c.data_key)
    return Chunks(fs_options, bucket, keys, spec)


# ---------------------------------------------------------------------------


@dataclass
class WindowResult:
    outputs: pa.Table  # output_ddl columns + `retract` (bool), in no particular order
    state: pa.Table  # state_ddl columns
    counted: int
    late: int
    # events of the inputs a window that names an `input:` does not read (so that, per window,
    # in = counted + late + other + duplicate); 0 for a window that reads every input
    other: int = 0


@dataclass
class EpochResult:
    windows: dict[str, WindowResult]
    dead_letters: pa.Table  # DEAD_LETTER schema
    ids: pa.Table | None  # id memory after the epoch: (id, expires)
    events: int  # events the windows saw: counted + late + duplicate, per window
    duplicate: int
    errors: int = 0  # records set aside as `error: <why>` or `malformed: <why>` dead letters (not in `events`)
    filtered: int = 0  # records the pipeline's `where` filtered out (not in `events`)
    extra: dict = field(default_factory=dict)


DEAD_LETTER = pa.schema(
    [
        ("reason", pa.string()),
        ("window", pa.string()),
        ("event", pa.string()),
        ("event_time", pa.int64()),
        ("segment", pa.string()),
        ("chunk", pa.int64()),
        ("row", pa.int64()),
    ]
)
# Id memory: an id with its event's key and time, so that it can be kept while the
# session that counted it stays open (sessions can outlive `t + extent + lateness`).
IDS = IDS_SCHEMA
IDS_DDL = "id STRING, expires BIGINT, key STRING, t BIGINT"


def _event_json(F, spec: Pipeline):
    """The event as the pipeline sees it, for dead letters (a composite key as `key`)."""
    # One entry per field name: a field can be both the key (or id) and an aggregate's field,
    # e.g. count_distinct(user) keyed by user, and Spark refuses duplicate map keys.
    pairs = {spec.time_field: F.col(TIME).cast("string")}
    if spec.key_fields:
        pairs.setdefault(spec.key_field or "key", F.col(KEY))
    if spec.id_field:
        pairs.setdefault(spec.id_field, F.col(ID))
    for f in sorted(set(spec.numeric_fields) | set(spec.distinct_fields) | set(spec.gap_fields)):
        pairs.setdefault(f, F.col(field_column(f)).cast("string"))
    return F.to_json(F.map_from_arrays(F.array(*[F.lit(k) for k in pairs]), F.array(*pairs.values())))


def _dead(F, df, spec: Pipeline):
    """Dead letters of the events of `df`, which carry their `reason` and `window` columns."""
    return df.select(
        F.col("reason"),
        F.col("window"),
        F.coalesce(F.col(SRC), _event_json(F, spec)).alias("event"),
        F.col(TIME).alias("event_time"),
        F.col(SEG).alias("segment"),
        F.col(SEQ).alias("chunk"),
        F.col(ROW).alias("row"),
    )


def _to_arrow(df, schema: pa.Schema) -> pa.Table:
    t = df.toArrow()
    return t.select(schema.names).cast(schema) if t.num_rows else schema.empty_table()


def _sorted(t: pa.Table, keys: list[str]) -> pa.Table:
    """Sorted on the driver (the table is collected anyway), ascending with nulls first as
    Spark's `orderBy` would: a deterministic order, so reruns write identical bytes."""
    if t.num_rows < 2:
        return t
    return t.sort_by([(k, "ascending", "at_start") for k in keys])


def _sorted_or_none(t: pa.Table | None, keys: list[str]) -> pa.Table | None:
    return None if t is None else _sorted(t, keys)


@functools.lru_cache(maxsize=256)
def _ddl_to_arrow(ddl: str) -> pa.Schema:
    """A DDL of columns as an Arrow schema, parsed once per process: Spark parses it (Spark
    Connect on the server, a round trip each time) and the answer never changes."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType, _parse_datatype_string

    return to_arrow_schema(cast(StructType, _parse_datatype_string(ddl)))  # a DDL of columns: a struct


@dataclass(frozen=True)
class Stored:
    """A Parquet object of the store (window state, id memory) that the executors read
    themselves, like the chunks: the driver never holds it, so a large state costs no
    driver memory and no task carries it."""

    fs_options: dict = field(repr=False)  # carries the store's credentials: never printed
    bucket: str
    key: str


def _frame(spark, ddl: str, src: pa.Table | Stored | None):
    """A DataFrame of `ddl` columns: from the store on the executors, or from a driver table."""
    schema = _ddl_to_arrow(ddl)
    if isinstance(src, Stored):
        return read_parquet_keys(spark, src.fs_options, src.bucket, [(src.key,)], schema, [])
    if src is None or src.num_rows == 0:
        from pyspark.sql.pandas.types import from_arrow_schema

        return spark.createDataFrame([], from_arrow_schema(schema))  # typed here: a DDL is a round trip
    return spark.createDataFrame(src.cast(schema))


# ONE Spark job per epoch, as a rule: the events are read, de-duplicated, shuffled by key
# bucket with the carried rows, and every bucket's tables (counts, results, new state, id
# memory, positions of late and duplicate events) come back in one collect, packed as Arrow
# IPC rows. Only when there are dead letters does a second job read their events again.


def run_epoch(
    spark,
    spec: Pipeline,
    events: Chunks | pa.Table,
    state: dict[str, pa.Table | Stored | None],
    ids: pa.Table | Stored | None,
    w_prev: int,
    w_new: int,
    single_task: bool = False,
    store: ObjectStore | None = None,
) -> EpochResult:
    """Process one epoch's events: its chunks in the store (`epoch_chunks`), or an Arrow table
    of chunk columns plus `_seg`, `_seq` (tests). The carried window state and id memory are
    Arrow tables or `Stored` objects the executors read.

    `single_task`: the whole epoch in one Spark task that reads the chunks itself, with no
    shuffle (for an epoch small enough for one worker, see `settings.single_task_rows`):
    the same results, without the fixed cost of stages and of handing the events from Python
    to the JVM and back.

    `store`: where the tables beyond the driver's room go (handover.py); None: every table
    through Spark (tests of the kernel alone)."""
    from pyspark.sql import functions as F

    if single_task:
        return run_epochs(spark, spec, [(events, w_prev, w_new)], state, ids, store)[0]
    handover = _handover(store, spec)
    packed = _bucketed(spark, F, spec, _frame_of(spark, events, spec), state, ids, w_prev, w_new, handover)
    return _gather(spark, F, spec, events, _unpacked(store, packed.toArrow(), 1)[0])


def _handover(store: ObjectStore | None, spec: Pipeline) -> Handover | None:
    return Handover.of_results(store, spec.name) if store is not None else None


def _unpacked(store: ObjectStore | None, packed: pa.Table, epochs: int) -> list[dict]:
    return unpacked(store, packed, epochs) if store is not None else unpack(packed, epochs)


def run_epochs(
    spark,
    spec: Pipeline,
    epochs: list[tuple[Chunks | pa.Table, int, int]],
    state: dict[str, pa.Table | Stored | None],
    ids: pa.Table | Stored | None,
    store: ObjectStore | None = None,
) -> list[EpochResult]:
    """Consecutive epochs, each (events, W before, W after), in ONE Spark task: the state and
    id memory each epoch leaves are carried in the task's memory to the next (sorted as the
    driver sorts what it stores, so every epoch sees what it would read back from the store),
    and the next epoch's chunks are fetched while one is computed. Each epoch's result is the
    one `run_epoch(..., single_task=True)` gives for it alone; the job's fixed cost and the
    carried rows' round trip through the store are paid once for all of them. For epochs that
    together fit one worker (the caller checks `settings.single_task_rows`).

    The task stops after the epoch whose packed results reach JOB_RESULT_BYTES: the results of
    the epochs it computed, a prefix of `epochs` (at least the first), are returned."""
    from pyspark.sql import functions as F

    packed = _one_task(spark, spec, epochs, state, ids, _handover(store, spec)).toArrow()
    # Every computed epoch has its one-row ("n", "") table, so the computed prefix is known.
    done = max(packed["epoch"].to_pylist(), default=-1) + 1
    if done == 0:
        raise RuntimeError("the kernel's task returned no epoch")
    per_epoch = _unpacked(store, packed, len(epochs))[:done]
    return [
        _gather(spark, F, spec, ev, tables) for (ev, _, _), tables in zip(epochs, per_epoch, strict=False)
    ]  # the epochs computed


def _frame_of(spark, events: Chunks | pa.Table, errors_of: Pipeline | None = None):
    """The events as a DataFrame with SRC; with ERR (`error_reasons`) for pipeline `errors_of`
    (chunks always have both)."""
    if isinstance(events, Chunks):
        return events.frame(spark)
    t: pa.Table = events
    if errors_of is not None and ERR not in t.column_names:
        t = t.append_column(ERR, error_reasons(errors_of, t))
    if SRC not in t.column_names:
        t = t.append_column(SRC, pa.nulls(t.num_rows, pa.string()))
    return spark.createDataFrame(t)


def _one_task(
    spark, spec: Pipeline, epochs: list[tuple[Chunks | pa.Table, int, int]], state, ids, handover: Handover | None
):
    """`bucket_epoch` over every event of each epoch in turn, with the window state and the id
    memory carried from one to the next (it also flags the repeated ids): one Spark stage of
    one task, driven by a one-row DataFrame."""
    carried = {w.name: state.get(w.name) for w in spec.windows}
    cores = session_cores(spark)
    budget = JOB_RESULT_BYTES  # read here: the task carries the value, not the module's name

    def task(batches):
        from concurrent.futures import ThreadPoolExecutor

        for _ in batches:  # the one driving row
            pass

        # The chunks and the carried objects are fetched side by side: each read mostly waits
        # on the store (pyarrow releases the GIL), ~30-60 ms per object one after the other.
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool, ThreadPoolExecutor(max_workers=1) as ahead:

            def events_of(ev: Chunks | pa.Table) -> pa.Table:
                return ev.table(pool) if isinstance(ev, Chunks) else ev

            loaded = {n: pool.submit(_load, x) for n, x in carried.items()}
            loaded_ids = pool.submit(_load, ids)
            nxt = ahead.submit(events_of, epochs[0][0])
            side = side_table(spec, {n: f.result() for n, f in loaded.items()}, loaded_ids.result())
            threads = task_threads(cores)
            sent = 0
            for i, (_, w_prev, w_new) in enumerate(epochs):
                ev = nxt.result()
                if i + 1 < len(epochs):  # the next epoch's chunks are read while this one is computed
                    nxt = ahead.submit(events_of, epochs[i + 1][0])
                out = bucket_epoch(spec, ev, side, w_prev, w_new, threads=threads)
                packed = pack(out, epoch=i)
                sent += packed.nbytes
                yield from (handover(packed) if handover is not None else packed).to_batches()
                if sent >= budget:
                    break  # the results the driver receives at once stay bounded: the rest is the next job's
                if i + 1 < len(epochs):
                    st = {
                        w.name: _sorted_or_none(out.get(("state", w.name)), ["key", "start", "end"])
                        for w in spec.windows
                    }
                    side = side_table(spec, st, _sorted_or_none(out.get(("ids", "")), ["id"]))

    return spark.range(0, 1, 1, 1).mapInArrow(task, packed_type())


def task_threads(cores: int) -> int:
    """The threads the only task of a job gives DuckDB, on its executor: `cores`
    (`sparkconf.session_cores`) as far as the executor has them. A job of many tasks gives each one."""
    import os

    return max(1, min(cores, len(os.sched_getaffinity(0))))


def _load(src: pa.Table | Stored | None) -> pa.Table | None:
    """A carried table, read from the store when it is `Stored` (on the executor running this)."""
    return _read_key(_fs(src.fs_options), src.bucket, src.key, None, []) if isinstance(src, Stored) else src


def _bucketed(spark, F, spec: Pipeline, events_df, state, ids, w_prev: int, w_new: int, handover: Handover | None):
    """Spark de-duplicates ids over the epoch, then shuffles events and carried rows by key
    bucket; each bucket's windows are computed by DuckDB in one Python worker."""
    from pyspark.sql import Window as SW

    ev = events_df.drop(SRC)  # a dead letter's text is read again for the dead letters only
    seen = None
    if spec.dedups:
        # A repeated id is a duplicate wherever it lands: flagged over the whole epoch (by id,
        # not by key bucket), against the id memory. An event the windows cannot process (`_err`)
        # is never a duplicate nor the first of its id: it is ordered last and not flagged, as
        # bucket_epoch sets it aside before it flags ids.
        seen = _frame(spark, IDS_DDL, ids)
        order = SW.partitionBy(ID).orderBy(F.col(ERR).isNotNull(), SEG, SEQ, ROW)
        ev = ev.withColumn("_rn", F.row_number().over(order)).join(
            seen.select(F.col("id").alias(ID), F.lit(True).alias("_seen")), on=ID, how="left"
        )
        repeated = (F.col("_rn") > 1) | F.col("_seen").isNotNull()
        # An event with no id (an input of a union that declares none) is never a duplicate.
        ev = ev.withColumn(DUP, F.col(ERR).isNull() & F.col(ID).isNotNull() & repeated).drop("_rn", "_seen")

    # Spark shuffles events and carried rows by key bucket; each bucket's windows are computed
    # by DuckDB in one Python worker (bucketkernel), and come back as Arrow IPC rows.
    buckets = 4 * session_cores(spark)
    side = _side(spark, F, spec, state, seen).withColumn("_b", _bucket(F, "key", buckets))

    share = handover.share(buckets) if handover is not None else None

    def one_bucket(events: pa.Table, carried: pa.Table) -> pa.Table:
        packed = pack(bucket_epoch(spec, events, carried, w_prev, w_new))
        return share(packed) if share is not None else packed

    return (
        ev.withColumn("_b", _bucket(F, KEY, buckets))
        .groupBy("_b")
        .cogroup(side.groupBy("_b"))
        .applyInArrow(one_bucket, packed_type())
    )


def _gather(spark, F, spec: Pipeline, events: Chunks | pa.Table, tables: dict) -> EpochResult:
    """The tables every bucket (or the one task) returned, as the epoch's result."""

    def gathered(kind: str, w: str, schema: pa.Schema) -> pa.Table:
        ts = [t.select(schema.names).cast(schema) for t in tables.get((kind, w), [])]
        return pa.concat_tables(ts) if ts else schema.empty_table()

    n_in = sum(t["n"][0].as_py() for t in tables.get(("n", ""), []))
    pos = pa.schema([(SEG, pa.string()), (SEQ, pa.int64()), (ROW, pa.int64())])
    dup = gathered("dup", "", pos)
    err = gathered("error", "", pos.append(pa.field(ERR, pa.string())))
    filtered = sum(t["n"][0].as_py() for t in tables.get(("filtered", ""), []))
    dead = [_with_reason(dup, "duplicate", None)] if dup.num_rows else []
    if err.num_rows:
        why = err[ERR]  # the whole reason: `error: ...` or `malformed: ...`
        no_window = pa.nulls(err.num_rows, pa.string())
        dead.append(err.select(pos.names).append_column("reason", why).append_column("window", no_window))
    results, late_by = {}, {}
    for w in spec.windows:
        late = gathered("late", w.name, pos)
        late_by[w.name] = late.num_rows
        if late.num_rows:
            dead.append(_with_reason(late, "late", w.name))
        out = gathered("out", w.name, _out_schema(w))
        st = gathered("state", w.name, _ddl_to_arrow(state_ddl(w)))
        # Results are sorted where they are written (engine.apply_changes, per partition); the
        # new state is written as it is, so it is sorted here: reruns write identical bytes.
        results[w.name] = (out, _sorted(st, ["key", "start", "end"]))
    dl = (
        _dead_letters(spark, F, spec, _frame_of(spark, events), pa.concat_tables(dead))
        if dead
        else DEAD_LETTER.empty_table()
    )
    counted_all = n_in - dup.num_rows
    windows = {}
    for name, (out, st) in results.items():
        # A window that names an input saw only its events (`seen`), the others' are `other`.
        seen = tables.get(("seen", name))
        mine = counted_all if seen is None else sum(t["n"][0].as_py() for t in seen)
        windows[name] = WindowResult(out, st, mine - late_by[name], late_by[name], other=counted_all - mine)
    ids_out = _sorted(gathered("ids", "", IDS), ["id"]) if spec.dedups else None
    return EpochResult(windows, dl, ids_out, n_in, dup.num_rows, errors=err.num_rows, filtered=filtered)


def _with_reason(positions: pa.Table, reason: str, window: str | None) -> pa.Table:
    n = positions.num_rows
    return positions.append_column("reason", pa.array([reason] * n, pa.string())).append_column(
        "window", pa.array([window] * n, pa.string())
    )


def _dead_letters(spark, F, spec: Pipeline, events_df, which: pa.Table) -> pa.Table:
    """The dead letters of the events at `which` positions (with their reason and window): the
    events are read again (the epoch's one job did not keep them) and joined by position."""
    rows = events_df.join(F.broadcast(spark.createDataFrame(which)), on=[SEG, SEQ, ROW], how="inner")
    return _sorted(_to_arrow(_dead(F, rows, spec), DEAD_LETTER), ["segment", "chunk", "row", "reason", "window"])


def _bucket(F, col: str, buckets: int):
    return F.pmod(F.xxhash64(F.col(col)), F.lit(buckets))


def _side(spark, F, spec: Pipeline, state, seen):
    """The carried rows by key: every window's state (partials under `side_column` names)
    and the id memory, in one DataFrame for the cogroup."""
    frames = []
    for i, w in enumerate(spec.windows):
        st = _frame(spark, state_ddl(w), state.get(w.name))
        parts = [c for a in w.aggregates for c, _ in partial_columns(a)]
        frames.append(
            st.select(
                F.lit(w.name).alias("_w"), "key", "start", "end", *[F.col(c).alias(side_column(i, c)) for c in parts]
            )
        )
    if seen is not None:
        frames.append(seen.select(F.lit(IDS_W).alias("_w"), "key", "id", "expires", "t"))
    side = frames[0]
    for f in frames[1:]:
        side = side.unionByName(f, allowMissingColumns=True)
    return side


def _out_schema(w: WindowSpec) -> pa.Schema:
    return _ddl_to_arrow(output_ddl(w)).append(pa.field("retract", pa.bool_()))
