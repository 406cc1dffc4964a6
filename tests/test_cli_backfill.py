"""`wire backfill`: one Dagster run over a range of partitions, in a subprocess, against the real
embedded S3 server and Spark, with a private DAGSTER_HOME.

The stream (two users, in order within the 2 s bound, nothing late, no duplicates) is produced
in two batches with a `wire tick` after each, so the committed timeline has two processing
epochs to replay, then closed. Then:

1. bad input (unknown pipeline, unparsable time, --from after --to, a range holding no committed
   partition, and a backfill before anything is committed): exit 2, one line on stderr, not one
   object written to the bucket and no Dagster run;
2. a backfill of every committed partition (stderr on a terminal: a progress bar there, JSON
   lines on stdout) reproduces every partition: no new epoch, the same objects in the bucket,
   and in Dagster's instance every partition's latest materialization is the backfill run's,
   with the data version it had (the content hash of the committed file);
3. the pipeline file changes (an aggregate added to the tumbling window, the session gap from
   20 s to 30 s): a backfill commits one new epoch; the results equal a plain batch aggregation
   under the new file (tests/reference.py); exactly the partitions whose brute-force content
   changed are reported `changed`, with the new epoch and the new content's data version; the
   sliding window, untouched, is `reproduced` everywhere;
4. a backfill of a sub-range with the new file (--from/--to) covers exactly the partitions the
   range overlaps and reproduces them: the backfill epoch is itself reproducible.
"""

from __future__ import annotations

import hashlib
import json
import os
import pty
import re
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import yaml

from cli_setup import local_spark, pipeline_env
from conftest import run_wire
from reference import assert_same_rows, batch_of_clicks
from wire_dagster.timeutil import parse_iso

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
S, M = 1000, 60_000
NAME = "bfill"

