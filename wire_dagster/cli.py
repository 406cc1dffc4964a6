"""`wire`: the command line (DESIGN §4).

Exit codes: 0 success, 2 bad input or configuration (one line on stderr),
1 anything else (one line on stderr). Secrets never reach the output.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from .errors import WireInputError, one_line


class _PlainHelp:
    """`--help` without a type column: typer shows click's help flag as `<bool>`."""

    def get_help_option(self, ctx):
        opt = super().get_help_option(ctx)  # pyright: ignore[reportAttributeAccessIssue]
        if opt is not None:
            opt.metavar = ""
        return opt


class _Command(_PlainHelp, TyperCommand):
    pass


class _Group(_PlainHelp, TyperGroup):
    pass


app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    help="Wire: bounded-stream, event-time processing on Dagster and Spark.",
)
s3_app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True, help="The embedded S3 server (SeaweedFS).")
app.add_typer(s3_app, name="s3")
spark_app = typer.Typer(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    help="The embedded Spark Connect server (runs attach to it).",
)
app.add_typer(spark_app, name="spark")
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class Fmt(StrEnum):
    table = "table"
    jsonl = "jsonl"
    parquet = "parquet"


class PrintFmt(StrEnum):
    """The formats of a command that prints (no Parquet)."""

    table = "table"
    jsonl = "jsonl"


PIPELINE = typer.Option(..., "--pipeline", "-p", help="Pipeline name (in WIRE_PIPELINES) or path to its YAML file.")


def project_pipelines() -> Path:
    """WIRE_PIPELINES, else ./pipelines, else the project's own example pipelines."""
    env = os.environ.get("WIRE_PIPELINES")
    if env:
        return Path(env)
    if Path("pipelines").is_dir():
        return Path("pipelines")
    return Path(__file__).resolve().parent.parent / "pipelines"


def _spec(name: str):
    from .spec import find_pipeline

    return find_pipeline(name, project_pipelines())


def _definitions_of(spec):
    """A builder of the Dagster definitions `wire tick` and `wire backfill` run: those of the
    pipeline's own file (`--pipeline` named it, or it is the one file in WIRE_PIPELINES declaring
    the name), so a file outside WIRE_PIPELINES ticks too. The CLI entry point is one of the two
    places allowed to join the core and the Dagster layer: `sensors/` never imports
    `definitions.py`, it is handed this builder."""
    from definitions import build_definitions

    source = Path(spec.source) if spec.source else project_pipelines()
    return lambda: build_definitions(source)


