"""Dagster assets built from pipeline specs: one event-time-partitioned asset per window, a
dead-letter asset, and asset checks evaluated per partition — thin wrappers over core functions.

A run for partition P first commits the pipeline's pending epochs (the two-phase protocol in
`wire_dagster.engine`), then reports P as committed: its own rows, the published file, the
column schema, watermark, epoch, the chunks the epoch read, final or provisional, and a
`data_version` that is the content hash of P's committed result, so a backfill that reproduces a
result shows the same version. The run log gets one line per committed epoch (runs.py).

A run may also cover a range of partitions (the `dagster/asset_partition_range_*` tags: `wire
backfill`, a single-run backfill, a sensor run for a backlog): it commits the pending epochs once,
replays the committed timeline once for all of them, and reports every partition with its own
materialization, metadata and `data_version`. Dagster's output path would stamp one data version
on every partition of a range (dagster-io/dagster#34013), so a range run logs one
`AssetMaterialization` per partition instead (the asset specs are `skippable` for that), and one
check evaluation per check and partition.

Lineage: the window and dead-letter assets depend on the asset of each raw stream they read
(`assets.streams`, built once per code location), or on the upstream windows of a stage over
derived streams. A run that committed new chunks of a stream reports the stream as materialized.

The multi-asset can be subset (`can_subset`): a run of checks alone (the UI's "Execute all")
commits nothing and evaluates the selected checks against the committed epoch, per partition of
the run, or, with no partition, per partition holding committed results plus one summary.
"""

import warnings

import dagster as dg

from resources import IO_MANAGER_KEY, ObjectStoreResource, SparkResource
from wire_dagster.assetview import Verdict, raw_streams
from wire_dagster.spec import Pipeline
from wire_dagster.timeutil import format_duration, iso

from .keys import (
    BACKFILL_PROGRESS,
    PROGRESS,
    REASON_TAG,
    WireWindow,
    dead_letter_key,
    is_backfill,
    pipeline_tags,
    window_key,
    wire_window,
)
from .metadata import (
    CODE_VERSION_TAG,
    DATA_VERSION_TAG,
    DATA_VERSION_USER_TAG,
    chart_metadata,
    chart_path,
    column_schema,
    dead_letter_metadata,
    window_description,
    window_metadata,
)
from .partitions import partition_key, partitions_def, run_partitions
from .streams import build_stream_specs, freshness_ms, freshness_policy, stream_key

__all__ = ["WireWindow", "build_assets", "build_stream_specs", "stream_key", "wire_window"]

#: A run of checks alone, with no partition, evaluates at most this many partitions (the newest).
CHECK_ALL_MAX_PARTITIONS = 100

PARTITION_COMPLETE = "partition_complete"
WATERMARK_LAG = "watermark_lag"
CONSERVATION = "conservation"
DEAD_LETTER_RATE = "dead_letter_rate"
SEVERITY = {
    PARTITION_COMPLETE: dg.AssetCheckSeverity.WARN,  # provisional is a state, not an error
    WATERMARK_LAG: dg.AssetCheckSeverity.ERROR,
    CONSERVATION: dg.AssetCheckSeverity.ERROR,
    DEAD_LETTER_RATE: dg.AssetCheckSeverity.WARN,
}


