"""The Spark window kernel: one epoch of event-time processing with DataFrames.

Given the chunks of epoch N, the window state and id memory after N-1, and the
watermarks `W_{N-1}` and `W_N`, it computes (DESIGN §1):

- per window: the results that fire or re-fire in N (``W_{N-1} < end <= W_N``,
  or ``end <= W_N`` and changed in N), the retractions of fired sessions that
  merged away, and the new state (windows with ``end + lateness > W_N``);
- dead letters: ``late`` (per window: the event counts toward none of its
  windows, i.e. every one has ``end + lateness <= W_{N-1}``) and ``duplicate``;
- the counts that must balance: ``in = counted + late + duplicate`` per window.

Events, and the window state and id memory carried from N-1, are read from the
object store on the executors (``mapInArrow`` with pyarrow's S3 filesystem); only
results, the new state and dead letters — bounded by window state, not by input —
come back to the driver, as Arrow tables, which stages them.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from .aggregates import SCALE, output_ddl, partial_columns, source_column, state_ddl
from .spec import Aggregate, Pipeline, WindowSpec, field_column
from .streams import ID, KEY, ROW, TIME, ChunkMeta, chunk_schema

# Columns every event row carries in Spark besides the chunk's own.
SEG, SEQ = "_seg", "_seq"

_FS_CACHE: dict = {}


def _fs(opts: dict):
    from .objectstore import arrow_fs_from_options

    k = tuple(sorted(opts.items()))
    if k not in _FS_CACHE:
        _FS_CACHE[k] = arrow_fs_from_options(opts)
    return _FS_CACHE[k]


def read_parquet_keys(spark, fs_options: dict, bucket: str, keys: list[tuple], schema: pa.Schema, extra: list[tuple[str, pa.DataType]]):
    """A DataFrame of the Parquet objects `keys` (tuples of key + extra column values),
    read in parallel on the executors with pyarrow's S3 filesystem."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    out_schema = pa.schema(list(schema) + [pa.field(n, t) for n, t in extra])

    def read(batches):
        fs = _fs(fs_options)
        for b in batches:
            for row in b.to_pylist():
                t = pq.read_table(f"{bucket}/{row['k']}", filesystem=fs, schema=schema)
                for n, typ in extra:
                    t = t.append_column(pa.field(n, typ), pa.array([row[n]] * t.num_rows, typ))
                yield from t.select(out_schema.names).cast(out_schema).to_batches(max_chunksize=65536)

    key_schema = "k STRING" + "".join(f", {n} {'BIGINT' if pa.types.is_integer(t) else 'STRING'}" for n, t in extra)
    kdf = spark.createDataFrame([tuple(k) for k in keys], key_schema) if keys else spark.createDataFrame([], key_schema)
    parts = max(1, min(len(keys), int(spark.conf.get("spark.sql.shuffle.partitions", "2")) * 2))
    spark_schema = from_arrow_schema(out_schema)
    return kdf.repartition(parts).mapInArrow(read, spark_schema)


def read_events(spark, fs_options: dict, bucket: str, spec: Pipeline, chunks: list[ChunkMeta]):
    keys = [(c.data_key, c.segment, c.seq) for c in chunks if c.data_key]
    return read_parquet_keys(spark, fs_options, bucket, keys, chunk_schema(spec), [(SEG, pa.string()), (SEQ, pa.int64())])


# ---------------------------------------------------------------------------


@dataclass
class WindowResult:
    outputs: pa.Table  # output_ddl columns + `retract` (bool)
    state: pa.Table  # state_ddl columns
    counted: int
    late: int


@dataclass
class EpochResult:
    windows: dict[str, WindowResult]
    dead_letters: pa.Table  # DEAD_LETTER schema
    ids: pa.Table | None  # id memory after the epoch: (id, expires)
    events: int
    duplicate: int
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
IDS = pa.schema([("id", pa.string()), ("expires", pa.int64()), ("key", pa.string()), ("t", pa.int64())])
IDS_DDL = "id STRING, expires BIGINT, key STRING, t BIGINT"


