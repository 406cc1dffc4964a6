"""Bad values never stop a pipeline (issue 21).

The value domain (`wire_dagster.aggregates`): a number an aggregate reads is finite and of
magnitude at most 2^53 (integers exactly), a per-event gap an integer in [1, 2^53]. Produce
dead-letters every value outside it — NaN, ±Infinity, 1e300, huge integers — from JSON lines
and from typed Parquet (float, integer, decimal columns) alike, with a reason naming the field
and the value; -0.0 is stored as the zero it is, subnormals and digits past the 9th decimal as
the double they are; missing values (JSON null, Parquet null, pandas' NaN, pd.NA, None) are no
value. A record that is past produce's checks anyway (a chunk written by hand, here with
`streams.append_chunk`) is set aside by the kernel as `error: <why>` at its source position, by
both kernel plans alike and on every rerun, and the epoch commits the rest; conservation counts
it with the malformed. One end-to-end case goes through `wire produce` and `wire tick`.
"""

from __future__ import annotations

import io
import json
import math
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import reference
from cli_setup import local_spark, pipeline_env
from conftest import run_wire
from wire_dagster import engine, events, ingest, kernel, results, streams
from wire_dagster.aggregates import NOT_FINITE, OUT_OF_RANGE
from wire_dagster.bucketkernel import event_errors
from wire_dagster.extract import read_chunk
from wire_dagster.objectstore import ObjectStore
from wire_dagster.parquetio import parquet_bytes
from wire_dagster.spec import Pipeline, field_column, pipeline_from_dict
from wire_dagster.status import pipeline_status
from wire_dagster.timeutil import INF, NEG_INF, now_ms

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, the pipeline's start
PIPE = {
    "name": "badvals",
    "stream": "badvals",
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "1s", "idle_timeout": "1h"},
    "lateness": {"allowed": "0s"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "windows": [
        {
            "name": "per_minute",
            "type": "tumbling",
            "size": "1m",
            "aggregates": {
                "n": "count",
                "total": "sum(amount)",
                "mean": "avg(amount)",
                "lo": "min(amount)",
                "hi": "max(amount)",
            },
        },
        {
            "name": "sessions",
            "type": "session",
            "gap": "10s",
            "gap_field": "g",
            "aggregates": {"n": "count", "total": "sum(amount)"},
        },
    ],
}
AMOUNT, GAP = field_column("amount"), field_column("g")


@pytest.fixture(scope="module")
def spec() -> Pipeline:
    return pipeline_from_dict(PIPE)


def nf(field: str, text: str) -> str:
    return f"malformed: {field}: {text} {NOT_FINITE}"


def oor(field: str, text: str) -> str:
    return f"malformed: {field}: {text} {OUT_OF_RANGE}"


def dead_letters(store: ObjectStore, spec: Pipeline, segment: str) -> dict[int, str]:
    """row -> reason of the segment's produce-time dead letters (one chunk per segment here)."""
    return {d["row"]: d["reason"] for d in streams.iter_dead_letters(store, spec.stream) if d["segment"] == segment}


def stored(store: ObjectStore, spec: Pipeline, segment: str) -> dict[int, dict]:
    """row -> stored event (chunk columns) of the segment's first chunk."""
    [c] = streams.read_stream(store, spec.stream, {})[segment].chunks
    return {r["_row"]: r for r in read_chunk(store, spec, c).to_pylist()}


def same_float(a: float | None, b: float | None) -> bool:
    """Equal, and the same sign for zeros (a -0.0 stored must show)."""
    if a is None or b is None:
        return a == b
    return a == b and (a != 0 or math.copysign(1, a) == math.copysign(1, b))