def _check_output(path: Path | None, flag: str) -> None:
    """A file an option writes: it is not a directory, and its directory exists and is writable
    (nothing is created outside it). Checked before any work, so a bad path costs nothing."""
    if path is None:
        return
    if path.is_dir():
        raise WireInputError(f"{flag}: {path} is a directory; give a file name in it")
    parent = path.parent
    if not parent.is_dir():
        existing = next((a for a in (parent, *parent.parents) if a.exists()), None)
        if existing is not None and not existing.is_dir():
            raise WireInputError(f"{flag}: {existing} is a file, not a directory")
        raise WireInputError(f"{flag}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise WireInputError(f"{flag}: directory {parent} is not writable")


def _spark_ahead(app: str = "wire-dagster") -> None:
    """A local Spark session started now, for a command whose runs need one after its imports and
    Dagster's work (sparksession.start_ahead)."""
    from .sparksession import start_ahead

    start_ahead(app)


def _store():
    from .embedded import default_store

    return default_store()


@contextmanager
def _reading_store() -> Iterator:
    """The store of a command that only reads (status, read, dlq, diff). With no WIRE_S3_ENDPOINT
    and the embedded server not running, the server is started for the command (said on stderr:
    its data is on disk) and stopped when the command ends, not left running behind it."""
    from .embedded import EmbeddedS3, default_home
    from .objectstore import S3Config

    started = None
    if S3Config.from_env() is None:
        server = EmbeddedS3(default_home() / "s3")
        if server.config is None:
            started = server
            err.print(
                f"embedded S3 not running: started it from {server.dir} for this command, stopped after it "
                "(`wire s3 start` keeps it running)",
                markup=False,
                highlight=False,
            )
    try:
        yield _store()
    finally:
        if started is not None:
            started.stop()


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


@app.command(cls=_Command)
def produce(
    pipeline: str = typer.Option(
        "", "--pipeline", "-p", help="Pipeline (name or YAML path): append to its stream, with its checks."
    ),
    stream: str = typer.Option(
        "", "--stream", help="Stream to append to, with the stream's checks only (time and id): shared streams."
    ),
    files: list[Path] = typer.Option(
        ..., "--file", "-f", metavar="FILE", help="JSONL or Parquet file of events; repeat for several files."
    ),
    segments: list[str] = typer.Option(
        ["0"],
        "--segment",
        "-s",
        metavar="SEGMENT",
        help="Segment to append to (a name of lowercase letters, digits, _ and -): one for every file, "
        "or one per --file, in order.",
    ),
    chunk_rows: int = typer.Option(
        0,
        "--chunk-rows",
        metavar="N",
        show_default=False,
        help="Rows per chunk at most (default: the pipeline's limits.chunk_rows); a chunk also ends "
        "at limits.chunk_bytes of records.",
    ),
    close_after: bool = typer.Option(
        False,
        "--close",
        metavar="",
        help="Then close the stream, as `wire close` does (bounded data: its watermark becomes final).",
    ),
):
    """Append the events of each FILE to a stream as chunks: the pipeline's (--pipeline: records
    its checks refuse are dead letters now) or a shared one (--stream: only the stream's time and
    id are checked now; each pipeline that reads it checks the rest where it reads).

    Several files go in one command (one process): every file is checked before anything is
    appended, and different segments are appended side by side. `--close` then closes the stream
    in the same command, once every file is appended; a failed append closes nothing."""
    from .spec import check_name
    from .streams import produce_files, producer_spec

    if bool(pipeline) == bool(stream):
        raise WireInputError("produce: give --pipeline P (its stream, its checks) or --stream S (a shared stream)")
    spec = _spec(pipeline) if pipeline else None
    if spec is not None:
        spec.own_stream("produce to")
    if len(segments) not in (1, len(files)):
        raise WireInputError(f"--segment: give one, or one per --file ({len(files)} files, {len(segments)} segments)")
    for seg in segments:
        check_name(seg, "--segment")
    if chunk_rows < 0:
        raise WireInputError("--chunk-rows: must be > 0")
    pairs = list(zip(files, segments if len(segments) == len(files) else segments * len(files), strict=True))
    store = _store()
    spec = spec or producer_spec(store, stream, project_pipelines())
    with _progress() as prog:
        task = prog.add_task(
            f"produce {files[0].name}" + (f" + {len(files) - 1} files" if len(files) > 1 else ""), total=None
        )

        def cb(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        reports = produce_files(store, spec, pairs, chunk_rows=chunk_rows or None, progress=cb)
    for rep in reports:
        out.print(
            f"appended {rep.events} events in {len(rep.chunks)} chunks to {rep.stream}/{rep.segment}"
            + (f" (chunks {rep.chunks[0]}..{rep.chunks[-1]})" if rep.chunks else "")
            + (f"; {rep.malformed} malformed records went to the dead letters" if rep.malformed else "")
        )
    if close_after:
        _close(store, spec if pipeline else None, spec.stream)


@app.command(cls=_Command)
def close(
    pipeline: str = typer.Option("", "--pipeline", "-p", help="Pipeline (name or YAML path) whose stream to close."),
    stream: str = typer.Option("", "--stream", help="Stream to close (shared by the pipelines that read it)."),
):
    """Seal every segment of a stream (bounded data is a stream that closes)."""
    from .spec import check_name

    if bool(pipeline) == bool(stream):
        raise WireInputError("close: give --pipeline P (its stream) or --stream S")
    spec = _spec(pipeline) if pipeline else None
    name = spec.own_stream("close") if spec else check_name(stream, "--stream")
    _close(_store(), spec, name)


def _close(store, spec, name: str) -> None:
    """`wire close` of stream `name` (pipeline `spec`'s own, or a shared one when None), and of
    `wire produce --close` after its appends."""
    from .landing import adopt_and_close, landing_readers
    from .spec import pipelines_dir, readers_of
    from .streams import close_stream

    # A stream with a landing prefix adopts what landed (a rescan) before its segments are sealed.
    readers = landing_readers(spec) if spec else readers_of(name, pipelines_dir())
    landed = [r for r in readers if r.landing and r.stream == name]
    for rep in adopt_and_close(store, landed[0], name) if landed else []:
        out.print(f"adopted {rep.adopted} objects from {rep.landing} before closing")
    sealed = close_stream(store, name)
    out.print(f"sealed {len(sealed)} segments of {name}: " + ", ".join(f"{s}@{n}" for s, n in sealed.items()))


@app.command(cls=_Command)
def process(
    pipeline: str = PIPELINE,
    max_epochs: int = typer.Option(100, help="Stop after this many epochs."),
):
    """Commit the pending epochs directly (what the Dagster assets call), without Dagster."""
    from .engine import process as do_process
    from .timeutil import iso

    spec = _spec(pipeline)
    _spark_ahead(app="wire")
    store = _store()
    res = do_process(store, spec, max_epochs=max_epochs, progress=lambda m: err.print(m) if err.is_terminal else None)
    m = res.manifest
    if res.repaired:
        out.print(f"self-correction rewrote {len(res.repaired)} published files: " + ", ".join(res.repaired))
    if not res.committed or m is None:  # a commit leaves a manifest
        out.print(f"nothing new; last epoch {m.epoch if m else '-'}")
    else:
        out.print(
            f"committed epochs {res.committed[0]}..{res.committed[-1]}; W = {iso(m.watermark)}; "
            f"{res.pending} chunks pending"
        )


VERBOSE = typer.Option(
    False, "--verbose", "-v", metavar="", help="Stack traces and Dagster's log on the terminal (WIRE_DEBUG=1)."
)


@app.callback()
def _options(verbose: bool = VERBOSE):
    """Wire: bounded-stream, event-time processing on Dagster and Spark."""
    if verbose:
        os.environ["WIRE_DEBUG"] = "1"


@app.command(cls=_Command)
def tick(
    pipeline: str = PIPELINE,
    upstream: bool = typer.Option(
        False,
        "--upstream",
        metavar="",
        help="First tick every pipeline this one reads from, transitively, upstream first, in this process.",
    ),
):
    """One evaluation of the pipeline's Dagster sensor, then every requested run to its commit.

    Waits for a tick or backfill of the same pipeline; fails runs left behind by a killed one first.
    A failed run stops the tick with one line naming its cause (-v: Dagster's report). A stage with
    raw inputs ticks the pipelines generated for them first; `--upstream` ticks its whole upstream
    graph first, in one process (one Python start, one Spark session for them all)."""
    from . import idleticks

    spec = _spec(pipeline)
    chain = _chain(spec, upstream)
    if not idleticks.all_idle(s.name for s in chain):  # a quiet pipeline's tick starts no JVM for nothing
        _spark_ahead()
    _store()
    runs: list[dict] = []
    for each in chain:
        done = _tick(each)
        idleticks.remember(each.name, idle=not done)
        runs += done
        if any(r["status"] != "SUCCESS" for r in runs):
            break
    if not runs:
        out.print("sensor requested no run")
    for r in runs:
        if r["status"] == "SUCCESS":
            out.print(f"run {r['run_key']}: {r['status']}")
    for r in runs:
        if r["status"] != "SUCCESS":
            raise r["error"]


def _chain(spec, upstream: bool) -> list:
    """What `wire tick --pipeline <spec>` ticks, in order: the pipelines generated for the
    stage's raw inputs, the stage, then those generated for its file's computations (expand.py),
    so one command brings the file up to date; with `upstream`, before them every pipeline they
    read from, transitively, each once and after those it reads from."""
    from .derived import upstreams
    from .spec import generated_with

    fed, comps = generated_with(spec)
    own = [spec, *comps]
    if not upstream:
        return [*fed, *own]
    out: dict[str, object] = {}

    def visit(s) -> None:
        for u in upstreams(s):
            if u.spec.name not in out:
                visit(u.spec)
                out[u.spec.name] = u.spec

    for s in own:
        visit(s)
        out.setdefault(s.name, s)
    return list(out.values())


def _tick(spec) -> list[dict]:
    # The CLI entry point is one of the two places allowed to join the core and the Dagster layer.
    from sensors.tick import tick as do_tick

    with _progress() as prog:
        task = prog.add_task(f"tick {spec.name}: runs", total=None)

        def cb(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        # Messages go through the progress bar's console (stderr), above the bar.
        return do_tick(spec, _definitions_of(spec), console=prog.console, progress=cb)


def _parse_time(value: str | None, flag: str) -> int | None:
    """A time for --from/--to -> epoch ms: ISO-8601 (a time without a zone is UTC) or a partition
    key as the Dagster UI shows it (2026-01-01-00:05, UTC)."""
    if value is None:
        return None
    from .timeutil import parse_time

    try:
        return parse_time(value)
    except ValueError:
        raise WireInputError(
            f"{flag}: {value!r} is neither an ISO-8601 time (e.g. 2026-01-01T00:05:00Z) nor a partition key "
            "(e.g. 2026-01-01-00:05)"
        ) from None


@app.command(cls=_Command)
def backfill(
    pipeline: str = PIPELINE,
    start: str = typer.Option(
        None,
        "--from",
        metavar="TIME",
        help="Event time (ISO-8601, no zone = UTC; or a partition key such as 2026-01-01-00:05): first partition "
        "to recompute is the one holding it.",
    ),
    end: str = typer.Option(
        None,
        "--to",
        metavar="TIME",
        help="Event time (as --from), exclusive: partitions starting at or after it are left alone.",
    ),
    format: PrintFmt = typer.Option(
        PrintFmt.table, "--format", help="table, or jsonl (one object per partition on stdout)."
    ),
):
    """Recompute partitions from the recorded remap through the pipeline's Dagster job, in one run.

    Default range: every partition with committed results. A partition whose recomputed content
    equals the committed one is `reproduced` (same data_version, no new epoch); one that differs
    (the code or configuration changed) is committed in a new epoch and shown as `changed`. The
    pipelines generated from the pipeline's file (its raw inputs', then its computations') are
    backfilled with it, upstream first, each in its run (jsonl names each one's `pipeline`).
    """
    spec = _spec(pipeline)
    lo, hi = _parse_time(start, "--from"), _parse_time(end, "--to")
    if lo is not None and hi is not None and lo > hi:
        raise WireInputError(f"--from {start} is after --to {end}")
    specs = _chain(spec, upstream=False)  # a file's generated pipelines too (expand.py)
    _spark_ahead()
    store = _store()
    for each, parts in _backfill_ranges(store, specs, lo, hi):
        res = _backfill(each, parts)
        if res["error"] is not None:
            raise res["error"]  # one line naming the cause (-v: Dagster's report)
        _print_backfill(each, res, format, named=len(specs) > 1)


def _backfill_ranges(store, specs: list, lo: int | None, hi: int | None) -> list[tuple]:
    """(pipeline, partitions) for each of a file's pipelines with committed results in [lo, hi);
    for one pipeline, or when none has any, the reason in one line."""
    from .backfill import select_partitions

    out, first_error = [], None
    for each in specs:
        try:
            out.append((each, select_partitions(store, each, lo, hi)))
        except WireInputError as e:
            first_error = first_error or e
            if len(specs) == 1:
                raise
    if not out and first_error is not None:
        raise first_error
    return out


def _print_backfill(spec, res: dict, format: PrintFmt, named: bool) -> None:
    rows = res["partitions"]
    if format == PrintFmt.jsonl:
        for r in rows:
            obj = {k: r[k] for k in ("partition", "result", "epoch", "changed_windows", "windows")}
            sys.stdout.write(json.dumps({"pipeline": spec.name, **obj} if named else obj) + "\n")
        return
    tab = Table(
        title=f"{spec.name}: backfill run {res['run_id']} ({res['status']})",
        caption="data versions: content hashes (first 8 digits) of " + ", ".join(w.name for w in spec.windows),
    )
    tab.add_column("partition", no_wrap=True)
    tab.add_column("result", no_wrap=True)
    tab.add_column("windows changed", overflow="fold")
    tab.add_column("data versions", overflow="fold")
    for r in rows:
        what = f"changed (epoch {r['epoch']})" if r["result"] == "changed" else "reproduced"
        versions = " ".join(str(r["windows"].get(w.name, {}).get("data_version") or "-")[:8] for w in spec.windows)
        tab.add_row(r["partition"], what, ", ".join(r["changed_windows"]) or "-", versions)
    out.print(tab)
    n_changed = sum(1 for r in rows if r["result"] == "changed")
    out.print(f"{len(rows)} partitions: {len(rows) - n_changed} reproduced, {n_changed} changed")


def _backfill(spec, parts: list[int]) -> dict:
    from sensors.backfill import backfill as do_backfill

    with _progress() as prog:
        task = prog.add_task(f"backfill {spec.name}: replay epochs", total=None)

        def cb(done: int, total: int) -> None:
            prog.update(task, completed=done, total=total)

        return do_backfill(spec, _definitions_of(spec), partitions=parts, console=prog.console, progress=cb)


def _results_table(store, spec, window: str):
    import pyarrow as pa
    import pyarrow.compute as pc

    from .results import read_results

    t = read_results(store, spec, window)
    for c in TIME_COLUMNS:
        i = t.schema.get_field_index(c)
        t = t.set_column(i, c, pc.cast(t[c], pa.timestamp("ms", tz="UTC")))
    return t


#: The time columns of a window's results (epoch ms; ISO-8601 in jsonl, shortened in tables).
TIME_COLUMNS = ("window_start", "window_end")


def _jsonable(v):
    from datetime import datetime

    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%dT%H:%M:%S.") + f"{v.microsecond // 1000:03d}Z"
    return v


def _write_jsonl(rows: list[dict], cols: list[str]) -> None:
    for r in rows:
        sys.stdout.write(json.dumps({c: _jsonable(r.get(c)) for c in cols}) + "\n")


@app.command(cls=_Command)
def read(
    pipeline: str = PIPELINE,
    window: str = typer.Option(..., "--window", "-w", help="Window name from the pipeline file."),
    format: Fmt = typer.Option(Fmt.table, "--format"),
    output: Path = typer.Option(None, "--output", "-o", help="With --format parquet: file to write (default: stdout)."),
):
    """The committed results of a window: key, window_start, window_end, one column per aggregate.

    The table shortens times (no date when all fall on one day, no milliseconds when all are whole
    seconds: the caption says which) and floats (10 digits); jsonl and parquet are exact."""
    import pyarrow.parquet as pq

    from .checkpoint import Checkpoints
    from .results import read_results
    from .spec import owner
    from .status import empty_result_hint, fit_table, written_atomically

    spec = owner(_spec(pipeline), window)  # a computation's output: its generated pipeline's (expand.py)
    spec.window(window)
    if output is not None and format != Fmt.parquet:
        raise WireInputError(f"--output: only with --format parquet ({format.value} goes to stdout)")
    _check_output(output, "--output")
    if format == Fmt.parquet and output is None and sys.stdout.isatty():
        raise WireInputError("--format parquet: give --output FILE or redirect stdout to a file")
    with _reading_store() as store:
        if format == Fmt.table:
            raw = read_results(store, spec, window)
            hint = None if raw.num_rows else empty_result_hint(spec, Checkpoints(store, spec.name).latest(), window)
        else:
            t = _results_table(store, spec, window)
    if format == Fmt.table:
        title = f"{spec.name}/{window} ({raw.num_rows} rows)"
        out.print(fit_table(title, raw.column_names, raw.to_pylist(), times=TIME_COLUMNS))
        if hint:
            out.print(hint, markup=False, highlight=False)
        return
    if format == Fmt.parquet:
        if output is None:
            pq.write_table(t, sys.stdout.buffer)
            return
        with written_atomically(output) as tmp:
            pq.write_table(t, str(tmp))
        return
    _write_jsonl(t.to_pylist(), t.column_names)


@app.command(cls=_Command)
def dlq(pipeline: str = PIPELINE, format: PrintFmt = typer.Option(PrintFmt.table, "--format")):
    """Dead letters: the event, its reason (late, duplicate, malformed: ...) and source position.

    Those of the pipelines generated from the pipeline's file too (its raw inputs' and its
    computations': a computation's errors), each named in jsonl's `pipeline`."""
    from .status import dead_letter_table

    spec = _spec(pipeline)
    specs = _chain(spec, upstream=False)  # a file's generated pipelines too (expand.py)
    with _reading_store() as store:
        rows = _dead_letters(store, specs)
    if format == PrintFmt.jsonl:
        landed = ["object"] if any(r.get("object") for r in rows) else []  # the landed object's key
        named = ["pipeline"] if len(specs) > 1 else []
        _write_jsonl(
            rows, [*named, "reason", "window", "stream", "segment", "chunk", "row", *landed, "epoch", "record"]
        )
        return
    of = f"pipelines {', '.join(s.name for s in specs)}" if len(specs) > 1 else f"stream {spec.stream}"
    out.print(dead_letter_table(f"{spec.name}: dead letters of {of} ({len(rows)})", rows))


def _dead_letters(store, specs: list) -> list[dict]:
    """The dead letters of `specs` (a file's pipelines), each with its pipeline's name; one a
    stream holds (found where it was produced: no epoch) once, however many of them read it."""
    from .results import read_dead_letters

    out, seen = [], set()
    for s in specs:
        for r in read_dead_letters(store, s):
            if r["epoch"] is None:  # a stream's: the same for every reader
                at = (r["stream"], r["segment"], r["chunk"], r["row"])
                if at in seen:
                    continue
                seen.add(at)
            out.append({"pipeline": s.name, **r})
    return out


@app.command(cls=_Command)
def status(
    pipeline: str = PIPELINE,
    as_json: bool = typer.Option(False, "--json", metavar="", help="Everything below as one JSON object."),
    plot: Path = typer.Option(None, "--plot", help="Write a watermark-lag chart (PNG) here."),
):
    """Watermarks per segment and stream, what each kept epoch read, windows with their state size,
    partitions ready/final, counts and dead letters."""
    from .status import fit_table, pipeline_status, plot_watermarks, size_text

    spec = _spec(pipeline)
    _check_output(plot, "--plot")
    with _reading_store() as store:
        st = pipeline_status(store, spec)
        from .landing import landing_readers, landing_status

        if landing_readers(spec):
            st["landing"] = landing_status(store, spec)
        if plot:
            plot_watermarks(store, spec, plot)
        generated = _generated_status(store, spec)
    if generated:
        st["generated"] = generated
    if as_json:
        sys.stdout.write(json.dumps(st, indent=1) + "\n")
        return
    segs = [
        {
            "segment": s["segment"],
            "chunks": s["chunks"],
            "read up to": s["next_seq"],
            "max event time": s["max_event_time_ms"],
            "watermark": s["watermark_ms"],
            "decision": s["decision"],
        }
        for s in st["segments"]
    ]
    cols = ["segment", "chunks", "read up to", "max event time", "watermark", "decision"]
    out.print(fit_table(f"{spec.name}: stream {spec.stream}", cols, segs, times=("max event time", "watermark")))
    for land in st.get("landing", []):
        for s in land["segments"]:
            rewritten = ", ".join(c["key"] for c in s["changed"]) or "none"
            closing = ", ".join(s["after_close"])
            late = f"; adopted as the stream closed (not read): {closing}" if closing else ""
            out.print(
                f"landing {land['landing']} segment {s['segment']}: {s['objects']} objects adopted "
                f"({s['bytes']} bytes, {s['events']} events, {s['malformed']} malformed), last key "
                f"{s['last_key'] or '-'}; rewritten after adoption (not read again): {rewritten}{late}",
                markup=False,
                highlight=False,
            )
        if land["unsegmented"]:
            out.print(f"landing {land['landing']}: not in a segment: {', '.join(land['unsegmented'])}", markup=False)
    out.print(
        f"stream watermark: {st['watermark']}   last committed epoch: {st['epoch'] if st['epoch'] else '-'}   "
        f"pending chunks: {st['pending_chunks']}"
    )
    out.print(f"partitions ready: {len(st['partitions']['ready'])}   final: {len(st['partitions']['final'])}")
    tot = st["totals"] or {}
    counted, late, other = tot.get("counted", {}), tot.get("late", {}), tot.get("other", {})
    windows = [
        {
            "window": w.name,
            "type": w.type,
            "counted": counted.get(w.name, 0),
            "late": late.get(w.name, 0),
            "other": other.get(w.name, 0),
            "state rows": st["state"].get(w.name, {}).get("rows", 0),
            "state size": size_text(st["state"].get(w.name, {}).get("bytes", 0)),
        }
        for w in spec.windows
    ]
    # `other`: the events of the inputs a window with `input:` does not read (shown when one does).
    cols = ["window", "type", "counted", "late", *(["other"] if other else []), "state rows", "state size"]
    ids = st["ids"]
    out.print(
        fit_table(
            "windows (state: what the last epoch carries forward)",
            cols,
            windows,
            no_wrap=("counted", "late", "other", "state rows", "state size"),
            caption=f"state {st['state_rows']} rows, {size_text(st['state_bytes'])}; "
            f"id memory {ids['rows']} ids, {size_text(ids['bytes'])}",
        )
    )
    out.print(
        f"events in: {tot.get('events_in', 0)} = counted + late{' + other' if other else ''} (per window) "
        f"+ {tot.get('duplicate', 0)} duplicate "
        f"+ {tot.get('malformed', 0)} malformed + {tot.get('filtered', 0)} filtered "
        f"({'balanced' if st['balanced'] else 'NOT balanced'})",
        markup=False,
        highlight=False,
    )
    dl = st["dead_letters"]
    late_text = ", ".join(f"{w} {n}" for w, n in dl["late"].items() if n) or "none"
    out.print(
        f"dead letters: {dl['malformed']} malformed, {dl['duplicate']} duplicate, late: {late_text}",
        markup=False,
        highlight=False,
    )
    epochs = [
        {"epoch": e["epoch"], "kind": e["kind"], "watermark": e["watermark_ms"], "read": e["read"]}
        for e in st["epochs"]
    ]
    out.print(
        fit_table(
            f"epochs kept ({len(epochs)}): the chunks each read",
            ["epoch", "kind", "watermark", "read"],
            epochs,
            times=("watermark",),
            no_wrap=("epoch", "kind"),
        )
    )
    for g in generated:
        out.print(
            f"generated from this file: {g['pipeline']}, last committed epoch {g['epoch'] or '-'}, "
            f"W {g['watermark']} (wire status --pipeline {g['pipeline']})",
            markup=False,
            highlight=False,
        )
    if plot:
        out.print(f"watermark chart written to {plot}")


def _generated_status(store, spec) -> list[dict]:
    """The pipelines generated from `spec`'s file (its raw inputs' and its computations', in the
    order `wire tick` runs them), each with its last committed epoch and watermark: a file's
    status names them, since its own pipeline is only one of them."""
    from .checkpoint import Checkpoints
    from .spec import generated_with
    from .timeutil import iso

    fed, comps = generated_with(spec)
    rows = []
    for p in (*fed, *comps):
        m = Checkpoints(store, p.name).latest()
        rows.append({"pipeline": p.name, "epoch": m.epoch if m else None, "watermark": iso(m.watermark) if m else "-"})
    return rows


@app.command(cls=_Command)
def rewind(
    pipeline: str = PIPELINE, epoch: int = typer.Option(..., "--epoch", help="Committed epoch to make current again.")
):
    """Make epoch N current again; the next runs re-process from there."""
    from .replay import rewind as do_rewind
    from .timeutil import iso

    spec = _spec(pipeline)
    m = do_rewind(_store(), spec, epoch)
    out.print(f"epoch {m.epoch} now points at epoch {epoch}: W = {iso(m.watermark)}, {len(m.replay)} epochs to replay")


@app.command(cls=_Command)
def diff(
    pipeline: str = PIPELINE,
    from_epoch: int = typer.Option(
        ..., "--from-epoch", metavar="A", help="Committed epoch to compare from (0: empty)."
    ),
    to_epoch: int = typer.Option(..., "--to-epoch", metavar="B", help="Committed epoch to compare to."),
    window: list[str] = typer.Option(
        None, "--window", "-w", metavar="WINDOW", help="Only this window (repeatable; default: every window)."
    ),
    format: PrintFmt = typer.Option(
        PrintFmt.table,
        "--format",
        help="table: per window the rows added, removed, changed; jsonl: those rows, one object each.",
    ),
):
    """What changed in the committed results from epoch A to epoch B, per window.

    Rows are compared by window identity (key, window_start, window_end): added (only in B), removed
    (only in A), changed (in both, other aggregates). Partitions whose files are identical in both
    epochs are not read. Garbage collection keeps the last WIRE_KEEP_EPOCHS epochs: an older one
    cannot be compared (exit 2). jsonl: {window, change, key, window_start, window_end, before,
    after} with ISO-8601 times, as `wire read` prints them."""
    from .diff import diff_epochs
    from .status import fit_table

    spec = _spec(pipeline)
    with _reading_store() as store:
        d = diff_epochs(store, spec, from_epoch, to_epoch, window or None)
    if format == PrintFmt.jsonl:
        for r in d.rows():
            sys.stdout.write(json.dumps(r) + "\n")
        return
    out.print(f"from {d.summary(d.from_manifest, from_epoch)}", markup=False, highlight=False)
    out.print(f"to   {d.summary(d.to_manifest, to_epoch)}", markup=False, highlight=False)
    rows = [{"window": wd.window, **wd.counts()} for wd in d.windows]
    out.print(
        fit_table(
            f"{spec.name}: rows from epoch {from_epoch} to epoch {to_epoch}",
            ["window", "added", "removed", "changed", "unchanged", "partitions"],
            rows,
            no_wrap=("added", "removed", "changed", "unchanged", "partitions"),
            caption="partitions: those whose content differs (the rest were not read); rows: --format jsonl",
        )
    )


@app.command(cls=_Command)
def gc(
    pipeline: str = PIPELINE,
    keep: int = typer.Option(
        None, help="Committed epochs to keep (default: WIRE_KEEP_EPOCHS, else the pipeline's dagster.keep_epochs, 10)."
    ),
    grace: float = typer.Option(600, help="Seconds before uncommitted staging is collected."),
):
    """Garbage-collect old epochs and abandoned staging (never a file a kept manifest names), and
    the chunk files of the pipeline's streams that a killed produce or adoption left unclaimed."""
    from .checkpoint import Checkpoints
    from .settings import keep_epochs
    from .streams import collect_orphans

    spec = _spec(pipeline)
    if keep is not None and keep < 1:
        raise WireInputError("--keep: must be >= 1")
    store = _store()
    res = Checkpoints(store, spec.name).gc(keep=keep_epochs(spec, keep), grace_s=grace)
    out.print(f"deleted {res['epochs']} epochs and {res['files']} files")
    for stream in sorted({r.stream for r in spec.readers.values() if r.stream}):
        n = collect_orphans(store, stream, grace_s=grace)
        out.print(f"stream {stream}: deleted {n} unclaimed chunk files")


@app.command(cls=_Command)
def shell(
    warm: bool = typer.Option(
        False,
        "--warm",
        metavar="",
        help="Before the first command: start the Spark session and its Python workers, load the "
        "pipelines' Dagster definitions, open the store and the Dagster instance (otherwise the first "
        "command that needs each does).",
    ),
):
    """Run `wire` commands from standard input in this one process, one per line (`tick -p clicks`).

    The process keeps Python, its imports, the Dagster definitions and instance, the store's clients
    and the Spark session (a local JVM, or the attached Spark Connect session) from one command to
    the next, as a warm Spark session does: a command costs its own work, not a process start (~2 s
    per `wire tick`). Each command ends with `wire: exit <code> in <s> s` on stderr; `-v` holds for
    its own command. On a terminal, a `wire> ` prompt; the shell ends at the end of input or on
    `exit`, with the last failed command's exit code. SIGTERM stops the running command and ends
    the shell (143); so does Ctrl-C, unless on a terminal (it stops the command, the shell goes on)."""
    from . import shell as sh

    def warm_up() -> None:
        from definitions import build_definitions
        from sensors.runs import command_instance

        from .devstack import ensure_dagster_home
        from .heap import settle
        from .sparksession import get_spark, warm_workers
        from .status import import_chart_modules

        warm_workers(get_spark(app="wire-dagster"))
        build_definitions(project_pipelines())
        # What a run imports only when it gets there (the chart after its commit, the counters of
        # computations, a backfill's replay): ~0.3-0.5 s the first timed command paid.
        import_chart_modules()
        from . import backfill, computestage  # noqa: F401

        _store()
        ensure_dagster_home()
        with command_instance():  # created (its storages' modules imported, schemas checked) for the commands
            pass
        settle(collect=True)  # all of it lives as long as the shell (wire_dagster/heap.py)

    def taken() -> int | None:  # the signal a tick took (it handles SIGINT/SIGTERM itself), once
        from sensors.runs import Signals

        signum, Signals.last = Signals.last, None
        return signum

    prompt = sys.stdin.isatty()
    stops = sh.Stops(interactive=prompt, taken=taken)
    inputs = sh.lines(sys.stdin, prompt, sys.stderr, stops)
    code = sh.run(main, inputs, sys.stderr, warm_up if warm else None, stops)
    if code:
        raise typer.Exit(code)


@app.command(cls=_Command)
def dev(port: int = typer.Option(3000, help="Dagster webserver port.")):
    """The embedded S3 and Spark Connect servers plus `dagster dev` with the example pipelines (Ctrl-C stops them)."""
    from .devstack import run_dev
    from .spec import load_all

    load_all(project_pipelines())  # what the code location will load: a bad file or a duplicate name exits 2 here
    raise typer.Exit(run_dev(port=port, pipelines=project_pipelines()))


@app.command(cls=_Command)
def demo():
    """The main job end to end on the embedded default."""
    from .demo import run_demo

    _spark_ahead()  # its JVM starts while the demo starts the store and produces its first batch
    run_demo(console=out, pipelines=project_pipelines(), tick=_tick)


@s3_app.command("start", cls=_Command)
def s3_start():
    """Start (or reuse) the embedded S3 server."""
    from .embedded import EmbeddedS3, default_home

    cfg = EmbeddedS3(default_home() / "s3").start()
    out.print(f"embedded S3 at {cfg.endpoint} (bucket {cfg.bucket})")


@s3_app.command("stop", cls=_Command)
def s3_stop():
    """Stop the embedded S3 server (by its process group)."""
    from .embedded import EmbeddedS3, default_home

    server = EmbeddedS3(default_home() / "s3")
    was_running = server.config is not None
    server.stop()  # also clears what a dead server left (its pid file, sockets)
    out.print("embedded S3 stopped" if was_running else f"embedded S3 was not running (in {server.dir})")


@spark_app.command("start", cls=_Command)
def spark_start(
    master: str = typer.Option(
        None, "--master", help="Spark master of a new server (default: WIRE_SPARK_MASTER, else local[*])."
    ),
    port: int = typer.Option(
        None, "--port", help="Port on 127.0.0.1 for a new server (default: the last one if free, else a free one)."
    ),
    conf: list[str] = typer.Option(
        None, "--conf", metavar="KEY=VALUE", help="Spark setting for a new server (repeatable)."
    ),
):
    """Start (or reuse) the embedded Spark Connect server; prints its URL (sc://127.0.0.1:PORT).

    A running server is reused as it is; the options apply to a new one."""
    from .procgroup import default_home
    from .sparkserver import EmbeddedSpark

    settings: dict[str, str] = {}
    for item in conf or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise WireInputError(f"--conf {item}: expected KEY=VALUE")
        settings[key.strip()] = value
    url = EmbeddedSpark(default_home() / "spark").start(master=master, port=port, conf=settings)
    out.print(url, markup=False, highlight=False)


@spark_app.command("stop", cls=_Command)
def spark_stop():
    """Stop the embedded Spark Connect server (by its process group)."""
    from .procgroup import default_home
    from .sparkserver import EmbeddedSpark

    server = EmbeddedSpark(default_home() / "spark")
    was_running = server.recorded() is not None
    server.stop()  # also clears a dead server's pid file
    out.print("embedded Spark stopped" if was_running else f"embedded Spark was not running (in {server.dir})")


@spark_app.command("status", cls=_Command)
def spark_status():
    """Print the embedded Spark Connect server's URL, or say it is not running (exit 1)."""
    from .procgroup import default_home
    from .sparkserver import EmbeddedSpark

    url = EmbeddedSpark(default_home() / "spark").running()
    if url is None:
        out.print("embedded Spark not running")
        raise typer.Exit(1)
    out.print(url, markup=False, highlight=False)


def _one_line_paragraphs(*apps: typer.Typer) -> None:
    """Typer's rich help keeps the single line breaks of a docstring's later paragraphs, so a
    paragraph wrapped at 120 columns in the source broke mid-sentence on an 80-column terminal:
    each paragraph becomes one line of help, which the terminal's width wraps."""
    import inspect

    for a in apps:
        for info in a.registered_commands:
            doc = info.help or (inspect.getdoc(info.callback) if info.callback else None)
            if doc:
                info.help = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n"))


_one_line_paragraphs(app, s3_app, spark_app)


def main(argv: list[str] | None = None) -> int:
    try:
        # Outside standalone mode click returns a command's `typer.Exit(code)` instead of raising it.
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool):
            return code
    except WireInputError as e:
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        return 2
    except (typer.Exit, SystemExit) as e:
        code = getattr(e, "exit_code", None)
        return int(code if code is not None else getattr(e, "code", 0) or 0)
    except typer.Abort:
        return 1
    except Exception as e:
        # Usage errors (click's, or the copy of click typer bundles) carry exit_code 2.
        format_message, exit_code = getattr(e, "format_message", None), getattr(e, "exit_code", None)
        if callable(format_message) and isinstance(exit_code, int):
            # `wire` alone: click already printed the help, and its message is empty.
            if message := format_message():
                err.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
            return 2 if exit_code == 2 else 1
        err.print(f"error: {one_line(e)}", markup=False, highlight=False, soft_wrap=True)
        if os.environ.get("WIRE_DEBUG"):
            raise
        return 1
    return 0


#: What `main` returned, for `_exit_now` (None while it runs).
_EXIT_CODE: int | None = None


def entry() -> None:
    """The `wire` console script: `main`, then an exit without the interpreter's teardown."""
    import atexit

    global _EXIT_CODE
    # `kill -USR1 <pid>` writes every thread's Python stack to stderr and the command goes on:
    # how to tell a stuck `wire tick` (or its in-process run) from a slow one.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Registered before the command imports anything that registers its own: exit handlers run
    # last in, first out, so this one runs after all of them (pyarrow's S3 shutdown, the Spark
    # Connect client's, logging's), and after Python has joined the non-daemon threads.
    atexit.register(_exit_now)
    _EXIT_CODE = main()
    sys.exit(_EXIT_CODE)


def _exit_now() -> None:
    """Leave without the teardown that only frees what is still alive: its collections walk every
    object the imports (Dagster, PySpark, pandas ...) and the command left, ~0.6 s after a
    `wire tick` of 1 M events (mypy's `util.hard_exit` exits the same way). Nothing is destroyed
    after pyarrow's S3 shutdown either: destructors racing it aborted `wire read` with SIGABRT
    ("terminate called without an active exception": apache/arrow#41087, #36346)."""
    if _EXIT_CODE is None:  # `main` did not return (interrupted while importing): the usual exit
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_CODE)


if __name__ == "__main__":
    entry()
