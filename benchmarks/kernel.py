"""Benchmark: the Spark window kernel's throughput (events/s) on 1 M (and 10 M) events in S3.

    .venv/bin/python benchmarks/kernel.py [--sizes 1M[,10M]] [--chunks-per-epoch 5] [--profile] [--no-id]

Events (the clicks pipeline's shape: 10 000 users (`--users`), ~46 events/s of event
time, out of order by up to 4 s) are appended with `streams.produce` (100 000-row chunks, two segments)
to WIRE_S3_ENDPOINT if set, else to an embedded S3 server started in a temporary
directory. The stream is closed, then each window set (tumbling, sliding, session, and
all three together) is processed by `engine.process` as a pipeline of its own, in
epochs of `--chunks-per-epoch` chunks, on one warm Spark session (`WIRE_SPARK_MASTER`,
default local[*]; its start-up is reported apart, as is the first, cold, run).

Reported per run: the kernel's time (`run_epoch`/`run_epochs`: reading the chunks on the executors,
windows, state, dead letters, back to Arrow), the whole `process` (plus staging, manifests,
commits; since the next Spark job computes while the previous job's epochs are committed, the
jobs' time includes sharing the cores with those commits, and `process` minus it is what is left
unoverlapped), events/s, and peak RSS of this process and of its Spark JVM and Python workers
(psutil over the process tree, sampled every 100 ms). The floor: DuckDB computing the
same windows over the same chunks (read from the same S3 server via pyarrow), in one
batch with no epochs, state, lateness or de-duplication. `--profile` adds where the
kernel's time goes (per call site in kernel.py: Spark actions, jobs, seconds) and
a few isolated measurements (read only, de-duplication, sliding explode).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Self

from benchmarks.common import TreeRss, bench_store, comma_list, cpu_count, mb, md_table, timed

ROOT = Path(__file__).resolve().parent.parent
CHUNK_ROWS = 100_000
BLOCK = 1_000_000  # events generated and produced per call (bounded memory)
RATE_MS = 6 * 3_600_000 / 1_000_000  # event-time ms per event: 1 M events span 6 h
WINDOWS = {
    "tumbling": {
        "name": "per_minute",
        "type": "tumbling",
        "size": "1m",
        "aggregates": {"events": "count", "total": "sum(amount)", "top": "max(amount)"},
    },
    "sliding": {
        "name": "five_by_one",
        "type": "sliding",
        "size": "5m",
        "slide": "1m",
        "aggregates": {"events": "count", "mean": "avg(amount)"},
    },
    "session": {
        "name": "sessions",
        "type": "session",
        "gap": "30s",
        "aggregates": {"events": "count", "total": "sum(amount)"},
    },
}
SETS = {
    "tumbling": ["tumbling"],
    "sliding": ["sliding"],
    "session": ["session"],
    "all three": ["tumbling", "sliding", "session"],
}


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1_000, "M": 1_000_000}.get(s[-1:], 1)
    return int(float(s.rstrip("KM")) * mult)


def pipeline(name: str, stream: str, kinds: list[str], chunks_per_epoch: int, with_id: bool):
    from wire_dagster.spec import pipeline_from_dict

    return pipeline_from_dict(
        {
            "name": name,
            "stream": stream,
            "event": {"key": "user_id", "time": "ts", **({"id": "event_id"} if with_id else {})},
            "watermark": {"max_out_of_orderness": "5s", "idle_timeout": "1m"},
            "lateness": {"allowed": "30s"},
            "partition": "1h",
            "start": "2026-01-01T00:00:00Z",
            "limits": {"chunk_rows": CHUNK_ROWS, "max_chunks_per_epoch": chunks_per_epoch},
            "windows": [WINDOWS[k] for k in kinds],
        }
    )


def generate(lo: int, n: int, seed: int, users: int = 10_000):
    """Events lo..lo+n-1 of one endless stream: time-ordered with up to ±4 s of disorder."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng([seed, lo])
    t0 = 1_767_225_600_000 + 3_600_000  # 2026-01-01T01:00Z
    idx = np.arange(lo, lo + n)
    ts = t0 + (idx * RATE_MS).astype(np.int64) + rng.integers(-4_000, 4_000, n)
    user_ids = rng.integers(0, users, n)
    return pa.table(
        {
            "ts": pa.array(ts, pa.int64()),
            "user_id": pa.array(np.char.add("u", user_ids.astype(str)).astype(object)),
            "event_id": pa.array(np.char.add("e", idx.astype(str)).astype(object)),
            "amount": pa.array(np.round(rng.gamma(2.0, 10.0, n), 2)),
        }
    )


