"""Spark's classes archived once for every later JVM Wire launches: class-data sharing (AppCDS).

A JVM that Wire launches (a local session's, the embedded Spark Connect server's) spends most of
its start loading and verifying Spark's classes, thousands of them from ~250 jars. Measured on
the EPYC VM, a local session's gateway, context, session and first job took 1.4, 1.0, 1.3 and
1.75 s; mapping an archive of those classes instead, 0.9, 0.65, 0.7 and 0.95 s; the embedded
server's start 7.2 → 4.9 s.

`make setup` makes the archive (`python -m wire_dagster.jvmarchive`, ~15 s, once per virtual
environment): a local session runs jobs of the kinds Wire's are (a shuffle, Arrow in and out,
Python workers, grouped and cogrouped Arrow) with `-XX:ArchiveClassesAtExit`, then ends, and its
JVM writes the classes it loaded. Every JVM Wire launches then maps it (`launch_options`).

It lives beside the jars it was made from (<venv>/share/wire), named by a digest of the Java
runtime and of the jars (path, size, time), so an upgrade of either makes a new one. A JVM that
cannot use an archive (another Java, a damaged file) starts without it, silently, as before: the
archive only saves time. WIRE_SPARK_CDS=false leaves it out (the benchmarks run Spark Structured
Streaming so, as it ships).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .procgroup import kill_group
from .sparkconf import env_switch, java_binary, spark_home, with_java_tmpdir


def enabled() -> bool:
    """WIRE_SPARK_CDS (default true): whether the JVMs Wire launches map the archive."""
    return env_switch("WIRE_SPARK_CDS")


def archive_path() -> Path | None:
    """Where the archive of this Java runtime and these Spark jars is (or would be); None without
    a Java runtime or Spark's jars."""
    java = java_binary()
    try:
        jars = sorted((spark_home() / "jars").iterdir())
    except Exception:
        return None
    if java is None or not jars:
        return None
    h = hashlib.sha256()
    for p in [Path(os.path.realpath(java)), *jars]:
        st = p.stat()
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return Path(sys.prefix) / "share" / "wire" / f"spark-{h.hexdigest()[:16]}.jsa"


def launch_options(submit_opts: str | None, tmpdir: str | os.PathLike[str]) -> str:
    """SPARK_SUBMIT_OPTS for a JVM Wire launches: `submit_opts`, its temporary directory `tmpdir`
    (`sparkconf.with_java_tmpdir`) and, if there is one, the class archive."""
    opts = with_java_tmpdir(submit_opts, tmpdir)
    path = archive_path() if enabled() else None
    if path is not None and path.is_file():
        opts += f' -XX:SharedArchiveFile="{path}"'
    return opts


def make(force: bool = False, timeout: float = 300) -> tuple[Path | None, str]:
    """Make the archive unless it exists (or `force`): (its path, what happened) — (None, why) when
    it could not be made; the JVMs then start as before."""
    path = archive_path()
    if path is None:
        return None, "no Java runtime or no Spark jars: no class archive"
    if not enabled():
        return None, "WIRE_SPARK_CDS=false: no class archive"
    if path.is_file() and not force:
        return path, f"Spark class archive {path} exists"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.stem + ".", suffix=".part", dir=path.parent)
    os.close(fd)
    os.unlink(tmp)  # the JVM writes it at its exit
    t0 = time.monotonic()
    env = dict(os.environ, WIRE_SPARK_CDS="false")  # the run that makes it must not map an older one
    env.pop("WIRE_SPARK_REMOTE", None)
    env["SPARK_SUBMIT_OPTS"] = f'{env.get("SPARK_SUBMIT_OPTS", "")} -XX:ArchiveClassesAtExit="{tmp}"'.lstrip()
    # Its own process group: a run that takes too long is stopped with its JVM, which would
    # otherwise write the archive after this function has given up on it.
    run = subprocess.Popen(
        [sys.executable, "-m", "wire_dagster.jvmarchive", "--jobs"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = run.communicate(timeout=timeout)
        if run.returncode != 0 or not os.path.isfile(tmp):
            tail = out.strip().splitlines()[-1:] or [f"exit {run.returncode}"]
            return None, f"no Spark class archive: its run failed ({tail[0]})"
        os.replace(tmp, path)
    except subprocess.TimeoutExpired:
        kill_group(run.pid, grace=5, reap=run.poll)
        run.communicate()
        return None, f"no Spark class archive: its run took over {timeout:.0f} s"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    for old in path.parent.glob("spark-*.jsa"):  # those of an earlier Java or Spark
        if old != path:
            old.unlink(missing_ok=True)
    mb = path.stat().st_size / 1e6
    return path, f"Spark class archive {path} made ({mb:.0f} MB, {time.monotonic() - t0:.0f} s)"


def _jobs() -> None:
    """The run the archive is made of: a local session, jobs of the kinds Wire's are, then the
    JVM's end (it writes the archive as it exits)."""
    import pyarrow as pa
    from pyspark.core.context import SparkContext
    from pyspark.sql import SparkSession

    # Spark's own builder, not sparksession's: the archive holds the classes jobs load whatever
    # the session's settings (those it lacks load as before), and this module stays below that one.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("wire-class-archive")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.log.level", "WARN")
        .getOrCreate()
    )
    spark.range(0, 20_000, 1, 4).selectExpr("id % 97 AS k", "id AS v").groupBy("k").sum("v").collect()
    df = spark.createDataFrame(pa.table({"k": list(range(100)) * 10, "v": [float(i) for i in range(1000)]}))
    df.mapInArrow(_same, df.schema).toArrow()
    df.groupBy("k").applyInArrow(_table, df.schema).collect()
    df.groupBy("k").cogroup(df.groupBy("k")).applyInArrow(_left, df.schema).toArrow()
    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)  # launch_gateway keeps the JVM's Popen there for its caller
    spark.stop()
    if proc is not None:
        proc.stdin.close()  # the JVM ends when its stdin does, writing the archive first
        proc.wait()


def _same(batches):
    yield from batches


def _table(t):
    return t


def _left(left, _right):
    return left


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--jobs"]:
        _jobs()
        return 0
    _path, said = make(force="--force" in args)
    print(said)
    return 0


if __name__ == "__main__":
    sys.exit(main())
