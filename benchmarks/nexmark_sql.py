"""The real NEXMark queries q5, q7, q8 and q11 outside Wire: DuckDB SQL (the reference of
tests/test_nexmark_queries.py and the floor of benchmarks/nexmark_queries.py) and Spark
Structured Streaming, plus the row-set form all engines' outputs are compared in.

    .venv/bin/python benchmarks/nexmark_sql.py duckdb --query q5 --data DIR --out OUT.parquet
    .venv/bin/python benchmarks/nexmark_sql.py spark --query q5 --data DIR --out OUTDIR --delay-ms 4000 \
        [--warm] [--master local[2]]

Each run prints one JSON line (timings, rows, or the error that refused the query);
nexmark_queries.py starts them as processes and measures them from the outside.

The SQL reads three tables, `persons`, `auctions` and `bids` (the generator's columns,
benchmarks/nexmark.py); each query is written as the nexmark repository's (nexmark-flink's
queries/*.sql) with Wire's semantics where pipelines/nexmark/*.yaml say they differ (q7: a
bid meets the maximum of its own window [start, end), not BETWEEN's closed interval).

Spark Structured Streaming, as a Spark user would write each query: `readStream` of the
stream's Parquet files (a directory per stream, `maxFilesPerTrigger` = the stream's real files,
so that its data is one batch as it is one epoch in Wire, and a sentinel event far in the
event-time future is a batch of its own: nexmark.write_sentinel), `withWatermark` on
`timestamp_millis(date_time)`, window / session_window aggregations, windowed stream-stream
joins, `Trigger.AvailableNow`, Parquet sink in append mode. Where Spark refuses a query (an
AnalysisException at start), the JSON line carries the error's first line instead of a time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pyarrow as pa

from benchmarks.peers import batches, parquet_sink, spark_process, timed_sql, write_duckdb_result

# ---------------------------------------------------------------------------
# DuckDB: the reference SQL (tables persons, auctions, bids)

Q11 = """
    WITH o AS (
        SELECT bidder, date_time AS t,
               CASE WHEN date_time - lag(date_time) OVER (PARTITION BY bidder ORDER BY date_time) <= 10000
                    THEN 0 ELSE 1 END AS brk
        FROM bids),
    s AS (SELECT *, sum(brk) OVER (PARTITION BY bidder ORDER BY t ROWS UNBOUNDED PRECEDING) AS sid FROM o)
    SELECT CAST(bidder AS VARCHAR) AS key, min(t) AS window_start, max(t) + 10000 AS window_end,
           count(*) AS bid_count
    FROM s GROUP BY bidder, sid ORDER BY key, window_start
"""
Q5 = """
    WITH hop AS (
        SELECT auction, ws AS starttime, ws + 10000 AS endtime, count(*) AS num
        FROM (SELECT auction, date_time - date_time % 2000 - k * 2000 AS ws FROM bids, range(0, 5) r(k))
        GROUP BY ALL),
    maxbids AS (SELECT starttime, endtime, max(num) AS maxn FROM hop GROUP BY ALL)
    SELECT CAST(h.auction AS VARCHAR) AS auction, h.num, h.starttime, h.endtime
    FROM hop h JOIN maxbids m ON h.starttime = m.starttime AND h.endtime = m.endtime AND h.num >= m.maxn
"""
Q8 = """
    SELECT CAST(p.id AS VARCHAR) AS id, p.name, p.starttime
    FROM (SELECT id, name, date_time - date_time % 10000 AS starttime FROM persons GROUP BY ALL) p
    JOIN (SELECT seller, date_time - date_time % 10000 AS starttime FROM auctions GROUP BY ALL) a
      ON p.id = a.seller AND p.starttime = a.starttime
"""
Q7 = """
    WITH b AS (SELECT *, date_time - date_time % 10000 AS ws FROM bids),
    m AS (SELECT ws, max(price) AS maxprice FROM b GROUP BY ws)
    SELECT b.auction, b.price, b.bidder, b.date_time
    FROM b JOIN m ON b.ws = m.ws AND b.price = m.maxprice