def _partial_exprs(F, w: WindowSpec):
    """Partials of one event (pre-aggregation) as column expressions."""
    cols = []
    for a in w.aggregates:
        src = source_column(a)
        for c, typ in partial_columns(a):
            if c.endswith("_n"):
                cols.append(F.lit(1).cast("bigint").alias(c))
            elif c.endswith("_s"):
                cols.append(F.col(src).cast(f"decimal(38,{SCALE})").alias(c))
            elif c.endswith("_nn"):
                cols.append(F.when(F.col(src).isNotNull(), 1).otherwise(0).cast("bigint").alias(c))
            elif c.endswith("_m"):
                cols.append(F.col(src).cast("double").alias(c))
            else:
                cols.append(F.when(F.col(src).isNotNull(), F.array(F.col(src).cast("string"))).otherwise(F.array().cast("array<string>")).alias(c))
    return cols


def _merge_aggs(F, w: WindowSpec):
    """Aggregations merging partial rows into one."""
    out = []
    for a in w.aggregates:
        for c, _ in partial_columns(a):
            if c.endswith(("_n", "_nn")):
                out.append(F.sum(c).cast("bigint").alias(c))
            elif c.endswith("_s"):
                out.append(F.sum(c).cast(f"decimal(38,{SCALE})").alias(c))
            elif c.endswith("_m"):
                out.append((F.min(c) if a.func == "min" else F.max(c)).alias(c))
            else:
                out.append(F.array_sort(F.array_distinct(F.flatten(F.collect_list(c)))).alias(c))
    return out


def _finalize(F, a: Aggregate):
    p = f"p_{a.name}"
    if a.func == "count":
        return F.col(f"{p}_n").alias(a.name)
    if a.func == "sum":
        return F.when(F.col(f"{p}_nn") > 0, F.col(f"{p}_s").cast("double")).alias(a.name)
    if a.func == "avg":
        return F.when(F.col(f"{p}_nn") > 0, (F.col(f"{p}_s") / F.col(f"{p}_nn")).cast("double")).alias(a.name)
    if a.func in ("min", "max"):
        return F.col(f"{p}_m").alias(a.name)
    return F.size(f"{p}_set").cast("bigint").alias(a.name)


def _event_json(F, spec: Pipeline):
    """The event as the pipeline sees it, for dead letters."""
    # One entry per field name: a field can be both the key (or id) and an aggregate's field,
    # e.g. count_distinct(user) keyed by user, and Spark refuses duplicate map keys.
    pairs = {spec.time_field: F.col(TIME).cast("string")}
    if spec.key_field:
        pairs.setdefault(spec.key_field, F.col(KEY))
    if spec.id_field:
        pairs.setdefault(spec.id_field, F.col(ID))
    for f in sorted(set(spec.numeric_fields) | set(spec.distinct_fields) | set(spec.gap_fields)):
        pairs.setdefault(f, F.col(field_column(f)).cast("string"))
    return F.to_json(F.map_from_arrays(F.array(*[F.lit(k) for k in pairs]), F.array(*pairs.values())))


