"""Dagster assets built from pipeline specs: one event-time-partitioned asset per
window, a dead-letter asset, and asset checks — thin wrappers over core functions.

A run for partition P first commits the pipeline's pending epochs (the
two-phase protocol in `wire_dagster.engine`), then reports P as committed:
watermark, epoch, remap, counts, final or provisional, and a `data_version`
that is the content hash of P's committed result, so a backfill that
reproduces a result shows the same version.

A run may also cover a range of partitions (the `dagster/asset_partition_range_*`
tags: `wire backfill`, or a single-run backfill): it commits the pending epochs
once, replays the committed timeline once for all of them, and reports every
partition with its own materialization, metadata and `data_version`. Dagster's
output path would stamp one data version on every partition of a range
(dagster-io/dagster#34013), so a range run logs one `AssetMaterialization` per
partition instead (the asset specs are `skippable` for that).
"""

import base64
from collections.abc import Callable
from contextvars import ContextVar
from datetime import UTC, datetime

import dagster as dg

from resources import ObjectStoreResource, SparkResource
from wire_dagster.errors import WireInputError
from wire_dagster.spec import Pipeline
from wire_dagster.timeutil import format_duration, iso

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
    start = datetime.fromtimestamp(spec.start / 1000, tz=UTC)
    if spec.end is not None:  # a bounded event-time range: exactly its partitions
        end = datetime.fromtimestamp(spec.end / 1000, tz=UTC)
        return dg.TimeWindowPartitionsDefinition(
            start=start, end=end, fmt=PARTITION_FMT, cron_schedule=partition_cron(spec), timezone="UTC"
        )
    # Event times may run ahead of the wall clock by up to limits.max_future.
    end_offset = -(-spec.max_future // spec.partition) + 1
    return dg.TimeWindowPartitionsDefinition(
        start=start, fmt=PARTITION_FMT, cron_schedule=partition_cron(spec), timezone="UTC", end_offset=end_offset
    )


def partition_key(spec: Pipeline, start_ms: int) -> str:
    return datetime.fromtimestamp(start_ms / 1000, tz=UTC).strftime(PARTITION_FMT)


def window_key(spec: Pipeline, window: str) -> dg.AssetKey:
    return dg.AssetKey([spec.name, window])


def dead_letter_key(spec: Pipeline) -> dg.AssetKey:
    return dg.AssetKey([spec.name, "dead_letters"])


def asset_keys(spec: Pipeline) -> list[dg.AssetKey]:
    return [window_key(spec, w.name) for w in spec.windows] + [dead_letter_key(spec)]


def pipeline_tags(spec: Pipeline) -> dict[str, str]:
    return {"wire/pipeline": spec.name}


#: Dagster's run tags for a range of partitions in one run (single-run backfills, sensor runs of an epoch).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"

#: Run tags that make a run a backfill: Dagster's own (UI / GraphQL backfills) and `wire backfill`'s.
BACKFILL_TAGS = ("dagster/backfill", "wire/backfill")

#: Display only: `wire backfill` sets a callback (epochs replayed, epochs in total) around its
#: in-process run to drive its progress bar; runs launched by the daemon leave it unset.
BACKFILL_PROGRESS: ContextVar[Callable[[int, int], None] | None] = ContextVar("wire_backfill_progress", default=None)

# Dagster's tags for a user-provided data version (what the output path writes for MaterializeResult).
_DATA_VERSION_TAG = "dagster/data_version"
_DATA_VERSION_USER_TAG = "dagster/data_version_is_user_provided"
_CODE_VERSION_TAG = "dagster/code_version"


def is_backfill(tags) -> bool:
    return any(tags.get(t) for t in BACKFILL_TAGS)


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def run_partitions(spec: Pipeline, context: dg.AssetExecutionContext) -> list[int]:
    """The event-time partitions (start, ms) a run covers: one, or every one of its range."""
    tw = context.partition_time_window
    parts = list(range(_ms(tw.start), _ms(tw.end), spec.partition))
    keys = list(context.partition_keys)
    if [partition_key(spec, p) for p in parts] != keys:
        raise WireInputError(
            f"run partitions {keys[:3]}... do not match the pipeline's {format_duration(spec.partition)} partitions"
        )
    return parts


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
    pdef = partitions_def(spec)
    group = spec.name.replace("-", "_")
    specs = [
        dg.AssetSpec(
            window_key(spec, w.name),
            description=_window_description(w),
            group_name=group,
            kinds={"spark", "s3"},
            metadata={"wire/window": w.name, "wire/type": w.type},
            skippable=True,  # a range run reports its partitions with AssetMaterialization events
        )
        for w in spec.windows
    ]
    specs.append(
        dg.AssetSpec(
            dead_letter_key(spec),
            description="Dead letters: late, duplicate and malformed events, with their source position",
            group_name=group,
            kinds={"s3"},
            skippable=True,
        )
    )
    checks = [
        dg.AssetCheckSpec(
            "partition_complete",
            asset=window_key(spec, w.name),
            description="final (W >= end + lateness) vs provisional",
        )
        for w in spec.windows
    ]
    checks += [
        dg.AssetCheckSpec(
            "watermark_lag",
            asset=dead_letter_key(spec),
            description=f"event-time lag of the watermark <= {format_duration(spec.orchestration.max_watermark_lag)}",
        ),
        dg.AssetCheckSpec(
            "conservation",
            asset=dead_letter_key(spec),
            description="in = counted + late + duplicate + malformed, per window, per epoch and in total",
        ),
        dg.AssetCheckSpec(
            "dead_letter_rate",
            asset=dead_letter_key(spec),
            description=f"dead letters / events <= {spec.orchestration.max_dead_letter_rate}",
        ),
    ]

    @dg.multi_asset(
        name=f"{spec.name.replace('-', '_')}_windows",
        specs=specs,
        check_specs=checks,
        partitions_def=pdef,
        pool=f"wire_{spec.name}",
        op_tags=pipeline_tags(spec),
        # A backfill of N partitions is one run: the timeline is replayed once, not N times.
        backfill_policy=dg.BackfillPolicy.single_run(),
        description=f"Event-time windows of pipeline {spec.name} over stream {spec.stream}",
    )
    def _windows(context: dg.AssetExecutionContext, wire_store: ObjectStoreResource, wire_spark: SparkResource):
        from wire_dagster.sparksession import LazySession, preload_client

        preload_client(
            wire_spark.master or None, wire_spark.remote or None
        )  # overlaps the run's first reads of the store
        # Started on first use: a run with nothing pending (it only reports) never starts Spark.
        yield from _run(spec, context, wire_store.get_store(), LazySession(wire_spark.get_session))

    return _windows


def _run(spec: Pipeline, context: dg.AssetExecutionContext, store, spark):
    """The body of a run: commit what is pending, backfill if asked, report every partition of the run."""
    from wire_dagster.backfill import backfill
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.runs import run_partition
    from wire_dagster.status import (
        partition_report,
        plot_watermarks,
        preload_chart_modules,
        watermark_lag,
    )

    preload_chart_modules()  # the chart is drawn after the commit: its import runs meanwhile
    parts = run_partitions(spec, context)
    _report, manifest = run_partition(store, spec, spark, parts[0], log=context.log.info)
    outcome: dict[str, dict[int, int | None]] | None = None  # backfills: window -> partition -> new epoch or None
    if is_backfill(context.run.tags):
        hook = BACKFILL_PROGRESS.get()

        def progress(done: int, total: int) -> None:
            context.log.debug(f"backfill: replayed epoch {done} of {total}")
            if hook is not None:
                hook(done, total)

        m = backfill(store, spec, spark, parts, progress=progress)
        span = f"[{iso(parts[0])}, {iso(parts[-1] + spec.partition)})"
        context.log.info(
            f"backfill of {span}: " + (f"committed epoch {m.epoch}" if m else "reproduced the committed content")
        )
        outcome = {
            w.name: {p: (m.epoch if m and p in set(m.changed.get(w.name, [])) else None) for p in parts}
            for w in spec.windows
        }
        manifest = Checkpoints(store, spec.name).latest()
    reports = {p: partition_report(spec, manifest, p) for p in parts}
    chart = plot_watermarks(store, spec, _chart_path(spec), reuse=True)
    png = base64.b64encode(chart.read_bytes()).decode()
    chart_md = dg.MetadataValue.md(f"![watermark lag per segment](data:image/png;base64,{png})")

    if len(parts) == 1:
        p = parts[0]
        report = reports[p]
        for w in spec.windows:
            wr = report["windows"][w.name]
            yield dg.MaterializeResult(
                asset_key=window_key(spec, w.name),
                data_version=dg.DataVersion(wr["data_version"]),
                metadata=_window_metadata(
                    spec, w.name, report, outcome is not None, outcome[w.name][p] if outcome is not None else None
                ),
            )
        yield dg.MaterializeResult(
            asset_key=dead_letter_key(spec), metadata=_dead_letter_metadata(report, chart, chart_md)
        )
    else:
        # One event per partition and asset, each with its own data version (see the module docstring).
        tags = {_DATA_VERSION_USER_TAG: "true", _CODE_VERSION_TAG: context.run_id}
        for i, p in enumerate(parts):
            report, pk = reports[p], partition_key(spec, p)
            for w in spec.windows:
                context.log_event(
                    dg.AssetMaterialization(
                        asset_key=window_key(spec, w.name),
                        partition=pk,
                        metadata=_window_metadata(
                            spec,
                            w.name,
                            report,
                            outcome is not None,
                            outcome[w.name][p] if outcome is not None else None,
                        ),
                        tags={**tags, _DATA_VERSION_TAG: report["windows"][w.name]["data_version"]},
                    )
                )
            # The chart (a PNG, tens of kB) goes with the range's last partition only.
            context.log_event(
                dg.AssetMaterialization(
                    asset_key=dead_letter_key(spec),
                    partition=pk,
                    metadata=_dead_letter_metadata(report, chart, chart_md if i == len(parts) - 1 else None),
                )
            )

    first = reports[parts[0]]
    final = [p for p in parts if reports[p]["final"]]
    status = {
        "final": len(final),
        "provisional": sum(1 for p in parts if reports[p]["ready"] and not reports[p]["final"]),
        "not ready": sum(1 for p in parts if not reports[p]["ready"]),
    }
    for w in spec.windows:  # a range run: one check result per window for the whole range
        yield dg.AssetCheckResult(
            asset_key=window_key(spec, w.name),
            check_name="partition_complete",
            passed=len(final) == len(parts),
            severity=dg.AssetCheckSeverity.WARN,
            metadata=(
                {"status": _status(first), "watermark": first["watermark"]}
                if len(parts) == 1
                else {**{f"partitions {k}": v for k, v in status.items()}, "watermark": first["watermark"]}
            ),
        )
    tot = first["counts_total"]
    events = tot.get("events_in", 0)
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
        passed=bool(first["balanced"]),
        metadata={"epoch_counts": str(first["counts_epoch"]), "total_counts": str(tot)},
    )
    rate = _dead(tot) / events if events else 0.0
    yield dg.AssetCheckResult(
        asset_key=dead_letter_key(spec),
        check_name="dead_letter_rate",
        passed=rate <= spec.orchestration.max_dead_letter_rate,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"rate": rate},
    )


def _status(report: dict) -> str:
    return "final" if report["final"] else ("provisional" if report["ready"] else "not ready")


def _dead(tot: dict) -> int:
    return tot.get("duplicate", 0) + tot.get("malformed", 0) + max(tot.get("late", {}).values(), default=0)


def _common_metadata(report: dict) -> dict:
    return {
        "watermark": report["watermark"],
        "epoch": report["epoch"],
        "remap": report["remap"],
        "partition": f"[{report['partition']}, {report['partition_end']})",
        "status": _status(report),
    }


def _window_metadata(spec: Pipeline, window: str, report: dict, backfill: bool, new_epoch: int | None) -> dict:
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


def _dead_letter_metadata(report: dict, chart, chart_md) -> dict:
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


def _chart_path(spec: Pipeline):
    import os
    import tempfile
    from pathlib import Path

    base = Path(os.environ.get("DAGSTER_HOME") or tempfile.gettempdir()) / "wire-charts"
    return base / f"{spec.name}-watermark-lag.png"
