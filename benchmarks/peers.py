"""The peers of the NEXMark-like comparison: Spark Structured Streaming and DuckDB, plus the
query definitions all three sides share and the normal form their outputs are compared in.

    .venv/bin/python benchmarks/peers.py spark  --query q5 --src DIR/bids --out OUT --delay-ms 9000 \
        --max-files 8 [--dedup] [--warm] [--master local[2]]
    .venv/bin/python benchmarks/peers.py duckdb --query q5 --src DIR/bids --out OUT.parquet [--dedup]

Each run prints one JSON line (timings, batches, rows); `compare.py` starts them as cold
processes and measures them from the outside (wall time, CPU, process-tree memory).

Spark Structured Streaming, as a Spark user would write the query: `readStream` of the bid
files (local Parquet, given schema, `maxFilesPerTrigger` = Wire's epoch budget, files taken in
modification-time order), `timestamp_millis(date_time)` as event time, `withWatermark` with
a delay, optionally `dropDuplicatesWithinWatermark(bid_id)`, then `window` / `session_window`
aggregation, `Trigger.AvailableNow`, Parquet sink in append mode (a window is written once,
when the watermark passes its end: its final result). Shuffle partitions = the local cores
(`wire_dagster.sparksession.get_spark`). The trailing windows are flushed by a sentinel bid far
in event-time future (`nexmark.write_sentinel`): it moves the watermark past every real window,
and the query's last, no-data batch emits them; the sentinel's own window never closes.

DuckDB is the floor: the same windows as one SQL batch over the same files (`r*.parquet`: the
sentinel is not read), tumbling/sliding by generated window starts, sessions by lag and a
cumulative sum per key with DESIGN §1's rule (two events exactly `gap` apart are one session).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa


@dataclass(frozen=True)
class Query:
    name: str
    title: str
    key: str | None  # bid field, None: one global group per window
    kind: str  # sliding | tumbling | session
    size_ms: int = 0
    slide_ms: int = 0
    gap_ms: int = 0
    agg: str = "count"  # count | max(price)
    column: str = "bids"  # output column

    @property
    def window_name(self) -> str:
        return {"sliding": "hot_items", "tumbling": "max_price", "session": "sessions"}[self.kind]


QUERIES = {
    "q5": Query(
        "q5", "Q5-like: bids per auction, sliding 10 s every 2 s", "auction", "sliding", size_ms=10_000, slide_ms=2_000
    ),
    "q7": Query(
        "q7",
        "Q7-like: highest price, tumbling 10 s (one global group)",
        None,
        "tumbling",
        size_ms=10_000,
        agg="max(price)",
        column="max_price",
    ),
    "q11": Query("q11", "Q11-like: bids per bidder session, gap 10 s", "bidder", "session", gap_ms=10_000),
}

#: The normal form of a result: key (string; null for q7), window bounds (epoch ms), value (int64).
NORMAL = pa.schema(
    [("key", pa.string()), ("window_start", pa.int64()), ("window_end", pa.int64()), ("value", pa.int64())]
)


def normalize(t: pa.Table, value_column: str) -> pa.Table:
    """Any side's result -> NORMAL, sorted. Values must be whole numbers (counts, prices in cents):
    a float that is not integral is an error, not something to round away."""
    import pyarrow.compute as pc

    cols = {}
    key = t["key"]
    cols["key"] = key if pa.types.is_string(key.type) else pc.cast(key, pa.string())
    for c in ("window_start", "window_end"):
        v = t[c]
        if pa.types.is_timestamp(v.type):
            v = pc.cast(pc.cast(v, pa.timestamp("ms", tz=v.type.tz)), pa.int64())
        cols[c] = pc.cast(v, pa.int64())
    val = t[value_column]
    if pa.types.is_floating(val.type):
        integral = pc.all(pc.equal(val, pc.floor(val)))  # pyright: ignore[reportAttributeAccessIssue]  generated at import
        if t.num_rows and not integral.as_py():
            raise ValueError(f"{value_column}: non-integral values in a result that must be whole numbers")
        val = pc.cast(val, pa.int64())
    elif pa.types.is_decimal(val.type):
        val = pc.cast(val, pa.int64())  # raises if a fraction would be lost
    cols["value"] = pc.cast(val, pa.int64())
    out = pa.table(cols, schema=NORMAL)
    return out.sort_by([("key", "ascending"), ("window_start", "ascending"), ("window_end", "ascending")])


def counted_bids(q: Query, t: pa.Table) -> float:
    """For a count query: how many bids its result counts (each bid is in size/slide sliding windows,
    one tumbling window, one session). Spark's watermark drops late rows without reporting them in
    numRowsDroppedByWatermark (seen with PySpark 4.3), so this is the check that nothing was dropped."""
    import pyarrow.compute as pc

    if q.agg != "count":
        raise ValueError(f"{q.name} is not a count query")
    per_bid = q.size_ms // q.slide_ms if q.kind == "sliding" else 1
    return (pc.sum(t["value"]).as_py() or 0) / per_bid  # pyright: ignore[reportAttributeAccessIssue]  generated at import


def diff(a: pa.Table, b: pa.Table, limit: int = 5) -> list[str]:
    """Differences between two NORMAL tables (empty list: equal)."""
    if a.equals(b):
        return []
    ka = {(r["key"], r["window_start"], r["window_end"]): r["value"] for r in a.to_pylist()}
    kb = {(r["key"], r["window_start"], r["window_end"]): r["value"] for r in b.to_pylist()}
    out = [f"rows {a.num_rows} vs {b.num_rows}"]
    only_a = sorted(set(ka) - set(kb), key=str)
    only_b = sorted(set(kb) - set(ka), key=str)
    vals = sorted((k for k in set(ka) & set(kb) if ka[k] != kb[k]), key=str)
    out += [f"only in first: {k} = {ka[k]}" for k in only_a[:limit]]
    out += [f"only in second: {k} = {kb[k]}" for k in only_b[:limit]]
    out += [f"value differs at {k}: {ka[k]} vs {kb[k]}" for k in vals[:limit]]
    out.append(f"({len(only_a)} only in first, {len(only_b)} only in second, {len(vals)} values differ)")
    return out


# ---------------------------------------------------------------------------
# Spark Structured Streaming


def spark_stream(spark, q: Query, src: Path, out: Path, ckpt: Path, delay_ms: int, max_files: int, dedup: bool):
    """Start the streaming query (Trigger.AvailableNow); returns the StreamingQuery."""
    from pyspark.sql import functions as F

    from benchmarks.nexmark import BID_SCHEMA

    ddl = ", ".join(f"{f.name} {'BIGINT' if pa.types.is_integer(f.type) else 'STRING'}" for f in BID_SCHEMA)
    ev = (
        spark.readStream.schema(ddl)
        .option("maxFilesPerTrigger", max_files)
        .parquet(str(src))
        .withColumn("ts", F.timestamp_millis("date_time"))
        .withWatermark("ts", f"{delay_ms} milliseconds")
    )
    if dedup:
        ev = ev.dropDuplicatesWithinWatermark(["bid_id"])
    if q.kind == "session":
        win = F.session_window("ts", f"{q.gap_ms} milliseconds")
    elif q.kind == "sliding":
        win = F.window("ts", f"{q.size_ms} milliseconds", f"{q.slide_ms} milliseconds")
    else:
        win = F.window("ts", f"{q.size_ms} milliseconds")
    keys = [win] + ([F.col(q.key)] if q.key else [])
    agg = F.count("*") if q.agg == "count" else F.max("price")
    res = ev.groupBy(*keys).agg(agg.alias(q.column))
    wcol = "session_window" if q.kind == "session" else "window"
    res = res.select(
        (F.col(q.key).cast("string") if q.key else F.lit(None).cast("string")).alias("key"),
        F.unix_millis(F.col(f"{wcol}.start")).alias("window_start"),
        F.unix_millis(F.col(f"{wcol}.end")).alias("window_end"),
        F.col(q.column),
    )
    return parquet_sink(res, out, ckpt)


def parquet_sink(df, out: Path, ckpt: Path):
    """Start the streaming DataFrame `df` into a Parquet sink at `out` in append mode (a window is
    written once, when the watermark passes its end: its final result), Trigger.AvailableNow."""
    return (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )


def batches(progress: list) -> int:
    """How many micro-batches a finished query ran, from its recent progress (last batch id + 1)."""
    return max((p["batchId"] for p in progress), default=-1) + 1


def spark_process(master: str, app: str, run: Callable[[Any, str], dict], first: str, warm: bool) -> None:
    """The Spark side of a peer process: a session (its start timed, a first job included), the
    query's run `run(spark, first)` and, with `warm`, its second run `run(spark, "warm")` in the same
    session (unless the first was refused); prints the figures as one JSON line."""
    from wire_dagster.sparksession import get_spark

    # Spark as it ships: without the class archive Wire's own JVMs map (wire_dagster/jvmarchive.py)
    # and with the JVM's own compiler thresholds (sparkconf.LATE_C2).
    os.environ["WIRE_SPARK_CDS"] = "false"
    os.environ["WIRE_SPARK_LATE_C2"] = "false"
    t0 = time.perf_counter()
    spark = get_spark(master=master, app=app)
    spark.range(1).count()
    res: dict = {"session_seconds": time.perf_counter() - t0}
    try:
        res.update(run(spark, first))
        if warm and "refused" not in res:
            res["warm"] = run(spark, "warm")
    finally:
        spark.stop()
    print(json.dumps(res))


def run_spark(spark, q: Query, src: Path, out: Path, ckpt: Path, delay_ms: int, max_files: int, dedup: bool) -> dict:
    t0 = time.perf_counter()
    sq = spark_stream(spark, q, src, out, ckpt, delay_ms, max_files, dedup)
    sq.awaitTermination()
    dt = time.perf_counter() - t0
    if sq.exception() is not None:
        raise RuntimeError(f"streaming query failed: {sq.exception()}")
    prog = sq.recentProgress  # the last 100 batches (spark.sql.streaming.numRecentProgressUpdates)
    return {
        "seconds": dt,
        "batches": batches(prog),
        "input_rows": sum(p.get("numInputRows", 0) for p in prog) if len(prog) < 100 else None,
    }


def read_spark_output(out: Path) -> pa.Table:
    """The Parquet sink's committed files (its _spark_metadata log names them)."""
    import pyarrow.parquet as pq

    files: set[str] = set()  # a compacted log (N.compact) repeats the entries of the batches before it
    for log in sorted((out / "_spark_metadata").iterdir()):
        if not log.name.split(".")[0].isdigit():
            continue
        for line in log.read_text().splitlines()[1:]:  # first line: the log version
            entry = json.loads(line)
            if entry.get("action", "add") == "add":
                files.add(entry["path"].removeprefix("file://").removeprefix("file:"))
    tables = [pq.read_table(f) for f in sorted(files)]
    if not tables:
        raise RuntimeError(f"the Spark sink at {out} committed no file")
    return pa.concat_tables(tables)