def produce_stream(store, stream: str, n: int, seed: int, tmp: Path, users: int = 10_000) -> float:
    """n events into `stream` (two segments, split by time block), closed; returns seconds."""
    import pyarrow.parquet as pq

    from wire_dagster.streams import close_stream, produce

    spec = pipeline("producer", stream, ["tumbling"], 1, True)
    t0 = time.perf_counter()
    for i, lo in enumerate(range(0, n, BLOCK)):
        path = tmp / f"{stream}-{i}.parquet"
        pq.write_table(generate(lo, min(BLOCK, n - lo), seed, users), path)
        # users split between the segments by parity: a key's events stay in one segment, in order
        t = pq.read_table(path)
        import pyarrow.compute as pc

        # pyarrow.compute generates these functions at import: pyright cannot see them.
        digits = pc.utf8_slice_codeunits(t["user_id"], 1)  # pyright: ignore[reportAttributeAccessIssue]
        odd = pc.equal(pc.bit_wise_and(pc.cast(digits, "int64"), 1), 1)  # pyright: ignore[reportAttributeAccessIssue]
        for seg, mask in (("0", pc.invert(odd)), ("1", odd)):  # pyright: ignore[reportAttributeAccessIssue]
            part = tmp / f"{stream}-{i}-{seg}.parquet"
            pq.write_table(t.filter(mask), part)
            rep = produce(store, spec, part, segment=seg)
            assert rep.malformed == 0, rep
            part.unlink()
        path.unlink()
    close_stream(store, spec)
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------
# Profiling: attribute every Spark action the kernel triggers to its call site.


def _kernel_source() -> list[str]:
    """kernel.py as imported (labels stay right if someone edits the file during a long run)."""
    import wire_dagster.kernel as k

    return Path(k.__file__).read_text().splitlines()


KERNEL_SOURCE = _kernel_source()


class ActionProfile:
    """Wraps the DataFrame actions and createDataFrame; keyed by the kernel.py line that called them."""

    PATCH = [
        ("pyspark.sql.classic.dataframe", "DataFrame", m) for m in ("count", "toArrow", "localCheckpoint", "collect")
    ] + [("pyspark.sql.session", "SparkSession", "createDataFrame")]

    def __init__(self, spark) -> None:
        self.spark = spark
        self.rows: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])  # site -> [calls, jobs, seconds]
        self._saved: list = []
        self._depth = 0

    def _jobs(self) -> int:
        ids = self.spark.sparkContext.statusTracker().getJobIdsForGroup(None)
        return max(ids) + 1 if ids else 0

    def _site(self) -> str:
        for fr in reversed(traceback.extract_stack()[:-2]):
            if fr.lineno is not None and fr.filename.endswith("wire_dagster/kernel.py"):
                line = KERNEL_SOURCE[fr.lineno - 1] if fr.lineno <= len(KERNEL_SOURCE) else ""
                return f"{fr.name}:{fr.lineno} {line.strip()[:60]}"
        return "(outside kernel.py)"

    def __enter__(self) -> Self:
        import importlib

        for mod, cls, meth in self.PATCH:
            klass = getattr(importlib.import_module(mod), cls)
            orig = getattr(klass, meth)
            self._saved.append((klass, meth, orig))
            setattr(klass, meth, self._wrap(orig, meth))
        return self

    def _wrap(self, orig, meth):
        prof = self

        def wrapper(*a, **kw):
            if prof._depth:
                return orig(*a, **kw)
            prof._depth += 1
            site = f"{meth:<15} {prof._site()}"
            j0, t0 = prof._jobs(), time.perf_counter()
            try:
                return orig(*a, **kw)
            finally:
                r = prof.rows[site]
                r[0] += 1
                r[1] += prof._jobs() - j0
                r[2] += time.perf_counter() - t0
                prof._depth -= 1

        return wrapper

    def __exit__(self, *exc) -> None:
        for klass, meth, orig in self._saved:
            setattr(klass, meth, orig)


