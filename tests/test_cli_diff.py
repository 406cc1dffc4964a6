"""`wire diff` and a remap people can read (issue 25, item 9).

Three epochs of the commit scenario (tests/commit_scenario.py: a tumbling, a sliding and a
session window over two segments) committed with a real Spark session, then `wire rewind
--epoch 1`, the replay, and a fourth batch. Every diff is checked against an independent
expectation: the reference implementation's committed view (tests/reference.py) after the
epochs each side of the diff covers, compared identity by identity here:

- 3 -> 4 (the rewind to epoch 1): exactly the rows epochs 2 and 3 added, removed or changed come
  back out, in the table's counts and, row by row with their aggregates, in `--format jsonl`;
- 3 -> 6 (after the replay): nothing differs, and no partition file is read (identical sha256);
- 6 -> 7 (the fourth batch: new windows, late events that change fired ones, sessions that grow):
  the rows the reference says that batch changed;
- 0 -> 1: every row of epoch 1 is added;
- an epoch that does not exist, or that garbage collection deleted: exit 2, one line (naming
  WIRE_KEEP_EPOCHS and --keep for a collected one).

The remap: `wire status --json` says per epoch which chunks of which segments it read, in words
(the chunks produced per batch, known here), the rewind reads nothing, the replayed epochs read
what the epochs they replay read; the metadata's `remap` entry says the same.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from commit_scenario import (
    assert_all,
    batch_lines,
    batch_malformed,
    expect,
    make_batches,
    pipeline_dict,
    produce_batch,
    read_all,
    tuned,
    wire,
)
from test_cli_polish import parse_tables, squash
from wire_dagster import diff as diffmod
from wire_dagster import engine
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import load_pipeline
from wire_dagster.status import partition_report
from wire_dagster.timeutil import iso, parse_iso

IDENT = ("key", "window_start", "window_end")


@pytest.fixture
def fast_spark(spark, monkeypatch):
    monkeypatch.delenv("WIRE_KEEP_EPOCHS", raising=False)
    with tuned(spark) as s:
        yield s


def _aggs(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in IDENT}


def _same(a: dict, b: dict) -> bool:
    """The same aggregates (floats to 1e-9: the reference sums in Python)."""
    a, b = _aggs(a), _aggs(b)
    if set(a) != set(b):
        return False
    for c, x in a.items():
        y = b[c]
        if isinstance(x, float) or isinstance(y, float):
            if x is None or y is None or not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9):
                if x != y:
                    return False
        elif x != y:
            return False
    return True


def expected_diff(before: dict, after: dict, windows: list[str]) -> dict[str, dict[str, dict]]:
    """Per window: the identities only `after` has (added), only `before` has (removed), and those
    both have with other aggregates (changed: (before row, after row)), from the reference's views."""
    out = {}
    for w in windows:
        a, b = before.get(w, {}), after.get(w, {})
        out[w] = {
            "added": {i: b[i] for i in set(b) - set(a)},
            "removed": {i: a[i] for i in set(a) - set(b)},
            "changed": {i: (a[i], b[i]) for i in set(a) & set(b) if not _same(a[i], b[i])},
        }
    return out


def assert_jsonl(lines: str, want: dict[str, dict[str, dict]]) -> None:
    """`wire diff --format jsonl` against the expectation: the same identities per window and change,
    ISO-8601 times as `wire read` prints them, and the aggregates before/after."""
    got: dict[str, dict[str, dict]] = {w: {"added": {}, "removed": {}, "changed": {}} for w in want}
    for line in lines.splitlines():
        r = json.loads(line)
        for c in ("window_start", "window_end"):
            assert r[c] == iso(parse_iso(r[c])), r  # 2026-03-02T00:00:10.000Z
        ident = (r["key"], parse_iso(r["window_start"]), parse_iso(r["window_end"]))
        assert ident not in got[r["window"]][r["change"]], r
        got[r["window"]][r["change"]][ident] = r
    for w, changes in want.items():
        for change, rows in changes.items():
            assert set(got[w][change]) == set(rows), (w, change, set(got[w][change]) ^ set(rows))
            for ident, row in rows.items():
                g = got[w][change][ident]
                before, after = row if change == "changed" else (row, row) if change == "removed" else (None, row)
                if change != "added":
                    assert before is not None and _same(g["before"], before), (w, change, ident, g, before)
                else:
                    assert "before" not in g
                if change != "removed":
                    assert after is not None and _same(g["after"], after), (w, change, ident, g, after)
                else:
                    assert "after" not in g


