"""Benchmark: user computations (issue 24) — MillWheel's spike detector per key, records/s.

    .venv/bin/python benchmarks/computations.py [--sizes 1M[,10M]] [--users 1000] [--no-spark-tws]

Events (kernel.py's generator: `--users` users, 1 M events span 6 h of event time, out of order by
up to 4 s) are produced to WIRE_S3_ENDPOINT if set, else to an embedded S3 server, and the stream
is closed. Then, on one warm Spark session (WIRE_SPARK_MASTER, default local[2]):

- **Wire**: `computestage.process` of the example pipeline `pipelines/computations/spikes.yaml`'s
  computation (spike.py) over the stream, every epoch to its commit (reading the chunks on the
  executors, per key bucket, state, timers, staging, manifests, commits);
- **Spark 4 transformWithStateInPandas** (`--no-spark-tws` skips it): the same detector as a
  StatefulProcessor (value state per key, an event-time timer per minute, RocksDB state store)
  over the same events as Parquet files, `Trigger.AvailableNow`, 5 s watermark. Its semantics are
  Spark's: a micro-batch gives a key's rows unordered (sorted here per batch), rows behind the
  watermark are dropped, and timers past the last watermark never fire at the end of the input.
  Its spike count is reported beside Wire's, not compared for equality.

Printed (Markdown): wall seconds, records/s, records/s per core, spikes found.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import bench_store, comma_list, cpu_count, md_table
from benchmarks.kernel import generate, parse_size

ROOT = Path(__file__).resolve().parent.parent
BLOCK = 1_000_000


def wire_pipeline(stream: str, tmp: Path):
    import shutil

    import yaml

    from wire_dagster.spec import load_pipeline

    d = tmp / "pipeline"
    d.mkdir(exist_ok=True)
    shutil.copy(ROOT / "pipelines" / "computations" / "spike.py", d / "spike.py")
    body = {
        "name": f"spikes-{stream}",
        "stream": stream,
        "event": {"key": "user_id", "time": "ts", "id": "event_id"},
        "watermark": {"max_out_of_orderness": "5s", "idle_timeout": "1m"},
        "partition": "1h",
        "start": "2026-01-01T00:00:00Z",
        "limits": {"chunk_rows": 100_000, "max_chunks_per_epoch": 10},
        "computations": [{"name": "spikes", "code": "spike:SpikeDetector", "outputs": ["spikes"]}],
    }
    (d / "spikes.yaml").write_text(yaml.safe_dump(body))
    return load_pipeline(d / "spikes.yaml")


def produce(store, stream: str, n: int, users: int, tmp: Path) -> list[Path]:
    """n events into `stream` (one segment), closed; the Parquet files they came from."""
    import pyarrow.parquet as pq

    from benchmarks.kernel import pipeline
    from wire_dagster.streams import close_stream
    from wire_dagster.streams import produce as produce_file

    spec = pipeline("producer", stream, ["tumbling"], 1, True)
    files = []
    src = tmp / f"src-{stream}"
    src.mkdir()
    for i, lo in enumerate(range(0, n, BLOCK)):
        path = src / f"part-{i:04d}.parquet"
        pq.write_table(generate(lo, min(BLOCK, n - lo), 24, users), path)
        rep = produce_file(store, spec, path)
        assert rep.malformed == 0, rep
        files.append(path)
    close_stream(store, spec)
    return files


def run_wire(store, spec, spark) -> tuple[float, int]:
    from wire_dagster.computestage import process
    from wire_dagster.results import read_results

    t0 = time.perf_counter()
    while process(store, spec, spark, max_epochs=1000).committed:
        pass
    wall = time.perf_counter() - t0
    return wall, read_results(store, spec, "spikes").num_rows


# ---------------------------------------------------------------------------
# The same detector in Spark 4's transformWithStateInPandas


def run_tws(spark, src: Path, tmp: Path) -> tuple[float, int]:
    import pandas as pd
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    minute, alpha, factor, min_count, warmup = 60_000, 0.3, 3.0, 5, 3
    state_schema = StructType(
        [
            StructField("minute", LongType()),
            StructField("count", LongType()),
            StructField("seen", LongType()),
            StructField("expected", DoubleType()),
            StructField("last_minute", LongType()),
        ]
    )
    out_schema = StructType(
        [
            StructField("key", StringType()),
            StructField("minute", LongType()),
            StructField("observed", LongType()),
            StructField("expected", DoubleType()),
        ]
    )

    cols = ("key", "minute", "observed", "expected")

    dtypes = ("object", "int64", "int64", "float64")

    def frame(out: list[tuple]):
        """The rows as a typed DataFrame (nothing for none: an empty frame of untyped columns made
        PySpark 4's TWS output conversion fail with `Cannot convert ChunkedArray to Array`)."""
        if out:
            yield pd.DataFrame(
                {c: pd.Series([r[i] for r in out], dtype=t) for i, (c, t) in enumerate(zip(cols, dtypes, strict=True))}
            )

    class Spikes(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.handle = handle
            self.state = handle.getValueState("s", state_schema)

        def _judge(self, key, s, out) -> tuple:
            m, count, seen, expected, last = s
            if last is not None and last >= 0:
                expected *= (1 - alpha) ** ((m - last) // minute - 1)
            if seen >= warmup and count >= min_count and count > factor * expected:
                out.append((key, m, count, round(expected, 6)))
            expected = alpha * count + (1 - alpha) * expected if seen else float(count)
            return (-1, 0, seen + 1, expected, m)

        def handleInputRows(self, key, rows, timerValues):
            k = key[0]
            got = self.state.get() if self.state.exists() else None
            s: tuple = tuple(got) if got is not None else (-1, 0, 0, 0.0, -1)
            out: list = []
            ts = sorted(t for pdf in rows for t in pdf["ts"].tolist())
            for t in ts:
                m = t - t % minute
                if s[4] is not None and s[4] >= 0 and m <= s[4]:
                    continue  # a minute already judged
                if s[0] != m:
                    if s[0] >= 0:  # a later minute: the current one is final
                        self.handle.deleteTimer(int(s[0]) + minute - 1)
                        s = self._judge(k, s, out)
                    s = (m, 0, *s[2:])
                    self.handle.registerTimer(int(m) + minute - 1)
                s = (s[0], s[1] + 1, *s[2:])
            self.state.update(s)
            yield from frame(out)

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
            got = self.state.get()
            s: tuple = tuple(got) if got is not None else (-1, 0, 0, 0.0, -1)
            out: list = []
            if s[0] >= 0:
                s = self._judge(key[0], s, out)
                self.state.update(s)
            yield from frame(out)

        def close(self) -> None:
            pass

    schema = "ts LONG, user_id STRING, event_id STRING, amount DOUBLE"
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    df = (
        spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(src))
        .withColumn("event_time", F.timestamp_millis("ts"))
        .withWatermark("event_time", "5 seconds")
    )
    out_dir, ckpt = tmp / "tws-out", tmp / "tws-ckpt"
    t0 = time.perf_counter()
    q = (
        df.groupBy("user_id")
        .transformWithStateInPandas(
            statefulProcessor=Spikes(), outputStructType=out_schema, outputMode="Append", timeMode="EventTime"
        )
        .writeStream.format("parquet")
        .option("path", str(out_dir))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    wall = time.perf_counter() - t0
    return wall, spark.read.schema(out_schema).parquet(str(out_dir)).count()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1M")
    ap.add_argument("--users", type=int, default=1_000)
    ap.add_argument("--no-spark-tws", action="store_true")
    ap.add_argument("--no-wire", action="store_true", help="only Spark's side (the events are produced anyway)")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from wire_dagster.sparksession import get_spark

    cores = cpu_count()
    rows = []
    with tempfile.TemporaryDirectory() as t, bench_store(Path(t)) as store:
        tmp = Path(t)
        t0 = time.perf_counter()
        spark = get_spark(master=os.environ.get("WIRE_SPARK_MASTER", f"local[{cores}]"), cores=cores)
        print(f"Spark session: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        for size in comma_list(args.sizes):
            n = parse_size(size)
            stream = f"clicks{n}"
            t0 = time.perf_counter()
            files = produce(store, stream, n, args.users, tmp)
            print(f"{size}: produced in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            if args.no_wire:
                wall, spikes = float("nan"), -1
            else:
                wall, spikes = run_wire(store, wire_pipeline(stream, tmp), spark)
            rows.append([size, args.users, "Wire (computestage)", f"{wall:.1f}", f"{n / wall:,.0f}",
                         f"{n / wall / cores:,.0f}", spikes])  # fmt: skip
            print(rows[-1], file=sys.stderr)
            if not args.no_spark_tws:
                try:
                    wall, spikes = run_tws(spark, files[0].parent, tmp / f"tws-{n}")
                    rows.append([size, args.users, "Spark 4 transformWithStateInPandas", f"{wall:.1f}",
                                 f"{n / wall:,.0f}", f"{n / wall / cores:,.0f}", spikes])  # fmt: skip
                except Exception as e:  # report what Spark said, keep Wire's row
                    rows.append([size, args.users, "Spark 4 transformWithStateInPandas", "failed", "", "",
                                 " ".join(str(e).split())[:120]])  # fmt: skip
                print(rows[-1], file=sys.stderr)
        spark.stop()
    print(md_table(["events", "users", "engine", "wall s", "records/s", "records/s per core", "spikes"], rows))


if __name__ == "__main__":
    main()