# ------------------------------------------------------------------ produce: JSON lines
# (amount's JSON text or None when absent, g's JSON text or None, the reason or None when valid,
#  the stored amount and gap when valid)
JSON_CASES = [
    ("NaN", None, nf("amount", "NaN"), None, None),
    ("Infinity", None, nf("amount", "Infinity"), None, None),
    ("-Infinity", None, nf("amount", "-Infinity"), None, None),
    ("1e300", None, oor("amount", "1e300"), None, None),
    ("-1e300", None, oor("amount", "-1e300"), None, None),
    ("1e400", None, nf("amount", "1e400"), None, None),  # a double overflows to Infinity
    ("9007199254740993", None, oor("amount", "9007199254740993"), None, None),  # 2^53 + 1: a double would round it
    ("-9007199254740993", None, oor("amount", "-9007199254740993"), None, None),
    ("18446744073709551616", None, oor("amount", "18446744073709551616"), None, None),  # 2^64
    ("123456789012345678901234567890", None, oor("amount", "123456789012345678901234567890"), None, None),
    ("2.5", "9007199254740993", oor("g", "9007199254740993"), None, None),
    ("2.5", "18446744073709551615", oor("g", "18446744073709551615"), None, None),
    ("2.5", "0", "malformed: gap field g must be a positive integer (ms)", None, None),
    # valid: the zero, subnormals, digits past the 9th decimal, the bounds themselves, no value
    ("-0.0", None, None, 0.0, None),
    ("5e-324", None, None, 5e-324, None),
    ("0.0000000005", None, None, 5e-10, None),
    ("9007199254740992", "9007199254740992", None, 2.0**53, 2**53),
    ("-9007199254740992", None, None, -(2.0**53), None),
    ("9007199254740992.0", None, None, 2.0**53, None),
    ("null", "null", None, None, None),
    (None, None, None, None, None),
    ("7", "1500", None, 7.0, 1500),
]


def json_line(i: int, amount: str | None, g: str | None) -> str:
    fields = [f'"ts": {T0 + 1000 * i}', f'"user": "u{i % 3}"', f'"eid": "j{i}"']
    fields += [f'"amount": {amount}'] if amount is not None else []
    fields += [f'"g": {g}'] if g is not None else []
    return "{" + ", ".join(fields) + "}"


def test_json_lines_values_outside_the_domain_are_dead_letters_naming_field_and_value(
    store, spec, tmp_path: Path
) -> None:
    path = tmp_path / "values.jsonl"
    path.write_text("".join(json_line(i, a, g) + "\n" for i, (a, g, *_) in enumerate(JSON_CASES)))
    rep = streams.produce(store, spec, path, segment="j")
    n_bad = sum(1 for c in JSON_CASES if c[2])
    assert (rep.events, rep.malformed) == (len(JSON_CASES) - n_bad, n_bad)
    dl, ok = dead_letters(store, spec, "j"), stored(store, spec, "j")
    assert dl == {i: c[2] for i, c in enumerate(JSON_CASES) if c[2]}
    assert sorted(ok) == [i for i, c in enumerate(JSON_CASES) if not c[2]]
    for i, (_, _, _, amount, gap) in enumerate(JSON_CASES):
        if i in ok:
            assert same_float(ok[i][AMOUNT], amount), (i, ok[i][AMOUNT], amount)
            assert ok[i][GAP] == gap, (i, ok[i][GAP], gap)


# ------------------------------------------------------------------ produce: typed Parquet
def base_columns(n: int) -> dict[str, pa.Array]:
    return {
        "ts": pa.array([T0 + 1000 * i for i in range(n)], pa.int64()),
        "user": [f"u{i % 2}" for i in range(n)],
        "eid": [f"p{i}" for i in range(n)],
    }


# (amount column, g column or None, row -> reason, row -> stored amount of the valid rows)
PARQUET_CASES = {
    "float64": (
        pa.array(
            [1.5, float("nan"), float("inf"), float("-inf"), 1e300, -0.0, 5e-324, 2.0**53, None, 1e16, -(2.0**53)]
        ),
        None,
        {
            1: nf("amount", "NaN"),
            2: nf("amount", "Infinity"),
            3: nf("amount", "-Infinity"),
            4: oor("amount", "1e300"),
            9: oor("amount", "10000000000000000.0"),
        },
        {0: 1.5, 5: 0.0, 6: 5e-324, 7: 2.0**53, 8: None, 10: -(2.0**53)},
    ),
    "int64": (
        pa.array([2**53, 2**53 + 1, -(2**53) - 1, -(2**63), 7, None], pa.int64()),
        None,
        {1: oor("amount", str(2**53 + 1)), 2: oor("amount", str(-(2**53) - 1)), 3: oor("amount", str(-(2**63)))},
        {0: 2.0**53, 4: 7.0, 5: None},
    ),
    "uint64": (
        pa.array([2**64 - 1, 5, 2**53], pa.uint64()),
        None,
        {0: oor("amount", str(2**64 - 1))},
        {1: 5.0, 2: 2.0**53},
    ),
    "decimal": (  # a decimal column goes through JSON lines: the same checks
        pa.array([Decimal(10**30), Decimal(12), Decimal(9007199254740993), None], pa.decimal128(38, 0)),
        None,
        {0: oor("amount", str(10**30)), 2: oor("amount", "9007199254740993")},
        {1: 12.0, 3: None},
    ),
    "decimal places": (
        pa.array(
            [Decimal("0.000000000123"), Decimal("-0.5"), Decimal("12345678901.123456789012")], pa.decimal128(38, 12)
        ),
        None,
        {},
        {0: 1.23e-10, 1: -0.5, 2: 12345678901.123457},
    ),
    "gap": (
        pa.array([1.0, 2.0, 3.0]),
        pa.array([2**53 + 1, 2**53, 2**63 - 1], pa.int64()),
        {0: oor("g", str(2**53 + 1)), 2: oor("g", str(2**63 - 1))},
        {1: 2.0},
    ),
}


