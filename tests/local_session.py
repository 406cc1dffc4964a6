"""Local Spark sessions in processes of their own, for the tests of how Wire starts them
(test_spark_ahead.py, test_jvmarchive.py): a session belongs to its process, so each check runs a
script in a fresh interpreter and reads back what it printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from wire_dagster import jvmarchive

#: Printed by a script of the session `get_spark` gives it (after `start_ahead`, if the script ran it).
SESSION_FACTS = """
import json, wire_dagster.sparksession as ss
s = ss.get_spark()
jvm = s.sparkContext._jvm
facts = {
    "app": s.sparkContext.appName,
    "jvm_pid": jvm.java.lang.ProcessHandle.current().pid(),
    "ahead_pid": ss._AHEAD.proc.pid if ss._AHEAD is not None else None,
    "count": s.range(5).count(),
    "same": ss.get_spark() is s,
    "args": list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()),
    "tier4": jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    ).getVMOption("Tier4InvocationThreshold").getValue(),
}
print("FACTS " + json.dumps(facts))
"""


def local_env(**extra: str) -> dict[str, str]:
    """This environment with the sessions local (`local[2]`) and the class archive on by default."""
    env = dict(os.environ, WIRE_SPARK_MASTER="local[2]", **extra)
    for k in ("WIRE_SPARK_REMOTE", "WIRE_SPARK_CDS", "WIRE_SPARK_LATE_C2", "SPARK_SUBMIT_OPTS"):
        if k not in extra:
            env.pop(k, None)
    return env


def python(code: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


def session_facts(code: str, env: dict[str, str]) -> dict:
    """Run `code` (ending with SESSION_FACTS); what it printed."""
    done = python(code, env)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("FACTS "))
    return json.loads(line.removeprefix("FACTS "))


def made_archive() -> Path:
    """The class archive of this Java and these jars: `make setup` made it; a bare checkout makes
    it here (~20 s)."""
    archive = jvmarchive.archive_path()
    assert archive is not None
    if not archive.is_file():
        assert jvmarchive.make()[0] == archive
    return archive
