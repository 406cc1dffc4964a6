"""What a run reports of each partition in Dagster: asset descriptions, materialization metadata
and the watermark chart — Dagster's metadata values over `wire_dagster.assetview`'s plain facts.

Per partition, a window's materialization carries the partition's own rows (`rows`,
`dagster/partition_row_count`), the whole window's (`dagster/row_count`, the table's rows over
every committed partition), `dagster/uri` of the published Parquet copy, `dagster/column_schema`,
W as text and as a timestamp, the epoch and the lag as numbers (the Plots tab draws them), the
chunks the epoch read, and, as JSON, the counts of the epoch that wrote the partition: the manifest
counts events per epoch and window, not per partition, so they are labelled as that epoch's.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import dagster as dg

from wire_dagster.assetview import (
    WindowPartition,
    aggregate_text,
    counts_json,
    lag_ms,
    newest_event,
    output_columns,
)
from wire_dagster.manifest import Manifest
from wire_dagster.spec import Pipeline, WindowSpec
from wire_dagster.timeutil import INF, NEG_INF, format_duration

# Dagster's tags for a user-provided data version (what the output path writes for MaterializeResult).
DATA_VERSION_TAG = "dagster/data_version"
DATA_VERSION_USER_TAG = "dagster/data_version_is_user_provided"
CODE_VERSION_TAG = "dagster/code_version"

#: Dagster renders a Markdown entry inline (not behind "[Show Markdown]") below this many characters.
INLINE_MARKDOWN_MAX = 1000


def window_description(w: WindowSpec) -> str:
    shape = {
        "tumbling": f"tumbling {format_duration(w.size)}",
        "sliding": f"sliding {format_duration(w.size)} every {format_duration(w.slide)}",
        "session": f"session gap {format_duration(w.gap)}",
        "join": f"join of {w.left} and {w.right} per tumbling {format_duration(w.size)}",
        "output": "records a computation produced (id, record as JSON), by event time",
    }[w.type]
    aggs = ", ".join(f"{a.name}={aggregate_text(a)}" for a in w.aggregates)
    cols = ", ".join(f"{c.name}={c.side}.{c.column}" for c in w.select)
    return f"{shape}: {aggs or cols}"


def column_schema(spec: Pipeline, window: str) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[dg.TableColumn(name, type=t, description=d or None) for name, t, d in output_columns(spec, window)]
    )


def partition_status(report: dict) -> str:
    return "final" if report["final"] else ("provisional" if report["ready"] else "not ready")


def _time(ms: int | None) -> dg.MetadataValue | None:
    return dg.MetadataValue.timestamp(ms / 1000) if ms is not None and NEG_INF < ms < INF else None


def _common_metadata(report: dict, m: Manifest | None) -> dict:
    md: dict = {
        "status": partition_status(report),
        "partition": f"[{report['partition']}, {report['partition_end']})",
        "watermark": report["watermark"],  # ISO-8601, `+inf` once the stream is closed
        "epoch": dg.MetadataValue.int(report["epoch"]),
        # `epoch 5: segment 0: chunks 3–5; segment 1: chunk 2`: the chunks the epoch read (its remap moved past them)
        "remap": report["read"],
    }
    w = m.watermark if m else NEG_INF
    if (t := _time(w)) is not None:
        md["watermark_time"] = t
    if (t := _time(newest_event(m))) is not None:
        md["newest_event_time"] = t
    lag = lag_ms(m)
    if lag is not None:
        md["event_time_lag_s"] = dg.MetadataValue.float(lag / 1000)  # newest event read − W
    return md


def window_metadata(
    spec: Pipeline,
    window: str,
    report: dict,
    backfill: bool,
    new_epoch: int | None,
    *,
    part: WindowPartition | None = None,
    m: Manifest | None = None,
    bucket: str | None = None,
    chart: dict | None = None,
) -> dict:
    """A window's materialization metadata for one partition (`part`: its facts from the manifest
    `m`, whose published copy is in `bucket`); a backfill adds `backfill` (`reproduced`: same
    content and data version, or `changed`) and, when changed, `backfill_epoch`."""
    rows = part.rows if part is not None else report["windows"][window]["rows"]
    md = {
        **_common_metadata(report, m),
        "rows": dg.MetadataValue.int(rows),
        "dagster/partition_row_count": dg.MetadataValue.int(rows),
        "dagster/column_schema": column_schema(spec, window),
    }
    if part is not None:
        md["dagster/row_count"] = dg.MetadataValue.int(part.window_rows)
        uri = part.uri(bucket) if bucket else None
        if uri is not None:
            md["dagster/uri"] = dg.MetadataValue.text(uri)
        if part.written_by_epoch is not None:
            md["written_by_epoch"] = dg.MetadataValue.int(part.written_by_epoch)
        if part.writer_counts is not None:
            md["writer_epoch_counts"] = dg.MetadataValue.json(part.writer_counts)
    md.update(chart or {})
    if backfill:
        md["backfill"] = "changed" if new_epoch is not None else "reproduced"
        if new_epoch is not None:
            md["backfill_epoch"] = new_epoch
    return md


def dead_letter_metadata(report: dict, m: Manifest | None, chart: dict) -> dict:
    """The dead letters' metadata: pipeline-wide counts (dead letters are not partitioned by
    event time), labelled as the latest epoch's and the totals since epoch 0."""
    md = _common_metadata(report, m)
    if m is not None:
        md["epoch_counts"] = dg.MetadataValue.json({"epoch": m.epoch, **counts_json(m.counts)})
        md["total_counts"] = dg.MetadataValue.json({"since": "epoch 0", **counts_json(m.totals)})
        md["dead_letter_files"] = dg.MetadataValue.int(len(m.letter_files()))
    md.update(chart)
    return md


def chart_metadata(path: Path, url: str | None, epoch: int) -> dict:
    """The watermark chart: inline as an image (a short Markdown entry linking the PNG kept in the
    store, which Dagster's UI renders in place), and the local file it was drawn to."""
    md: dict = {}
    if url is not None:
        text = f"![watermarks in event time, per stream and segment, up to epoch {epoch}]({url})"
        if len(text) < INLINE_MARKDOWN_MAX:
            md["watermark_chart"] = dg.MetadataValue.md(text)
        else:  # a long endpoint: a link instead of a hidden blob
            md["watermark_chart"] = dg.MetadataValue.url(url)
    md["watermark_chart_path"] = dg.MetadataValue.path(str(path))
    return md


def chart_path(spec: Pipeline) -> Path:
    base = Path(os.environ.get("DAGSTER_HOME") or tempfile.gettempdir()) / "wire-charts"
    return base / f"{spec.name}-watermarks.png"
