"""Shared helpers for the benchmarks (and the tests' Dagster stack): an object store, a
process-tree memory sampler, Markdown tables, a small-epoch Spark Connect conf and a clean
child-process environment."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

# Small epochs: without AQE and with one shuffle partition an epoch runs far fewer Spark jobs.
CONNECT_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
}


def clean_env() -> dict[str, str]:
    """This process's environment without its Spark/Dagster wiring, for a child that gets its own."""
    from wire_dagster.sparkserver import SPARK_CLIENT_ENV

    drop = {*SPARK_CLIENT_ENV, "DAGSTER_HOME", "WIRE_PIPELINES"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


@contextlib.contextmanager
def bench_store(tmp: Path) -> Iterator:
    """An ObjectStore on a fresh bucket: WIRE_S3_* when set, else an embedded S3 server in `tmp`
    (stopped at the end)."""
    from wire_dagster.embedded import EmbeddedS3
    from wire_dagster.objectstore import ObjectStore, S3Config

    server = None
    cfg = S3Config.from_env()
    if cfg is None:
        server = EmbeddedS3(tmp / "s3")
        cfg = server.start()
    try:
        cfg = replace(cfg, bucket="bench-" + uuid.uuid4().hex[:8])
        store = ObjectStore(cfg)
        store.ensure_bucket()
        yield store
    finally:
        if server is not None:
            server.stop()


@dataclass
class Peak:
    driver: int = 0  # this Python process
    spark: int = 0  # the Spark JVM(s) and Python workers below this process
    total: int = 0  # both, at the same instant


class TreeRss:
    """Samples the RSS of this process and its descendants (but not the S3 server) every `interval` seconds;
    `cpu` is the tree's CPU seconds spent inside the `with` block (robust to other load on the machine)."""

    def __init__(self, interval: float = 0.1, exclude: tuple[str, ...] = ("weed",)) -> None:
        import psutil

        self._me = psutil.Process()
        self.interval = interval
        self.exclude = exclude
        self.peak = Peak()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Peak:
        import psutil

        driver = self._me.memory_info().rss
        spark = 0
        for p in self._me.children(recursive=True):
            try:
                if p.name() in self.exclude:
                    continue
                spark += p.memory_info().rss
            except psutil.Error:
                continue
        return Peak(driver, spark, driver + spark)

    def _run(self) -> None:
        while not self._stop.is_set():
            s = self.sample()
            self.peak = Peak(
                max(self.peak.driver, s.driver), max(self.peak.spark, s.spark), max(self.peak.total, s.total)
            )
            self._stop.wait(self.interval)

    def cpu_by_kind(self) -> dict[str, float]:
        """User + system CPU seconds so far of this process ("driver"), of java ("jvm") and of the other
        descendants ("python workers"); children already reaped count with their parents."""
        import psutil

        out = {"driver": 0.0, "jvm": 0.0, "python workers": 0.0}
        for p in [self._me, *self._me.children(recursive=True)]:
            try:
                name = p.name()
                if p is not self._me and name in self.exclude:
                    continue
                t = p.cpu_times()
                kind = "driver" if p is self._me else ("jvm" if name == "java" else "python workers")
                own = t.user + t.system
                reaped = t.children_user + t.children_system
                if p is self._me:
                    out["driver"] += own  # reaped children of the driver are its finished subprocesses: not Spark
                else:
                    out[kind] += own
                    out["python workers"] += reaped  # executors/daemons reap exited Python workers
            except psutil.Error:
                continue
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU of this process tree so far."""
        return sum(self.cpu_by_kind().values())

    def __enter__(self) -> Self:
        self.peak = self.sample()
        self._cpu0 = self.cpu_by_kind()
        self.cpu = 0.0
        self.cpu_kinds: dict[str, float] = {}
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        now = self.cpu_by_kind()
        self.cpu_kinds = {k: now[k] - self._cpu0.get(k, 0.0) for k in now}
        self.cpu = sum(self.cpu_kinds.values())


def md_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A Markdown table; `align` is one char per column (l or r), default: first left, others right."""
    align = align or "l" + "r" * (len(headers) - 1)
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" if a == "l" else "---:" for a in align) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def mb(n: int) -> str:
    return f"{n / 2**20:,.0f}"


@contextlib.contextmanager
def timed() -> Iterator[list[float]]:
    """`with timed() as t: ...` then t[0] is the wall time in seconds."""
    box = [0.0]
    t0 = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - t0


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
