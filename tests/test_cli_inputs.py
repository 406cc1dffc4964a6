"""`wire` on bad input: exit 2 with one line on stderr and nothing written; dead letters through
`wire dlq`; and the S3 secret never reaches any output or any object in the bucket."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import run_wire
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import load_pipeline

ROOT = Path(__file__).resolve().parent.parent
CLICKS = ROOT / "pipelines" / "clicks.yaml"
START = load_pipeline(CLICKS).start


def _event(i: int, **kw) -> dict:
    return {"ts": START + 1000 * i, "user_id": f"u{i % 3}", "event_id": f"e{i}", "amount": float(i), **kw}


def _jsonl(path: Path, recs: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))
    return path


def _keys(store: ObjectStore) -> list[tuple[str, str]]:
    return sorted((o.key, o.etag) for o in store.list(""))


def _run_all(cases: dict[str, list[str]], env: dict[str, str]) -> dict[str, subprocess.CompletedProcess]:
    """Run independent `wire` invocations a few at a time (each is a fresh interpreter)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        futs = {name: pool.submit(run_wire, args, env, 120) for name, args in cases.items()}
        return {name: f.result() for name, f in futs.items()}


def _run_in_process(args: list[str], capsys: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess:
    """`wire ARGS` through the CLI's own `main` in this process (the entry point only sys.exit()s its result)."""
    from wire_dagster.cli import main

    capsys.readouterr()
    code = main(args)
    cap = capsys.readouterr()
    return subprocess.CompletedProcess(["wire", *args], code, cap.out, cap.err)


def _assert_one_line_error(name: str, p: subprocess.CompletedProcess, code: int, *needles: str) -> None:
    err = p.stderr
    assert p.returncode == code, f"{name}: exit {p.returncode}, stderr {err!r}"
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, f"{name}: {err!r}"
    assert "Traceback" not in err and p.stdout == "", f"{name}: {p.stdout!r}"
    for n in needles:
        assert n in err, f"{name}: {n!r} not in {err!r}"


def test_bad_input_exits_2_and_writes_nothing(
    store: ObjectStore,
    cli_env: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every case through the CLI's `main` in-process (cheap), and the ones marked * also as real
    `wire` processes: exit 2, exactly one line on stderr, no traceback, the bucket unchanged."""
    good = _jsonl(tmp_path / "good.jsonl", [_event(i) for i in range(3)])
    run_wire(["produce", "--pipeline", "clicks", "--file", str(good)], cli_env, check=True)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "blank.jsonl").write_bytes(b"\xef\xbb\xbf\n \n\r\n")
    (tmp_path / "adir").mkdir()
    pq.write_table(pa.table({"ts": [START], "user_id": ["u"], "event_id": ["x"]}), tmp_path / "ok.parquet")
    (tmp_path / "corrupt.parquet").write_bytes((tmp_path / "ok.parquet").read_bytes()[:-30])
    (tmp_path / "corrupt.jsonl").write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")  # Parquet magic, not Parquet
    pq.write_table(pa.table({"ts": pa.array([], pa.int64())}), tmp_path / "norows.parquet")
    bad_window = yaml.safe_load(CLICKS.read_text())
    bad_window["windows"][0]["type"] = "hopping"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad_window))
    (tmp_path / "syntax.yaml").write_text("name: clicks\nwindows: [\n")
    assert Path("/proc/self/mem").is_file()  # exists, is a file, and read() fails with EIO even for root

    def produce(file: str, *extra: str, pipeline: str = "clicks") -> list[str]:
        return ["produce", "--pipeline", pipeline, "--file", file, *extra]

    cases = {
        "*missing file": (produce(str(tmp_path / "nope.jsonl")), ["--file", "no such file"]),
        "directory": (produce(str(tmp_path / "adir")), ["--file", "not a file"]),
        "empty file": (produce(str(tmp_path / "empty.jsonl")), ["--file", "empty"]),
        "only blank lines and a BOM": (produce(str(tmp_path / "blank.jsonl")), ["--file", "empty"]),
        "*unreadable file": (produce("/proc/self/mem"), ["--file", "cannot read"]),
        "corrupt parquet": (produce(str(tmp_path / "corrupt.parquet")), ["--file", "not a readable Parquet file"]),
        "parquet magic in a .jsonl": (produce(str(tmp_path / "corrupt.jsonl")), ["--file", "Parquet"]),
        "parquet without rows": (produce(str(tmp_path / "norows.parquet")), ["--file", "no rows"]),
        "*pipeline name ../x": (produce(str(good), pipeline="../x"), ["--pipeline", "bad name"]),
        "segment with a slash": (produce(str(good), "--segment", "a/b"), ["--segment", "bad name"]),
        "segment ..": (produce(str(good), "--segment", ".."), ["--segment", "bad name"]),
        "*unknown window": (
            ["read", "--pipeline", "clicks", "--window", "nope"],
            ["--window", "nope", "clicks_per_minute"],
        ),
        "*pipeline file with a bad window type": (
            produce(str(good), pipeline=str(tmp_path / "bad.yaml")),
            ["windows.clicks_per_minute.type", "hopping"],
        ),
        "pipeline file with bad YAML": (produce(str(good), pipeline=str(tmp_path / "syntax.yaml")), ["invalid YAML"]),
        "pipeline file missing": (
            produce(str(good), pipeline=str(tmp_path / "missing.yaml")),
            ["--pipeline", "no such file"],
        ),
        "unknown pipeline name": (produce(str(good), pipeline="nosuch"), ["--pipeline", "nosuch"]),
        "negative --chunk-rows": (produce(str(good), "--chunk-rows", "-1"), ["--chunk-rows"]),
        # Several files in one command: a bad one (even the last) means none is appended.
        "*good file then a missing one": (
            produce(str(good), "--file", str(tmp_path / "nope.jsonl")),
            ["--file", "no such file"],
        ),
        "good file then an empty one": (
            produce(str(good), "--file", str(tmp_path / "empty.jsonl"), "--segment", "a", "--segment", "b"),
            ["--file", "empty"],
        ),
        "two segments for three files": (
            produce(str(good), "--file", str(good), "--file", str(good), "--segment", "a", "--segment", "b"),
            ["--segment", "3 files, 2 segments"],
        ),
        "second segment bad": (
            produce(str(good), "--file", str(good), "--segment", "a", "--segment", "b/c"),
            ["--segment", "bad name"],
        ),
    }
    before = _keys(store)
    monkeypatch.setenv("WIRE_PIPELINES", cli_env["WIRE_PIPELINES"])
    for name, (args, needles) in cases.items():
        _assert_one_line_error(name, _run_in_process(args, capsys), 2, *needles)
    results = _run_all({name: args for name, (args, _) in cases.items() if name.startswith("*")}, cli_env)
    for name, p in results.items():
        _assert_one_line_error(name, p, 2, *cases[name][1])
    assert _keys(store) == before


def test_one_produce_command_appends_several_files(store: ObjectStore, cli_env: dict[str, str], tmp_path: Path) -> None:
    """`wire produce` with three files in one process: the first to segment a, the other two to
    segment b one after the other; each segment holds exactly its files' events, in order."""
    from wire_dagster.extract import read_chunk
    from wire_dagster.streams import read_stream

    spec = load_pipeline(CLICKS)
    a = [_event(i) for i in range(5)]
    b1 = [_event(10 + i) for i in range(3)]
    b2 = [_event(20 + i) for i in range(2)]
    files = [_jsonl(tmp_path / "a.jsonl", a), _jsonl(tmp_path / "b1.jsonl", b1)]
    pq.write_table(pa.Table.from_pylist(b2), tmp_path / "b2.parquet")
    args = ["produce", "--pipeline", "clicks", "--chunk-rows", "2"]
    for f, seg in zip([*files, tmp_path / "b2.parquet"], ["a", "b", "b"], strict=True):
        args += ["--file", str(f), "--segment", seg]
    p = run_wire(args, cli_env, check=True)
    assert p.stdout.splitlines() == [
        "appended 5 events in 3 chunks to clicks/a (chunks 0..2)",
        "appended 3 events in 2 chunks to clicks/b (chunks 0..1)",
        "appended 2 events in 1 chunks to clicks/b (chunks 2..2)",
    ], p.stdout
    views = read_stream(store, "clicks", {})
    assert sorted(views) == ["a", "b"]
    for seg, want in (("a", a), ("b", b1 + b2)):
        chunks = views[seg].chunks
        assert [c.seq for c in chunks] == list(range(len(chunks)))
        got = []
        for c in chunks:
            assert c.data_key is not None, (seg, c.seq)  # no malformed record: every chunk holds data
            got += read_chunk(store, spec, c).to_pylist()
        assert [(r["_t"], r["_id"]) for r in got] == [(e["ts"], e["event_id"]) for e in want], seg


def test_dead_letters_through_wire_dlq(store: ObjectStore, cli_env: dict[str, str], tmp_path: Path) -> None:
    """An oversized record (pipeline limit 200 bytes) and a bad time, read back with `wire dlq --format jsonl`."""
    raw = yaml.safe_load(CLICKS.read_text())
    raw["limits"] = {"max_record_bytes": 200}
    pipe = tmp_path / "small.yaml"
    pipe.write_text(yaml.safe_dump(raw))
    big = json.dumps(_event(2, note="n" * 250))
    recs = [_event(0), _event(1, ts="yesterday"), big, _event(3), _event(4, ts="2026-01-01T00:00:04Z")]
    f = _jsonl(tmp_path / "mixed.jsonl", recs)
    p = run_wire(
        ["produce", "--pipeline", str(pipe), "--file", str(f), "--segment", "s7", "--chunk-rows", "2"],
        cli_env,
        check=True,
    )
    assert "appended 3 events in 3 chunks" in p.stdout and "2 malformed" in p.stdout
    p = run_wire(["dlq", "--pipeline", str(pipe), "--format", "jsonl"], cli_env, check=True)
    rows = sorted((json.loads(line) for line in p.stdout.splitlines()), key=lambda d: (d["chunk"], d["row"]))
    assert [(d["stream"], d["segment"], d["chunk"], d["row"]) for d in rows] == [
        ("clicks", "s7", 0, 1),
        ("clicks", "s7", 1, 0),
    ]
    assert rows[0]["reason"].startswith("malformed: non-numeric time field ts")
    assert rows[1]["reason"] == "malformed: record larger than 200 bytes"
    assert rows[0]["record"] == json.dumps(recs[1]) and rows[1]["record"] == big
    assert all(d["window"] is None and d["epoch"] is None for d in rows)
    # The valid rows of the same file are all kept.
    p = run_wire(["status", "--pipeline", str(pipe), "--json"], cli_env, check=True)
    st = json.loads(p.stdout)
    assert st["pending_chunks"] == 3


def test_the_secret_never_reaches_output_or_the_bucket(
    store: ObjectStore, cli_env: dict[str, str], tmp_path: Path
) -> None:
    secret = cli_env["WIRE_S3_SECRET_KEY"]
    access = cli_env["WIRE_S3_ACCESS_KEY"]
    assert len(secret) >= 16
    f = _jsonl(tmp_path / "ev.jsonl", [_event(0), "{oops", _event(2, amount="x"), _event(3)])
    wrong = dict(cli_env, WIRE_S3_SECRET_KEY="Wr0ngSecret" + secret[::-1])
    no_scheme = dict(cli_env, WIRE_S3_ENDPOINT=cli_env["WIRE_S3_ENDPOINT"].removeprefix("http://"))
    runs = {
        "produce": (["produce", "--pipeline", "clicks", "--file", str(f)], cli_env, 0),
        "status": (["status", "--pipeline", "clicks"], cli_env, 0),
        "dlq jsonl": (["dlq", "--pipeline", "clicks", "--format", "jsonl"], cli_env, 0),
        "close": (["close", "--pipeline", "clicks"], cli_env, 0),
        "produce with a wrong secret": (
            ["produce", "--pipeline", "clicks", "--file", str(f), "--segment", "w"],
            wrong,
            1,
        ),
        "endpoint without a scheme": (["status", "--pipeline", "clicks"], no_scheme, 2),
    }
    ordered = ["produce", "status", "dlq jsonl", "close"]  # in order: they build on each other
    results = {name: run_wire(runs[name][0], runs[name][1], 120) for name in ordered}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futs = {n: pool.submit(run_wire, runs[n][0], runs[n][1], 120) for n in runs if n not in ordered}
        results.update({n: fut.result() for n, fut in futs.items()})
    for name, (_, env, code) in runs.items():
        p = results[name]
        assert p.returncode == code, f"{name}: {p.returncode} {p.stderr!r}"
        for value in {secret, env["WIRE_S3_SECRET_KEY"]}:
            assert value not in p.stdout and value not in p.stderr, name
    assert "access denied" in results["produce with a wrong secret"].stderr
    reasons = sorted(json.loads(line)["reason"] for line in results["dlq jsonl"].stdout.splitlines())
    assert reasons == ["malformed: field amount has wrong type (want a number)", "malformed: unparsable JSON"]
    # Nothing stored in the bucket holds the secret (manifests, chunk indexes, data, dead letters, seals).
    keys = [o.key for o in store.list("")]
    assert any(k.endswith(".json") for k in keys) and any(k.endswith("_SEALED") for k in keys)
    for k in keys:
        body = store.get(k)
        assert secret.encode() not in body and access.encode() not in body, k


@pytest.mark.parametrize("args", [["produce", "--pipeline", "clicks", "--file", "x.jsonl", "--bogus"], ["produce"]])
def test_usage_errors_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _assert_one_line_error(" ".join(args), _run_in_process(args, capsys), 2)


def test_no_command_prints_the_help_and_no_empty_error(capsys: pytest.CaptureFixture[str]) -> None:
    p = _run_in_process([], capsys)
    assert p.returncode == 2
    assert "Usage:" in p.stdout + p.stderr and "produce" in p.stdout + p.stderr
    assert "error:" not in p.stderr, p.stderr


def test_the_console_script_exits_with_mains_code_after_every_exit_handler(tmp_path):
    """`wire` is `cli.entry`: its exit skips the interpreter's teardown (os._exit), but only after
    Python has joined the non-daemon threads and run the exit handlers registered while the
    command ran, with stdout and stderr flushed, and with the code `main` returned."""
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "wire"]
    assert script.value == "wire_dagster.cli:entry"
    marks = tmp_path / "marks"
    prog = f"""
import atexit, sys, threading, time
from pathlib import Path
import wire_dagster.cli as cli

def main(argv=None):
    marks = Path({str(marks)!r})
    def late_thread():
        while cli._EXIT_CODE is None:  # finishes only after main has returned: the exit joins it
            time.sleep(0.01)
        marks.open("a").write("thread\\n")
    threading.Thread(target=late_thread).start()
    atexit.register(lambda: marks.open("a").write("handler\\n"))
    sys.stdout.write("no newline, buffered")
    sys.stderr.write("err, buffered")
    return 3

cli.main = main
cli.entry()
"""
    p = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    assert (p.stdout, p.stderr) == ("no newline, buffered", "err, buffered")
    assert marks.read_text() == "thread\nhandler\n"


def test_a_closed_stream_refuses_new_events_in_any_segment(
    store: ObjectStore, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """After `wire close`, `wire produce` to the stream exits 2 with one line saying what to do,
    for a sealed segment and for a new one alike, and writes nothing. A new segment whose first
    chunk is claimed as the stream closes (after the producer's check) is refused too, and
    sealed: the stream stays closed."""
    from wire_dagster.errors import WireInputError
    from wire_dagster.ingest import open_input
    from wire_dagster.streams import append_chunk, read_stream, sealed_seq

    f = _jsonl(tmp_path / "a.jsonl", [_event(i) for i in range(3)])
    run_wire(["produce", "--pipeline", "clicks", "--file", str(f), "--segment", "a"], cli_env, check=True)
    run_wire(["close", "--pipeline", "clicks"], cli_env, check=True)
    before = _keys(store)
    cases = {seg: ["produce", "--pipeline", "clicks", "--file", str(f), "--segment", seg] for seg in ("a", "new")}
    for name, p in _run_all(cases, cli_env).items():
        _assert_one_line_error(name, p, 2, "stream 'clicks' is closed", "a new stream", "rewind")
    assert _keys(store) == before

    spec = load_pipeline(CLICKS)
    good, dlq = open_input(f).normalize(spec, 0, 3, START + 10**9)
    with pytest.raises(WireInputError, match="was closed during the append"):
        append_chunk(store, spec, "late", good, dlq, check_sealed=False)  # past the check, as in a race
    assert sealed_seq(store, "clicks", "late") == 0
    views = read_stream(store, "clicks", {})
    assert sorted(views) == ["a", "late"] and all(v.sealed_at is not None for v in views.values())


def test_produce_close_appends_then_closes_and_a_failed_append_closes_nothing(
    store: ObjectStore, cli_env: dict[str, str], tmp_path: Path
) -> None:
    """`wire produce --close` is `wire produce` then `wire close` in one command: every file
    appended, then every segment of the stream sealed after its last chunk and the stream marked
    closed, so the next produce is refused. A produce that fails (here a file that is no Parquet,
    checked before anything is appended) exits 2 with its one line and leaves the stream open and
    unchanged; `--stream` closes a shared stream by name the same way."""
    from wire_dagster.streams import closed_key, is_closed, last_seq, list_segments, sealed_seq

    a = _jsonl(tmp_path / "a.jsonl", [_event(i) for i in range(5)])
    b = _jsonl(tmp_path / "b.jsonl", [_event(i) for i in range(5, 9)])
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not a Parquet file")
    base = ["produce", "--pipeline", "clicks", "--chunk-rows", "2"]

    failed = run_wire([*base, "--file", str(a), "--file", str(bad), "--segment", "a", "--close"], cli_env)
    _assert_one_line_error("bad file", failed, 2, "bad.parquet")
    assert _keys(store) == [] and not is_closed(store, "clicks")

    p = run_wire([*base, "--file", str(a), "--segment", "a", "--file", str(b), "--segment", "b", "--close"], cli_env)
    assert p.returncode == 0, p.stderr
    assert "appended 5 events in 3 chunks to clicks/a" in p.stdout
    assert "appended 4 events in 2 chunks to clicks/b" in p.stdout
    assert p.stdout.strip().splitlines()[-1] == "sealed 2 segments of clicks: a@2, b@1"
    assert store.exists(closed_key("clicks"))
    assert list_segments(store, "clicks") == ["a", "b"]
    assert all(sealed_seq(store, "clicks", s) == last_seq(store, "clicks", s) for s in ("a", "b"))
    again = run_wire([*base, "--file", str(a), "--segment", "c"], cli_env)
    _assert_one_line_error("after --close", again, 2, "stream 'clicks' is closed")

    bids = [{"date_time": START + 1000 * i, "bid_id": i, "auction": i % 2, "price": i} for i in range(3)]
    shared = run_wire(
        ["produce", "--stream", "bids", "--file", str(_jsonl(tmp_path / "bids.jsonl", bids)), "--close"], cli_env
    )
    assert shared.returncode == 0, shared.stderr
    assert shared.stdout.strip().splitlines()[-1] == "sealed 1 segments of bids: 0@0"
    assert is_closed(store, "bids")
