"""A "progress" run never materializes a partition with no content (issue 25, item 6).

An epoch that makes no partition ready still needs a run to commit it, or W never reaches the
next partition end (planner.py); that run names the newest ready partition, which may hold
nothing: here the hour before the data starts. `wire tick` runs it through the real Dagster job:
the epoch commits, and the empty partition gets no materialization (it used to get one with
`rows 0`), while the partition the events belong to materializes once W passes its end.
"""

from __future__ import annotations

import json
from pathlib import Path

from cli_setup import pipeline_env
from conftest import run_wire

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
M = 60_000

PIPELINE = {
    "name": "progressy",
    "stream": "progressy",
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
    "lateness": {"allowed": "0s"},
    "partition": "10m",
    "start": "2026-01-01T00:00:00Z",
    "windows": [{"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"n": "count"}}],
}


def produce_minutes(store, spec, tmp_path: Path, first: int, last: int) -> None:
    """Events every 10 s over minutes [first, last), one chunk per call."""
    from wire_dagster.streams import produce

    evs = [{"user": "u", "ts": T0 + m * M + s * 1000, "eid": f"e{m}-{s}"} for m in range(first, last) for s in (0, 30)]
    f = tmp_path / f"m{first}.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in evs))
    assert produce(store, spec, f, segment="0").events == len(evs)


def materialized(home: Path, asset: str) -> dict[str, list[int]]:
    """partition key -> the `rows` of each materialization of the asset (0 for dead letters)."""
    import dagster as dg

    instance = dg.DagsterInstance.from_config(str(home))
    try:
        out: dict[str, list[int]] = {}
        for rec in instance.fetch_materializations(dg.AssetKey(["progressy", asset]), limit=100).records:
            mat = rec.asset_materialization
            assert mat is not None and mat.partition is not None
            rows = mat.metadata.get("rows")
            out.setdefault(mat.partition, []).append(
                rows.value if rows is not None and isinstance(rows.value, int) else 0
            )
        return out
    finally:
        instance.dispose()


def test_a_progress_run_commits_without_materializing_an_empty_partition(store, cli_env, tmp_path: Path) -> None:
    from wire_dagster.checkpoint import Checkpoints

    (spec,), env, _, home = pipeline_env(tmp_path, cli_env, PIPELINE)

    # The data starts at 01:00; W after it is 01:03:28: the newest ready partition is 00:50, empty.
    produce_minutes(store, spec, tmp_path, 60, 64)
    first = run_wire(["tick", "--pipeline", "progressy"], env, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "SUCCESS" in first.stdout and "FAILURE" not in first.stdout, first.stdout
    m = Checkpoints(store, spec.name).latest()
    assert m is not None and m.epoch == 1, "the progress run committed its epoch"
    assert T0 + 63 * M < m.watermark < T0 + 70 * M
    assert m.outputs["per_minute"], "minutes 01:00-01:02 fired into partition 01:00"
    got = materialized(home, "per_minute")
    assert "2026-01-01-00:50" not in got, got  # the empty partition the run was named after
    assert "2026-01-01-00:50" not in materialized(home, "dead_letters")
    assert "2026-01-01-01:00" not in got, got  # not ready yet: W < 01:10

    # W passes 01:10: partition 01:00 is ready and materializes with its ten minutes' rows.
    produce_minutes(store, spec, tmp_path, 64, 12 * 6)
    second = run_wire(["tick", "--pipeline", "progressy"], env, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    got = materialized(home, "per_minute")
    assert got.get("2026-01-01-01:00") == [10], got
    assert "2026-01-01-00:50" not in got, got
    assert all(rows > 0 for rs in got.values() for rows in rs), got
