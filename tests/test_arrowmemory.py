"""Arrow's memory pool (arrowmemory.py): jemalloc in every process that imports Wire, Spark's
Python workers included; a user's ARROW_DEFAULT_MEMORY_POOL stays."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa

POOL = "import wire_dagster, pyarrow; print(pyarrow.default_memory_pool().backend_name)"


def _pool(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", POOL], env=env, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_importing_wire_makes_jemalloc_the_pool_unless_the_user_chose_one() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    assert _pool(env) == "jemalloc"
    assert _pool({**env, "ARROW_DEFAULT_MEMORY_POOL": "system"}) == "system"


def test_a_spark_python_worker_running_wires_code_allocates_with_jemalloc(spark) -> None:
    """A task's function refers to Wire's code, so the worker imports Wire when it unpickles it
    (after pyarrow): from then on the worker's columns come from jemalloc."""
    from wire_dagster.bigarrow import gather

    def task(batches):
        for _ in batches:
            pass
        assert gather is not None
        yield pa.record_batch({"pool": [pa.default_memory_pool().backend_name]})

    got = spark.range(0, 1, 1, 1).mapInArrow(task, "pool string").toArrow()
    assert got["pool"].to_pylist() == ["jemalloc"]