@contextlib.contextmanager
def kernel_timer(acc: list[float]):
    """Adds the seconds spent in the kernel's Spark jobs (`engine.run_epoch` for an epoch of its
    own, `engine.run_epochs` for the epochs one job computes: read + windows + to Arrow) to acc[0]."""
    import wire_dagster.engine as eng

    saved = {name: getattr(eng, name) for name in ("run_epoch", "run_epochs")}

    def timed(orig):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                return orig(*a, **kw)
            finally:
                acc[0] += time.perf_counter() - t0

        return run

    for name, orig in saved.items():
        setattr(eng, name, timed(orig))
    try:
        yield
    finally:
        for name, orig in saved.items():
            setattr(eng, name, orig)


def run_pipeline(store, spark, spec, now: int) -> dict:
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.engine import process

    k = [0.0]
    with TreeRss() as mem, kernel_timer(k), timed() as wall:
        out = process(store, spec, spark, max_epochs=10**6, now=now)
    m = Checkpoints(store, spec.name).latest()
    assert m is not None and m.totals.balanced(), "counts must balance"
    # Result rows from the committed manifest's file references: reading them back (44 M rows at
    # 10 M events) would leave the allocator's high-water mark in the next run's peak memory.
    rows = {w.name: sum(ref.rows for ref in m.outputs.get(w.name, {}).values()) for w in spec.windows}
    return {
        "kernel": k[0],
        "wall": wall[0],
        "cpu": mem.cpu,
        "cpu_kinds": mem.cpu_kinds,
        "epochs": len(out.committed),
        "peak": mem.peak,
        "rows": rows,
        "totals": m.totals,
    }


# ---------------------------------------------------------------------------
# The floor: DuckDB, the same windows over the same chunks, one batch.


def duckdb_sql(kind: str) -> str:
    from wire_dagster.spec import pipeline_from_dict

    w = pipeline_from_dict(
        {"name": "x", "event": {"time": "ts"}, "partition": "1h", "windows": [WINDOWS[kind]]}
    ).windows[0]
    if kind == "tumbling":
        return f"""SELECT _key, _t - (_t % {w.size}) AS ws, count(*) AS events, sum(f_amount) AS total,
                          max(f_amount) AS top
                   FROM ev GROUP BY ALL"""
    if kind == "sliding":
        n = w.size // w.slide
        return f"""SELECT _key, ws, count(*) AS events, avg(f_amount) AS mean FROM (
                     SELECT _key, f_amount, (_t - (_t % {w.slide})) - k * {w.slide} AS ws FROM ev, range(0, {n}) r(k))
                   GROUP BY ALL"""
    return f"""SELECT _key, min(_t) AS ws, max(_t) + {w.gap} AS we, count(*) AS events, sum(f_amount) AS total FROM (
                 SELECT *, sum(brk) OVER (PARTITION BY _key ORDER BY _t ROWS UNBOUNDED PRECEDING) AS sid FROM (
                   SELECT _key, _t, f_amount,
                          CASE WHEN _t - lag(_t) OVER (PARTITION BY _key ORDER BY _t) <= {w.gap}
                               THEN 0 ELSE 1 END AS brk
                   FROM ev))
               GROUP BY _key, sid"""


def run_duckdb(store, stream: str, kinds: list[str], threads: int) -> dict:
    import duckdb
    import pyarrow.dataset as pads

    from wire_dagster.streams import read_stream

    keys = [
        f"{store.bucket}/{c.data_key}" for v in read_stream(store, stream, {}).values() for c in v.chunks if c.data_key
    ]
    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    rows = {}
    with TreeRss() as mem, timed() as wall:
        chunks = pads.dataset(keys, filesystem=store.arrow_fs(), format="parquet")
        con.register("chunks", chunks)
        # The stream's records (a shared stream's chunks: the record's Parquet columns under `_rec`),
        # read as the pipeline reads them: its key and its field.
        con.execute(
            "CREATE OR REPLACE TEMP VIEW ev AS SELECT _t, CAST(_rec.user_id AS VARCHAR) AS _key, "
            "CAST(_rec.amount AS DOUBLE) AS f_amount FROM chunks"
            if "_rec" in chunks.schema.names
            else "CREATE OR REPLACE TEMP VIEW ev AS SELECT * FROM chunks"
        )
        for k in kinds:
            rows[WINDOWS[k]["name"]] = con.execute(f"SELECT count(*) FROM ({duckdb_sql(k)})").fetchall()[0][0]
    con.close()
    return {"wall": wall[0], "cpu": mem.cpu, "rows": rows, "peak": mem.peak}