@pytest.mark.parametrize("case", list(PARQUET_CASES))
def test_typed_parquet_values_outside_the_domain_are_dead_letters_on_both_paths(
    store, spec, tmp_path: Path, case: str
) -> None:
    """Typed Parquet columns: the Arrow fast path sends a block with any such value to the SQL,
    whose reasons are those of the JSON-lines path for the same rows; produced through a file."""
    amount, gap, reasons, values = PARQUET_CASES[case]
    cols = {**base_columns(len(amount)), "amount": amount, **({"g": gap} if gap is not None else {})}
    table = pa.table(cols)
    ingest_ms = now_ms()
    if ingest.typed_columns(spec, table.schema):
        assert (ingest._all_valid(spec, table, ingest_ms) is None) == bool(reasons), case
    typed = ingest.normalize_table(spec, table, ingest_ms)
    via_json = ingest.normalize_lines(spec, ingest.parquet_to_lines(table), ingest_ms)
    assert typed[1].to_pylist() == via_json[1].to_pylist()
    assert [r[AMOUNT] for r in typed[0].to_pylist()] == [r[AMOUNT] for r in via_json[0].to_pylist()]

    pq.write_table(table, tmp_path / "in.parquet")
    seg = case.replace(" ", "-")
    rep = streams.produce(store, spec, tmp_path / "in.parquet", segment=seg)
    assert (rep.events, rep.malformed) == (len(values), len(reasons))
    assert dead_letters(store, spec, seg) == reasons
    ok = stored(store, spec, seg)
    assert sorted(ok) == sorted(values)
    for i, v in values.items():
        assert same_float(ok[i][AMOUNT], v), (i, ok[i][AMOUNT], v)


def test_the_arrow_path_stores_minus_zero_as_zero(spec) -> None:
    table = pa.table({**base_columns(3), "amount": pa.array([-0.0, 0.0, 1.0])})
    good = ingest._all_valid(spec, table, now_ms())
    assert good is not None  # a valid block: no SQL
    assert [math.copysign(1, x) for x in good[AMOUNT].to_pylist()] == [1, 1, 1]


def test_missing_values_as_pandas_writes_them_are_no_value(store, spec, tmp_path: Path) -> None:
    """pandas writes NaN in a float column, pd.NA and None as Parquet nulls: no value, not a dead
    letter, and not counted by sum/avg/min/max. A NaN that is in the file (pyarrow from numpy) is."""
    import pandas as pd

    base = {k: v.to_pylist() if isinstance(v, pa.Array) else v for k, v in base_columns(4).items()}
    frames = {
        "pd-nan": pd.DataFrame({**base, "amount": [1.0, np.nan, 2.5, np.nan]}),
        "pd-na": pd.DataFrame({**base, "amount": pd.array([1.0, pd.NA, 2.5, None], dtype="Float64")}),
        "pd-none": pd.DataFrame({**base, "amount": [1.0, None, 2.5, None]}, dtype=object).astype({"ts": "int64"}),
    }
    for seg, df in frames.items():
        df.to_parquet(tmp_path / f"{seg}.parquet")
        rep = streams.produce(store, spec, tmp_path / f"{seg}.parquet", segment=seg)
        assert (rep.events, rep.malformed) == (4, 0), seg
        assert [r[AMOUNT] for _, r in sorted(stored(store, spec, seg).items())] == [1.0, None, 2.5, None], seg
    raw = pa.table({**base_columns(4), "amount": pa.array(np.array([1.0, np.nan, 2.5, np.nan]))})
    assert raw["amount"].null_count == 0  # NaN, not null
    pq.write_table(raw, tmp_path / "raw.parquet")
    rep = streams.produce(store, spec, tmp_path / "raw.parquet", segment="raw-nan")
    assert (rep.events, rep.malformed) == (2, 2)
    assert dead_letters(store, spec, "raw-nan") == {1: nf("amount", "NaN"), 3: nf("amount", "NaN")}