def assert_table(stdout: str, want: dict[str, dict[str, dict]], windows: list[str]) -> None:
    tables = parse_tables(stdout)
    assert len(tables) == 1, stdout
    (t,) = tables
    assert t.headers == ["window", "added", "removed", "changed", "unchanged", "partitions"]
    rows = {r[0]: r for r in t.rows(anchor=0)}
    assert list(rows) == windows
    for w in windows:
        counts = [int(x) for x in rows[w][1:4]]
        assert counts == [len(want[w][c]) for c in ("added", "removed", "changed")], (w, counts, stdout)


def core_jsonl(store: ObjectStore, spec, a: int, b: int) -> str:
    """`wire diff --format jsonl`'s lines, from the core API."""
    return "".join(json.dumps(r) + "\n" for r in diffmod.diff_epochs(store, spec, a, b).rows())


def expected_read(split: dict[str, list[int]]) -> str:
    """What an epoch that read these chunks (segment -> sequences) says it read."""
    parts = []
    for s in sorted(split):
        q = sorted(split[s])
        assert q == list(range(q[0], q[-1] + 1))
        parts.append(f"segment {s}: chunk {q[0]}" if len(q) == 1 else f"segment {s}: chunks {q[0]}–{q[-1]}")
    return "; ".join(parts)


