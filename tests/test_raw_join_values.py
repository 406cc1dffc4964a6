"""Values users really send, through a join of raw streams (tests/test_raw_joins.py's `joined`:
clicks ⋈ views on user, tumbling 10 s, here with `where: left.amount > 10`).

The generated pipeline `<stage>__clicks` passes each accepted click on as it is; the join reads
the records' fields as columns, each typed as a stream's JSON lines are for `where` and `fields`
(extract._json_typed): numbers where any value is one (NaN, ±Infinity, 1e308, -0.0, 2^64 too),
the other values then null; so one click with `"amount": "12"` never stops the join. Where no
record of what a join reads holds a number, the field is text, which `left.amount > 10` cannot
compare: the tick fails with one line naming the join, the cause and the remedy (a type in the
stage's `fields:`, then `wire backfill` of the stage), and after the remedy the join commits what
a plain Python reference says. NaN is greater than every number, as in Spark and DuckDB.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pyarrow as pa
import yaml

from cli_setup import pipeline_env
from commit_scenario import subprocess_env, wire
from test_raw_joins import CLICKS, COMMON, JOINED, T0, _write
from wire_dagster import results
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.derived import JOIN_KEY, JOIN_T, _record_fields, join_rows, typed_as_one
from wire_dagster.duck import duckdb_connection
from wire_dagster.errors import one_line, worker_cause
from wire_dagster.extract import _json_type, _json_typed
from wire_dagster.spec import load_all
from wire_dagster.timeutil import INF

#: The clicks' `amount` as their JSON lines write it, and as the join reads it (numbers win).
MIXED = {
    "NaN": math.nan,
    "Infinity": math.inf,
    "-Infinity": -math.inf,
    "1e308": 1e308,
    "-0.0": -0.0,
    "null": None,
    "18446744073709551616": 2.0**64,  # past int64
    '"12"': None,  # text among numbers: the poison value
    "true": None,
    "[30]": None,
    "20": 20.0,
    "5": 5.0,
    "3.5": 3.5,
}
#: ... and a stream whose amounts are all text, as TRY_CAST(amount AS DOUBLE) reads them.
TEXT = {'"12"': 12.0, '"30.5"': 30.5, '"x"': None, '"7"': 7.0}
WHERE = {"where": "left.amount > 10"}
STAGE = {**JOINED, "windows": [{**JOINED["windows"][0], **WHERE}]}
TEXT_STAGE = {**STAGE, "name": "joined_text", "inputs": [{**CLICKS, "stream": "tclicks"}, JOINED["inputs"][1]]}
TYPED = {**TEXT_STAGE, "fields": {"amount": "TRY_CAST(amount AS DOUBLE)"}}

WORKER_ERROR = (
    "An exception was thrown from the Python worker:\n"
    "Traceback (most recent call last):\n"
    '  File "/w/wire_dagster/derived.py", line 468, in block_rows\n'
    "    out[('out', w.name)] = join_rows(w, records)\n"
    "                           ^^^^^^^^^^^^^^^^^^^^^\n"
    "wire_dagster.errors.WireInputError: join tumble: Binder Error: Cannot compare values\n"
    "\n"
    "JVM stacktrace:\n"
    "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
    "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:624)\n"
)


def test_a_spark_workers_error_is_told_by_its_own_line() -> None:
    """PySpark's message for a worker's error starts with a line that names no cause: the worker's
    exception (the traceback's last unindented line, before the JVM's stack) is the line told."""
    assert worker_cause(WORKER_ERROR) == ("WireInputError", "join tumble: Binder Error: Cannot compare values")
    as_dagster_records_it = "pyspark.errors.exceptions.captured.PythonException: \n  " + WORKER_ERROR
    assert worker_cause(as_dagster_records_it) == worker_cause(WORKER_ERROR)
    assert one_line(RuntimeError(WORKER_ERROR)) == "WireInputError: join tumble: Binder Error: Cannot compare values"
    assert worker_cause("Binder Error: Cannot compare values") is None
    assert one_line(ValueError("bad\nsecond")) == "ValueError: bad"
    no_exception_line = "An exception was thrown from the Python worker:\nTraceback (most recent call last):\n  x\n"
    assert worker_cause(no_exception_line) is None


def test_a_joins_fields_are_typed_as_a_streams_json_lines_are() -> None:
    """`_record_fields` (the join's columns of passed-on records) against DuckDB evaluating
    extract._json_type/_json_typed (the type a stream's JSON lines give a field in `where` and `fields`) over
    the same lines: the same values, for mixes of every JSON type. Both follow one rule
    (recordtypes.field_type): 2^64, an integer past int64, is a number, read as double by both (the
    SQL read it as NULL before the rule was one)."""
    values = ["1", "-2", "2.5", "NaN", "-Infinity", "1e308", "-0.0", "null", '"12"', '"x"', "true", "false", "[1]"]
    values += ['{"a": 1}', '"2026-01-01T00:00:00Z"', "18446744073709551616"]
    mixes = [values, values[:3], values[:3] + ['"12"'], ["true", "false", "null"], ['"x"', "[1]", "null"]]
    mixes += [['"12"', "true"], ["null", "null"], ["2.5", '"x"', "true", "{}"]] + [[v, "7"] for v in values]
    con = duckdb_connection()
    for mix in mixes:
        lines = [f'{{"n": {i}, "amount": {v}}}' for i, v in enumerate(mix)]
        got = _record_fields(pa.chunked_array([pa.array(lines)]))
        con.register("chunk", pa.table({"raw": pa.array([x.encode() for x in lines], pa.binary())}))
        typed = _json_typed("amount", _json_type(con, "chunk", "amount"))
        want = [r[0] for r in con.sql(f"SELECT {typed} FROM chunk").fetchall()]
        con.unregister("chunk")
        mine = got["amount"].to_pylist() if "amount" in got.column_names else [None] * len(mix)
        assert len(mine) == len(want), mix
        for a, b in zip(mine, want, strict=True):
            same = (a is None and b is None) or (
                isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
            )
            assert same or a == b, (mix, mine, want)


def test_records_typed_in_parts_are_typed_as_if_read_at_once() -> None:
    """A join's task types each file's records by itself (`_record_fields`), then joins them as one
    table (`typed_as_one`): in random splits of the mixes into files, every field is what typing
    all the records at once gives (a file whose amounts are all text among files of numbers:
    null there; booleans among text: their JSON text). Before, such files failed to concatenate
    (`ArrowTypeError: ... incompatible types: int64 vs string`) on every retry."""
    rnd = random.Random(7)
    values = ["1", "-2", "2.5", "NaN", "1e308", "null", '"12"', '"x"', "true", "false", "[1]", '{"a": 1}']
    values += ['"2026-01-01T00:00:00Z"', "18446744073709551616"]
    for _ in range(300):
        mix = [rnd.choice(values) for _ in range(rnd.randint(2, 9))]
        lines = [f'{{"n": {i}, "amount": {v}}}' if v != "absent" else f'{{"n": {i}}}' for i, v in enumerate(mix)]
        cuts = sorted(rnd.sample(range(1, len(lines)), rnd.randint(1, len(lines) - 1)))
        parts = [lines[a:b] for a, b in zip([0, *cuts], [*cuts, len(lines)], strict=True)]
        got = typed_as_one([_record_fields(pa.chunked_array([pa.array(p)])) for p in parts])
        want = _record_fields(pa.chunked_array([pa.array(lines)]))
        assert sorted(got.column_names) == sorted(want.column_names), (parts, got.schema, want.schema)
        for name in want.column_names:
            a, b = got[name].to_pylist(), want[name].to_pylist()
            same = [x == y or (x is None and y is None) or (x != x and y != y) for x, y in zip(a, b, strict=True)]
            assert all(same) and got[name].type == want[name].type, (parts, name, a, b)


def _kept(amounts: dict[str, float | None]) -> list[tuple]:
    """(eid, amount) of every click with amount > 10 (NaN too; null never), sorted by eid."""
    kept = [(f"c{i}", v) for i, v in enumerate(amounts.values()) if v is not None and (math.isnan(v) or v > 10)]
    return sorted(kept, key=lambda x: x[0])


def _produce(env: dict[str, str], tmp_path: Path, stream: str, amounts: dict[str, float | None]) -> None:
    lines = [f'{{"ts": {T0 + 500 * i}, "eid": "c{i}", "user": "u", "amount": {a}}}' for i, a in enumerate(amounts)]
    lines.append(f'{{"ts": {T0 + 100}, "eid": "c-missing", "user": "u"}}')  # no amount at all
    # a minute later (another partition of `<stage>__<stream>`, no view to meet), the one amount
    # of its partition, text: the join's task reads it beside the numbers (`typed_as_one`)
    lines.append(f'{{"ts": {T0 + 61_000}, "eid": "c-text", "user": "u", "amount": "12"}}')
    (tmp_path / f"{stream}.jsonl").write_text("\n".join(lines) + "\n")
    wire(["produce", "--stream", stream, "--file", tmp_path / f"{stream}.jsonl"], env)
    wire(["close", "--stream", stream], env)


def _joined(store, pdir: Path, name: str) -> list[tuple]:
    spec = next(s for s in load_all(pdir) if s.name == name)
    rows = results.read_results(store, spec, "tumble").to_pylist()
    assert {(r["vid"], r["page"]) for r in rows} <= {("v0", "p")}
    return sorted(((r["eid"], r["amount"]) for r in rows), key=lambda x: x[0])


def _same(got: list[tuple], want: list[tuple]) -> bool:
    return [e for e, _ in got] == [e for e, _ in want] and all(
        (math.isnan(a) and math.isnan(b)) or a == b for (_, a), (_, b) in zip(got, want, strict=True)
    )


def test_poison_values_never_stop_a_join_and_a_text_field_is_one_line_then_typed(
    store, cli_env, spark_remote, tmp_path: Path
) -> None:
    (_, env, pdir, _) = pipeline_env(
        tmp_path, subprocess_env(cli_env, spark_remote), {**COMMON, **STAGE}, {**COMMON, **TEXT_STAGE}
    )
    _produce(env, tmp_path, "clicks", MIXED)
    _produce(env, tmp_path, "tclicks", TEXT)
    (tmp_path / "views.jsonl").write_text(json.dumps({"ts": T0 + 200, "vid": "v0", "user": "u", "page": "p"}) + "\n")
    wire(["produce", "--stream", "views", "--file", tmp_path / "views.jsonl"], env)
    wire(["close", "--stream", "views"], env)

    # Numbers, NaN, Infinity, 2^64 and a few values of other types: the join commits at once.
    wire(["tick", "--pipeline", "joined", "--upstream"], env)
    got, want = _joined(store, pdir, "joined"), _kept(MIXED)
    assert want and _same(got, want), (got, want)

    # Every amount text: one line naming the join, the cause and the remedy; exit 2.
    failed = wire(["tick", "--pipeline", "joined_text", "--upstream"], env, expect_rc=2)
    said = [x for x in failed.stderr.splitlines() if x.strip()]
    assert len(said) == 1 and said[0].startswith("error: join tumble: Binder Error: "), said
    assert "TRY_CAST(amount AS DOUBLE)" in said[0] and "wire backfill" in said[0], said

    # The remedy it names: a type for the field, then a backfill of the stage (its raw inputs'
    # pipelines first: their records carry the stage's fields), then a tick.
    (pdir / "joined_text.yaml").write_text(yaml.safe_dump({**COMMON, **TYPED}))
    wire(["backfill", "--pipeline", "joined_text"], env)
    wire(["tick", "--pipeline", "joined_text", "--upstream"], env)
    got, want = _joined(store, pdir, "joined_text"), _kept(TEXT)
    assert want and _same(got, want), (got, want)


def _lines(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_task_of_text_alone_reads_it_as_the_numbers_other_tasks_and_epochs_read(
    store, cli_env, spark_remote, tmp_path: Path
) -> None:
    """A join's tasks (here one per upstream file: WIRE_DERIVED_BLOCK_FILES=1) type their records
    by themselves; a task whose only `amount` is text (`"40"`, the one click of its minute) cannot
    take `left.amount > 10`. It is run again with the types the other tasks of the epoch read
    (numbers), and a later epoch whose records hold only text reads them with the types the
    stage's earlier epochs read (`Manifest.join_numbers`): the text is null, never an error that
    stops the stage on every retry. Both ticks failed with exit 2 before."""
    (_, env, pdir, _) = pipeline_env(tmp_path, subprocess_env(cli_env, spark_remote), {**COMMON, **STAGE})
    env = {**env, "WIRE_DERIVED_BLOCK_FILES": "1"}
    minute = 60_000

    def click(eid: str, t: int, **amount) -> dict:
        return {"ts": T0 + t, "eid": eid, "user": "u", **amount}

    def view(vid: str, t: int) -> dict:
        return {"ts": T0 + t, "vid": vid, "user": "u", "page": "p"}

    # epoch 1: numbers in minute 0, a text amount alone in minute 3, a click without one in minute 6
    # (and a view: the stage's W is its inputs' least)
    clicks = [click("c0", 100, amount=20), click("c1", 200, amount=5), click("c2", 300, amount=30)]
    clicks += [click("c-text", 3 * minute + 100, amount="40"), click("c-none", 6 * minute)]
    wire(["produce", "--stream", "clicks", "--file", _lines(tmp_path / "c1.jsonl", clicks)], env)
    views = [view("v0", 200), view("v3", 3 * minute + 200), view("v6", 6 * minute)]
    wire(["produce", "--stream", "views", "--file", _lines(tmp_path / "v1.jsonl", views)], env)
    wire(["tick", "--pipeline", "joined", "--upstream"], env)
    spec = next(s for s in load_all(pdir) if s.name == "joined")
    m = Checkpoints(store, "joined").latest()
    assert m is not None and m.watermark > T0 + 3 * minute + 10_000  # minute 3's window fired
    assert m.join_numbers["clicks"]["amount"] == "int64"
    pairs = sorted((r["eid"], r["vid"]) for r in results.read_results(store, spec, "tumble").to_pylist())
    assert pairs == [("c0", "v0"), ("c2", "v0")]

    # epoch 2 reads minute 6 (no amount) and minute 30 (text alone): the earlier epoch's numbers
    wire(
        [
            "produce",
            "--stream",
            "clicks",
            "--file",
            _lines(tmp_path / "c2.jsonl", [click("c30", 30 * minute, amount="50")]),
        ],
        env,
    )
    wire(
        ["produce", "--stream", "views", "--file", _lines(tmp_path / "v2.jsonl", [view("v30", 30 * minute + 100)])], env
    )
    for stream in ("clicks", "views"):
        wire(["close", "--stream", stream], env)
    wire(["tick", "--pipeline", "joined", "--upstream"], env)
    m = Checkpoints(store, "joined").latest()
    assert m is not None and m.watermark == INF
    pairs = sorted((r["eid"], r["vid"]) for r in results.read_results(store, spec, "tumble").to_pylist())
    assert pairs == [("c0", "v0"), ("c2", "v0")]
    plain = [r for r in results.read_results(store, spec, "tumble").to_pylist() if r["eid"] == "c0"]
    assert [r["amount"] for r in plain] == [20]


def test_a_join_over_records_without_a_field_it_names_pairs_them_with_null(tmp_path: Path) -> None:
    """Records none of which has a field the join's `select` or `where` names (a block of clicks
    without `amount`) are no error: the field is null there, so `where: left.amount > 10` keeps
    none and a join without `where` selects null."""
    _write(tmp_path, STAGE)
    spec = next(s for s in load_all(tmp_path) if s.name == "joined")
    (w,) = spec.windows

    def side(rows: list[dict]) -> list[pa.Table]:
        t = pa.Table.from_pylist(rows)
        return [t.append_column(JOIN_KEY, pa.array(["u"] * len(rows))).append_column(JOIN_T, t["ts"])]

    clicks = side([{"ts": T0 + 10, "eid": "c0", "user": "u"}, {"ts": T0 + 20, "eid": "c1", "user": "u"}])
    views = side([{"ts": T0 + 30, "vid": "v0", "user": "u", "page": "p"}])
    assert join_rows(w, {"clicks": clicks, "views": views}).num_rows == 0
    plain = w.model_copy(update={"where": None})
    got = join_rows(plain, {"clicks": clicks, "views": views}).to_pylist()
    assert sorted((r["eid"], r["amount"], r["vid"]) for r in got) == [("c0", None, "v0"), ("c1", None, "v0")]


def test_a_joins_partition_keeps_its_rows_when_a_column_changes_type_between_epochs() -> None:
    """A join's columns keep their inputs' types, which the records one epoch reads decide: a
    partition whose committed `amount` is double may get rows whose `amount` is int64 (only
    integers read), null (no record had it) or text. The merge (content.apply_changes) keeps every
    committed value: double with int64 is double, with null double, with text text; it used to
    cast the committed 3.5 to the new rows' int64 (an error on every retry) or to null."""
    from wire_dagster.content import apply_changes

    old = pa.table({"key": ["u"], "window_start": [0], "window_end": [10], "amount": pa.array([3.5])})
    for typ, new, want_type, want in (
        (pa.int64(), 20, pa.float64(), [3.5, 20.0]),
        (pa.null(), None, pa.float64(), [3.5, None]),
        (pa.string(), "x", pa.string(), ["3.5", "x"]),
        (pa.float64(), 1.5, pa.float64(), [3.5, 1.5]),
    ):
        changes = pa.table(
            {"key": ["u"], "window_start": [10], "window_end": [20], "amount": pa.array([new], typ), "retract": [False]}
        )
        got = apply_changes(old, changes)
        assert (got.schema.field("amount").type, got["amount"].to_pylist()) == (want_type, want), typ
        assert got.column_names == ["key", "window_start", "window_end", "amount"]
