"""Crash rows for the derived step (issue 23): a `wire process` of a stage reading another
pipeline's window, killed between the upstream's commit and its own run — at the named fault
points of its commit, and by kill -9 at random moments — then restarted. Right after the crash
readers see a whole epoch (every committed marker names an intact manifest); after the restart
the stage's results equal the composition of the upstream's final rows (nothing lost, nothing
twice; an upstream row past the value domain a dead letter, once), its remap names the
upstream's epoch, its published output is what its manifest names, and the bytes it commits
are the same whatever the crash.

    batch 1 ─ up: epoch 1 ─ down: epoch 1
    batch 2 (later events, and a late one for an upstream window that already fired)
            ─ up: epoch 2 ─ down: ✗ killed ─ down: restart ─▶ equal to the composition
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from dataclasses import replace

import pytest
import yaml

from commit_scenario import (
    assert_committed_sound,
    assert_published,
    copied_bucket,
    kill_at_random_moments,
    module_cli_env,
    output_hashes,
    subprocess_env,
    wire,
)
from reference import assert_same_rows, batch
from wire_dagster import results
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import field_column, load_pipeline

T0 = 1_767_225_600_000
COMMON = {
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-02T00:00:00Z",
    "partition": "1m",
}
UP = {
    "name": "up",
    "stream": "clicks",
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "lateness": {"allowed": "5m"},
    "windows": [
        {"name": "per_10s", "type": "tumbling", "size": "10s", "aggregates": {"n": "count", "total": "sum(amount)"}}
    ],
}
DOWN = {
    "name": "down",
    "inputs": [{"name": "tens", "pipeline": "up", "output": "per_10s", "key": "key"}],
    "lateness": {"allowed": "0s"},
    "windows": [
        {"name": "per_30s", "type": "tumbling", "size": "30s", "aggregates": {"peak": "max(n)", "total": "sum(total)"}}
    ],
}
#: The points the stage's commit passes (the streaming engine's others are not on its path);
#: `make test` runs two of them, WIRE_CRASH_SEEDS > 1 (`make test-long`) all.
POINTS = ("before-staging", "mid-staging", "after-staging", "after-manifest", "before-marker", "after-marker")
QUICK = ("after-manifest", "after-marker")
ALL_POINTS = int(os.environ.get("WIRE_CRASH_SEEDS") or 1) > 1


def _batch(lo: int, n: int, late: bool) -> list[dict]:
    rows = [{"ts": T0 + (lo + i) * 1_500, "eid": f"e{lo + i}", "user": f"u{i % 4}", "amount": i} for i in range(n)]
    if late:  # an upstream window that fired in epoch 1 fires again in epoch 2
        rows.append({"ts": T0 + 5_000, "eid": "late", "user": "u0", "amount": 1_000})
        # and one whose sum (3 * 2^52) is past the domain the stage's sum(total) reads: a dead letter
        rows += [{"ts": T0 + 150_000 + i, "eid": f"big{i}", "user": "big", "amount": 2**52} for i in range(3)]
    return rows


@pytest.fixture(scope="module")
def template(s3_server, tmp_path_factory, spark_remote, cli_env_module):
    """A bucket holding: up epochs 1 and 2 committed, down epoch 1 committed (through the CLI)."""
    d = tmp_path_factory.mktemp("derived-crash")
    for body in (UP, DOWN):
        (d / f"{body['name']}.yaml").write_text(yaml.safe_dump({**body, **COMMON}))
    st = ObjectStore(replace(s3_server, bucket="tpl-" + uuid.uuid4().hex[:10]))
    st.ensure_bucket()
    env = subprocess_env(dict(cli_env_module, WIRE_S3_BUCKET=st.bucket), spark_remote, WIRE_PIPELINES=str(d))
    for k, rows in enumerate((_batch(0, 80, False), _batch(80, 40, True))):
        f = d / f"b{k}.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
        wire(["produce", "--stream", "clicks", "--file", f], env)
        wire(["process", "--pipeline", "up", "--max-epochs", "5"], env)
        if k == 0:
            wire(["process", "--pipeline", "down"], env)
    return st, d, load_pipeline(d / "down.yaml"), load_pipeline(d / "up.yaml")


@pytest.fixture(scope="module")
def cli_env_module(s3_server, tmp_path_factory):
    return module_cli_env(s3_server, tmp_path_factory.mktemp("wire-home"))


def _fresh(template, s3_server, cli_env_module, spark_remote):
    st0, d, down, up = template
    st = copied_bucket(st0, s3_server, "t-")
    env = subprocess_env(dict(cli_env_module, WIRE_S3_BUCKET=st.bucket), spark_remote, WIRE_PIPELINES=str(d))
    return st, env, down, up


def _composition(st: ObjectStore, up, down) -> None:
    """The stage's results equal its windows over the upstream's committed rows within the value
    domain, its dead letters are those past it, each once, and it is in sync."""
    rows = results.read_results(st, up, "per_10s").to_pylist()
    past = sorted((r["key"], r["window_start"]) for r in rows if abs(r["total"]) > 2**53)
    letters = [json.loads(d["record"]) for d in results.read_dead_letters(st, down)]
    assert past and sorted((r["key"], r["window_start"]) for r in letters) == past
    rows = [r for r in rows if abs(r["total"]) <= 2**53]
    evs = [
        {
            "_t": r["window_end"] - 1,
            "_key": r["key"],
            field_column("n"): float(r["n"]),
            field_column("total"): r["total"],
        }
        for r in rows
    ]
    m, m_up = Checkpoints(st, "down").latest(), Checkpoints(st, "up").latest()
    assert m is not None and m_up is not None and m.remap == {"tens": m_up.epoch}
    assert m.watermark == m_up.watermark < T0 + 10 * 60_000  # open: the windows W has passed fired
    fired = {
        w.name: [x for _, x in sorted(batch(down, w, evs).items()) if x["window_end"] <= m.watermark]
        for w in down.windows
    }
    assert_same_rows(down, {"per_30s": results.read_results(st, down, "per_30s").to_pylist()}, fired)
    want = fired
    assert max(r["total"] for r in want["per_30s"]) >= 1_000  # the late event upstream reached it
    assert_committed_sound(st, down)
    assert_published(st, down)


_FINAL: dict[str, dict] = {}


@pytest.mark.parametrize("point", POINTS if ALL_POINTS else QUICK)
def test_a_derived_run_killed_at_a_commit_step_then_restarted(
    template, s3_server, cli_env_module, spark_remote, point: str
) -> None:
    st, env, down, up = _fresh(template, s3_server, cli_env_module, spark_remote)
    p = wire(["process", "--pipeline", "down"], dict(env, WIRE_FAULT=point), expect_rc=None)
    assert p.returncode == 86, (point, p.returncode, p.stderr[-2000:])
    committed = Checkpoints(st, "down").committed()
    assert committed == ([1, 2] if point == "after-marker" else [1]), committed  # a whole epoch, or none
    assert_committed_sound(st, down)
    wire(["process", "--pipeline", "down"], env)
    _composition(st, up, down)
    m = Checkpoints(st, "down").latest()
    assert m is not None and m.epoch == 2
    # the same bytes whatever the crash (determinism)
    assert _FINAL.setdefault("hashes", output_hashes(m)) == output_hashes(m)


def test_a_derived_run_killed_at_random_moments_then_restarted(
    template, s3_server, cli_env_module, spark_remote
) -> None:
    """kill -9 of the real CLI's process group, three times at random moments of its run (from
    its start to its typical end), then a run to completion."""
    st, env, down, up = _fresh(template, s3_server, cli_env_module, spark_remote)
    rnd = random.Random(int(os.environ.get("WIRE_SEED", "7")))
    # The moments are drawn in the life of an uninterrupted run of the same work, on a copy (as
    # warm as the killed ones: runs share the server's Spark session).
    ok = copied_bucket(st, s3_server, "ok-")
    t0 = time.monotonic()
    wire(["process", "--pipeline", "down"], dict(env, WIRE_S3_BUCKET=ok.bucket))
    took = time.monotonic() - t0

    def whole_epochs() -> None:
        assert_committed_sound(st, down)
        assert Checkpoints(st, "down").committed() in ([1], [1, 2])

    kills = kill_at_random_moments(
        ["process", "--pipeline", "down"], env, rnd, 3, (0.1 * took, 0.9 * took), whole_epochs
    )
    assert kills >= 1  # at least one run died mid-way (the others may have ended first)
    wire(["process", "--pipeline", "down"], env)
    _composition(st, up, down)
