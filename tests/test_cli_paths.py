"""`--pipeline` paths, duplicate pipeline names, output paths and WIRE_KEEP_EPOCHS (issue 21, items 3, 4, 5, 8).

- A pipeline file outside WIRE_PIPELINES (where another file declares the same name) goes
  through `wire produce`, `close`, `tick`, `read -o` and `backfill` by its path: the tick commits
  the batch aggregation, and the backfill reproduces it.
- Two files in WIRE_PIPELINES declaring one name: every command naming it exits 2 with one line
  naming both files and writes nothing; the code location (what `dagster dev` loads) fails with
  the same message, not Dagster's duplicate asset key.
- `--output` / `--plot` under a regular file, in a directory that does not exist, or naming a
  directory: exit 2, one line, nothing created; a write that fails leaves the old file as it was.
- WIRE_KEEP_EPOCHS=2 over a `wire tick` that commits several epochs leaves 2 commit markers;
  unset, the pipeline's `dagster.keep_epochs` (3) applies; `wire gc` defaults to the variable.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from cli_setup import local_spark, pipeline_env
from conftest import run_wire
from reference import assert_same_rows, batch_of_clicks
from test_cli_inputs import CLICKS, _assert_one_line_error, _keys, _run_in_process
from test_cli_tick import PIPELINE as TICKY
from test_cli_tick import launched, make_events
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.objectstore import ObjectStore
from wire_dagster.spec import load_pipeline

ROOT = Path(__file__).resolve().parent.parent


def _tick_env(cli_env: dict[str, str], spark_remote: str | None) -> dict[str, str]:
    """`wire tick`'s base environment: runs attach to the session's Spark Connect server when there
    is one, else boot local[2] (as tests/test_cli_tick.py); no inherited WIRE_KEEP_EPOCHS."""
    env = local_spark(cli_env, spark_remote)
    env.pop("WIRE_KEEP_EPOCHS", None)
    return env


def _write(path: Path, raw: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return path


def _jsonl(path: Path, events: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def _markers(store: ObjectStore, pipeline: str) -> list[int]:
    """The epochs whose commit marker is in the bucket, from a listing of the pipeline's prefix."""
    return sorted(
        int(o.key.split("/")[-2]) for o in store.list(f"pipelines/{pipeline}/epochs/") if o.key.endswith("/_COMMITTED")
    )


# --- item 3 -----------------------------------------------------------------------------------