# ---------------------------------------------------------------------------
# DuckDB


def duckdb_sql(q: Query, src_glob: str, dedup: bool) -> str:
    src = f"read_parquet('{src_glob}')"
    if dedup:  # same semantics as the id field: the first occurrence of an id counts (none repeat here)
        src = f"(SELECT * FROM {src} QUALIFY row_number() OVER (PARTITION BY bid_id ORDER BY date_time) = 1)"
    key = f"CAST({q.key} AS VARCHAR)" if q.key else "CAST(NULL AS VARCHAR)"
    val = "count(*)" if q.agg == "count" else "max(price)"
    if q.kind == "tumbling":
        return f"""SELECT {key} AS key, date_time - (date_time % {q.size_ms}) AS window_start,
                          date_time - (date_time % {q.size_ms}) + {q.size_ms} AS window_end, {val} AS {q.column}
                   FROM {src} GROUP BY ALL"""
    if q.kind == "sliding":
        n = q.size_ms // q.slide_ms
        return f"""SELECT key, ws AS window_start, ws + {q.size_ms} AS window_end, {val} AS {q.column} FROM (
                     SELECT {key} AS key, price, date_time - (date_time % {q.slide_ms}) - k * {q.slide_ms} AS ws
                     FROM {src}, range(0, {n}) r(k))
                   GROUP BY ALL"""
    # sessions: a new session when the previous event of the key is more than `gap` earlier
    return f"""SELECT key, min(date_time) AS window_start, max(date_time) + {q.gap_ms} AS window_end,
                      {val} AS {q.column} FROM (
                 SELECT *, sum(brk) OVER (PARTITION BY key ORDER BY date_time ROWS UNBOUNDED PRECEDING) AS sid FROM (
                   SELECT {key} AS key, date_time, price,
                          CASE WHEN date_time - lag(date_time) OVER (PARTITION BY {key} ORDER BY date_time)
                                    <= {q.gap_ms} THEN 0 ELSE 1 END AS brk
                   FROM {src}))
               GROUP BY key, sid"""


