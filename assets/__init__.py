"""Dagster assets built from pipeline specs: one event-time-partitioned asset per
window, a dead-letter asset, and asset checks — thin wrappers over core functions.

A run for partition P first commits the pipeline's pending epochs (the
two-phase protocol in `wire_dagster.engine`), then reports P as committed:
watermark, epoch, remap, counts, final or provisional, and a `data_version`
that is the content hash of P's committed result, so a backfill that
reproduces a result shows the same version.
"""


import base64
from datetime import datetime, timezone

import dagster as dg

from resources import ObjectStoreResource, SparkResource
from wire_dagster.errors import WireInputError
from wire_dagster.spec import Pipeline
from wire_dagster.timeutil import format_duration

PARTITION_FMT = "%Y-%m-%d-%H:%M"


def partition_cron(spec: Pipeline) -> str:
    """The cron schedule whose ticks are the partition boundaries."""
    p = spec.partition
    minute, hour, day = 60_000, 3_600_000, 86_400_000
    if p % minute == 0 and p < hour and hour % p == 0:
        k = p // minute
        return "* * * * *" if k == 1 else f"*/{k} * * * *"
    if p % hour == 0 and p < day and day % p == 0:
        k = p // hour
        return "0 * * * *" if k == 1 else f"0 */{k} * * *"
    if p == day:
        return "0 0 * * *"
    raise WireInputError(
        f"partition: {format_duration(p)} cannot be a Dagster time partition; use whole minutes dividing an hour, "
        "whole hours dividing a day, or 1d"
    )


