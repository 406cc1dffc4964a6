"""Spark settings read from the environment and checked, shared by the session factory
(sparksession.py) and the embedded Spark Connect server (sparkserver.py), so that neither
imports the other for them: sparksession uses sparkserver (to find the embedded server),
sparkserver uses only this module. `session_cores` reads back, from a session, the parallelism
these settings gave it: the one place jobs size their tasks and key buckets from.

Standard library only (and errors.py): `sparksession.spark_target` runs on every session a
run builds, and the CLI imports the server module to start and stop it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from urllib.parse import urlsplit

from .errors import WireInputError

#: Hosts that are this machine: a driver reached only through them binds to loopback too.
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def java_binary() -> str | None:
    """The `java` Spark's launcher runs: JAVA_HOME's, else the one on PATH; None if there is none."""
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    return java if java and os.path.exists(java) else None


def java_problem() -> str | None:
    """None if a Java 17+ runtime is on PATH (or JAVA_HOME), else how to install one."""
    if java_binary() is None:
        return "Java 17 is missing: install it with `sudo apt-get install -y openjdk-17-jre-headless`"
    return None


def spark_home() -> Path:
    """The Spark distribution inside the pyspark wheel (bin/spark-submit, jars/)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise WireInputError("embedded Spark: pyspark is not installed in this interpreter")
    return Path(spec.origin).parent


def env_value(name: str) -> str | None:
    """The variable's value, stripped; None when unset or empty (compose passes `VAR=` for 'unset')."""
    v = os.environ.get(name, "").strip()
    return v or None


def env_switch(name: str) -> bool:
    """A switch that is on unless the variable says false, 0, no or off."""
    return (env_value(name) or "true").lower() not in ("false", "0", "no", "off")


#: The driver's heap when nothing names one (WIRE_SPARK_DRIVER_MEMORY).
DEFAULT_DRIVER_MEMORY = "2g"


def driver_memory() -> str:
    """The driver heap of a Spark Wire starts (a local session, the embedded server):
    WIRE_SPARK_DRIVER_MEMORY, else DEFAULT_DRIVER_MEMORY."""
    return env_value("WIRE_SPARK_DRIVER_MEMORY") or DEFAULT_DRIVER_MEMORY


def check_master(master: str, what: str = "WIRE_SPARK_MASTER") -> str:
    """`master` if it is a Spark master URL Wire accepts (local, local[*], local[N], spark://…, …),
    else a WireInputError."""
    if not re.fullmatch(r"local(\[(\*|\d+)(,\d+)?\])?|(spark|k8s|mesos)://\S+|yarn", master):
        raise WireInputError(f"{what}: expected local[*], local[N] or spark://host:port, got {master!r}")
    return master


def local_cores(master: str) -> int | None:
    """The cores a `local[N]` / `local` master names; None for `local[*]` and any cluster."""
    m = re.fullmatch(r"local\[(\d+)(,\d+)?\]", master)
    if m:
        return int(m.group(1))
    return 1 if master == "local" else None


def session_cores(spark) -> int:
    """The cores a session's parallelism names: its shuffle partitions (the local cores or
    WIRE_SPARK_SHUFFLE_PARTITIONS in a session Wire starts or its embedded server runs; a server's
    own setting, Spark's 200 unless set, in one Wire attaches to). Jobs size their tasks and key
    buckets by it, and the only task of a job uses that many threads as far as its executor has
    them (`kernel.task_threads`). Read on the driver: on Spark Connect, a round trip."""
    return max(1, int(spark.conf.get("spark.sql.shuffle.partitions", "1")))


def driver_host(master: str) -> str | None:
    """The address executors use to reach the driver: loopback for local and loopback clusters."""
    explicit = env_value("WIRE_SPARK_DRIVER_HOST")
    if explicit:
        return explicit
    if master.startswith("local"):
        return "127.0.0.1"
    if master.startswith("spark://"):
        hosts = [urlsplit("spark://" + h).hostname or "" for h in master[len("spark://") :].split(",")]
        if hosts and all(h in LOOPBACK or h.startswith("127.") for h in hosts):
            return "127.0.0.1"
    return None


#: The JVM's optimising compiler (C2) takes a method after ten times the calls (and loop turns) it
#: waits for by default. In a command's own short-lived JVM, C2 compiling Spark's start-up code
#: competed with the command and the Python workers for the 2 cores; measured on the EPYC VM, a cold
#: q11 tick (1 M events) 7.1-7.6 -> 6.3-6.5 s, a cold q7 tick at 10 M 57.6-59.5 -> 55.3 s (C1 alone,
#: `-XX:TieredStopAtLevel=1`, saved 1.4 s at 1 M but cost 14 s at 10 M: the hot loops need C2).
LATE_C2 = (
    "-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=20000 "
    "-XX:Tier4CompileThreshold=100000 -XX:Tier4BackEdgeThreshold=400000"
)


def with_late_c2(submit_opts: str | None) -> str:
    """SPARK_SUBMIT_OPTS of a local session's JVM: LATE_C2, then `submit_opts` (a user's own flags
    come later and win), unless WIRE_SPARK_LATE_C2=false."""
    own = LATE_C2 if env_switch("WIRE_SPARK_LATE_C2") else ""
    return f"{own} {submit_opts or ''}".strip()


def with_java_tmpdir(submit_opts: str | None, path: str | os.PathLike[str]) -> str:
    """SPARK_SUBMIT_OPTS that also set the JVM's java.io.tmpdir to `path` (the launcher parses the
    quotes; it puts these options before any spark.driver.*JavaOptions, which still win)."""
    return f'{submit_opts or ""} -Djava.io.tmpdir="{path}"'.lstrip()
