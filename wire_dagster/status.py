"""What `wire status` and the Dagster metadata show: watermarks, epochs, partitions, counts."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import partitions
from .checkpoint import Checkpoints
from .manifest import Manifest
from .objectstore import ObjectStore
from .spec import Pipeline
from .streams import read_inputs
from .timeutil import INF, NEG_INF, format_duration, iso


def partition_range(spec: Pipeline, m: Manifest | None) -> list[int]:
    """Partitions that hold committed results (by window end) or became ready."""
    if m is None:
        return []
    ps = {int(p) for parts in m.outputs.values() for p in parts}
    ps |= {p for parts in m.changed.values() for p in parts}
    return sorted(ps)


def pipeline_status(store: ObjectStore, spec: Pipeline) -> dict:
    cp = Checkpoints(store, spec.name)
    m = cp.latest()
    committed = cp.committed()
    offsets = m.remap if m else {}
    views = read_inputs(store, spec, offsets)
    segs = []
    for s in sorted(set(views) | set(m.segments if m else {})):
        rec = m.segments.get(s) if m else None
        segs.append(
            {
                "segment": s,
                "chunks": (rec.next_seq if rec else 0) + len(views[s].chunks if s in views else []),
                "next_seq": rec.next_seq if rec else 0,
                "pending": len(views[s].chunks) if s in views else 0,
                "sealed": views[s].sealed_at is not None if s in views else False,
                "max_event_time": iso(rec.max_t) if rec and rec.max_t > NEG_INF else "-",
                "max_event_time_ms": rec.max_t if rec and rec.max_t > NEG_INF else None,
                "watermark": iso(m.segment_watermarks.get(s, NEG_INF)) if m else "-inf",
                "watermark_ms": m.segment_watermarks.get(s, NEG_INF) if m else NEG_INF,
                "decision": m.decisions.get(s, "-") if m else "-",
            }
        )
    w = m.watermark if m else NEG_INF
    parts = partition_range(spec, m)
    epochs = []
    for n in committed:
        e = m if m is not None and n == m.epoch else cp.load(n)
        epochs.append(
            {
                "epoch": n,
                "kind": e.kind,
                "watermark": iso(e.watermark),
                "watermark_ms": e.watermark,
                "chunks": dict(e.chunks),
                "read": describe_epoch(e),
            }
        )
    state = {
        name: {"rows": ref.rows, "bytes": ref.bytes} for name, ref in (m.state.items() if m else []) if ref is not None
    }
    dl = {
        "malformed": m.totals.malformed if m else 0,
        "duplicate": m.totals.duplicate if m else 0,
        "late": dict(m.totals.late) if m else {},
    }
    return {
        "pipeline": spec.name,
        "stream": spec.stream,
        "epoch": m.epoch if m else None,
        "run_id": m.run_id if m else None,
        "remap": m.remap if m else {},
        "read": describe_epoch(m),
        "watermark": iso(w),
        "watermark_ms": w if w < INF else None,
        "closed": w >= INF,
        "epochs_kept": committed,
        "epochs": epochs,
        "segments": segs,
        "pending_chunks": sum(s["pending"] for s in segs),
        "partitions": {
            "ready": [iso(p) for p in parts if partitions.ready(spec, w, p)],
            "final": [iso(p) for p in parts if partitions.final(spec, w, p)],
        },
        "totals": m.totals.model_dump() if m else {},
        "balanced": m.totals.balanced() if m else True,
        "dead_letters": dl,
        # Window state (open windows, pending firings) and id memory the last epoch carries forward.
        "state": state,
        "state_rows": sum(v["rows"] for v in state.values()),
        "state_bytes": sum(v["bytes"] for v in state.values()),
        "ids": {"rows": m.ids.rows, "bytes": m.ids.bytes} if m and m.ids else {"rows": 0, "bytes": 0},
    }


def _segment_order(s: str) -> tuple[int, int, str]:
    return (0, int(s), "") if s.isdigit() else (1, 0, s)


def describe_chunks(chunks: Mapping[str, Sequence[int]]) -> str:
    """What an epoch read, for people: `segment 0: chunks 3–5; segment 1: chunk 2` from a manifest's
    `chunks` (segment -> [first, last] sequence read), `nothing new` when it read no chunk."""
    parts = []
    for s in sorted(chunks, key=_segment_order):
        seqs = chunks[s]
        if not seqs:
            continue
        first, last = seqs[0], seqs[-1]
        parts.append(f"segment {s}: chunk {first}" if first == last else f"segment {s}: chunks {first}–{last}")
    return "; ".join(parts) or "nothing new"


def describe_epoch(m: Manifest | None) -> str:
    """`describe_chunks` of a committed epoch (its remap moved past exactly these chunks); a rewind
    or a backfill reads nothing and says what it was."""
    if m is None:
        return "nothing new"
    read = describe_chunks(m.chunks)
    if m.kind == "rewind":
        return f"{read} (rewind to epoch {m.rewound_to})"
    if m.kind == "backfill":
        return f"{read} (backfill)"
    return read


def size_text(n: int) -> str:
    """Bytes for people: `812 B`, `3.4 kB`, `12.0 MB`."""
    if n < 1000:
        return f"{n} B"
    x = float(n)
    for unit in ("kB", "MB", "GB"):
        x /= 1000
        if x < 999.95:
            return f"{x:.1f} {unit}"
    return f"{x / 1000:.1f} TB"


# -- tables for an 80-column terminal ------------------------------------------


def time_cells(values: Sequence[int | None]) -> tuple[list[str], str]:
    """Times (epoch ms) for the cells of one table, as short as they stay exact: milliseconds only
    if one of them has some, the date only if they fall on more than one day (else the note names
    it). Returns (cells, note), the note for the table's caption (`times UTC, 2026-01-01`)."""
    real = [v for v in values if v is not None and NEG_INF < v < INF]
    with_ms = any(v % 1000 for v in real)
    days = {v // 86_400_000 for v in real}

    def cell(v: int | None) -> str:
        if v is None:
            return "-"
        text = iso(v)
        if not NEG_INF < v < INF:
            return text
        clock = text[11:23] if with_ms else text[11:19]
        return clock if len(days) == 1 else f"{text[:10]} {clock}"

    note = f"times UTC, {iso(real[0])[:10]}" if len(days) == 1 else "times UTC"
    return [cell(v) for v in values], note


def value_cell(v: Any) -> str:
    """A result value for a table cell: a float with at most 10 significant digits (the exact
    value is in `--format jsonl`), no value as `-`."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.10g}"
    return str(v)


def fit_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    *,
    times: Sequence[str] = (),
    no_wrap: Sequence[str] = (),
    max_widths: Mapping[str, int] | None = None,
    caption: str | None = None,
):
    """A rich Table of `rows` (dicts) that fits the terminal by wrapping, never by cutting: the
    time columns (epoch ms, see `time_cells`) and the `no_wrap` ones keep their width, every other
    column folds its text over lines (a cell is never cut to `…`, a column never to nothing)."""
    from rich.table import Table

    times = [c for c in columns if c in times]
    cells: dict[str, list[str]] = {}
    notes = []
    if times and rows:
        flat, note = time_cells([r.get(c) for r in rows for c in times])
        for i, c in enumerate(times):
            cells[c] = flat[i :: len(times)]
        notes.append(note)
    for c in columns:
        if c not in cells:
            cells[c] = [value_cell(r.get(c)) for r in rows]
    tab = Table(title=title, caption="; ".join([*([caption] if caption else []), *notes]) or None)
    for c in columns:
        keep = c in times or c in no_wrap
        widest = max([len(x) for x in cells[c]] + [len(c)])
        tab.add_column(
            c,
            no_wrap=keep,
            overflow="fold",
            min_width=widest if keep else min(widest, max(len(c), 4)),
            max_width=(max_widths or {}).get(c),
        )
    for i in range(len(rows)):
        tab.add_row(*[cells[c][i] for c in columns])
    return tab


def dead_letter_table(title: str, letters: Sequence[Mapping[str, Any]]):
    """Dead letters as a table that fits 80 columns: the reason (with the window a late event
    missed), the source position (segment/chunk/row), the epoch and the record, long text folded
    over lines."""
    rows = [
        {
            "reason": f"{d.get('reason')} ({d['window']})" if d.get("window") else d.get("reason"),
            "source": f"{d.get('segment')}/{d.get('chunk')}/{d.get('row')}",
            "object": d.get("object") or "-",
            "epoch": d.get("epoch"),
            "record": d.get("record"),
        }
        for d in letters
    ]
    landed = any(d.get("object") for d in letters)  # chunks adopted from a landing prefix
    return fit_table(
        title,
        ["reason", "source", *(["object"] if landed else []), "epoch", "record"],
        rows,
        no_wrap=("source", "epoch"),
        max_widths={"reason": 26, "object": 30},
        caption="source: segment/chunk/row"
        + ("; object: the landed object it came from" if landed else "")
        + "; epoch: the epoch that found it (- at produce)",
    )


def empty_result_hint(spec: Pipeline, m: Manifest | None, window: str) -> str:
    """Why `wire read` of a window shows no row, and what would change it."""
    if m is None:
        return f"no committed epoch yet: produce events, then `wire tick --pipeline {spec.name}`"
    w = spec.window(window)
    ref = m.state.get(window)
    open_ = ref.rows if ref is not None else 0
    if open_ and m.watermark < INF:
        when = (
            f"the watermark passes its last event + the gap "
            f"({f'field {w.gap_field}' if w.gap_field else format_duration(w.gap)})"
            if w.type == "session"
            else "the watermark passes its end"
        )
        return (
            f"no rows committed yet: {open_} windows of {window} are still open in the window state "
            f"(epoch {m.epoch}, W = {iso(m.watermark)}); a window is emitted once {when}, "
            f"or when the stream is closed (`wire close --pipeline {spec.name}`)"
        )
    return f"no rows: the committed epochs (last {m.epoch}, W = {iso(m.watermark)}) produced none in {window}"


def watermark_history(store: ObjectStore, spec: Pipeline) -> list[dict]:
    """Per kept epoch: its commit time, the pipeline watermark W, and each segment's watermark,
    newest event time read and last chunk's ingestion time."""
    cp = Checkpoints(store, spec.name)
    rows = []
    for n in cp.committed():
        m = cp.load(n)
        rows.append(
            {
                "epoch": n,
                "created_ms": m.created_ms,
                "watermark": m.watermark,
                "segments": {
                    s: {"wm": m.segment_watermarks.get(s, NEG_INF), "max_t": r.max_t, "ingest": r.last_ingest}
                    for s, r in m.segments.items()
                },
            }
        )
    return rows


def _finite(t: int | None) -> bool:
    return t is not None and NEG_INF < t < INF


def _stream_of(spec: Pipeline, segment: str) -> str:
    """The raw stream a remap segment belongs to (`bids.0` of input `bids`), else the segment's input."""
    for prefix, reader in spec.readers.items():
        if segment.startswith(prefix):
            return reader.stream or prefix.rstrip(".")
    return segment


def chart_series(spec: Pipeline, hist: list[dict]) -> dict:
    """What the watermark chart draws, per stream (epochs on x, event times in ms on y, None
    where undefined): the stream's W (the minimum over its segments; the pipeline's W for a
    pipeline of one input), its newest event read, their difference (the event-time lag), and
    each segment's W when the stream has several; plus the epoch the pipeline closed at."""
    epochs = [h["epoch"] for h in hist]
    segs = sorted({s for h in hist for s in h["segments"]}, key=_segment_order)
    streams: dict[str, list[str]] = {}
    for s in segs:
        streams.setdefault(_stream_of(spec, s), []).append(s)
    single = len(streams) <= 1
    out: dict = {"epochs": epochs, "streams": {}, "closed_at": None}
    for h in hist:
        if h["watermark"] >= INF:
            out["closed_at"] = h["epoch"]
            break
    for name, ss in streams.items():
        wm, newest, lag = [], [], []
        for h in hist:
            d = [h["segments"][s] for s in ss if s in h["segments"]]
            w = h["watermark"] if single else min((x["wm"] for x in d), default=NEG_INF)
            t = max((x["max_t"] for x in d), default=NEG_INF)
            wm.append(w if _finite(w) else None)
            newest.append(t if _finite(t) else None)
            lag.append(max(0, t - w) if _finite(w) and _finite(t) else None)
        per_segment = {}
        if len(ss) > 1:
            for s in ss:
                ws = [h["segments"].get(s, {}).get("wm") for h in hist]
                per_segment[s] = [w if _finite(w) else None for w in ws]
        out["streams"][name] = {"watermark": wm, "newest_event": newest, "lag": lag, "segments": per_segment}
    if not streams and hist:  # a stage over derived streams: its own W only
        out["streams"]["(derived inputs)"] = {
            "watermark": [h["watermark"] if _finite(h["watermark"]) else None for h in hist],
            "newest_event": [None] * len(hist),
            "lag": [None] * len(hist),
            "segments": {},
        }
    return out


def _lag_unit(max_ms: float) -> tuple[str, float]:
    """A unit people read for lags up to `max_ms`: s, min, h or d."""
    for unit, ms, upto in (("s", 1000.0, 120), ("min", 60_000.0, 120), ("h", 3_600_000.0, 72)):
        if max_ms < upto * ms:
            return unit, ms
    return "d", 86_400_000.0


def import_chart_modules() -> None:
    """What drawing the watermark chart imports (matplotlib's, ~0.3 s)."""
    import matplotlib.backends.backend_agg
    import matplotlib.dates
    import matplotlib.figure
    import matplotlib.ticker  # noqa: F401


def preload_chart_modules() -> threading.Thread:
    """Import matplotlib in a background thread, for a caller that will draw a chart once its
    epochs are committed: the import (~0.3 s) then runs while the caller waits on Spark and the
    store instead of after the commit. `plot_watermarks` works whether it has finished or not
    (an import in progress in another thread is waited for, not repeated)."""
    t = threading.Thread(target=import_chart_modules, name="wire-chart-import", daemon=True)
    t.start()
    return t


CHART_VERSION = "3"  # part of the reuse key: a chart drawn by another version is drawn again


def plot_watermarks(store: ObjectStore, spec: Pipeline, path: Path, reuse: bool = False) -> Path:
    """A PNG of the watermarks over the committed epochs, in event time (UTC): per stream its
    watermark W and the newest event read (per segment too when a stream has several), and
    below, the event-time lag of W (newest event read − W) in seconds, minutes, hours or days.
    The x axis is the epoch (whole numbers); a closed stream's W = +inf is marked, not drawn.

    The chart is a function of the committed epochs (their manifests never change): with
    `reuse`, a chart at `path` drawn for the same store, pipeline and committed epochs (the key
    it carries in its PNG text says so) is returned as it is, not drawn again — the runs of one
    backlog all report the same epochs."""
    import hashlib
    from datetime import UTC, datetime

    path = Path(path)
    key = hashlib.sha256(
        f"{CHART_VERSION}|{store.cfg.endpoint}|{store.bucket}|{spec.name}|"
        f"{Checkpoints(store, spec.name).committed()}".encode()
    ).hexdigest()
    if reuse and path.is_file() and key.encode() in path.read_bytes():
        return path

    import_chart_modules()
    import matplotlib
    import matplotlib.dates as mdates
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    data = chart_series(spec, watermark_history(store, spec))
    epochs = data["epochs"]
    # A Figure of its own, not pyplot's: no global figure registry, so charts may be drawn on
    # several threads at once, and nothing to close.
    fig = Figure(figsize=(8, 5.4), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})

    base = float(mdates.date2num(datetime(1970, 1, 1, tzinfo=UTC)))

    def when(ts: list[int | None]) -> list[float]:
        """Event times as Matplotlib dates (days), NaN (a gap in the line) where undefined."""
        return [base + t / 86_400_000 if t is not None else float("nan") for t in ts]

    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    lags = [x for s in data["streams"].values() for x in s["lag"] if x is not None]
    unit, per = _lag_unit(max(lags, default=0))
    times = []
    fmt = ""  # the event-time axis's label format, once there are times
    for i, (name, s) in enumerate(sorted(data["streams"].items())):
        c = colors[i % len(colors)]
        for j, (seg, ws) in enumerate(sorted(s["segments"].items())):
            if any(w is not None for w in ws):
                top.plot(epochs, when(ws), color=c, lw=0.9, alpha=0.55, ls=(0, (1, 1 + j)), label=f"segment {seg}: W")
        if any(w is not None for w in s["watermark"]):
            top.plot(epochs, when(s["watermark"]), color=c, lw=2, marker="o", ms=4, label=f"{name}: W")
        if any(t is not None for t in s["newest_event"]):
            top.plot(
                epochs,
                when(s["newest_event"]),
                color=c,
                lw=1.2,
                ls="--",
                marker="^",
                ms=4,
                label=f"{name}: newest event",
            )
        times += [
            t
            for series in (s["watermark"], s["newest_event"], *s["segments"].values())
            for t in series
            if t is not None
        ]
        if any(x is not None for x in s["lag"]):
            ys = [x / per if x is not None else float("nan") for x in s["lag"]]
            bottom.plot(epochs, ys, color=c, lw=1.6, marker="o", ms=4, label=name)
    if times:
        lo, hi = min(times), max(times)
        pad = max(30_000, (hi - lo) // 10)  # a single instant still gets an axis of readable times
        top.set_ylim(when([lo - pad])[0], when([hi + pad])[0])
        top.yaxis_date(tz=UTC)
        top.yaxis.set_major_locator(mdates.AutoDateLocator(tz=UTC, minticks=3, maxticks=7))
        day = {(t - pad) // 86_400_000 for t in (lo, hi)} | {(t + pad) // 86_400_000 for t in (lo, hi)}
        fmt = "%H:%M:%S" if hi - lo + 2 * pad < 7_200_000 else "%H:%M"
        if len(day) > 1:
            fmt = "%Y-%m-%d " + fmt
        top.yaxis.set_major_formatter(mdates.DateFormatter(fmt, tz=UTC))
        top.set_ylabel("event time (UTC" + (f", {iso(lo)[:10]})" if len(day) == 1 else ")"))
        top.legend(loc="upper left", fontsize="x-small", ncol=2)
    else:
        top.text(0.5, 0.5, "no event read yet", ha="center", va="center", transform=top.transAxes)
        top.set_yticks([])
    if not lags:
        why = "the stream is closed (W = +inf)" if data["closed_at"] is not None else "no watermark yet"
        bottom.text(0.5, 0.5, f"no lag: {why}", ha="center", va="center", transform=bottom.transAxes, color="0.3")
    if data["closed_at"] is not None:
        for ax in (top, bottom):
            ax.axvline(data["closed_at"], color="0.4", lw=1, ls=":")
        top.annotate(
            f"closed at epoch {data['closed_at']} (W = +inf)",
            xy=(data["closed_at"], 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(-4, -12),
            textcoords="offset points",
            ha="right",
            fontsize="x-small",
            color="0.3",
        )
    if not times:
        top.set_ylabel("event time (UTC)")
    fig.suptitle(f"{spec.name}: watermark W and newest event read, per stream and segment", fontsize="medium")
    bottom.set_ylabel(f"lag ({unit})")
    bottom.set_title("event-time lag of W = newest event read − W", fontsize="small")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("epoch (committed)")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    if epochs:
        pad = 0.5 if len(epochs) > 1 else 1
        bottom.set_xlim(min(epochs) - pad, max(epochs) + pad)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    # Margins from the widest tick label's length, not `tight_layout` (which draws the figure once
    # more to measure its texts: a third of the chart's time, ~0.03-0.15 s a run).
    label = max(len(datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC).strftime(fmt)) if fmt else 0, 6)
    fig.subplots_adjust(left=(0.5 + 0.07 * label) / 8, right=0.98, top=0.93, bottom=0.09, hspace=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)  # the assets' chart directory; `wire status --plot` checked its own
    with written_atomically(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"wire-key": key})
    return path


@contextmanager
def written_atomically(path: Path) -> Iterator[Path]:
    """A temporary file beside `path` for the caller to write, renamed to `path` once the block
    ends: a reader (a concurrent run, an engine reading `wire read -o`) never sees half a file,
    and a failed write leaves nothing. The directory must exist."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


EMPTY_VERSION = "empty"


def partition_report(spec: Pipeline, m: Manifest | None, partition: int) -> dict:
    """What a run reports for one event-time partition: per window the committed file's
    content hash (the Dagster data_version), rows, and whether the partition is final."""
    w = m.watermark if m else NEG_INF
    windows = {}
    for win in spec.windows:
        ref = m.outputs.get(win.name, {}).get(str(partition)) if m else None
        windows[win.name] = {
            "data_version": ref.sha256[:32] if ref else EMPTY_VERSION,
            "rows": ref.rows if ref else 0,
            "file": ref.key if ref else None,
            "written_by_epoch": ref.epoch if ref else None,
        }
    return {
        "partition": iso(partition),
        "partition_end": iso(partition + spec.partition),
        "watermark": iso(w),
        "epoch": m.epoch if m else 0,
        "run_id": m.run_id if m else None,
        "remap": dict(m.remap) if m else {},  # segment -> next chunk to read
        "read": f"epoch {m.epoch}: {describe_epoch(m)}" if m else "nothing new",
        "ready": partitions.ready(spec, w, partition),
        "final": partitions.final(spec, w, partition),
        "counts_epoch": m.counts.model_dump() if m else {},
        "counts_total": m.totals.model_dump() if m else {},
        "balanced": (m.counts.balanced() and m.totals.balanced()) if m else True,
        "windows": windows,
    }


def watermark_lag(m: Manifest | None) -> int | None:
    """Event-time lag: the newest event read minus the stream watermark (ms); None before data
    or once the stream is closed."""
    if m is None or m.watermark >= INF:
        return None
    hi = max([r.max_t for r in m.segments.values()] + [NEG_INF])
    if hi <= NEG_INF or m.watermark <= NEG_INF:
        return None
    return max(0, hi - m.watermark)
