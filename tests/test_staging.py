"""The staging threads (checkpoint.staged): one set per process (each keeps its DuckDB connection), results
in order, and an error leaves nothing of the call still running."""

from __future__ import annotations

import threading
import time

import pytest

from wire_dagster import checkpoint
from wire_dagster.duck import duckdb_connection


def test_results_in_order_on_the_same_threads_and_connections_every_call():
    def work(i: int) -> tuple[int, str, int]:
        time.sleep(0.002 * (i % 3))  # finish out of order
        return i, threading.current_thread().name, id(duckdb_connection())

    seen_threads, seen_cons = set(), set()
    for _ in range(5):  # five epochs
        with checkpoint.staged(work, list(range(12))) as results:
            out = list(results)
        assert [i for i, _, _ in out] == list(range(12))
        seen_threads |= {t for _, t, _ in out}
        seen_cons |= {c for _, _, c in out}
    assert all(t.startswith("wire-staging") for t in seen_threads)
    assert len(seen_threads) <= checkpoint.STAGING_THREADS
    assert len(seen_cons) == len(seen_threads)  # one connection per thread, opened once


def test_an_error_cancels_what_has_not_started_and_waits_for_what_has():
    started, finished = [], []
    lock = threading.Lock()

    def work(i: int) -> int:
        with lock:
            started.append(i)
        if i == 1:
            raise ValueError("item 1")
        time.sleep(0.05)
        with lock:
            finished.append(i)
        return i

    with pytest.raises(ValueError, match="item 1"):
        with checkpoint.staged(work, list(range(40))) as results:
            for _ in results:
                pass
    # Everything that started has finished by now; nothing starts afterwards.
    with lock:
        done = (sorted(started), sorted(finished))
    assert set(done[1]) == set(done[0]) - {1}
    assert len(done[0]) < 40
    time.sleep(0.2)
    with lock:
        assert sorted(started) == done[0]
