"""CLI polish (issue 25, item 8): every point a real `wire` call on an 80-column terminal.

- `wire demo`'s tables (results and dead letters) fit 80 columns: no column cut to nothing, no
  cell cut to `…`; what the tables show is, once the folded lines are joined, what
  `wire read`/`wire dlq --format jsonl` print (times shortened only as the caption says).
- `wire read` and `wire dlq` print the same tables; `wire read` of a window whose sessions are
  all still open prints a hint saying how many are open and what emits them.
- `wire status` prints no Python dict, gains the window-state size (rows and bytes per window and
  in total, as `--json` and the committed manifest say) and, per kept epoch, the chunks it read.
- Help pages: no `<list[...]>` types, `--segment`'s help says what a name may hold (it printed
  `()`), paragraphs are not broken mid-sentence; `backfill`/`dlq --format` offer only what they
  print and refuse `parquet` as a usage error (exit 2, one line, before any work).
- `wire status` with no WIRE_S3_ENDPOINT says it starts the embedded S3 server and leaves none
  running; `wire s3 stop`/`wire spark stop` with nothing running say so.
- The Dagster UI's partition keys (`2026-01-01-00:05`) are times wherever the CLI takes ISO times.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from cli_setup import local_spark
from conftest import run_wire
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.embedded import EmbeddedS3
from wire_dagster.objectstore import ObjectStore, S3Config
from wire_dagster.timeutil import iso, parse_iso, parse_time

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 80

# ---------------------------------------------------------------------------------------------
# Reading rich's box tables back from the text a command printed


@dataclass
class Box:
    title: str
    headers: list[str]  # each column's header, its folded lines joined
    widths: list[int]  # each column's width on screen, padding included
    lines: list[list[str]]  # the body's lines, split into cells (stripped)
    caption: str

    def rows(self, anchor: int) -> list[list[str]]:
        """Logical rows: a line whose `anchor` cell (a column that never wraps) is blank continues the
        row above it; a folded cell's pieces are joined with a space (compare with `squash`)."""
        out: list[list[str]] = []
        for cells in self.lines:
            if cells[anchor] or not out:
                out.append(list(cells))
            else:
                out[-1] = [f"{a} {b}".strip() for a, b in zip(out[-1], cells, strict=True)]
        return out

    def column(self, name: str) -> int:
        return self.headers.index(name)


def squash(text: str) -> str:
    """Text without whitespace: a folded cell's pieces compare equal to the text they came from."""
    return "".join(str(text).split())


def parse_tables(text: str) -> list[Box]:
    lines = text.splitlines()
    boxes = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("┏"):
            i += 1
            continue
        title = lines[i - 1].strip() if i else ""
        widths = [len(seg) for seg in lines[i][1:-1].split("┳")]
        head: list[list[str]] = []
        i += 1
        while lines[i].startswith("┃"):
            head.append([c.strip() for c in lines[i][1:-1].split("┃")])
            i += 1
        assert lines[i].startswith("┡"), lines[i]
        i += 1
        body = []
        while lines[i].startswith("│"):
            body.append([c.strip() for c in lines[i][1:-1].split("│")])
            i += 1
        assert lines[i].startswith("└"), lines[i]
        caption = lines[i + 1].strip() if i + 1 < len(lines) else ""
        headers = [" ".join(h[k] for h in head if h[k]).strip() for k in range(len(widths))]
        boxes.append(Box(title, headers, widths, body, caption))
        i += 1
    return boxes


def assert_fits(text: str, tables: int | None = None) -> list[Box]:
    """Every table line within 80 columns (prose lines are the terminal's to wrap), nothing cut to
    `…`, every column at least 3 wide with a header."""
    for line in text.splitlines():
        if line[:1] in ("┏", "┃", "┡", "│", "└"):
            assert len(line) <= WIDTH, f"{len(line)} columns: {line!r}"
    assert "…" not in text, text
    boxes = parse_tables(text)
    if tables is not None:
        assert len(boxes) == tables, text
    for b in boxes:
        assert all(w >= 3 for w in b.widths), (b.title, b.widths)
        assert all(b.headers), (b.title, b.headers)
        for cells in b.lines:
            assert len(cells) == len(b.headers), (b.title, cells)
    return boxes


def time_from_cell(cell: str, caption: str) -> int:
    """A shortened table time back to epoch ms: the caption names the day when cells omit it."""
    m = re.search(r"times UTC, (\d{4}-\d{2}-\d{2})", caption)
    text = cell if m is None else f"{m.group(1)} {cell}"
    return parse_iso(text.replace(" ", "T") + "Z")


def env80(env: dict[str, str]) -> dict[str, str]:
    return dict(env, COLUMNS=str(WIDTH), LINES="50", TERM="xterm")