# ------------------------------------------------------------------ the kernel's guard
def test_event_errors_name_the_field_and_value(spec) -> None:
    schema = (
        events.chunk_schema(spec).append(pa.field(kernel.SEG, pa.string())).append(pa.field(kernel.SEQ, pa.int64()))
    )
    rows = [
        {"_t": T0, AMOUNT: 1.0, GAP: 5},
        {"_t": None, AMOUNT: float("nan")},  # the time first
        {"_t": 2**60, AMOUNT: 1.0},
        {"_t": T0, AMOUNT: float("-inf")},
        {"_t": T0, AMOUNT: 2.0**60},
        {"_t": T0, AMOUNT: -0.0, GAP: -(2**62)},
        {"_t": T0, AMOUNT: None, GAP: None},
    ]
    table = pa.Table.from_pylist(
        [
            {c: r.get(c, "0" if c == kernel.SEG else 0 if c in ("_row", kernel.SEQ) else None) for c in schema.names}
            for r in rows
        ],
        schema=pa.schema([f.with_nullable(True) for f in schema]),
    )
    assert event_errors(spec, table).to_pylist() == [
        None,
        "null time field ts",
        f"ts: {2**60} {OUT_OF_RANGE}",
        f"amount: -Infinity {NOT_FINITE}",
        f"amount: 1.152921504606847e+18 {OUT_OF_RANGE}",
        f"g: {-(2**62)} {OUT_OF_RANGE}",
        None,
    ]
    assert event_errors(spec, table.slice(6)).null_count == 1


def as_counted(records: list[dict]) -> list[dict]:
    """Produced JSON records (ts, user, amount) as the events the reference takes."""
    return [{"_t": e["ts"], "_key": e["user"], AMOUNT: float(e["amount"]), GAP: None} for e in records]


def assert_batch_results(store: ObjectStore, spec: Pipeline, counted: list[dict]) -> None:
    """The committed results are the batch aggregation (tests/reference.py) of the events that
    count: a closed stream with nothing late."""

    def by_window(rows):
        return sorted(rows, key=lambda r: (r["key"], r["window_start"]))

    reference.assert_same_rows(
        spec,
        {w.name: by_window(results.read_results(store, spec, w.name).to_pylist()) for w in spec.windows},
        {w.name: by_window(reference.batch(spec, w, counted).values()) for w in spec.windows},
    )


def hand_chunk(spec: Pipeline, rows: list[dict]) -> pa.Table:
    """Chunk rows as an older producer or a hand might write them: no validation."""
    schema = events.chunk_schema(spec)
    return pa.Table.from_pylist(
        [{**{c: None for c in schema.names}, **r, "_row": i} for i, r in enumerate(rows)], schema=schema
    )


# A hand-written chunk: (time offset, user, id, amount, gap, the kernel's reason or None)
HAND = [
    (1_000, "a", "h0", 1.5, None, None),
    (2_000, "a", "h1", float("nan"), None, f"error: amount: NaN {NOT_FINITE}"),
    (3_000, "b", "h2", float("inf"), None, f"error: amount: Infinity {NOT_FINITE}"),
    (4_000, "b", "h3", float("-inf"), None, f"error: amount: -Infinity {NOT_FINITE}"),
    (5_000, "a", "h4", 1e300, None, f"error: amount: 1e+300 {OUT_OF_RANGE}"),
    (6_000, "a", "h5", 2.0**60, None, f"error: amount: 1.152921504606847e+18 {OUT_OF_RANGE}"),
    (7_000, "b", "h6", 2.0, 2**62, f"error: g: {2**62} {OUT_OF_RANGE}"),
    (8_000, "b", "h1", 4.0, None, None),  # the id of an errored event: counted, not a duplicate
    (9_000, "a", "h0", 100.0, None, "duplicate"),
    (61_000, "a", "h9", -0.0, None, None),
    (62_000, "c", "h10", 5e-324, 3_000, None),
    (70_000, "c", "h11", None, None, None),
]


def _hand_rows() -> list[dict]:
    return [{"_t": T0 + dt, "_key": u, "_id": i, AMOUNT: a, GAP: g} for dt, u, i, a, g, _ in HAND]