# ---------------------------------------------------------------------------
# Isolated measurements for the profile.


def isolated(store, spark, spec) -> list[list]:
    from pyspark.sql import Window as SW
    from pyspark.sql import functions as F

    from wire_dagster.kernel import ID, ROW, SEG, SEQ, TIME, epoch_chunks
    from wire_dagster.streams import read_stream

    views = read_stream(store, spec.stream, {})
    chunks = [c for s in sorted(views) for c in views[s].chunks]
    ev = epoch_chunks(store.fs_options(), store.bucket, spec, chunks).frame(spark)

    def noop(df) -> float:
        with timed() as t:
            df.write.format("noop").mode("overwrite").save()
        return t[0]

    out = [["read all chunks (mapInArrow, S3 → Arrow → Spark)", f"{noop(ev):.2f}"]]
    out.append(["read + count()", f"{timed_call(ev.count):.2f}"])
    out.append(["read + localCheckpoint()", f"{timed_call(ev.localCheckpoint):.2f}"])
    order = SW.partitionBy(ID).orderBy(SEG, SEQ, ROW)
    out.append(
        [
            "read + de-duplicate (row_number over id)",
            f"{noop(ev.withColumn('_rn', F.row_number().over(order)).filter('_rn = 1')):.2f}",
        ]
    )
    n = 5
    x = ev.withColumn("_k", F.explode(F.sequence(F.lit(0), F.lit(n - 1)))).select(
        F.col("_key"), (F.col(TIME) - F.col("_k") * 60000).alias("s"), "f_amount"
    )
    out.append(["read + explode ×5 (sliding 5m/1m)", f"{noop(x):.2f}"])
    out.append(
        ["read + explode ×5 + groupBy", f"{noop(x.groupBy('_key', 's').agg(F.count('*'), F.avg('f_amount'))):.2f}"]
    )
    return out


def timed_call(fn) -> float:
    with timed() as t:
        fn()
    return t[0]