def build_assets(spec: Pipeline) -> dg.AssetsDefinition:
    """One multi-asset per pipeline: every window of one epoch is computed by the same Spark job."""
    pdef = partitions_def(spec)
    group = spec.name.replace("-", "_")
    # Lineage is the dataflow: a stage over other pipelines' windows (derived streams) depends on
    # them, a partition mapped to the upstream partitions of the same event time; a pipeline of
    # raw streams depends on each stream's asset.
    upstream = [
        dg.AssetDep(dg.AssetKey([i.pipeline, i.output]), partition_mapping=dg.TimeWindowPartitionMapping())
        for i in spec.derived
        if i.pipeline and i.output
    ]
    upstream += [dg.AssetDep(stream_key(s)) for s in raw_streams(spec)]
    fresh = freshness_policy(freshness_ms(spec))
    specs = [
        dg.AssetSpec(
            window_key(spec, w.name),
            description=window_description(w),
            group_name=group,
            kinds={"spark", "s3"},
            metadata={"wire/window": w.name, "wire/type": w.type, "dagster/column_schema": column_schema(spec, w.name)},
            deps=upstream,
            skippable=True,  # a range run reports its partitions with AssetMaterialization events
            # A partition materializes once W passes its end: a live stream whose W lags less than
            # max_watermark_lag materializes one at least every max_watermark_lag + one partition.
            freshness_policy=fresh,
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
            deps=upstream,
            skippable=True,
        )
    )
    lag = format_duration(spec.orchestration.max_watermark_lag)
    with warnings.catch_warnings():  # partitioned checks are "preview" in Dagster 1.13
        warnings.simplefilter("ignore", dg.PreviewWarning)
        checks = [
            dg.AssetCheckSpec(
                PARTITION_COMPLETE,
                asset=window_key(spec, w.name),
                description="The partition is final (W >= its end + allowed lateness), else provisional or not ready",
                partitions_def=pdef,
            )
            for w in spec.windows
        ]
        checks += [
            dg.AssetCheckSpec(
                WATERMARK_LAG,
                asset=dead_letter_key(spec),
                description=f"Event-time lag of the watermark (newest event read - W) <= {lag}",
                partitions_def=pdef,
            ),
            dg.AssetCheckSpec(
                CONSERVATION,
                asset=dead_letter_key(spec),
                description="in = counted + late + duplicate + malformed + filtered, per window, per epoch, in total",
                partitions_def=pdef,
            ),
            dg.AssetCheckSpec(
                DEAD_LETTER_RATE,
                asset=dead_letter_key(spec),
                description=f"Dead letters / events <= {spec.orchestration.max_dead_letter_rate}",
                partitions_def=pdef,
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
        # Checks run alone ("Execute all"); a run of some windows commits every window's epochs,
        # and the sensor reports the rest (a committed epoch it has not reported).
        can_subset=True,
        description=f"Event-time windows of pipeline {spec.name} over "
        + (
            ", ".join(f"{i.pipeline}.{i.output}" for i in spec.derived)
            if spec.derived
            else "stream(s) " + ", ".join(raw_streams(spec))
        ),
    )
    def _windows(context: dg.AssetExecutionContext, wire_store: ObjectStoreResource, wire_spark: SparkResource):
        from wire_dagster.sparksession import LazySession, preload_client

        if context.selected_asset_keys:
            preload_client(
                wire_spark.master or None, wire_spark.remote or None
            )  # overlaps the run's first reads of the store
        # Started on first use: a run with nothing pending (it only reports) never starts Spark.
        yield from _run(spec, context, wire_store.get_store(), LazySession(wire_spark.get_session))

    return _windows


def _run(spec: Pipeline, context: dg.AssetExecutionContext, store, spark):
    """The body of a run: commit what is pending, backfill if asked, report every selected asset
    of every partition of the run, evaluate the selected checks."""
    from wire_dagster.checkpoint import Checkpoints

    selected = set(context.selected_asset_keys)
    if not selected:  # checks alone: against what is committed, nothing processed
        manifest = Checkpoints(store, spec.name).latest()
        parts = run_partitions(spec, context) if _partitioned(context) else None
        yield from _checks(spec, context, manifest, parts)
        return

    from wire_dagster.backfill import backfill
    from wire_dagster.runs import run_partition
    from wire_dagster.status import preload_chart_modules

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
    _report_streams(spec, context, store, manifest)
    yield from _materializations(spec, context, store, manifest, parts, selected, outcome)
    yield from _checks(spec, context, manifest, parts)


def _partitioned(context: dg.AssetExecutionContext) -> bool:
    return context.has_partition_key or context.has_partition_key_range


def _report_streams(spec: Pipeline, context: dg.AssetExecutionContext, store, manifest) -> None:
    """Report each raw stream whose chunks this pipeline's commits have read further than the
    stream's last report (from any reader): what a reader has committed of a stream is landed."""
    from wire_dagster.assetview import advance_stream, stream_states
    from wire_dagster.timeutil import INF, NEG_INF

    for stream, mine in stream_states(spec, manifest).items():
        key = stream_key(stream)
        last = context.instance.get_latest_materialization_event(key)
        seen = None
        if last is not None and last.asset_materialization is not None:
            entry = last.asset_materialization.metadata.get("segments")
            seen = entry.value if isinstance(entry, dg.JsonMetadataValue) else None
        nxt = advance_stream(seen if isinstance(seen, dict) else None, mine["segments"])
        if nxt is None:
            continue
        segs = nxt["segments"]
        md: dict = {
            "segments": dg.MetadataValue.json(segs),
            "chunks": dg.MetadataValue.int(sum(v.get("chunks", 0) for v in segs.values())),
            "sealed_segments": dg.MetadataValue.int(sum(1 for v in segs.values() if v.get("sealed"))),
            "reported_by": spec.name,
            "dagster/uri": dg.MetadataValue.text(f"s3://{store.bucket}/streams/{stream}/"),
        }
        for label, field in (("newest_event_time", "newest_event_ms"), ("last_chunk_time", "last_chunk_ms")):
            t = max((v[field] for v in segs.values() if v.get(field) is not None), default=None)
            if t is not None and NEG_INF < t < INF:
                md[label] = dg.MetadataValue.timestamp(t / 1000)
        md["version"] = nxt["version"]  # changes exactly when the chunks read or the seals do
        # No data version tag: the stream's version stays Dagster's "INITIAL", so its growth never
        # marks every window partition already materialized "unsynced" (a final one cannot change).
        context.log_event(
            dg.AssetMaterialization(
                asset_key=key, description=f"chunks of stream {stream} committed by {spec.name}", metadata=md
            )
        )


def _chart(spec: Pipeline, context: dg.AssetExecutionContext, store, manifest) -> dict:
    """Draw the watermark chart of the committed epochs, keep it beside them in the store and
    return its metadata (inline image, local path). The store failing to keep it only costs the
    inline image."""
    from wire_dagster.assetview import chart_links, chart_url, keep_chart
    from wire_dagster.errors import WireError
    from wire_dagster.status import plot_watermarks

    path = plot_watermarks(store, spec, chart_path(spec), reuse=True)
    url = None
    if manifest is not None and chart_links():
        try:
            url = chart_url(store, keep_chart(store, spec, path.read_bytes(), manifest.epoch))
        except WireError as e:
            context.log.warning(f"watermark chart not kept in the store ({e}): shown by its path only")
    return chart_metadata(path, url, manifest.epoch if manifest else 0)


def _materializations(spec: Pipeline, context, store, manifest, parts: list[int], selected, outcome):
    """One materialization per selected asset and partition: MaterializeResult for a run of one
    partition, AssetMaterialization events (each with its own data version) for a range."""
    from wire_dagster.assetview import EpochCounts, window_partition
    from wire_dagster.computestage import partition_counters
    from wire_dagster.status import partition_report

    chart = _chart(spec, context, store, manifest)
    counts = EpochCounts(store, spec, manifest)
    computed = partition_counters(store, spec, manifest) if spec.computations else {}
    totals = {
        w.name: sum(r.rows for r in (manifest.outputs.get(w.name, {}) if manifest else {}).values())
        for w in spec.windows
    }
    single = len(parts) == 1
    tags = {DATA_VERSION_USER_TAG: "true", CODE_VERSION_TAG: context.run.run_id, **_stream_provenance(spec)}
    progress_only = set(context.run.tags.get(REASON_TAG, "").split(",")) == {PROGRESS}
    for p in parts:
        report, pk = partition_report(spec, manifest, p), partition_key(spec, p)
        if progress_only and not any(v["rows"] for v in report["windows"].values()):
            # A "progress" run commits an epoch that makes no partition ready (planner.py); the
            # partition it names only carries the run: with no committed rows it is not reported.
            context.log.info(f"partition {pk} has no content yet: not materialized (a progress run)")
            continue
        for w in spec.windows:
            key = window_key(spec, w.name)
            if key not in selected:
                continue
            md = window_metadata(
                spec,
                w.name,
                report,
                outcome is not None,
                outcome[w.name][p] if outcome is not None else None,
                part=window_partition(store, spec, manifest, w.name, p, counts, totals[w.name]),
                m=manifest,
                bucket=store.bucket,
                chart=chart,
            )
            if w.type == "output":  # a computation's records: its counters in this partition
                zero = {"records_in": 0, "timers_fired": 0, "errors": 0, "produced": 0}
                for k, v in computed.get((w.name, p), zero).items():
                    md[f"computation/{k}"] = v if isinstance(v, str) else dg.MetadataValue.int(v)
            version = report["windows"][w.name]["data_version"]
            if single:
                yield dg.MaterializeResult(asset_key=key, data_version=dg.DataVersion(version), metadata=md)
            else:  # one event per partition and asset, each with its own data version (module docstring)
                context.log_event(
                    dg.AssetMaterialization(
                        asset_key=key, partition=pk, metadata=md, tags={**tags, DATA_VERSION_TAG: version}
                    )
                )
        if dead_letter_key(spec) in selected:
            md = dead_letter_metadata(report, manifest, chart)
            if single:
                yield dg.MaterializeResult(asset_key=dead_letter_key(spec), metadata=md)
            else:
                context.log_event(dg.AssetMaterialization(asset_key=dead_letter_key(spec), partition=pk, metadata=md))


def _stream_provenance(spec: Pipeline) -> dict[str, str]:
    """The input provenance Dagster's output path records for a window's unpartitioned stream
    dependencies (their version is always "INITIAL", see _report_streams), for the events a range
    run logs itself: without it Dagster reports each partition "unsynced: new dependency"."""
    from dagster._core.definitions.data_version import (
        DEFAULT_DATA_VERSION,
        NULL_EVENT_POINTER,
        get_input_data_version_tag,
        get_input_event_pointer_tag,
    )

    out = {}
    for s in raw_streams(spec):
        out[get_input_data_version_tag(stream_key(s))] = DEFAULT_DATA_VERSION.value
        out[get_input_event_pointer_tag(stream_key(s))] = NULL_EVENT_POINTER
    return out


def _verdicts(spec: Pipeline, manifest, p: int, wanted: set[dg.AssetCheckKey]) -> dict[dg.AssetCheckKey, Verdict]:
    from wire_dagster import assetview as av

    out: dict[dg.AssetCheckKey, Verdict] = {}
    for w in spec.windows:
        k = dg.AssetCheckKey(window_key(spec, w.name), PARTITION_COMPLETE)
        if k in wanted:
            out[k] = av.check_partition_complete(spec, manifest, p)
    dl = dead_letter_key(spec)
    for name, fn in (
        (WATERMARK_LAG, lambda: av.check_watermark_lag(spec, manifest)),
        (CONSERVATION, lambda: av.check_conservation(manifest)),
        (DEAD_LETTER_RATE, lambda: av.check_dead_letter_rate(spec, manifest)),
    ):
        if dg.AssetCheckKey(dl, name) in wanted:
            out[dg.AssetCheckKey(dl, name)] = fn()
    return out


def _check_metadata(md: dict) -> dict:
    return {k: dg.MetadataValue.json(v) if isinstance(v, dict | list) else v for k, v in md.items()}


def _evaluation(key: dg.AssetCheckKey, v: Verdict, partition: str | None) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(
        asset_key=key.asset_key,
        check_name=key.name,
        passed=v.passed,
        metadata=_check_metadata(v.metadata),
        severity=SEVERITY[key.name],
        description=v.description,
        blocking=False,
        partition=partition,
    )


def _checks(spec: Pipeline, context: dg.AssetExecutionContext, manifest, parts: list[int] | None):
    """Evaluate the selected checks per partition of the run: a result Dagster attributes to the
    run's partition for one partition, an evaluation event per partition for a range. A run with
    no partition (checks alone, from the UI) evaluates every partition holding committed results
    (the newest CHECK_ALL_MAX_PARTITIONS) and yields one summary per check for the run itself."""
    from wire_dagster.status import partition_range

    wanted = set(context.selected_asset_check_keys)
    if not wanted:
        return
    if parts is not None and len(parts) == 1 and context.has_partition_key:
        for key, v in _verdicts(spec, manifest, parts[0], wanted).items():
            yield dg.AssetCheckResult(
                asset_key=key.asset_key,
                check_name=key.name,
                passed=v.passed,
                severity=SEVERITY[key.name],
                description=v.description,
                metadata=_check_metadata(v.metadata),
            )
        return
    every = parts if parts is not None else partition_range(spec, manifest)[-CHECK_ALL_MAX_PARTITIONS:]
    results: dict[dg.AssetCheckKey, list[tuple[str, Verdict]]] = {k: [] for k in wanted}
    for p in every:
        pk = partition_key(spec, p)
        for key, v in _verdicts(spec, manifest, p, wanted).items():
            # Dagster logs check evaluations from the body too (its UserEvent type omits them).
            context.log_event(_evaluation(key, v, pk))  # pyright: ignore[reportArgumentType]
            results[key].append((pk, v))
    if parts is not None:
        return
    # No partition: Dagster planned one evaluation of each check for the run as a whole.
    for key, got in results.items():
        failed = [pk for pk, v in got if not v.passed]
        if got and key.name != PARTITION_COMPLETE:
            v = got[-1][1]  # a pipeline-wide verdict: the same for every partition
            text, md = v.description, v.metadata
        else:
            text = (
                f"{len(got) - len(failed)} of {len(got)} partitions holding committed results pass"
                + (f"; not final: {', '.join(failed[:10])}" + (" ..." if len(failed) > 10 else "") if failed else "")
                if got
                else "no partition holds committed results yet"
            )
            md = {"partitions": len(got), "failed": len(failed)}
        yield dg.AssetCheckResult(
            asset_key=key.asset_key,
            check_name=key.name,
            passed=not failed,
            severity=SEVERITY[key.name],
            description=text,
            metadata=_check_metadata(md),
        )