def test_the_kernel_sets_aside_what_it_cannot_process_and_commits_the_rest(
    store, spark, spec, tmp_path: Path, monkeypatch
) -> None:
    """A hand-written chunk with NaN, ±Infinity, 1e300, 2^60 and a huge gap, next to a produced
    chunk: the epoch commits; each such record is an `error:` dead letter at its position, the
    rest equals the reference, conservation balances (errors with the malformed). The engine
    commits it by key buckets; the single task, run again on the same chunks (a retry), gives the
    same dead letters, byte for byte, and the same results."""
    monkeypatch.setenv("WIRE_SINGLE_TASK_ROWS", "0")  # the engine's epoch by key buckets
    streams.append_chunk(store, spec, "hand", hand_chunk(spec, _hand_rows()), events.DLQ_SCHEMA.empty_table())
    good = [{"ts": T0 + 30_000 + 4_000 * i, "user": "a", "eid": f"q{i}", "amount": i} for i in range(5)]
    (tmp_path / "good.jsonl").write_text("".join(json.dumps(e) + "\n" for e in good) + '{"ts": 1, "amount": NaN}\n')
    assert streams.produce(store, spec, tmp_path / "good.jsonl", segment="prod").malformed == 1
    streams.close_stream(store, spec)

    out = engine.process(store, spec, spark)
    m = out.manifest
    assert m is not None
    assert out.committed == [1] and m.watermark == INF
    errors = sum(1 for *_, why in HAND if why and why.startswith("error"))
    assert m.totals.malformed == errors + 1 and m.totals.duplicate == 1
    assert m.totals.events_in == len(HAND) + len(good) + 1 and m.totals.balanced()

    letters = results.read_dead_letters(store, spec)
    got = sorted((d["segment"], d["chunk"], d["row"], d["reason"]) for d in letters)
    want = sorted(
        [("hand", 0, i, why) for i, (*_, why) in enumerate(HAND) if why]
        + [("prod", 0, len(good), "malformed: time out of range in ts")]
    )
    assert got == want

    counted = [{"_t": T0 + dt, "_key": u, AMOUNT: a, GAP: g} for dt, u, _, a, g, why in HAND if not why]
    assert_batch_results(store, spec, counted + as_counted(good))
    mins = [
        r["lo"] for r in results.read_results(store, spec, "per_minute").to_pylist() if r["window_start"] == T0 + 60_000
    ]
    assert [math.copysign(1, x) for x in mins if x == 0] == [1]  # the -0.0 was stored as 0.0

    # The epoch again, by the other plan (a retry): the bytes of the committed dead letters, the same results.
    views = streams.read_stream(store, spec.stream, {})
    chunks = kernel.epoch_chunks(store.fs_options(), store.bucket, spec, [c for v in views.values() for c in v.chunks])
    again = kernel.run_epoch(spark, spec, chunks, {}, None, NEG_INF, INF, single_task=True)
    committed = pa.concat_tables(pq.read_table(io.BytesIO(store.get(ref.key))) for ref in m.dead_letters)
    assert parquet_bytes(again.dead_letters) == parquet_bytes(committed.drop_columns(["epoch"]))
    assert (again.errors, again.duplicate, again.events) == (errors, 1, len(HAND) + len(good) - errors)
    for w in spec.windows:
        keys = [(k, "ascending") for k in ("key", "window_start", "window_end")]
        outputs = again.windows[w.name].outputs.drop_columns(["retract"]).sort_by(keys)
        assert outputs.to_pylist() == results.read_results(store, spec, w.name).sort_by(keys).to_pylist(), w.name