# ---------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sizes", default="1M", help="comma-separated event counts, e.g. 1M,10M (default 1M)")
    ap.add_argument("--chunks-per-epoch", type=int, default=5, help="read budget per epoch (chunks of 100 000 events)")
    ap.add_argument("--sets", default=",".join(SETS), help="window sets to run: " + ", ".join(SETS))
    ap.add_argument("--no-id", action="store_true", help="pipelines without an id field (no de-duplication)")
    ap.add_argument("--no-duckdb", action="store_true")
    ap.add_argument(
        "--profile",
        action="store_true",
        help="attribute the kernel's time to its Spark actions (all three, first size)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--users", type=int, default=10_000, help="distinct keys (10 000: most 1-minute windows hold one event)"
    )
    args = ap.parse_args()
    sizes = [parse_size(s) for s in comma_list(args.sizes)]
    sets = comma_list(args.sets)
    with_id = not args.no_id

    from wire_dagster.sparksession import get_spark
    from wire_dagster.timeutil import now_ms

    results, floor, notes = [], {}, []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="wire-bench-") as tmpd, bench_store(Path(tmpd)) as store:
        tmp = Path(tmpd)
        with TreeRss() as mem0, timed() as t_jvm:
            spark = get_spark(app="wire-bench")
            spark.range(1).count()
        master = spark.sparkContext.master
        notes.append(f"Spark session start (JVM + first job): {t_jvm[0]:.1f} s, peak {mb(mem0.peak.total)} MB")
        # Cold run: a small stream, all three windows — JIT, Python workers, S3 connections.
        produce_stream(store, "warm", 200_000, args.seed, tmp)
        cold = run_pipeline(store, spark, pipeline("warm", "warm", SETS["all three"], 1, with_id), now_ms())
        notes.append(
            f"cold first run (200 k events, all three windows, {cold['epochs']} epochs): kernel {cold['kernel']:.1f} "
            f"s, process {cold['wall']:.1f} s"
        )
        for n in sizes:
            stream = f"ev{n}"
            t_prod = produce_stream(store, stream, n, args.seed, tmp, args.users)
            notes.append(
                f"{n:,} events produced (streams.produce, {math.ceil(n / CHUNK_ROWS)}+ chunks) in {t_prod:.1f} s"
            )
            now = now_ms()
            for s in sets:
                spec = pipeline(f"b{n}-{s.replace(' ', '')}", stream, SETS[s], args.chunks_per_epoch, with_id)
                r = run_pipeline(store, spark, spec, now)
                assert all(r["totals"].counted[w.name] == n for w in spec.windows), r["totals"]
                results.append((n, s, r))
                print(
                    f"{n:,} {s}: kernel {r['kernel']:.1f}s, process {r['wall']:.1f}s, {r['epochs']} epochs",
                    file=sys.stderr,
                    flush=True,
                )
            if not args.no_duckdb:
                for s in sets:
                    floor[(n, s)] = run_duckdb(store, stream, SETS[s], cpu_count())
                    print(f"{n:,} {s}: duckdb {floor[(n, s)]['wall']:.1f}s", file=sys.stderr, flush=True)
            if args.profile and n == sizes[0]:
                spec = pipeline(f"p{n}", stream, SETS["all three"], args.chunks_per_epoch, with_id)
                with ActionProfile(spark) as prof:
                    pr = run_pipeline(store, spark, spec, now)
                iso = isolated(store, spark, spec)
        spark.stop()  # the JVM and its Python workers exit before the S3 server stops

    ident = "with" if with_id else "without"
    print(
        f"\n## Kernel throughput — {master}, {cpu_count()} CPUs, {args.users:,} keys, pipelines {ident} an id field, "
        f"{args.chunks_per_epoch} chunks ({args.chunks_per_epoch * CHUNK_ROWS:,} events) per epoch\n"
    )
    rows = []
    for n, s, r in results:
        f = floor.get((n, s))
        wrong = f and f["rows"] != r["rows"]
        rows.append(
            [
                f"{n / 1e6:g} M",
                s,
                r["epochs"],
                f"{r['kernel']:.1f}",
                f"{n / r['kernel']:,.0f}",
                f"{r['wall']:.1f}",
                f"{r['cpu']:.0f}",
                mb(r["peak"].driver),
                mb(r["peak"].spark),
                mb(r["peak"].total),
                f"{f['wall']:.1f}" if f else "-",
                f"{f['cpu']:.1f}" if f else "-",
                f"{n / f['wall']:,.0f}" if f else "-",
                (f"{r['kernel'] / f['wall']:.1f}×" + (" (rows differ!)" if wrong else "")) if f else "-",
                sum(r["rows"].values()),
            ]
        )
    print(
        md_table(
            [
                "events",
                "windows",
                "epochs",
                "kernel s",
                "kernel ev/s",
                "process s",
                "process CPU s",
                "driver MB",
                "Spark MB",
                "total MB",
                "DuckDB s",
                "DuckDB CPU s",
                "DuckDB ev/s",
                "kernel / DuckDB",
                "result rows",
            ],
            rows,
            "llrrrrrrrrrrrrr",
        )
    )
    print(
        f"\nload average while running: {load0[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
        "(wall times on a shared machine stretch with its load; CPU seconds much less)"
    )
    print()
    for x in notes:
        print(f"- {x}")
    if args.profile:
        print(
            f"\n## Profile: all three windows, {sizes[0]:,} events, {pr['epochs']} epochs, kernel {pr['kernel']:.1f} "
            "s\n"
        )
        prow = sorted(prof.rows.items(), key=lambda kv: -kv[1][2])
        tot = sum(v[2] for _, v in prow)
        print(
            md_table(
                ["action / call site in kernel.py", "calls", "Spark jobs", "seconds", "share"],
                [[f"`{k}`", v[0], v[1], f"{v[2]:.2f}", f"{100 * v[2] / pr['kernel']:.0f}%"] for k, v in prow],
            )
        )
        print(
            f"\nactions total {tot:.1f} s of kernel {pr['kernel']:.1f} s; "
            f"{sum(v[0] for _, v in prow) / pr['epochs']:.0f} actions and "
            f"{sum(v[1] for _, v in prow) / pr['epochs']:.0f} Spark jobs per epoch; "
            "CPU seconds of the whole process: " + ", ".join(f"{k} {v:.1f}" for k, v in pr["cpu_kinds"].items()) + "\n"
        )
        print(md_table(["isolated (all chunks at once)", "seconds"], iso, "lr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
