"""A classic (local) session's JVM keeps its temporary files in a directory of its process, gone at exit
(or, if the process was killed, when the next local session starts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_CHILD = r"""
import json, os
from wire_dagster.sparksession import get_spark
s = get_spark(master="local[1]")
assert s.range(3).count() == 3
tmp = s.sparkContext._jvm.java.lang.System.getProperty("java.io.tmpdir")
assert s.conf.get("spark.local.dir") == tmp, (s.conf.get("spark.local.dir"), tmp)
files = sorted(os.listdir(tmp))
s.stop()  # as the benchmarks' Spark SS runs end: PySpark 4.3 leaves the artifacts directory behind then
print(json.dumps({"tmp": tmp, "files": files, "opts": os.environ.get("SPARK_SUBMIT_OPTS")}))
"""


def test_a_local_sessions_jvm_temporary_files_go_at_its_exit_or_at_the_next_sessions_start(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_SUBMIT_OPTS", "WIRE_SPARK_REMOTE", "SPARK_REMOTE")}
    env["WIRE_SPARK_LOCAL_DIR"] = str(tmp_path)
    # What a killed process left (its pid is gone) is removed; a live process's directory is not.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / f"jvm-{gone.pid}-killed" / "artifacts-x").mkdir(parents=True)
    live = tmp_path / f"jvm-{os.getpid()}-running"
    live.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    tmp = Path(seen["tmp"])
    assert tmp.parent == tmp_path and tmp.name.startswith("jvm-"), seen
    # What Spark left there while the session ran (its artifacts, block manager and spill directories
    # among them) was in that directory...
    for kind in ("artifacts-", "blockmgr-", "spark-"):
        assert any(name.startswith(kind) for name in seen["files"]), (kind, seen)
    # ...the option was set only for the JVM's launch...
    assert seen["opts"] is None
    # ...and the directory went with the process.
    assert not tmp.exists()
    assert [p.name for p in tmp_path.iterdir()] == [live.name]