def test_diff_after_rewind_replay_and_new_data(store: ObjectStore, fast_spark, cli_env, tmp_path: Path, monkeypatch):
    # The scenario's pipeline with 15 s of allowed lateness (more than a tumbling window): an event
    # in the last tumbling window that fired is then always counted, and changes that window.
    raw = pipeline_dict("dif")
    raw["lateness"] = {"allowed": "15s"}
    yml = tmp_path / "dif.yaml"
    yml.write_text(yaml.safe_dump(raw, sort_keys=False))
    spec = load_pipeline(yml)
    names = [w.name for w in spec.windows]
    cp = Checkpoints(store, spec.name)
    batches = make_batches(31, 4)  # the first three are epochs 1-3; the fourth comes after the replay
    splits = []
    for k, b in enumerate(batches[:3]):
        splits.append(produce_batch(store, spec, tmp_path, b, k))
        assert engine.process(store, spec, fast_spark).committed == [k + 1]

    def exp(n: int):
        bs = batches[:n]
        return expect(store, spec, splits[:n], sum(map(batch_lines, bs)), sum(map(batch_malformed, bs)))

    view1, view3 = exp(1).state.view, exp(3).state.view
    assert_all(store, spec, exp(3))
    before_rewind = read_all(store, spec)
    env = dict(cli_env, COLUMNS="80")
    env.pop("WIRE_KEEP_EPOCHS", None)

    # 0 -> 1: every row of epoch 1 is new.
    want = expected_diff({}, view1, names)
    assert_jsonl(
        wire(["diff", "-p", yml, "--from-epoch", "0", "--to-epoch", "1", "--format", "jsonl"], env).stdout, want
    )

    # The rewind to epoch 1 (epoch 4): epochs 2 and 3's rows go back to epoch 1's.
    wire(["rewind", "-p", yml, "--epoch", "1"], env)
    want = expected_diff(view3, view1, names)
    assert all(want[w]["removed"] for w in names), want
    p = wire(["diff", "-p", yml, "--from-epoch", "3", "--to-epoch", "4"], env)
    assert_table(p.stdout, want, names)
    assert p.stdout.startswith("from epoch 3 (process, W ") and "to   epoch 4 (rewind, W " in p.stdout
    assert_jsonl(
        wire(["diff", "-p", yml, "--from-epoch", "3", "--to-epoch", "4", "--format", "jsonl"], env).stdout, want
    )
    # The other way round: what the replay will bring back.
    back = expected_diff(view1, view3, names)
    assert_jsonl(core_jsonl(store, spec, 4, 3), back)  # through the core API: what the command prints

    # The replay (epochs 5, 6) commits epoch 3's results again: nothing differs, no file is read.
    assert engine.process(store, spec, fast_spark, max_epochs=10).committed == [5, 6]
    assert read_all(store, spec) == before_rewind
    p = wire(["diff", "-p", yml, "--from-epoch", "3", "--to-epoch", "6"], env)
    assert_table(p.stdout, expected_diff(view3, view3, names), names)
    reads = []
    real = diffmod.read_file
    monkeypatch.setattr(diffmod, "read_file", lambda st, ref: reads.append(ref) or real(st, ref))
    d = diffmod.diff_epochs(store, spec, 3, 6)
    assert reads == [] and all(wd.partitions == 0 and wd.unchanged > 0 for wd in d.windows), d.windows
    assert sum(wd.unchanged for wd in d.windows) == sum(len(view3[w]) for w in names)

    # New data: the fourth batch (new windows, sessions growing and merging) and one late event in
    # the last tumbling window that fired, for a key that has a row there: that row changes.
    w3 = exp(3).watermarks[-1]
    assert cp.load(6).watermark == w3
    end = w3 // 10_000 * 10_000  # the last tumbling window end at or before W3: fired, within lateness
    key = min(k for (k, _, e) in view3["tumble"] if e == end)
    late = {"user": key, "ts": end - 1, "eid": "dif-late-into-fired", "amount": 50}
    batches[3] = dict(batches[3], a=[*batches[3]["a"], json.dumps(late)])
    splits.append(produce_batch(store, spec, tmp_path, batches[3], 3))
    assert engine.process(store, spec, fast_spark).committed == [7]
    e4 = exp(4)
    assert_all(store, spec, e4)
    want = expected_diff(view3, e4.state.view, names)
    assert all(want[w]["added"] for w in names), want
    fired = (key, end - 10_000, end)
    before, after = want["tumble"]["changed"][fired]
    assert (after["n"], after["total"]) == (before["n"] + 1, before["total"] + 50), (before, after)
    p = wire(["diff", "-p", yml, "--from-epoch", "6", "--to-epoch", "7"], env)
    assert_table(p.stdout, want, names)
    assert_jsonl(
        wire(["diff", "-p", yml, "--from-epoch", "6", "--to-epoch", "7", "--format", "jsonl"], env).stdout, want
    )
    # One window only.
    p = wire(["diff", "-p", yml, "--from-epoch", "6", "--to-epoch", "7", "-w", "sess", "--format", "jsonl"], env)
    assert {json.loads(x)["window"] for x in p.stdout.splitlines()} == {"sess"}

    # The remap in words: per epoch, the chunks of each segment it read.
    st = json.loads(wire(["status", "-p", yml, "--json"], env).stdout)
    read = {e["epoch"]: e["read"] for e in st["epochs"]}
    texts = [expected_read(s) for s in splits]
    assert read == {
        1: texts[0],
        2: texts[1],
        3: texts[2],
        4: "nothing new (rewind to epoch 1)",
        5: texts[1],
        6: texts[2],
        7: texts[3],
    }, read
    assert "segment a: chunks " in texts[3] and "; segment b: chunks " in texts[3]
    assert st["read"] == texts[3]
    p = wire(["status", "-p", yml], env)
    assert "{" not in p.stdout, p.stdout
    (table,) = [t for t in parse_tables(p.stdout) if t.headers == ["epoch", "kind", "watermark", "read"]]
    shown = {int(r[0]): squash(r[3]) for r in table.rows(anchor=0)}
    assert shown == {n: squash(text) for n, text in read.items()}, p.stdout
    # ... and in the partition's Dagster metadata.
    from assets.metadata import window_metadata

    m7 = cp.load(7)
    part = int(next(iter(m7.outputs["tumble"])))
    md = window_metadata(spec, "tumble", partition_report(spec, m7, part), False, None)
    assert md["remap"] == f"epoch 7: {texts[3]}"

    # Epochs that are not there: one line, exit 2.
    p = wire(["diff", "-p", yml, "--from-epoch", "3", "--to-epoch", "99"], env, expect_rc=2)
    assert p.stdout == "" and p.stderr.strip().splitlines() == [
        "error: --to-epoch: epoch 99 does not exist (the last committed epoch is 7)"
    ]
    assert cp.gc(keep=3, grace_s=0)["epochs"] == 4 and cp.committed() == [5, 6, 7]
    p = wire(["diff", "-p", yml, "--from-epoch", "2", "--to-epoch", "7"], env, expect_rc=2)
    lines = p.stderr.strip().splitlines()
    assert p.stdout == "" and len(lines) == 1, p.stderr
    assert lines[0].startswith("error: --from-epoch: epoch 2 was garbage-collected (kept epochs: 5..7)"), lines
    assert "WIRE_KEEP_EPOCHS" in lines[0] and "--keep" in lines[0], lines
    # What is kept still compares.
    assert_jsonl(core_jsonl(store, spec, 6, 7), want)