def run_duckdb(q: Query, src: Path, dedup: bool, threads: int | None = None) -> tuple[pa.Table, float]:
    return timed_sql(duckdb_sql(q, str(src / "r*.parquet"), dedup), threads)


def timed_sql(sql: str, threads: int | None = None, views: dict[str, str] | None = None) -> tuple[pa.Table, float]:
    """`sql` in a fresh DuckDB with `threads` threads (default: the cores), after creating `views`
    (name -> table expression); its result and the seconds it took, the views' creation included."""
    import duckdb

    from benchmarks.common import cpu_count

    con = duckdb.connect()
    con.execute(f"SET threads={threads or cpu_count()}")
    t0 = time.perf_counter()
    for name, expr in (views or {}).items():
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM {expr}")
    t = con.sql(sql).to_arrow_table()
    dt = time.perf_counter() - t0
    con.close()
    return t, dt


def write_duckdb_result(t: pa.Table, seconds: float, out: Path) -> None:
    """A DuckDB peer's result to the Parquet file `out`, and its figures as one JSON line."""
    import pyarrow.parquet as pq

    pq.write_table(t, out)
    print(json.dumps({"seconds": seconds, "rows": t.num_rows}))


# ---------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("engine", choices=("spark", "duckdb"))
    ap.add_argument("--query", required=True, choices=sorted(QUERIES))
    ap.add_argument("--src", type=Path, required=True, help="directory of the bid files")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--delay-ms", type=int, default=0, help="Spark: withWatermark delay")
    ap.add_argument("--max-files", type=int, default=8, help="Spark: maxFilesPerTrigger")
    ap.add_argument("--dedup", action="store_true", help="de-duplicate by bid_id, as Wire does with an id field")
    ap.add_argument("--warm", action="store_true", help="Spark: run the query a second time in the same session")
    ap.add_argument("--master", default="local[2]")
    a = ap.parse_args()
    q = QUERIES[a.query]
    if a.engine == "duckdb":
        write_duckdb_result(*run_duckdb(q, a.src, a.dedup), a.out)
        return 0

    def run(spark, name: str) -> dict:
        return run_spark(spark, q, a.src, a.out / name, a.out / f"ckpt-{name}", a.delay_ms, a.max_files, a.dedup)

    spark_process(a.master, f"nexmark-{q.name}", run, "cold", a.warm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