# ---------------------------------------------------------------------------------------------
# One `wire demo` for the module (its bucket and WIRE_HOME of its own)


@pytest.fixture(scope="module")
def demo(s3_server: S3Config, tmp_path_factory: pytest.TempPathFactory):
    """(environment, stdout) of `wire demo` at 80 columns on a fresh bucket; its runs boot local[2]."""
    cfg = replace(s3_server, bucket="t-" + uuid.uuid4().hex[:10])
    home = tmp_path_factory.mktemp("polish-home")
    env = dict(os.environ)
    env.update(cfg.export_env())
    env.update(
        WIRE_HOME=str(home),
        WIRE_PIPELINES=str(ROOT / "pipelines"),
        WIRE_DEMO_BUCKET=cfg.bucket,
        WIRE_SPARK_MASTER="local[2]",
        DAGSTER_HOME=str(home / "dagster"),
    )
    for k in ("WIRE_SPARK_REMOTE", "WIRE_KEEP_EPOCHS", "WIRE_FAULT", "WIRE_PAUSE"):
        env.pop(k, None)
    env = env80(env)
    p = run_wire(["demo"], env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return env, p.stdout


def _jsonl(p) -> list[dict]:
    assert p.returncode == 0, p.stderr[-2000:]
    return [json.loads(x) for x in p.stdout.splitlines() if x.strip()]


def test_demo_tables_fit_80_columns_and_show_whole_values(demo) -> None:
    env, out = demo
    boxes = assert_fits(out, tables=4)  # three windows and the dead letters
    by_title = {b.title.split(" (")[0]: b for b in boxes}
    # Every result cell is the committed value (floats to 10 digits), every time complete.
    for window in ("clicks_per_minute", "clicks_5m_every_1m", "sessions"):
        b = by_title[f"clicks/{window}"]
        every = _jsonl(run_wire(["read", "--pipeline", "clicks", "--window", window, "--format", "jsonl"], env))
        assert b.title == f"clicks/{window} ({len(every)} rows; first 12)"
        want = every[:12]
        rows = b.rows(anchor=b.column("key"))
        assert len(rows) == len(want) == min(12, len(every)) > 0, (window, rows)
        for cells, w in zip(rows, want, strict=True):
            got = dict(zip(b.headers, cells, strict=True))
            assert got["key"] == w["key"]
            for c in ("window_start", "window_end"):
                assert time_from_cell(got[c], b.caption) == parse_iso(w[c]), (window, c, got[c], b.caption)
            for c, v in w.items():
                if c not in ("key", "window_start", "window_end"):
                    assert got[c] == (f"{v:.10g}" if isinstance(v, float) else str(v)), (window, c, got[c], v)
    # The dead letters: five columns the table squeezed to nothing; each record whole.
    b = by_title["dead letters"]
    assert b.headers == ["reason", "source", "epoch", "record"]
    letters = _jsonl(run_wire(["dlq", "--pipeline", "clicks", "--format", "jsonl"], env))
    rows = b.rows(anchor=b.column("source"))
    assert len(rows) == len(letters) == 6
    for cells, d in zip(rows, letters, strict=True):
        reason, source, epoch, record = cells
        assert squash(reason) == squash(d["reason"] + (f" ({d['window']})" if d["window"] else ""))
        assert source == f"{d['segment']}/{d['chunk']}/{d['row']}"
        assert epoch == ("-" if d["epoch"] is None else str(d["epoch"]))
        assert squash(record) == squash(d["record"])
    # The conservation line: no Python dict.
    line = next(x for x in out.splitlines() if x.startswith("conservation:"))
    assert "{" not in line and "'" not in line, line


def test_read_and_dlq_tables_fit_80_columns(demo) -> None:
    env, _ = demo
    p = run_wire(["read", "--pipeline", "clicks", "--window", "clicks_5m_every_1m"], env)
    assert p.returncode == 0, p.stderr
    (b,) = assert_fits(p.stdout, tables=1)
    # Sliding windows span two days: the table keeps the dates, and every row is there.
    want = _jsonl(
        run_wire(["read", "--pipeline", "clicks", "--window", "clicks_5m_every_1m", "--format", "jsonl"], env)
    )
    rows = b.rows(anchor=b.column("key"))
    assert len(rows) == len(want) == 76
    assert b.caption == "times UTC"
    starts = [time_from_cell(r[b.column("window_start")], b.caption) for r in rows]
    assert starts == [parse_iso(w["window_start"]) for w in want]

    p = run_wire(["dlq", "--pipeline", "clicks"], env)
    assert p.returncode == 0, p.stderr
    (b,) = assert_fits(p.stdout, tables=1)
    assert len(b.rows(anchor=b.column("source"))) == 6


def test_status_shows_state_size_and_what_each_epoch_read(demo, s3_server: S3Config) -> None:
    env, _ = demo
    p = run_wire(["status", "--pipeline", "clicks"], env)
    assert p.returncode == 0, p.stderr
    assert "{" not in p.stdout and "'" not in p.stdout, p.stdout  # no Python dict
    segs, windows, epochs = assert_fits(p.stdout, tables=3)
    st = json.loads(run_wire(["status", "--pipeline", "clicks", "--json"], env, check=True).stdout)
    store = ObjectStore(replace(s3_server, bucket=env["WIRE_S3_BUCKET"]))
    cp = Checkpoints(store, "clicks")
    m = cp.latest()
    assert m is not None
    # Window state: rows and size per window, as the last manifest names them.
    assert windows.headers == ["window", "type", "counted", "late", "state rows", "state size"]
    got = {r[0]: r for r in windows.rows(anchor=0)}
    assert set(got) == set(m.state) == {"clicks_per_minute", "clicks_5m_every_1m", "sessions"}
    for name, ref in m.state.items():
        assert st["state"][name] == {"rows": ref.rows, "bytes": ref.bytes}
        assert got[name][4] == str(ref.rows)
        want = f"{ref.bytes} B" if ref.bytes < 1000 else f"{ref.bytes / 1000:.1f} kB"
        assert got[name][5] == want, (got[name], ref)
    assert st["state_bytes"] == sum(r.bytes for r in m.state.values()) > 0
    assert "state " in windows.caption and "id memory" in windows.caption
    # Per kept epoch, the chunks it read: the demo lands batch 1 in segment 0, batch 2 in segment 1,
    # batch 3 in segment 0 (one chunk each), then closes the stream (an epoch that reads nothing).
    assert epochs.headers == ["epoch", "kind", "watermark", "read"]
    read = {int(r[0]): r[3] for r in epochs.rows(anchor=0)}
    assert read == {
        1: "segment 0: chunk 0",
        2: "segment 1: chunk 0",
        3: "segment 0: chunk 1",
        4: "nothing new",
    }
    assert {n: cp.load(n).chunks for n in read} == {1: {"0": [0, 0]}, 2: {"1": [0, 0]}, 3: {"0": [1, 1]}, 4: {}}
    assert [e["read"] for e in st["epochs"]] == list(read.values())
    assert "events in: 567 = counted" in p.stdout and "dead letters: 3 malformed, 2 duplicate" in p.stdout


def test_read_of_open_sessions_says_why_it_is_empty(cli_env, tmp_path: Path) -> None:
    """Two users' clicks, processed but not closed: both sessions are still open."""
    f = tmp_path / "clicks.jsonl"
    t0 = parse_iso("2026-01-01T00:00:00Z")
    users = ["ada", "bob", "ada", "bob", "ada"]
    f.write_text(
        "".join(
            json.dumps({"event_id": f"e{i}", "user_id": u, "ts": t0 + i * 1000, "amount": 1}) + "\n"
            for i, u in enumerate(users)
        )
    )
    env = env80(local_spark(cli_env))
    run_wire(["produce", "--pipeline", "clicks", "--file", str(f)], env, check=True)
    run_wire(["process", "--pipeline", "clicks"], env, check=True)
    p = run_wire(["read", "--pipeline", "clicks", "--window", "sessions"], env, check=True)
    (b,) = assert_fits(p.stdout, tables=1)
    assert b.lines == [] and b.headers == ["key", "window_start", "window_end", "events", "total"]
    hint = p.stdout.split("└", 1)[1]
    assert "no rows committed yet: 2 windows of sessions are still open" in " ".join(hint.split()), p.stdout
    assert "gap (30s)" in hint and "wire close --pipeline clicks" in hint, p.stdout


def flat(text: str) -> str:
    """A help page as one line of words: box characters and line breaks gone."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def _help(args: list[str], env: dict[str, str]) -> str:
    p = run_wire([*args, "--help"], env)
    assert p.returncode == 0, (args, p.stderr)
    return p.stdout


COMMANDS = [
    ["produce"],
    ["close"],
    ["process"],
    ["tick"],
    ["backfill"],
    ["read"],
    ["dlq"],
    ["status"],
    ["rewind"],
    ["diff"],
    ["gc"],
    ["dev"],
    ["demo"],
    ["shell"],
    ["s3", "start"],
    ["spark", "start"],
    [],
]


def test_help_pages_fit_and_say_what_options_take(cli_env) -> None:
    from concurrent.futures import ThreadPoolExecutor

    env = env80(cli_env)
    with ThreadPoolExecutor(max_workers=2) as pool:
        pages = dict(zip(map(tuple, COMMANDS), pool.map(lambda c: _help(c, env), COMMANDS), strict=True))
    for cmd, text in pages.items():
        assert "list[" not in text and "()" not in text, (cmd, text)
        assert "<bool>" not in text, (cmd, text)  # typer's type of click's --help flag
        assert all(len(line) <= WIDTH for line in text.splitlines()), cmd
        # The description: each paragraph wraps at the terminal's width, never in the middle of a line.
        prose = text.split("╭")[0].splitlines()[3:]
        paragraph: list[str] = []
        for line in [*prose, ""]:
            if line.strip():
                paragraph.append(line.rstrip())
                continue
            for short in paragraph[:-1]:
                assert len(short) >= WIDTH - 25, (cmd, short, paragraph)
            paragraph = []
    produce = flat(pages[("produce",)])
    assert "--file -f FILE" in produce and "--segment -s SEGMENT" in produce, produce
    assert "a name of lowercase letters, digits, _ and -" in produce
    assert "every file is checked before anything is appended" in produce
    assert "--conf KEY=VALUE" in flat(pages[("spark", "start")])
    # --format offers what the command prints: parquet only where it writes Parquet.
    for cmd in (("backfill",), ("dlq",), ("diff",)):
        assert "<table|jsonl>" in pages[cmd] and "parquet" not in pages[cmd].split("╭")[1], cmd
    assert "<table|jsonl|parquet>" in pages[("read",)]
    for cmd in (["backfill"], ["dlq"], ["diff", "--from-epoch", "1", "--to-epoch", "2"]):
        p = run_wire([*cmd, "--pipeline", "clicks", "--format", "parquet"], env)
        assert p.returncode == 2 and p.stdout == "", (cmd, p.stdout, p.stderr)
        assert p.stderr.count("\n") == 1 and "'parquet' is not one of 'table', 'jsonl'" in p.stderr, p.stderr


def test_status_leaves_no_embedded_server_running_and_stops_say_what_they_did(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WIRE_")}
    env.update(WIRE_HOME=str(home), WIRE_PIPELINES=str(ROOT / "pipelines"), COLUMNS=str(WIDTH))
    server = EmbeddedS3(home / "s3")
    try:
        p = run_wire(["status", "--pipeline", "clicks"], env, timeout=180)
        assert p.returncode == 0, p.stderr
        assert "embedded S3 not running: started it" in p.stderr and "stopped after it" in p.stderr, p.stderr
        assert "last committed epoch: -" in p.stdout
        assert server.config is None, "wire status left the embedded S3 server running"
        data = str(server.data).encode()
        left = [d for d in os.listdir("/proc") if d.isdigit() and _cmdline_has(d, data)]
        assert left == [], left
        p = run_wire(["s3", "stop"], env)
        assert p.returncode == 0 and p.stdout.startswith("embedded S3 was not running"), p.stdout
        p = run_wire(["spark", "stop"], env)
        assert p.returncode == 0 and p.stdout.startswith("embedded Spark was not running"), p.stdout
        run_wire(["s3", "start"], env, check=True, timeout=180)
        p = run_wire(["status", "--pipeline", "clicks"], env)  # a running server: used, and left running
        assert p.returncode == 0 and "started" not in p.stderr, p.stderr
        assert server.config is not None
        p = run_wire(["s3", "stop"], env)
        assert p.returncode == 0 and p.stdout.strip() == "embedded S3 stopped", p.stdout
        assert server.config is None
    finally:
        server.stop()


def _cmdline_has(pid: str, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_partition_keys_are_times_where_the_cli_takes_iso_times(cli_env) -> None:
    assert parse_time("2026-01-01-00:05") == parse_iso("2026-01-01T00:05:00Z")
    assert parse_time("2026-01-01T00:05") == parse_time("2026-01-01T00:05:00+00:00")
    with pytest.raises(ValueError):
        parse_time("2026-01-01-24:05")
    env = env80(cli_env)
    # Both flags parse a partition key as its start: 00:06 is after 00:05:59 and before 00:06:01.
    for args in (
        ["--from", "2026-01-01-00:06", "--to", "2026-01-01T00:05:59Z"],
        ["--from", "2026-01-01T00:06:01Z", "--to", "2026-01-01-00:06"],
    ):
        p = run_wire(["backfill", "--pipeline", "clicks", *args], env)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert f"--from {args[1]} is after --to {args[3]}" in p.stderr, p.stderr
    p = run_wire(["backfill", "--pipeline", "clicks", "--from", "2026-01-01 at noon"], env)
    assert p.returncode == 2 and "nor a partition key (e.g. 2026-01-01-00:05)" in p.stderr, p.stderr
    assert iso(parse_time("2026-01-01-23:55")) == "2026-01-01T23:55:00.000Z"