PIPELINE = {
    "name": NAME,
    "stream": NAME,
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
    "lateness": {"allowed": "10s"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-02T00:00:00Z",  # bounded, as the examples: Dagster checks keys against 1,440 partitions, not ~500 K
    "windows": [
        {"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"n": "count", "total": "sum(amount)"}},
        {
            "name": "two_by_one",
            "type": "sliding",
            "size": "2m",
            "slide": "1m",
            "aggregates": {"n": "count", "mean": "avg(amount)"},
        },
        {"name": "sessions", "type": "session", "gap": "20s", "aggregates": {"n": "count", "total": "sum(amount)"}},
    ],
}


def changed_pipeline() -> dict:
    d = json.loads(json.dumps(PIPELINE))
    d["windows"][0]["aggregates"]["low"] = "min(amount)"
    d["windows"][2]["gap"] = "30s"
    return d


def make_events() -> list[dict]:
    """u1 every 7 s over 0:00-2:48; u2 in bursts whose gaps (24-26 s) split sessions at 20 s but not at 30 s."""
    evs = [{"user": "u1", "ts": T0 + i * 7000, "amount": i % 5} for i in range(25)]
    evs += [{"user": "u2", "ts": T0 + 30_000 + i * 3000, "amount": 10 + i} for i in range(6)]
    evs += [
        {"user": "u2", "ts": T0 + 70_000 + i * 4000, "amount": 2 * i} for i in range(5)
    ]  # 25 s after the last burst
    evs += [{"user": "u2", "ts": T0 + 110_000 + i * 5000, "amount": i} for i in range(4)]  # 24 s after
    evs.sort(key=lambda e: e["ts"])
    for i, e in enumerate(evs):
        e["eid"] = f"e{i}"
    return evs


def partition_of(end: int) -> int:
    return T0 + (end - 1 - T0) // M * M


def dagster_key(p: int) -> str:
    return f"2026-01-01-00:{(p - T0) // M:02d}"


def by_partition(rows: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in rows:
        out.setdefault(partition_of(r["window_end"]), []).append(r)
    return out


def read_window(env: dict[str, str], window: str) -> list[dict]:
    p = run_wire(["read", "--pipeline", NAME, "--window", window, "--format", "jsonl"], env, timeout=180, check=True)
    rows = [json.loads(ln) for ln in p.stdout.splitlines() if ln.strip()]
    for r in rows:
        r["window_start"], r["window_end"] = parse_iso(r["window_start"]), parse_iso(r["window_end"])
    return sorted(rows, key=lambda r: (r["key"], r["window_start"], r["window_end"]))


def assert_results(env: dict[str, str], spec, want: dict[str, list[dict]]) -> None:
    assert_same_rows(spec, {w.name: read_window(env, w.name) for w in spec.windows}, want)


def run_wire_tty_stderr(args: list[str], env: dict[str, str], timeout: float = 600) -> tuple[int, str, str]:
    """`wire ARGS` with stdout on a pipe and stderr on a pseudo-terminal (as in an interactive shell
    whose output is redirected): (exit code, stdout, everything written to the terminal)."""
    import shutil
    import sys

    exe = shutil.which("wire", path=str(Path(sys.executable).parent)) or "wire"
    master, slave = pty.openpty()
    env = dict(env, TERM="xterm-256color", COLUMNS="120")
    proc = subprocess.Popen(
        [exe, *args], env=env, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, start_new_session=True
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:  # the terminal must be read while the command runs, or its writes block
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                return
            if not b:
                return
            chunks.append(b)

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise
    finally:
        t.join(timeout=10)
        os.close(master)
    return proc.returncode, stdout.decode(), b"".join(chunks).decode(errors="replace")


def bucket_snapshot(store) -> set[tuple[str, str]]:
    return {(o.key, o.etag) for o in store.list("")}


def dagster_runs(home: Path) -> list:
    import dagster as dg

    if not (home / "dagster.yaml").exists():
        return []
    inst = dg.DagsterInstance.from_config(str(home))
    try:
        return list(inst.get_runs())
    finally:
        inst.dispose()


class Materialization(NamedTuple):
    run_id: str
    tags: Mapping[str, str]
    metadata: Mapping[str, object]  # the values of the metadata entries


def latest_materializations(home: Path, spec, partitions: list[int]) -> dict[tuple[str, int], Materialization]:
    """(window, partition) -> the latest AssetMaterialization in the instance, and its run."""
    import dagster as dg

    inst = dg.DagsterInstance.from_config(str(home))
    try:
        out = {}
        for w in spec.windows:
            for p in partitions:
                recs = inst.fetch_materializations(
                    dg.AssetRecordsFilter(asset_key=dg.AssetKey([NAME, w.name]), asset_partitions=[dagster_key(p)]),
                    limit=1,
                ).records
                if recs:
                    mat = recs[0].asset_materialization
                    assert mat is not None  # a materialization's record carries it
                    meta = {k: v.value for k, v in mat.metadata.items()}
                    out[(w.name, p)] = Materialization(recs[0].run_id, dict(mat.tags or {}), meta)
        return out
    finally:
        inst.dispose()


def content_version(store, m, window: str, p: int) -> str:
    """What the data_version of (window, partition) must be: the content hash of its committed file."""
    ref = m.outputs.get(window, {}).get(str(p))
    return hashlib.sha256(store.get(ref.key)).hexdigest()[:32] if ref else "empty"


def test_backfill_reproduces_then_commits_a_code_change(store, cli_env, spark_remote, tmp_path: Path) -> None:
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.spec import load_pipeline
    from wire_dagster.streams import close_stream, produce

    (spec,), env, pdir, home = pipeline_env(tmp_path, local_spark(cli_env, spark_remote), PIPELINE)
    pfile = pdir / f"{NAME}.yaml"
    cp = Checkpoints(store, spec.name)

    events = make_events()
    half = len(events) // 2
    for i, batch in enumerate((events[:half], events[half:])):
        f = tmp_path / f"batch{i}.jsonl"
        f.write_text("".join(json.dumps(e) + "\n" for e in batch))
        assert produce(store, spec, f, segment="0").events == len(batch)

        # 1a. Nothing committed yet: a backfill is bad input.
        if i == 0:
            before = bucket_snapshot(store)
            p = run_wire(["backfill", "--pipeline", NAME], env, timeout=300)
            assert p.returncode == 2, p.stdout + p.stderr
            assert p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1, p.stderr
            assert bucket_snapshot(store) == before
            assert dagster_runs(home) == []
        else:
            close_stream(store, spec)

        if i == 1:  # the second tick with stderr on a terminal: its progress bar goes there, stdout stays parseable
            rc, stdout, term = run_wire_tty_stderr(["tick", "--pipeline", NAME], env)
            assert rc == 0, stdout[-3000:] + term[-3000:]
            assert "tick bfill: runs" in term, term[-3000:]
        else:
            p = run_wire(["tick", "--pipeline", NAME], env, timeout=600)
            assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
            stdout = p.stdout
        lines = [ln for ln in stdout.splitlines() if ln.strip()]
        assert lines and all(re.fullmatch(r"run \S+: SUCCESS", ln) for ln in lines), stdout

    m1 = cp.latest()
    assert m1 is not None
    assert [cp.load(n).kind for n in cp.committed()] == ["process", "process"], "two processing epochs to replay"
    assert_results(env, spec, batch_of_clicks(spec, events))  # closed stream, nothing late
    held = sorted({int(p) for parts in m1.outputs.values() for p in parts})
    want_held = sorted({partition_of(r["window_end"]) for rows in batch_of_clicks(spec, events).values() for r in rows})
    assert held == want_held
    span = list(range(held[0], held[-1] + M, M))
    versions_before = {k: r.tags["dagster/data_version"] for k, r in latest_materializations(home, spec, span).items()}
    assert versions_before == {(w.name, p): content_version(store, m1, w.name, p) for w in spec.windows for p in span}

    # 1b. Bad input once results are committed: exit 2, one line, nothing written, no Dagster run.
    before, runs_before = bucket_snapshot(store), len(dagster_runs(home))
    for args, msg in [
        (["--pipeline", "no_such_pipeline"], "--pipeline"),
        (["--pipeline", NAME, "--from", "yesterday"], "--from"),
        (["--pipeline", NAME, "--to", "2026-13-01T00:00:00Z"], "--to"),
        (["--pipeline", NAME, "--from", "2026-01-01T00:02:00Z", "--to", "2026-01-01T00:01:00Z"], "after"),
        (["--pipeline", NAME, "--from", "2026-01-02T00:00:00Z"], "no partition with committed results"),
        (["--pipeline", NAME, "--to", "2025-12-31T23:00:00Z"], "no partition with committed results"),
        (["--pipeline", NAME, "--format", "parquet"], "--format"),
    ]:
        p = run_wire(["backfill", *args], env, timeout=300)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert p.stdout == "", (args, p.stdout)
        assert len(p.stderr.strip().splitlines()) == 1 and p.stderr.startswith("error: ") and msg in p.stderr, (
            args,
            p.stderr,
        )
    assert bucket_snapshot(store) == before
    assert len(dagster_runs(home)) == runs_before

    # 2. Same code, same input: every partition is reproduced; nothing new in the bucket.
    rc, stdout, term = run_wire_tty_stderr(["backfill", "--pipeline", NAME, "--format", "jsonl"], env)
    assert rc == 0, stdout[-3000:] + term[-3000:]
    assert "backfill bfill: replay epochs" in term, term[-3000:]
    rows = [json.loads(ln) for ln in stdout.splitlines()]  # stdout is JSON lines only
    assert [parse_iso(r["partition"]) for r in rows] == span
    assert {r["result"] for r in rows} == {"reproduced"} and all(r["epoch"] is None for r in rows), rows
    assert {
        (w, parse_iso(r["partition"])): v["data_version"] for r in rows for w, v in r["windows"].items()
    } == versions_before
    assert cp.committed() == [1, 2], "a reproduced backfill commits no epoch"
    assert bucket_snapshot(store) == before

    runs = dagster_runs(home)
    bf = [r for r in runs if r.tags.get("wire/launched-by") == "wire backfill"]
    assert len(bf) == 1 and bf[0].is_success, [(r.run_id, r.tags) for r in runs]
    assert bf[0].tags["dagster/asset_partition_range_start"] == dagster_key(span[0])
    assert bf[0].tags["dagster/asset_partition_range_end"] == dagster_key(span[-1])
    after = latest_materializations(home, spec, span)
    assert {k: r.run_id for k, r in after.items()} == {k: bf[0].run_id for k in versions_before}
    assert {k: r.tags["dagster/data_version"] for k, r in after.items()} == versions_before
    assert {r.metadata["backfill"] for r in after.values()} == {"reproduced"}

    # 3. The pipeline changes: one new epoch, results = batch aggregation under the new file.
    pfile.write_text(yaml.safe_dump(changed_pipeline()))
    spec2 = load_pipeline(pfile)
    old, new = batch_of_clicks(spec, events), batch_of_clicks(spec2, events)
    old_p = {w.name: by_partition(old[w.name]) for w in spec.windows}
    new_p = {w.name: by_partition(new[w.name]) for w in spec2.windows}
    want_changed = {
        (w.name, p)
        for w in spec2.windows
        for p in span
        if (w.name == "per_minute" and new_p[w.name].get(p))
        or (w.name == "sessions" and old_p[w.name].get(p) != new_p[w.name].get(p))
    }
    assert any(w == "sessions" for w, _ in want_changed), "the gap change must move sessions"

    p = run_wire(["backfill", "--pipeline", NAME], env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert cp.committed() == [1, 2, 3]
    m3 = cp.latest()
    assert m3 is not None and m3.kind == "backfill"
    changed_parts = {pp for _, pp in want_changed}
    assert (
        f"{len(span)} partitions: {len(span) - len(changed_parts)} reproduced, {len(changed_parts)} changed" in p.stdout
    ), p.stdout
    assert "changed (epoch 3)" in p.stdout, p.stdout
    assert_results(env, spec2, new)
    # The published copies are exactly the new manifest's files (a partition left empty lost its copy).
    published = {o.key for o in store.list(f"pipelines/{NAME}/output/")}
    assert published == {cp.published_key(w, int(pp)) for w, parts in m3.outputs.items() for pp in parts}

    after = latest_materializations(home, spec2, span)
    bf3 = {r.run_id for r in dagster_runs(home) if r.tags.get("wire/launched-by") == "wire backfill"} - {bf[0].run_id}
    assert len(bf3) == 1
    for w in spec2.windows:
        for pp in span:
            rec = after[(w.name, pp)]
            assert rec.run_id in bf3
            assert rec.tags["dagster/data_version"] == content_version(store, m3, w.name, pp), (w.name, pp)
            if (w.name, pp) in want_changed:
                assert rec.metadata["backfill"] == "changed" and rec.metadata["backfill_epoch"] == 3, (w.name, pp)
                assert rec.tags["dagster/data_version"] != versions_before[(w.name, pp)], (w.name, pp)
            else:
                assert rec.metadata["backfill"] == "reproduced", (w.name, pp)
                assert rec.tags["dagster/data_version"] == versions_before[(w.name, pp)], (w.name, pp)

    # 4. A sub-range with the new file: exactly the partitions it overlaps, all reproduced.
    snap = bucket_snapshot(store)
    p = run_wire(
        [
            "backfill",
            "--pipeline",
            NAME,
            "--from",
            "2026-01-01T00:01:30Z",
            "--to",
            "2026-01-01T00:02:30",
            "--format",
            "jsonl",
        ],
        env,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [json.loads(ln) for ln in p.stdout.splitlines()]
    assert [parse_iso(r["partition"]) for r in rows] == [T0 + M, T0 + 2 * M]
    assert {r["result"] for r in rows} == {"reproduced"}, rows
    assert cp.committed() == [1, 2, 3]
    assert bucket_snapshot(store) == snap