"""
SQL = {"q5": Q5, "q7": Q7, "q8": Q8, "q11": Q11}

#: Per query: the Wire stages in dependency order (pipelines/nexmark/<stage>.yaml, pipeline
#: `nexmark_<stage>`), the final stage's output window, the compared columns, the streams read.
QUERIES: dict[str, dict] = {
    "q5": {
        "stages": ["q5_counts", "q5_max", "q5"],
        "window": "hot_items",
        "columns": ["auction", "num", "starttime", "endtime"],
        "streams": ["bids"],
        "title": "hot items: bids per auction in sliding 10 s / 2 s windows, the top auctions of each (ties kept)",
    },
    "q7": {
        "stages": ["q7_max", "q7"],  # q7's tick ticks nexmark_q7__bids (its raw bids) first
        "window": "highest_bids",
        "columns": ["auction", "price", "bidder", "date_time"],
        "streams": ["bids"],
        "title": "highest bid: the bids of each tumbling 10 s window at its maximum price (ties kept)",
    },
    "q8": {
        "stages": ["q8_persons", "q8_auctions", "q8"],
        "window": "new_sellers",
        "columns": ["id", "name", "starttime"],
        "streams": ["persons", "auctions"],
        "title": "monitor new users: persons who opened an auction in the tumbling 10 s window they registered in",
    },
    "q11": {
        "stages": ["q11"],
        "window": "sessions",
        "columns": ["key", "window_start", "window_end", "bid_count"],
        "streams": ["bids"],
        "title": "user sessions: bids per bidder session, gap 10 s",
    },
}


def rows(t: pa.Table, columns: list[str]) -> list[tuple]:
    """A result as a sorted list of tuples over `columns` (a multiset of rows), every value in one
    form whatever the engine's types: whole floats and decimals as int, timestamps as epoch ms."""
    import pyarrow.compute as pc

    cols = []
    for c in columns:
        v = t[c]
        if pa.types.is_timestamp(v.type):
            v = pc.cast(pc.cast(v, pa.timestamp("ms", tz=v.type.tz)), pa.int64())
        cols.append(v.to_pylist())

    def norm(x):
        if isinstance(x, float) and x.is_integer():
            return int(x)
        if x.__class__.__name__ == "Decimal":
            return int(x) if x == int(x) else float(x)
        return x

    return sorted(tuple(norm(x) for x in r) for r in zip(*cols, strict=True)) if cols else []


def row_diff(a: list[tuple], b: list[tuple], limit: int = 3) -> list[str]:
    """Differences between two sorted row lists (empty: equal as multisets)."""
    if a == b:
        return []
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    only_a, only_b = list((ca - cb).elements()), list((cb - ca).elements())
    out = [f"rows {len(a):,} vs {len(b):,}; {len(only_a):,} only in the first, {len(only_b):,} only in the second"]
    out += [f"only in the first: {r}" for r in only_a[:limit]]
    out += [f"only in the second: {r}" for r in only_b[:limit]]
    return out


def duckdb_tables(data: Path) -> dict[str, str]:
    """The generator's files (benchmarks/nexmark.py write_dataset) as DuckDB table expressions;
    the sentinels (spark/*/zz-sentinel.parquet) are not read."""
    return {
        "bids": f"read_parquet('{data / 'bids' / 'r*.parquet'}')",
        "persons": f"read_parquet('{data / 'wire' / 'persons-s*.parquet'}')",
        "auctions": f"read_parquet('{data / 'wire' / 'auctions-s*.parquet'}')",
    }


def run_duckdb(query: str, data: Path, threads: int = 0) -> tuple[pa.Table, float]:
    """The reference SQL of `query` over the generator's files in `data` (threads 0: the cores)."""
    return timed_sql(SQL[query], threads, duckdb_tables(data))


# ---------------------------------------------------------------------------
# Spark Structured Streaming


