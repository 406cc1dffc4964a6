"""What `wire status` and the Dagster metadata show: watermarks, epochs, partitions, counts."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import partitions
from .checkpoint import Checkpoints
from .manifest import Manifest
from .objectstore import ObjectStore
from .spec import Pipeline
from .streams import read_inputs
from .timeutil import INF, NEG_INF, iso


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
                "watermark": iso(m.segment_watermarks.get(s, NEG_INF)) if m else "-inf",
                "watermark_ms": m.segment_watermarks.get(s, NEG_INF) if m else NEG_INF,
                "decision": m.decisions.get(s, "-") if m else "-",
            }
        )
    w = m.watermark if m else NEG_INF
    parts = partition_range(spec, m)
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
        "watermark": iso(w),
        "watermark_ms": w if w < INF else None,
        "closed": w >= INF,
        "epochs_kept": committed,
        "segments": segs,
        "pending_chunks": sum(s["pending"] for s in segs),
        "partitions": {
            "ready": [iso(p) for p in parts if partitions.ready(spec, w, p)],
            "final": [iso(p) for p in parts if partitions.final(spec, w, p)],
        },
        "totals": m.totals.model_dump() if m else {},
        "balanced": m.totals.balanced() if m else True,
        "dead_letters": dl,
    }


def watermark_history(store: ObjectStore, spec: Pipeline) -> list[dict]:
    """Per kept epoch: the stream watermark, each segment's watermark and max event time."""
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


def _import_chart_modules() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot


def preload_chart_modules() -> threading.Thread:
    """Import matplotlib in a background thread, for a caller that will draw a chart once its
    epochs are committed: the import (~0.3 s) then runs while the caller waits on Spark and the
    store instead of after the commit. `plot_watermarks` works whether it has finished or not
    (an import in progress in another thread is waited for, not repeated)."""
    t = threading.Thread(target=_import_chart_modules, name="wire-chart-import", daemon=True)
    t.start()
    return t


def plot_watermarks(store: ObjectStore, spec: Pipeline, path: Path, reuse: bool = False) -> Path:
    """A PNG of watermark lag per segment over epochs: lag = last ingestion time − segment watermark.

    The chart is a function of the committed epochs (their manifests never change): with
    `reuse`, a chart at `path` drawn for the same store, pipeline and committed epochs (the key
    it carries in its PNG text says so) is returned as it is, not drawn again — the runs of one
    backlog all report the same epochs."""
    import hashlib

    path = Path(path)
    key = hashlib.sha256(
        f"{store.cfg.endpoint}|{store.bucket}|{spec.name}|{Checkpoints(store, spec.name).committed()}".encode()
    ).hexdigest()
    if reuse and path.is_file() and key.encode() in path.read_bytes():
        return path

    _import_chart_modules()
    import matplotlib.pyplot as plt

    hist = watermark_history(store, spec)
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    segs = sorted({s for h in hist for s in h["segments"]})
    for s in segs:
        xs, ys = [], []
        for h in hist:
            d = h["segments"].get(s)
            if d and NEG_INF < d["wm"] < INF and d["ingest"] > NEG_INF:
                xs.append(h["epoch"])
                ys.append((d["ingest"] - d["wm"]) / 1000)
        ax.plot(xs, ys, marker="o", label=f"segment {s}")
    ax.set_xlabel("epoch")
    ax.set_ylabel("watermark lag (s)")
    ax.set_title(f"{spec.name}: watermark lag per segment")
    if segs:
        ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)  # the assets' chart directory; `wire status --plot` checked its own
    try:
        with written_atomically(path) as tmp:
            fig.savefig(tmp, format="png", metadata={"wire-key": key})
    finally:
        plt.close(fig)
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
        "remap": ", ".join(f"{s}:{n}" for s, n in (m.remap.items() if m else [])) or "-",
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
