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

import dagster as dg

from resources import IO_MANAGER_KEY, ObjectStoreResource, SparkResource
from wire_dagster.spec import Pipeline
from wire_dagster.timeutil import format_duration, iso

from .keys import BACKFILL_PROGRESS, WireWindow, dead_letter_key, is_backfill, pipeline_tags, window_key, wire_window
from .metadata import (
    CODE_VERSION_TAG,
    DATA_VERSION_TAG,
    DATA_VERSION_USER_TAG,
    chart_path,
    dead,
    dead_letter_metadata,
    partition_status,
    window_description,
    window_metadata,
)
from .partitions import partition_key, partitions_def, run_partitions

__all__ = ["WireWindow", "build_assets", "wire_window"]


def build_assets(spec: Pipeline) -> dg.AssetsDefinition:
    """One multi-asset per pipeline: every window of one epoch is computed by the same Spark job."""
    pdef = partitions_def(spec)
    group = spec.name.replace("-", "_")
    # A stage over other pipelines' windows (derived streams) depends on them in the asset graph:
    # lineage is the dataflow; a partition maps to the upstream partitions of the same event time.
    upstream = [
        dg.AssetDep(dg.AssetKey([i.pipeline, i.output]), partition_mapping=dg.TimeWindowPartitionMapping())
        for i in spec.derived
        if i.pipeline and i.output
    ]
    specs = [
        dg.AssetSpec(
            window_key(spec, w.name),
            description=window_description(w),
            group_name=group,
            kinds={"spark", "s3"},
            metadata={"wire/window": w.name, "wire/type": w.type},
            deps=upstream,
            skippable=True,  # a range run reports its partitions with AssetMaterialization events
        )
        # Downstream assets load a window's committed rows through Wire's IO manager. It never
        # writes: a MaterializeResult without a value does not reach handle_output.
        .with_io_manager_key(IO_MANAGER_KEY)
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
        description=f"Event-time windows of pipeline {spec.name} over "
        + (
            ", ".join(f"{i.pipeline}.{i.output}" for i in spec.derived)
            if spec.derived
            else "stream(s) " + ", ".join(sorted({r.stream for r in spec.readers.values()}))
        ),
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
    chart = plot_watermarks(store, spec, chart_path(spec), reuse=True)
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
                metadata=window_metadata(
                    spec, w.name, report, outcome is not None, outcome[w.name][p] if outcome is not None else None
                ),
            )
        yield dg.MaterializeResult(
            asset_key=dead_letter_key(spec), metadata=dead_letter_metadata(report, chart, chart_md)
        )
    else:
        # One event per partition and asset, each with its own data version (see the module docstring).
        tags = {DATA_VERSION_USER_TAG: "true", CODE_VERSION_TAG: context.run_id}
        for i, p in enumerate(parts):
            report, pk = reports[p], partition_key(spec, p)
            for w in spec.windows:
                context.log_event(
                    dg.AssetMaterialization(
                        asset_key=window_key(spec, w.name),
                        partition=pk,
                        metadata=window_metadata(
                            spec,
                            w.name,
                            report,
                            outcome is not None,
                            outcome[w.name][p] if outcome is not None else None,
                        ),
                        tags={**tags, DATA_VERSION_TAG: report["windows"][w.name]["data_version"]},
                    )
                )
            # The chart (a PNG, tens of kB) goes with the range's last partition only.
            context.log_event(
                dg.AssetMaterialization(
                    asset_key=dead_letter_key(spec),
                    partition=pk,
                    metadata=dead_letter_metadata(report, chart, chart_md if i == len(parts) - 1 else None),
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
                {"status": partition_status(first), "watermark": first["watermark"]}
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
    rate = dead(tot) / events if events else 0.0
    yield dg.AssetCheckResult(
        asset_key=dead_letter_key(spec),
        check_name="dead_letter_rate",
        passed=rate <= spec.orchestration.max_dead_letter_rate,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"rate": rate},
    )