def test_tick_and_backfill_take_a_pipeline_file_outside_wire_pipelines(
    store, cli_env, spark_remote, tmp_path: Path
) -> None:
    path = _write(tmp_path / "elsewhere" / "ticky.yaml", TICKY)
    spec = load_pipeline(path)
    # WIRE_PIPELINES holds another pipeline of the same name with other windows: the path is what counts.
    decoy = dict(TICKY, windows=[dict(TICKY["windows"][0], name="decoy_only")])
    env = pipeline_env(tmp_path, _tick_env(cli_env, spark_remote), decoy).env

    events = make_events()
    f = _jsonl(tmp_path / "events.jsonl", events)
    p = run_wire(["produce", "--pipeline", str(path), "--file", str(f)], env, timeout=180, check=True)
    assert f"appended {len(events)} events" in p.stdout, p.stdout
    run_wire(["close", "--pipeline", str(path)], env, timeout=180, check=True)

    tick = run_wire(["tick", "--pipeline", str(path)], env, timeout=600)
    assert tick.returncode == 0, tick.stdout[-3000:] + tick.stderr[-3000:]
    runs = launched(tick.stdout)
    assert runs and set(runs.values()) == {"SUCCESS"}, tick.stdout
    m = Checkpoints(store, "ticky").latest()
    assert m is not None and m.epoch >= 1

    # The committed results are the batch aggregation of the file's windows (closed stream, nothing late).
    from wire_dagster.results import read_results

    want = batch_of_clicks(spec, events)
    assert_same_rows(spec, {w.name: read_results(store, spec, w.name).to_pylist() for w in spec.windows}, want)

    # `wire read -o` by the path writes exactly that table, and nothing else, into its directory.
    outdir = tmp_path / "out"
    outdir.mkdir()
    run_wire(
        [
            "read",
            "--pipeline",
            str(path),
            "--window",
            "sessions",
            "--format",
            "parquet",
            "-o",
            str(outdir / "s.parquet"),
        ],
        env,
        timeout=180,
        check=True,
    )
    assert [x.name for x in outdir.iterdir()] == ["s.parquet"]
    written = pq.read_table(outdir / "s.parquet")
    assert written.schema.field("window_start").type == pa.timestamp("ms", tz="UTC")
    for c in ("window_start", "window_end"):  # `wire read` shows window bounds as timestamps
        written = written.set_column(written.schema.get_field_index(c), c, written[c].cast(pa.int64()))
    assert written.equals(read_results(store, spec, "sessions"))

    # `wire backfill` by the path: the same Dagster job replays the timeline and reproduces every partition.
    bf = run_wire(["backfill", "--pipeline", str(path), "--format", "jsonl"], env, timeout=600)
    assert bf.returncode == 0, bf.stdout[-3000:] + bf.stderr[-3000:]
    rows = [json.loads(ln) for ln in bf.stdout.splitlines() if ln.strip()]
    assert rows and {r["result"] for r in rows} == {"reproduced"}, bf.stdout
    assert set(rows[0]["windows"]) == {w.name for w in spec.windows}


# --- item 4 -----------------------------------------------------------------------------------


