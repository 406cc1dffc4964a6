"""One Spark session factory for `local[*]`, a standalone cluster and Spark Connect.

`WIRE_SPARK_REMOTE` (sc://host:port) attaches to a Spark Connect server;
otherwise `WIRE_SPARK_MASTER` (default `local[*]`) starts or joins a classic
session. Local defaults: UI off, shuffle partitions sized to the cores, session
time zone UTC, Python workers on this interpreter (they import pyarrow).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile


def java_problem() -> str | None:
    """None if a Java 17+ runtime is on PATH (or JAVA_HOME), else how to install one."""
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    if not java or not os.path.exists(java):
        return "Java 17 is missing: install it with `sudo apt-get install -y openjdk-17-jre-headless`"
    return None


def get_spark(master: str | None = None, remote: str | None = None, app: str = "wire", cores: int | None = None):
    """The active session if there is one, else a new one configured from the environment."""
    from pyspark.sql import SparkSession

    remote = remote or os.environ.get("WIRE_SPARK_REMOTE")
    if remote:
        return SparkSession.builder.remote(remote).appName(app).getOrCreate()
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    problem = java_problem()
    if problem:
        from .errors import WireInputError

        raise WireInputError(problem)
    master = master or os.environ.get("WIRE_SPARK_MASTER") or "local[*]"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    n = cores or os.cpu_count() or 2
    tmp = os.environ.get("WIRE_SPARK_LOCAL_DIR") or os.path.join(tempfile.gettempdir(), "wire-spark")
    os.makedirs(tmp, exist_ok=True)
    b = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", os.environ.get("WIRE_SPARK_UI", "false"))
        .config("spark.sql.shuffle.partitions", str(max(2, n)))
        .config("spark.default.parallelism", str(max(2, n)))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.local.dir", tmp)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", os.environ.get("WIRE_SPARK_DRIVER_MEMORY", "2g"))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "WARN")
    )
    return b.getOrCreate()