def _ddl(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {'BIGINT' if pa.types.is_integer(f.type) else 'STRING'}" for f in schema)


def spark_source(spark, data: Path, stream: str, delay_ms: int):
    """One stream's files (spark/<stream>/: the real files, then the sentinel) with a watermark."""
    from pyspark.sql import functions as F

    from benchmarks.nexmark import AUCTION_SCHEMA, BID_SCHEMA, PERSON_SCHEMA

    schema = {"bids": BID_SCHEMA, "persons": PERSON_SCHEMA, "auctions": AUCTION_SCHEMA}[stream]
    src = data / "spark" / stream
    real = len([p for p in src.iterdir() if not p.name.startswith("zz-")])
    return (
        spark.readStream.schema(_ddl(schema))
        .option("maxFilesPerTrigger", real)
        .parquet(str(src))
        .withColumn("ts", F.timestamp_millis("date_time"))
        .withWatermark("ts", f"{delay_ms} milliseconds")
    )


def spark_query(spark, query: str, data: Path, delay_ms: int):
    """The query as a streaming DataFrame with the compared columns (plus none else)."""
    from pyspark.sql import functions as F

    ms = F.unix_millis
    if query == "q11":
        b = spark_source(spark, data, "bids", delay_ms)
        s = b.groupBy(F.session_window("ts", "10 seconds").alias("w"), "bidder").agg(F.count("*").alias("bid_count"))
        return s.select(
            F.col("bidder").cast("string").alias("key"),
            ms("w.start").alias("window_start"),
            ms("w.end").alias("window_end"),
            "bid_count",
        )
    if query == "q5":
        b = spark_source(spark, data, "bids", delay_ms)
        # AuctionBids: bids per auction in every sliding window; MaxBids: the largest count of each
        # window, an aggregation chained on the first (grouped by its window column, which carries
        # the event time), joined back on that window.
        hop = b.groupBy(F.window("ts", "10 seconds", "2 seconds").alias("w"), "auction").agg(F.count("*").alias("num"))
        top = hop.groupBy(F.col("w").alias("tw")).agg(F.max("num").alias("maxn"))
        j = hop.join(top, (F.col("w") == F.col("tw")) & (F.col("num") >= F.col("maxn")))
        return j.select(
            F.col("auction").cast("string").alias("auction"),
            "num",
            ms("w.start").alias("starttime"),
            ms("w.end").alias("endtime"),
        )
    if query == "q7":
        b = spark_source(spark, data, "bids", delay_ms).withColumn("w", F.window("ts", "10 seconds"))
        top = b.groupBy(F.col("w").alias("tw")).agg(F.max("price").alias("maxprice"))
        j = b.join(top, (F.col("w") == F.col("tw")) & (F.col("price") == F.col("maxprice")))
        return j.select("auction", "price", "bidder", "date_time")  # the bids' own columns
    if query == "q8":
        p = spark_source(spark, data, "persons", delay_ms)
        a = spark_source(spark, data, "auctions", delay_ms)
        pw = p.groupBy(F.window("ts", "10 seconds").alias("pw"), "id", "name").agg(F.count("*").alias("n"))
        aw = a.groupBy(F.window("ts", "10 seconds").alias("aw"), "seller").agg(F.count("*").alias("m"))
        j = pw.join(aw, (F.col("id") == F.col("seller")) & (F.col("pw") == F.col("aw")))
        return j.select(F.col("id").cast("string").alias("id"), "name", ms("pw.start").alias("starttime"))
    raise ValueError(f"unknown query {query}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else repr(e)


def run_spark(spark, query: str, data: Path, out: Path, ckpt: Path, delay_ms: int) -> dict:
    """One AvailableNow run of the query into a fresh Parquet sink; {"seconds", "batches"} or
    {"refused": first line of Spark's error} when Spark will not start the query."""
    t0 = time.perf_counter()
    try:
        sq = parquet_sink(spark_query(spark, query, data, delay_ms), out, ckpt)
    except Exception as e:  # AnalysisException & co: Spark SS cannot express the query this way
        return {"refused": f"{type(e).__name__}: {_first_line(e)}"}
    try:
        sq.awaitTermination()
    except Exception as e:  # StreamingQueryException: refused in the first batch's planning, or failed
        return {"refused": f"{type(e).__name__}: {_first_line(e)}"}
    dt = time.perf_counter() - t0
    return {"seconds": dt, "batches": batches(sq.recentProgress)}


# ---------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("engine", choices=("spark", "duckdb"))
    ap.add_argument("--query", required=True, choices=sorted(SQL))
    ap.add_argument("--data", type=Path, required=True, help="the generator's directory (nexmark.write_dataset)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--delay-ms", type=int, default=4000, help="Spark: withWatermark delay")
    ap.add_argument("--warm", action="store_true", help="Spark: time the query's second run in the same session")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--threads", type=int, default=0, help="DuckDB threads (default: the cores)")
    a = ap.parse_args()
    if a.engine == "duckdb":
        write_duckdb_result(*run_duckdb(a.query, a.data, a.threads), a.out)
        return 0

    def run(spark, name: str) -> dict:
        return run_spark(spark, a.query, a.data, a.out / name, a.out / f"ckpt-{name}", a.delay_ms)

    spark_process(a.master, f"nexmark-{a.query}", run, "first", a.warm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