def test_two_files_declaring_one_pipeline_name_are_refused(
    store: ObjectStore, cli_env, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = yaml.safe_load(CLICKS.read_text())
    pdir = tmp_path / "pipelines"
    a = _write(pdir / "a.yaml", dict(raw, name="dup", stream="dup"))
    b = _write(pdir / "b.yml", dict(raw, name="dup", stream="dup2"))
    _write(pdir / "c.yaml", dict(raw, name="solo", stream="solo"))
    events = _jsonl(
        tmp_path / "ev.jsonl",
        [{"ts": load_pipeline(a).start + i, "user_id": "u", "event_id": f"e{i}", "amount": i} for i in range(3)],
    )
    env = dict(cli_env, WIRE_PIPELINES=str(pdir), DAGSTER_HOME=str(tmp_path / "dagster-home"))
    (tmp_path / "dagster-home").mkdir()
    monkeypatch.setenv("WIRE_PIPELINES", str(pdir))
    monkeypatch.setenv("WIRE_HOME", env["WIRE_HOME"])

    commands = {
        "produce": ["--file", str(events)],
        "close": [],
        "tick": [],
        "backfill": [],
        "process": [],
        "read": ["--window", "sessions"],
        "dlq": [],
        "status": [],
        "rewind": ["--epoch", "1"],
        "gc": [],
    }
    before = _keys(store)
    for cmd, extra in commands.items():
        p = _run_in_process([cmd, "--pipeline", "dup", *extra], capsys)
        _assert_one_line_error(cmd, p, 2, "'dup' is declared by two files", str(a), str(b))
    # `wire dev` loads the whole directory into its code location: it refuses before starting anything.
    _assert_one_line_error(
        "dev", _run_in_process(["dev", "--port", "1"], capsys), 2, "'dup' is declared by two files", str(a), str(b)
    )
    real = run_wire(["tick", "--pipeline", "dup"], env, timeout=120)
    _assert_one_line_error("wire tick", real, 2, "'dup' is declared by two files", str(a), str(b))
    assert _keys(store) == before

    # The name nobody else declares still resolves; so does either file by its path.
    assert _run_in_process(["produce", "--pipeline", "solo", "--file", str(events)], capsys).returncode == 0
    assert _run_in_process(["produce", "--pipeline", str(b), "--file", str(events)], capsys).returncode == 0
    assert {k.split("/")[1] for k, _ in _keys(store) if k.startswith("streams/")} >= {"solo", "dup2"}

    # The code location `dagster dev` loads (workspace.yaml -> definitions.py) fails with the same message.
    v = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    text = v.stdout + v.stderr
    assert v.returncode == 1, text[-3000:]
    assert f"WireInputError: pipeline 'dup' is declared by two files, {a} and {b}" in text, text[-3000:]
    assert "Duplicate asset key" not in text


# --- item 5 -----------------------------------------------------------------------------------


def test_output_paths_must_lie_in_an_existing_directory(
    store: ObjectStore, cli_env, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WIRE_PIPELINES", str(ROOT / "pipelines"))
    monkeypatch.setenv("WIRE_HOME", cli_env["WIRE_HOME"])
    regular = tmp_path / "regular.txt"
    regular.write_text("a file\n")
    adir = tmp_path / "adir"
    adir.mkdir()
    nowhere = Path("/") / f"wire-test-missing-{uuid.uuid4().hex[:8]}"
    read = ["read", "--pipeline", "clicks", "--window", "sessions", "--format", "parquet", "--output"]
    status = ["status", "--pipeline", "clicks", "--plot"]
    cases = {
        "read: parent is a file": (
            [*read, str(regular / "x.parquet")],
            ["--output", f"{regular} is a file, not a directory"],
        ),
        "read: under a file": (
            [*read, str(regular / "d" / "x.parquet")],
            ["--output", f"{regular} is a file, not a directory"],
        ),
        "read: parent missing": (
            [*read, str(nowhere / "d" / "x.parquet")],
            ["--output", f"directory {nowhere / 'd'} does not exist"],
        ),
        "read: a directory": ([*read, str(adir)], ["--output", f"{adir} is a directory"]),
        "read: table to a file": (
            [*read[:-3], "--output", str(adir / "x")],
            ["--output", "only with --format parquet"],
        ),
        "plot: parent is a file": (
            [*status, str(regular / "x.png")],
            ["--plot", f"{regular} is a file, not a directory"],
        ),
        "plot: parent missing": (
            [*status, str(nowhere / "dir" / "x.png")],
            ["--plot", f"directory {nowhere / 'dir'} does not exist"],
        ),
        "plot: a directory": ([*status, str(adir)], ["--plot", f"{adir} is a directory"]),
    }
    before = _keys(store)
    for name, (args, needles) in cases.items():
        _assert_one_line_error(name, _run_in_process(args, capsys), 2, *needles)
    with ThreadPoolExecutor(max_workers=2) as pool:  # the same through real `wire` processes
        real = {
            n: pool.submit(run_wire, cases[n][0], cli_env, 120) for n in ("read: under a file", "plot: parent missing")
        }
        for n, fut in real.items():
            _assert_one_line_error(n, fut.result(), 2, *cases[n][1])
    assert not nowhere.exists()
    assert regular.read_text() == "a file\n" and list(adir.iterdir()) == []
    assert _keys(store) == before

    # A write that fails half-way leaves the existing file as it was and no temporary file beside it.
    import matplotlib.figure

    out, chart = adir / "s.parquet", adir / "lag.png"
    out.write_bytes(b"old")
    chart.write_bytes(b"old chart")

    def half_then_fail(obj, where, *args, **kwargs):
        Path(where).write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(pq, "write_table", half_then_fail)
        m.setattr(matplotlib.figure.Figure, "savefig", half_then_fail)
        assert _run_in_process([*read, str(out)], capsys).returncode == 1
        assert _run_in_process([*status, str(chart)], capsys).returncode == 1
    assert out.read_bytes() == b"old" and chart.read_bytes() == b"old chart"
    assert sorted(x.name for x in adir.iterdir()) == ["lag.png", "s.parquet"]
    # And one that succeeds replaces them whole.
    assert _run_in_process([*read, str(out)], capsys).returncode == 0
    assert _run_in_process([*status, str(chart)], capsys).returncode == 0
    assert pq.read_table(out).column_names[:3] == ["key", "window_start", "window_end"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(x.name for x in adir.iterdir()) == ["lag.png", "s.parquet"]


# --- item 8 -----------------------------------------------------------------------------------


KEEP = {
    "event": {"key": "user", "time": "ts", "id": "eid"},
    "watermark": {"max_out_of_orderness": "0s", "idle_timeout": "1h"},
    "partition": "1m",
    "start": "2026-01-01T00:00:00Z",
    "limits": {"chunk_rows": 2, "max_chunks_per_epoch": 1},  # a chunk per epoch: one tick commits several
    "dagster": {"keep_epochs": 3},
    "windows": [{"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"n": "count"}}],
}


def test_wire_keep_epochs_wins_over_the_pipeline_files_keep_epochs(
    store, cli_env, spark_remote, tmp_path: Path
) -> None:
    from wire_dagster.streams import close_stream, produce

    t0 = 1_767_225_600_000
    events = [{"user": f"u{i % 2}", "ts": t0 + i * 20_000, "eid": f"e{i}"} for i in range(12)]  # 6 chunks
    f = _jsonl(tmp_path / "events.jsonl", events)
    names = ("kept_by_env", "kept_by_file")
    kept = [dict(KEEP, name=name, stream=name) for name in names]
    loaded, env, _, _ = pipeline_env(tmp_path, _tick_env(cli_env, spark_remote), *kept, home=tmp_path / "home-env")
    specs = dict(zip(names, loaded, strict=True))
    for spec in specs.values():
        assert produce(store, spec, f).events == len(events)
        close_stream(store, spec)

    envs = {
        "kept_by_env": dict(env, WIRE_KEEP_EPOCHS="2"),
        "kept_by_file": dict(env, DAGSTER_HOME=str(tmp_path / "home-file")),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        ticks = {n: pool.submit(run_wire, ["tick", "--pipeline", n], env, 600) for n, env in envs.items()}
        ticks = {n: t.result() for n, t in ticks.items()}
    for n, t in ticks.items():
        assert t.returncode == 0 and set(launched(t.stdout).values()) == {"SUCCESS"}, (
            n + t.stdout[-2000:] + t.stderr[-2000:]
        )

    last: dict[str, int] = {}
    for n in specs:
        m = Checkpoints(store, n).latest()
        assert m is not None, n
        last[n] = m.epoch
    assert min(last.values()) >= 6, last  # one chunk per epoch: the tick committed every one of them
    assert _markers(store, "kept_by_env") == [last["kept_by_env"] - 1, last["kept_by_env"]]
    assert _markers(store, "kept_by_file") == [last["kept_by_file"] - 2, last["kept_by_file"] - 1, last["kept_by_file"]]

    # `wire gc`'s default is the same setting: the variable, else the file's.
    env = envs["kept_by_file"]
    run_wire(["gc", "--pipeline", "kept_by_file", "--grace", "0"], env, timeout=120, check=True)
    assert len(_markers(store, "kept_by_file")) == 3
    run_wire(["gc", "--pipeline", "kept_by_file"], dict(env, WIRE_KEEP_EPOCHS="1"), timeout=120, check=True)
    assert _markers(store, "kept_by_file") == [last["kept_by_file"]]
    bad = run_wire(["gc", "--pipeline", "kept_by_file"], dict(env, WIRE_KEEP_EPOCHS="zero"), timeout=120)
    _assert_one_line_error("WIRE_KEEP_EPOCHS=zero", bad, 2, "WIRE_KEEP_EPOCHS")
    assert _markers(store, "kept_by_file") == [last["kept_by_file"]]