# ------------------------------------------------------------------ end to end: wire produce, wire tick
def test_wire_produce_and_tick_keep_committing_past_bad_values(store, cli_env, spark_remote, tmp_path: Path) -> None:
    """The issue's case through the CLI: NaN, Infinity and 1e300 in JSON lines are dead letters at
    produce (exit 0, counted as malformed); hand-written chunks with such values are dead-lettered
    by the kernel — in the first tick by key buckets, in the second by the single task, on the
    session's Spark Connect server when there is one; every `wire tick` exits 0 without a
    traceback and commits, and the good records beside the bad ones are counted."""
    (spec,), env, _, _ = pipeline_env(tmp_path, local_spark(cli_env, spark_remote), PIPE)

    first = [{"ts": T0 + 5_000 * i, "user": f"u{i % 2}", "eid": f"a{i}", "amount": i + 0.25} for i in range(8)]
    bad = [
        f'{{"ts": {T0 + 1}, "user": "u0", "eid": "b0", "amount": NaN}}',
        f'{{"ts": {T0 + 2}, "user": "u1", "eid": "b1", "amount": Infinity}}',
        f'{{"ts": {T0 + 3}, "user": "u0", "eid": "b2", "amount": 1e300}}',
    ]
    f1 = tmp_path / "first.jsonl"
    f1.write_text(
        "".join(json.dumps(e) + "\n" for e in first[:4])
        + "\n".join(bad)
        + "\n"
        + "".join(json.dumps(e) + "\n" for e in first[4:])
    )
    p = run_wire(["produce", "--pipeline", "badvals", "--file", str(f1), "--segment", "0"], env, timeout=300)
    assert p.returncode == 0 and "3 malformed" in p.stdout, p.stdout + p.stderr
    hand = [
        {"_t": T0 + 10_000, "_key": "u1", "_id": "h0", AMOUNT: float("nan")},
        {"_t": T0 + 11_000, "_key": "u1", "_id": "h1", AMOUNT: 3.0},
        {"_t": T0 + 12_000, "_key": "u0", "_id": "h2", AMOUNT: 1e300},
    ]
    streams.append_chunk(store, spec, "hand", hand_chunk(spec, hand), events.DLQ_SCHEMA.empty_table())

    def tick(single_task_rows: str) -> None:
        t = run_wire(["tick", "--pipeline", "badvals"], dict(env, WIRE_SINGLE_TASK_ROWS=single_task_rows), timeout=600)
        assert t.returncode == 0 and "Traceback" not in t.stderr, t.stdout[-3000:] + t.stderr[-3000:]
        runs = dict(line.rsplit(": ", 1) for line in t.stdout.splitlines() if line.startswith("run "))
        assert runs and set(runs.values()) == {"SUCCESS"}, t.stdout

    tick("0")
    from wire_dagster.checkpoint import Checkpoints

    m1 = Checkpoints(store, spec.name).latest()
    assert m1 is not None and m1.epoch == 1 and m1.totals.malformed == 3 + 2 and m1.totals.balanced()

    # The pipeline keeps committing: more good records, the stream closes, the next tick commits.
    second = [{"ts": T0 + 120_000 + 5_000 * i, "user": "u0", "eid": f"c{i}", "amount": -i} for i in range(4)]
    f2 = tmp_path / "second.jsonl"
    f2.write_text("".join(json.dumps(e) + "\n" for e in second))
    assert streams.produce(store, spec, f2, segment="0").malformed == 0  # (the CLI's produce was tested above)
    hand2 = [
        {"_t": T0 + 125_000, "_key": "u0", "_id": "h3", AMOUNT: float("-inf")},
        {"_t": T0 + 126_000, "_key": "u1", "_id": "h4", AMOUNT: 2.0**60},
    ]
    streams.append_chunk(store, spec, "hand", hand_chunk(spec, hand2), events.DLQ_SCHEMA.empty_table())
    streams.close_stream(store, spec)
    tick("1000000")
    st = pipeline_status(store, spec)  # what `wire status --json` prints
    assert st["epoch"] == 2 and st["closed"] and st["balanced"]
    assert st["dead_letters"]["malformed"] == 7
    assert st["totals"]["events_in"] == len(first) + len(bad) + len(hand) + len(second) + len(hand2)

    d = run_wire(["dlq", "--pipeline", "badvals", "--format", "jsonl"], env, timeout=300, check=True)
    letters = sorted(
        (r["segment"], r["chunk"], r["row"], r["reason"]) for r in map(json.loads, d.stdout.splitlines()) if r
    )
    assert letters == [
        ("0", 0, 4, nf("amount", "NaN")),
        ("0", 0, 5, nf("amount", "Infinity")),
        ("0", 0, 6, oor("amount", "1e300")),
        ("hand", 0, 0, f"error: amount: NaN {NOT_FINITE}"),
        ("hand", 0, 2, f"error: amount: 1e+300 {OUT_OF_RANGE}"),
        ("hand", 1, 0, f"error: amount: -Infinity {NOT_FINITE}"),
        ("hand", 1, 1, f"error: amount: 1.152921504606847e+18 {OUT_OF_RANGE}"),
    ]
    assert_batch_results(
        store, spec, as_counted(first + second) + [{"_t": T0 + 11_000, "_key": "u1", AMOUNT: 3.0, GAP: None}]
    )