def _dead(F, df, spec: Pipeline, reason: str, window: str | None):
    return df.select(
        F.lit(reason).alias("reason"),
        F.lit(window).cast("string").alias("window"),
        _event_json(F, spec).alias("event"),
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


def _ddl_to_arrow(spark, ddl: str) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_string

    return to_arrow_schema(_parse_datatype_string(ddl))


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
    if isinstance(src, Stored):
        return read_parquet_keys(spark, src.fs_options, src.bucket, [(src.key,)], _ddl_to_arrow(spark, ddl), [])
    if src is None or src.num_rows == 0:
        return spark.createDataFrame([], ddl)
    return spark.createDataFrame(src.cast(_ddl_to_arrow(spark, ddl)))


# The kernel's Spark jobs are few on purpose: an epoch's fixed cost is a few hundred ms per
# job, so each window's results and new state come back in ONE collect (rows flagged `_fire`,
# `_keep`, `_retract`, split and sorted on the driver), the dead letters of every reason and
# window in one more, and late counts are read off the collected dead letters.


def run_epoch(
    spark,
    spec: Pipeline,
    events_df,
    state: dict[str, pa.Table | Stored | None],
    ids: pa.Table | Stored | None,
    w_prev: int,
    w_new: int,
) -> EpochResult:
    """Process one epoch's events (a DataFrame from `read_events`). The carried window state
    and id memory are Arrow tables or `Stored` objects the executors read."""
    from pyspark.sql import Window as SW
    from pyspark.sql import functions as F

    ev = events_df
    dead = []
    seen = None
    if spec.id_field:
        seen = _frame(spark, IDS_DDL, ids)
        order = SW.partitionBy(ID).orderBy(SEG, SEQ, ROW)
        ev = ev.withColumn("_rn", F.row_number().over(order)).join(
            seen.select(F.col("id").alias(ID), F.lit(True).alias("_seen")), on=ID, how="left"
        )
        ev = ev.withColumn("_dup", (F.col("_rn") > 1) | F.col("_seen").isNotNull()).drop("_rn", "_seen")
    else:
        ev = ev.withColumn("_dup", F.lit(False))
    # The epoch's events are read from the object store once, here. Cached (not checkpointed)
    # and released when the epoch ends, so nothing piles up in the block manager over a backlog.
    cached = [ev.persist(_storage())]
    try:
        return _epoch(spark, F, SW, spec, cached, dead, state, seen, w_prev, w_new)
    finally:
        for df in cached:
            df.unpersist()


def _storage():
    from pyspark import StorageLevel

    return StorageLevel.MEMORY_AND_DISK


def _epoch(spark, F, SW, spec: Pipeline, cached: list, dead: list, state, seen, w_prev: int, w_new: int) -> EpochResult:
    """The rest of `run_epoch`, over the cached events (`cached[0]`, with a `_dup` flag)."""
    L = spec.allowed_lateness
    ev = cached[0]
    n_in, duplicate = ev.agg(F.count(F.lit(1)), F.coalesce(F.sum(F.col("_dup").cast("bigint")), F.lit(0))).first()
    if duplicate:
        dead.append(_dead(F, ev.filter(F.col("_dup")), spec, "duplicate", None))
    ev = ev.filter(~F.col("_dup")).drop("_dup")
    ids_df = ids_out = None
    if spec.id_field:
        # Remember ids while a window that counted them can still change.
        extent = spec.max_extent + L
        if spec.gap_fields:
            ext = F.greatest(F.lit(spec.max_extent), *[F.coalesce(F.col(field_column(g)), F.lit(0)) for g in spec.gap_fields]) + L
        else:
            ext = F.lit(extent)
        fresh = ev.select(F.col(ID).alias("id"), (F.col(TIME) + ext).alias("expires"), F.col(KEY).alias("key"), F.col(TIME).alias("t"))
        ids_df = seen.unionByName(fresh)  # disjoint: `fresh` holds neither seen ids nor repeats

    parts, kept = {}, {}
    for w in spec.windows:
        st = _frame(spark, state_ddl(w), state.get(w.name))
        if w.type == "session":
            parts[w.name], late_df, kept[w.name] = _session(spark, F, SW, spec, w, ev, st, w_prev, w_new, cached)
        else:
            parts[w.name], late_df, kept[w.name] = _fixed(spark, F, spec, w, ev, st, w_prev, w_new)
        dead.append(_dead(F, late_df, spec, "late", w.name))

    d = dead[0]
    for x in dead[1:]:
        d = d.unionByName(x)
    dl = _sorted(_to_arrow(d, DEAD_LETTER), ["segment", "chunk", "row", "reason", "window"])
    late_w = pc.value_counts(dl.filter(pc.equal(dl["reason"], "late"))["window"]).to_pylist() if dl.num_rows else []
    late_by = {x["values"]: x["counts"] for x in late_w}
    counted_all = n_in - duplicate
    results = {
        name: WindowResult(out, st, counted_all - late_by.get(name, 0), late_by.get(name, 0)) for name, (out, st) in parts.items()
    }

    if spec.id_field:
        # An id inside a session that is still open is kept until that session is purged:
        # a retried event would otherwise touch the open session and be counted again.
        for w in spec.windows:
            if w.type == "session":
                s = kept[w.name].select(
                    F.col("key").alias("_sk"), F.col("start").alias("_ss"), F.col("end").alias("_se")
                )
                inside = F.col("key").eqNullSafe(F.col("_sk")) & (F.col("_ss") <= F.col("t")) & (F.col("t") < F.col("_se"))
                ids_df = ids_df.join(s, inside, "left").select(
                    "id", F.greatest(F.col("expires"), F.col("_se") + F.lit(L)).alias("expires"), "key", "t"
                )
        ids_out = _sorted(_to_arrow(ids_df.filter(F.col("expires") > F.lit(w_new)), IDS), ["id"])

    return EpochResult(results, dl, ids_out, n_in, duplicate)


def _outputs(F, w: WindowSpec, df, retract: bool):
    return df.select(
        F.col("key"),
        F.col("start").alias("window_start"),
        F.col("end").alias("window_end"),
        *[_finalize(F, a) for a in w.aggregates],
        F.lit(retract).alias("retract"),
    )


def _out_schema(spark, w: WindowSpec) -> pa.Schema:
    return _ddl_to_arrow(spark, output_ddl(w)).append(pa.field("retract", pa.bool_()))


def _collect_split(spark, F, w: WindowSpec, flagged) -> tuple[pa.Table, pa.Table]:
    """One collect of rows flagged `_fire` / `_keep` / `_retract` (partials + finalized values),
    split on the driver into (outputs, new state)."""
    aggs = [a.name for a in w.aggregates]
    partials = [c for a in w.aggregates for c, _ in partial_columns(a)]
    # Finalized values under temporary names: an aggregate may share a partial's name prefix only.
    cols = ["key", "start", "end", *partials]
    df = flagged.select(*cols, *[_finalize(F, a).alias(f"_o_{a.name}") for a in w.aggregates], "_fire", "_keep", "_retract")
    t = df.toArrow()
    out_schema, st_schema = _out_schema(spark, w), _ddl_to_arrow(spark, state_ddl(w))
    if t.num_rows == 0:
        return out_schema.empty_table(), st_schema.empty_table()
    fire = t.filter(pc.or_(t["_fire"], t["_retract"]))
    outputs = pa.table(
        [fire["key"], fire["start"], fire["end"], *[fire[f"_o_{n}"] for n in aggs], fire["_retract"]],
        names=["key", "window_start", "window_end", *aggs, "retract"],
    ).cast(out_schema)
    keep = t.filter(t["_keep"])
    new_state = keep.select(cols).cast(st_schema)
    return _sorted(outputs, ["key", "window_start", "window_end", "retract"]), _sorted(new_state, ["key", "start", "end"])


def _fixed(spark, F, spec: Pipeline, w: WindowSpec, ev, st, w_prev: int, w_new: int):
    """Tumbling and sliding windows: explode each event into its size/slide windows."""
    L = spec.allowed_lateness
    n = w.size // w.slide
    last = F.col(TIME) - F.pmod(F.col(TIME) - F.lit(w.offset), F.lit(w.slide))
    ev2 = ev.withColumn("_last", last)
    # The newest window of an event ends last: if it is expired, all are.
    late_df = ev2.filter(F.col("_last") + F.lit(w.size + L) <= F.lit(w_prev))
    elig = ev2.filter(F.col("_last") + F.lit(w.size + L) > F.lit(w_prev))
    if n > 1:
        elig = elig.withColumn("_k", F.explode(F.sequence(F.lit(0), F.lit(n - 1))))
        shift = F.col("_k") * F.lit(w.slide)
    else:
        shift = F.lit(0).cast("bigint")
    exploded = elig.select(
        F.col(KEY).alias("key"),
        (F.col("_last") - shift).alias("start"),
        (F.col("_last") - shift + F.lit(w.size)).alias("end"),
        *_partial_exprs(F, w),
    )
    # Drop the individual windows already purged (end + L <= W_prev).
    exploded = exploded.filter(F.col("end") + F.lit(L) > F.lit(w_prev))
    delta = exploded.withColumn("_touched", F.lit(True))
    merged = (
        st.withColumn("_touched", F.lit(False))
        .unionByName(delta)
        .groupBy("key", "start", "end")
        .agg(*_merge_aggs(F, w), F.max("_touched").alias("_touched"))
    )
    flagged = merged.select(
        "*",
        ((F.col("end") <= F.lit(w_new)) & (F.col("_touched") | (F.col("end") > F.lit(w_prev)))).alias("_fire"),
        (F.col("end") + F.lit(L) > F.lit(w_new)).alias("_keep"),
        F.lit(False).alias("_retract"),
    ).filter(F.col("_fire") | F.col("_keep"))
    return _collect_split(spark, F, w, flagged), late_df, flagged.filter(F.col("_keep"))


def _session(spark, F, SW, spec: Pipeline, w: WindowSpec, ev, st, w_prev: int, w_new: int, cached: list):
    """Session windows: one-event windows, merged per key with the open sessions of the state."""
    L = spec.allowed_lateness
    gap = F.lit(w.gap)
    if w.gap_field:
        g = F.col(field_column(w.gap_field))
        gap = F.when(g.isNotNull() & (g > 0), g).otherwise(F.lit(w.gap))
    proto = ev.withColumn("start", F.col(TIME)).withColumn("end", F.col(TIME) + gap)
    maybe_late = proto.filter(F.col("end") + F.lit(L) <= F.lit(w_prev))
    # A late one-event window still counts if it touches an open session of its key (Flink merges first).
    s = st.select(F.col("key").alias("_sk"), F.col("start").alias("_ss"), F.col("end").alias("_se"))
    touch_cond = F.col(KEY).eqNullSafe(F.col("_sk")) & (F.col("_ss") <= F.col("end")) & (F.col("start") <= F.col("_se"))
    rescued = maybe_late.join(s, touch_cond, "left_semi")
    late_df = maybe_late.join(s, touch_cond, "left_anti")
    elig = proto.filter(F.col("end") + F.lit(L) > F.lit(w_prev)).unionByName(rescued)
    pieces_new = elig.select(
        F.col(KEY).alias("key"), "start", "end", *_partial_exprs(F, w),
        F.lit(True).alias("_touched"), F.lit(None).cast("bigint").alias("_os"), F.lit(None).cast("bigint").alias("_oe"),
    )
    # Every open session goes through the sweep: the sessions of one key in the state neither
    # overlap nor touch (they would have merged), so a state session no event of this epoch
    # reaches stays a group of its own, unchanged and untouched.
    pieces = st.withColumn("_touched", F.lit(False)).withColumn("_os", F.col("start")).withColumn("_oe", F.col("end")).unionByName(pieces_new)
    order = SW.partitionBy("key").orderBy("start", "end")
    pieces = pieces.withColumn(
        "_pmax", F.max("end").over(order.rowsBetween(SW.unboundedPreceding, -1))
    ).withColumn("_new", F.when(F.col("_pmax").isNull() | (F.col("start") > F.col("_pmax")), 1).otherwise(0))
    pieces = pieces.withColumn("_grp", F.sum("_new").over(order.rowsBetween(SW.unboundedPreceding, 0)))
    # Group bounds and members in one pass per key: the fired state sessions of a group whose
    # bounds changed (merged with new events or with each other) are retracted.
    grp = SW.partitionBy("key", "_grp")
    pieces = pieces.withColumn("_gs", F.min("start").over(grp)).withColumn("_ge", F.max("end").over(grp)).persist(_storage())
    cached.append(pieces)  # read twice (groups, retractions) by one collect
    groups = pieces.groupBy("key", "_grp").agg(
        F.min("start").alias("start"), F.max("end").alias("end"), *_merge_aggs(F, w), F.max("_touched").alias("_touched")
    ).drop("_grp")
    partials = [c for a in w.aggregates for c, _ in partial_columns(a)]
    retracted = pieces.filter(
        F.col("_os").isNotNull() & (F.col("_oe") <= F.lit(w_prev)) & ((F.col("_os") != F.col("_gs")) | (F.col("_oe") != F.col("_ge")))
    ).select("key", F.col("_os").alias("start"), F.col("_oe").alias("end"), *partials)
    flagged = groups.select(
        "key", "start", "end", *partials,
        ((F.col("end") <= F.lit(w_new)) & (F.col("_touched") | (F.col("end") > F.lit(w_prev)))).alias("_fire"),
        (F.col("end") + F.lit(L) > F.lit(w_new)).alias("_keep"),
        F.lit(False).alias("_retract"),
    ).filter(F.col("_fire") | F.col("_keep"))
    kept = flagged.filter(F.col("_keep"))  # the new state, for the id memory (recomputed from `pieces`)
    flagged = flagged.unionByName(
        retracted.withColumn("_fire", F.lit(False)).withColumn("_keep", F.lit(False)).withColumn("_retract", F.lit(True))
    )
    return _collect_split(spark, F, w, flagged), late_df, kept


def table_bytes(t: pa.Table) -> bytes:
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(t, buf, compression="zstd")
    return buf.getvalue()
