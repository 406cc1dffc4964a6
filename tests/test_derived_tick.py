"""A derived stream through Dagster (issue 23 item 3): `wire tick` of an upstream pipeline, then of
a pipeline reading its window, each through its real sensor and Dagster job. The downstream's
asset depends on the upstream's in the asset graph; a late event that changes an upstream
partition makes the downstream's partition re-run and change (a new data version, the
content hash of its committed file); and the downstream's results always equal the plain
batch of its windows over the upstream's committed rows."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import yaml

from conftest import run_wire
from reference import assert_same_rows, batch
from wire_dagster.spec import field_column

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
M = 60_000
COMMON = {
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-02T00:00:00Z",
}
UP = {
    "name": "up",
    "stream": "clicks",
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "lateness": {"allowed": "5m"},
    "partition": "1m",
    "windows": [
        {"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"n": "count", "total": "sum(amount)"}}
    ],
}
DOWN = {
    "name": "down",
    "inputs": [{"name": "minutes", "pipeline": "up", "output": "per_minute", "key": "key"}],
    "lateness": {"allowed": "0s"},
    "partition": "2m",
    "windows": [
        {"name": "per_2m", "type": "tumbling", "size": "2m", "aggregates": {"peak": "max(n)", "total": "sum(total)"}}
    ],
}


def _rows(env: dict, pipeline: str, window: str) -> list[dict]:
    from datetime import datetime

    p = run_wire(["read", "--pipeline", pipeline, "--window", window, "--format", "jsonl"], env, check=True)
    rows = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]
    for r in rows:
        for c in ("window_start", "window_end"):
            r[c] = int(datetime.fromisoformat(r[c].replace("Z", "+00:00")).timestamp() * 1000)
    return rows


def _want(spec, up_rows: list[dict]) -> dict:
    evs = [
        {
            "_t": r["window_end"] - 1,
            "_key": r["key"],
            field_column("n"): float(r["n"]),
            field_column("total"): r["total"],
        }
        for r in up_rows
    ]
    return {w.name: [x for _, x in sorted(batch(spec, w, evs).items())] for w in spec.windows}


def _tick(env: dict, pipeline: str, *more: str) -> dict[str, str]:
    p = run_wire(["tick", "--pipeline", pipeline, *more], env, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return dict(re.findall(r"^run (\S+): (\S+)$", p.stdout, flags=re.MULTILINE))


def test_a_late_event_upstream_reruns_and_changes_the_downstream_partition(
    store, cli_env, spark_remote, tmp_path: Path
) -> None:
    import dagster as dg

    from definitions import build_definitions
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.spec import load_pipeline

    pdir = tmp_path / "pipelines"
    pdir.mkdir()
    for body in (UP, DOWN):
        (pdir / f"{body['name']}.yaml").write_text(yaml.safe_dump({**body, **COMMON}))
    down = load_pipeline(pdir / "down.yaml")
    home = tmp_path / "dagster-home"
    env = dict(cli_env, WIRE_PIPELINES=str(pdir), DAGSTER_HOME=str(home), WIRE_SPARK_MASTER="local[2]")
    env.pop("WIRE_SPARK_REMOTE", None)
    if spark_remote:
        env["WIRE_SPARK_REMOTE"] = spark_remote

    # Lineage: the downstream window depends on the upstream window, partition by event time.
    graph = build_definitions(pdir).resolve_asset_graph()
    assert dg.AssetKey(["up", "per_minute"]) in graph.get(dg.AssetKey(["down", "per_2m"])).parent_keys

    # Minutes 0:00-4:50 in order: the upstream fires minutes 0-3 (W = 4:48); the downstream fires [0:00, 2:00).
    events = [{"ts": T0 + i * 10_000, "eid": f"e{i}", "user": f"u{i % 3}", "amount": i} for i in range(30)]
    f = tmp_path / "a.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    run_wire(["produce", "--stream", "clicks", "--file", str(f)], env, check=True)
    assert set(_tick(env, "up").values()) == {"SUCCESS"}
    runs = _tick(env, "down")
    assert runs and set(runs.values()) == {"SUCCESS"}, runs
    first = _rows(env, "down", "per_2m")
    assert_same_rows(down, {"per_2m": first}, _want(down, _rows(env, "up", "per_minute")))
    assert {r["window_start"] for r in first} == {T0, T0 + 2 * M}  # W_down = 4:48: [0:00, 2:00), [2:00, 4:00)

    # A late event for 1:30 (within the upstream's 5 minutes of lateness) changes upstream minute 1,
    # so the downstream's first partition re-runs and changes.
    late = tmp_path / "late.jsonl"
    late.write_text(json.dumps({"ts": T0 + 90_000, "eid": "late", "user": "u0", "amount": 1000}) + "\n")
    run_wire(["produce", "--stream", "clicks", "--file", str(late)], env, check=True)
    # One command for the graph: `--upstream` ticks `up` first, then `down`, in one process.
    reruns = _tick(env, "down", "--upstream")
    assert set(reruns.values()) == {"SUCCESS"} and any(k.startswith("up:") for k in reruns), reruns
    assert any(k.startswith("down:e2:2026-01-01T00:00:00.000Z") for k in reruns), reruns
    second = _rows(env, "down", "per_2m")
    assert_same_rows(down, {"per_2m": second}, _want(down, _rows(env, "up", "per_minute")))
    assert second != first and max(r["total"] for r in second) >= 1000

    m = Checkpoints(store, "down").latest()
    assert m is not None and m.remap == {"minutes": Checkpoints(store, "up").latest().epoch}  # pyright: ignore[reportOptionalMemberAccess]
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        recs = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(["down", "per_2m"]), asset_partitions=["2026-01-01-00:00"]),
            limit=10,
        ).records
        versions = [(r.asset_materialization.tags or {})["dagster/data_version"] for r in recs]  # pyright: ignore[reportOptionalMemberAccess]
        assert len(versions) == 2 and versions[0] != versions[1], versions  # newest first
        ref = m.outputs["per_2m"][str(T0)]
        assert versions[0] == hashlib.sha256(store.get(ref.key)).hexdigest()[:32]
    finally:
        instance.dispose()

    # A backfill of the upstream's range, then of the downstream's, through their Dagster jobs:
    # every partition reproduced, the same data versions, no new epoch.
    for name in ("up", "down"):
        before = Checkpoints(store, name).latest().epoch  # pyright: ignore[reportOptionalMemberAccess]
        p = run_wire(["backfill", "--pipeline", name, "--format", "jsonl"], env, timeout=600, check=True)
        rows = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]
        assert rows and {r["result"] for r in rows} == {"reproduced"}, rows
        assert Checkpoints(store, name).latest().epoch == before  # pyright: ignore[reportOptionalMemberAccess]
    first_part = next(r for r in rows if r["partition"].startswith("2026-01-01T00:00:00"))
    assert first_part["windows"]["per_2m"]["data_version"] == versions[0]
