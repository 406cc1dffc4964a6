"""What a run reports of each partition in Dagster: asset descriptions, materialization metadata
and the watermark chart — built from `wire_dagster.status.partition_report`."""

import dagster as dg

from wire_dagster.spec import Pipeline
from wire_dagster.timeutil import format_duration

# Dagster's tags for a user-provided data version (what the output path writes for MaterializeResult).
DATA_VERSION_TAG = "dagster/data_version"
DATA_VERSION_USER_TAG = "dagster/data_version_is_user_provided"
CODE_VERSION_TAG = "dagster/code_version"


def window_description(w) -> str:
    shape = {
        "tumbling": f"tumbling {format_duration(w.size)}",
        "sliding": f"sliding {format_duration(w.size)} every {format_duration(w.slide)}",
        "session": f"session gap {format_duration(w.gap)}",
    }[w.type]
    aggs = ", ".join(f"{a.name}={a.func}({a.field or ''})" for a in w.aggregates)
    return f"{shape}: {aggs}"


def partition_status(report: dict) -> str:
    return "final" if report["final"] else ("provisional" if report["ready"] else "not ready")


def dead(tot: dict) -> int:
    return tot.get("duplicate", 0) + tot.get("malformed", 0) + max(tot.get("late", {}).values(), default=0)


def _common_metadata(report: dict) -> dict:
    return {
        "watermark": report["watermark"],
        "epoch": report["epoch"],
        "remap": report["read"],  # `epoch 5: segment 0: chunks 3–5; segment 1: chunk 2` (status.describe_epoch)
        "partition": f"[{report['partition']}, {report['partition_end']})",
        "status": partition_status(report),
    }


def window_metadata(spec: Pipeline, window: str, report: dict, backfill: bool, new_epoch: int | None) -> dict:
    """A window's materialization metadata for one partition; a backfill adds `backfill`
    (`reproduced`: same content and data version, or `changed`) and, when changed, `backfill_epoch`."""
    tot = report["counts_total"]
    wr = report["windows"][window]
    md = {
        **_common_metadata(report),
        "rows": wr["rows"],
        "events_in": tot.get("events_in", 0),
        "counted": tot.get("counted", {}).get(window, 0),
        "late": tot.get("late", {}).get(window, 0),
        "duplicate": tot.get("duplicate", 0),
        "malformed": tot.get("malformed", 0),
        "file": wr["file"] or "-",
    }
    if backfill:
        md["backfill"] = "changed" if new_epoch is not None else "reproduced"
        if new_epoch is not None:
            md["backfill_epoch"] = new_epoch
    return md


def dead_letter_metadata(report: dict, chart, chart_md) -> dict:
    tot = report["counts_total"]
    md = {
        **_common_metadata(report),
        "events_in": tot.get("events_in", 0),
        "duplicate": tot.get("duplicate", 0),
        "malformed": tot.get("malformed", 0),
        "late": str(tot.get("late", {})),
    }
    if chart_md is not None:
        md["watermark_lag_chart"] = chart_md
    md["watermark_lag_chart_path"] = dg.MetadataValue.path(str(chart))
    return md


def chart_path(spec: Pipeline):
    import os
    import tempfile
    from pathlib import Path

    base = Path(os.environ.get("DAGSTER_HOME") or tempfile.gettempdir()) / "wire-charts"
    return base / f"{spec.name}-watermark-lag.png"
