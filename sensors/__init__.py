"""Watermark sensors and schedules: small factories over the core planner.

A sensor reads the stream's offsets and watermark (`wire_dagster.planner.plan`)
and returns `SensorResult(run_requests, cursor)`: one run for the backlog of
pending epochs (and one per committed epoch not yet reported), over the
partitions they make ready or that late data changes (one partition, or a range
tagged as Dagster's single-run backfills are), keyed by (pipeline, epochs,
partitions) so a tick never launches twice, and a cursor whose epoch moves only with
commits. Errors propagate (Dagster shows a failed tick); nothing becomes a skip.
"""

import dagster as dg

from assets.keys import pipeline_tags
from assets.partitions import RANGE_END_TAG, RANGE_START_TAG, partition_key
from resources import ObjectStoreResource
from wire_dagster.planner import plan
from wire_dagster.spec import Pipeline
from wire_dagster.timeutil import iso


def sensor_name(spec: Pipeline) -> str:
    return f"{spec.name.replace('-', '_')}_watermark"


def job_name(spec: Pipeline) -> str:
    return f"{spec.name.replace('-', '_')}_job"


def run_requests(spec: Pipeline, store, cursor: str | None) -> tuple[list[dg.RunRequest], str, str]:
    """The run requests of one evaluation (one per epoch: a partition, or a range of them, as
    Dagster's single-run backfills tag it), the new cursor, and a one-line summary."""
    p = plan(store, spec, cursor)
    reqs = []
    for s in p.runs:
        tags = {**pipeline_tags(spec), "wire/epoch": s.epochs, "wire/reason": ",".join(s.reasons)}
        if s.first == s.last:
            reqs.append(
                dg.RunRequest(run_key=s.run_key(spec.name), partition_key=partition_key(spec, s.first), tags=tags)
            )
        else:
            tags.update({RANGE_START_TAG: partition_key(spec, s.first), RANGE_END_TAG: partition_key(spec, s.last)})
            reqs.append(dg.RunRequest(run_key=s.run_key(spec.name), tags=tags))
    summary = (
        f"epoch {p.committed_epoch}, W {iso(p.watermark)} -> predicted {iso(p.predicted_watermark)}, "
        f"{p.pending_chunks} chunks pending, {len(p.requests)} partitions in {len(reqs)} run requests"
    )
    return reqs, p.cursor, summary


def request_partitions(rr: dg.RunRequest) -> str:
    """A run request's partition or range of partitions, for display."""
    if rr.partition_key is not None:
        return rr.partition_key
    return f"{rr.tags[RANGE_START_TAG]}..{rr.tags[RANGE_END_TAG]}"


def build_sensor(spec: Pipeline, job) -> dg.SensorDefinition:
    o = spec.orchestration

    @dg.sensor(
        name=sensor_name(spec),
        job=job,
        minimum_interval_seconds=o.sensor_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING if o.sensor_running else dg.DefaultSensorStatus.STOPPED,
        description=f"Follows the watermark of stream {spec.stream}; requests ready and late-changed partitions.",
    )
    def _sensor(context: dg.SensorEvaluationContext, wire_store: ObjectStoreResource):
        reqs, cursor, summary = run_requests(spec, wire_store.get_store(), context.cursor)
        context.log.info(summary)
        return dg.SensorResult(run_requests=reqs, cursor=cursor)

    return _sensor


def build_schedule(spec: Pipeline, job) -> dg.ScheduleDefinition:
    """For users who prefer scheduled runs: the same plan, on a cron (stopped by default)."""
    from assets.partitions import partition_cron

    @dg.schedule(
        name=f"{spec.name.replace('-', '_')}_schedule",
        job=job,
        cron_schedule=spec.orchestration.schedule or partition_cron(spec),
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description=f"Runs the ready and late-changed partitions of {spec.name} on a cron.",
    )
    def _schedule(context: dg.ScheduleEvaluationContext, wire_store: ObjectStoreResource):
        # Schedules have no cursor: every committed epoch's partitions are re-reported,
        # deduplicated by run key.
        reqs, _cursor, _summary = run_requests(spec, wire_store.get_store(), None)
        return reqs

    return _schedule