def partitions_def(spec: Pipeline) -> dg.TimeWindowPartitionsDefinition:
    start = datetime.fromtimestamp(spec.start / 1000, tz=timezone.utc)
    if spec.end is not None:  # a bounded event-time range: exactly its partitions
        end = datetime.fromtimestamp(spec.end / 1000, tz=timezone.utc)
        return dg.TimeWindowPartitionsDefinition(
            start=start, end=end, fmt=PARTITION_FMT, cron_schedule=partition_cron(spec), timezone="UTC"
        )
    # Event times may run ahead of the wall clock by up to limits.max_future.
    end_offset = -(-spec.max_future // spec.partition) + 1
    return dg.TimeWindowPartitionsDefinition(
        start=start, fmt=PARTITION_FMT, cron_schedule=partition_cron(spec), timezone="UTC", end_offset=end_offset
    )


def partition_key(spec: Pipeline, start_ms: int) -> str:
    return datetime.fromtimestamp(start_ms / 1000, tz=timezone.utc).strftime(PARTITION_FMT)


def window_key(spec: Pipeline, window: str) -> dg.AssetKey:
    return dg.AssetKey([spec.name, window])


def dead_letter_key(spec: Pipeline) -> dg.AssetKey:
    return dg.AssetKey([spec.name, "dead_letters"])


def asset_keys(spec: Pipeline) -> list[dg.AssetKey]:
    return [window_key(spec, w.name) for w in spec.windows] + [dead_letter_key(spec)]


def pipeline_tags(spec: Pipeline) -> dict[str, str]:
    return {"wire/pipeline": spec.name}


def _window_description(w) -> str:
    shape = {
        "tumbling": f"tumbling {format_duration(w.size)}",
        "sliding": f"sliding {format_duration(w.size)} every {format_duration(w.slide)}",
        "session": f"session gap {format_duration(w.gap)}",
    }[w.type]
    aggs = ", ".join(f"{a.name}={a.func}({a.field or ''})" for a in w.aggregates)
    return f"{shape}: {aggs}"


def build_assets(spec: Pipeline) -> dg.AssetsDefinition:
    """One multi-asset per pipeline: every window of one epoch is computed by the same Spark job."""
    from wire_dagster.backfill import backfill
    from wire_dagster.runs import run_partition
    from wire_dagster.status import plot_watermarks, watermark_lag

    pdef = partitions_def(spec)
    group = spec.name.replace("-", "_")
    specs = [
        dg.AssetSpec(
            window_key(spec, w.name),
            description=_window_description(w),
            group_name=group,
            kinds={"spark", "s3"},
            metadata={"wire/window": w.name, "wire/type": w.type},
        )
        for w in spec.windows
    ]
    specs.append(
        dg.AssetSpec(
            dead_letter_key(spec),
            description="Dead letters: late, duplicate and malformed events, with their source position",
            group_name=group,
            kinds={"s3"},
        )
    )
    checks = [dg.AssetCheckSpec("partition_complete", asset=window_key(spec, w.name), description="final (W >= end + lateness) vs provisional") for w in spec.windows]
    checks += [
        dg.AssetCheckSpec("watermark_lag", asset=dead_letter_key(spec), description=f"event-time lag of the watermark <= {format_duration(spec.orchestration.max_watermark_lag)}"),
        dg.AssetCheckSpec("conservation", asset=dead_letter_key(spec), description="in = counted + late + duplicate + malformed, per window, per epoch and in total"),
        dg.AssetCheckSpec("dead_letter_rate", asset=dead_letter_key(spec), description=f"dead letters / events <= {spec.orchestration.max_dead_letter_rate}"),
    ]

    @dg.multi_asset(
        name=f"{spec.name.replace('-', '_')}_windows",
        specs=specs,
        check_specs=checks,
        partitions_def=pdef,
        pool=f"wire_{spec.name}",
        op_tags=pipeline_tags(spec),
        description=f"Event-time windows of pipeline {spec.name} over stream {spec.stream}",
    )
    def _windows(context: dg.AssetExecutionContext, wire_store: ObjectStoreResource, wire_spark: SparkResource):
        tw = context.partition_time_window
        p = int(tw.start.timestamp() * 1000)
        store = wire_store.get_store()
        spark = wire_spark.get_session()
        report, manifest = run_partition(store, spec, spark, p, log=context.log.info)
        if context.run.tags.get("dagster/backfill") or context.run.tags.get("wire/backfill"):
            m = backfill(store, spec, spark, [p])
            context.log.info(f"backfill of {report['partition']}: " + (f"committed epoch {m.epoch}" if m else "reproduced the committed content"))
            report, manifest = run_partition(store, spec, spark, p, process_pending=False)
        common = {
            "watermark": report["watermark"],
            "epoch": report["epoch"],
            "remap": report["remap"],
            "partition": f"[{report['partition']}, {report['partition_end']})",
            "status": "final" if report["final"] else ("provisional" if report["ready"] else "not ready"),
        }
        tot = report["counts_total"]
        for w in spec.windows:
            wr = report["windows"][w.name]
            yield dg.MaterializeResult(
                asset_key=window_key(spec, w.name),
                data_version=dg.DataVersion(wr["data_version"]),
                metadata={
                    **common,
                    "rows": wr["rows"],
                    "events_in": tot.get("events_in", 0),
                    "counted": tot.get("counted", {}).get(w.name, 0),
                    "late": tot.get("late", {}).get(w.name, 0),
                    "duplicate": tot.get("duplicate", 0),
                    "malformed": tot.get("malformed", 0),
                    "file": wr["file"] or "-",
                },
            )
            yield dg.AssetCheckResult(
                asset_key=window_key(spec, w.name),
                check_name="partition_complete",
                passed=bool(report["final"]),
                severity=dg.AssetCheckSeverity.WARN,
                metadata={"status": common["status"], "watermark": report["watermark"]},
            )
        chart = plot_watermarks(store, spec, _chart_path(spec))
        png = base64.b64encode(chart.read_bytes()).decode()
        events = tot.get("events_in", 0)
        dead = tot.get("duplicate", 0) + tot.get("malformed", 0) + max(tot.get("late", {}).values(), default=0)
        yield dg.MaterializeResult(
            asset_key=dead_letter_key(spec),
            metadata={
                **common,
                "events_in": events,
                "duplicate": tot.get("duplicate", 0),
                "malformed": tot.get("malformed", 0),
                "late": str(tot.get("late", {})),
                "watermark_lag_chart": dg.MetadataValue.md(f"![watermark lag per segment](data:image/png;base64,{png})"),
                "watermark_lag_chart_path": dg.MetadataValue.path(str(chart)),
            },
        )
        lag = watermark_lag(manifest)
        yield dg.AssetCheckResult(
            asset_key=dead_letter_key(spec),
            check_name="watermark_lag",
            passed=lag is None or lag <= spec.orchestration.max_watermark_lag,
            metadata={"lag_ms": lag if lag is not None else 0},
        )
        yield dg.AssetCheckResult(
            asset_key=dead_letter_key(spec),
            check_name="conservation",
            passed=bool(report["balanced"]),
            metadata={"epoch_counts": str(report["counts_epoch"]), "total_counts": str(tot)},
        )
        rate = dead / events if events else 0.0
        yield dg.AssetCheckResult(
            asset_key=dead_letter_key(spec),
            check_name="dead_letter_rate",
            passed=rate <= spec.orchestration.max_dead_letter_rate,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"rate": rate},
        )

    return _windows


def _chart_path(spec: Pipeline):
    import os
    import tempfile
    from pathlib import Path

    base = Path(os.environ.get("DAGSTER_HOME") or tempfile.gettempdir()) / "wire-charts"
    return base / f"{spec.name}-watermark-lag.png"
