"""Watermark sensors and schedules: small factories over the core planner.

A sensor reads the stream's offsets and watermark (`wire_dagster.planner.plan`)
and returns `SensorResult(run_requests, cursor)`: one run for the backlog of
pending epochs (and one per committed epoch not yet reported), over the
partitions they make ready or that late data changes (one partition, or a range
tagged as Dagster's single-run backfills are), keyed by (pipeline, epochs,
partitions) so a tick never launches twice, and a cursor whose epoch moves only with
commits. Errors propagate (Dagster shows a failed tick); nothing becomes a skip.

The daemon and `wire tick` evaluate the same sensor, so they share what it remembers: the
cursor lives in the instance (`shared_cursor`; the daemon saves it as it evaluates, `wire tick`
once its runs succeeded), and every run carries the sensor's name, so
the daemon, which launches a run key once per sensor, never repeats a run `wire tick` launched.
A run key whose run failed would so never run again, and the sensor plans the same epochs
until they commit: `retry_keys` gives such a request the key's next attempt (`<key>#2`, ...)
once a back-off after the failure has passed, so a failed run never blocks the pipeline.
"""

import json
import time
from contextvars import ContextVar

import dagster as dg

from assets.keys import REASON_TAG, RUN_KEY_TAG, SENSOR_NAME_TAG, pipeline_tags
from assets.partitions import RANGE_END_TAG, RANGE_START_TAG, partition_key
from assets.streams import landing_observations
from resources import ObjectStoreResource
from wire_dagster.landing import adopt
from wire_dagster.planner import parse_cursor, plan
from wire_dagster.spec import Pipeline
from wire_dagster.timeutil import iso


def sensor_name(spec: Pipeline) -> str:
    return f"{spec.name.replace('-', '_')}_watermark"


def job_name(spec: Pipeline) -> str:
    return f"{spec.name.replace('-', '_')}_job"


FAILED = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
RETRY_BASE_S, RETRY_MAX_S = 5.0, 300.0  # back-off after a failed run: 5 s, doubling, at most 5 min
MAX_ATTEMPTS = 1000  # a key failing this often is left failed (and said so)


#: Set by `wire tick` around its evaluation. A person (or a cron job) asked for the work now, so
#: a failed key's next attempt is requested at once, with no back-off; and the tick saves the
#: shared cursor itself once its runs have succeeded (`save_cursor`): a tick killed, or whose run
#: failed, leaves the cursor where it was, so the next evaluation asks for that work again.
#: The daemon's evaluations save it at once, as Dagster stores a sensor's cursor.
BY_TICK: ContextVar[bool] = ContextVar("wire_by_tick", default=False)


def _cursor_key(spec: Pipeline) -> str:
    return f"wire/sensor-cursor/{spec.name}"


def shared_cursor(spec: Pipeline, instance: dg.DagsterInstance, own: str | None) -> str | None:
    """The newer of the evaluation's own cursor and the one the instance holds for the pipeline
    (written by whichever of the daemon and `wire tick` evaluated last): newer = a later epoch."""
    key = _cursor_key(spec)
    stored = instance.run_storage.get_cursor_values({key}).get(key)
    if stored is None or own is None:
        return stored if own is None else own
    return stored if parse_cursor(stored) > parse_cursor(own) else own


def save_cursor(spec: Pipeline, instance: dg.DagsterInstance, cursor: str) -> None:
    instance.run_storage.set_cursor_values({_cursor_key(spec): cursor})


def retry_delay(failures: int) -> float:
    """Seconds to wait after the `failures`-th failed run of a key before its next attempt."""
    return min(RETRY_MAX_S, RETRY_BASE_S * 2 ** max(0, failures - 1))


def _attempt(instance: dg.DagsterInstance, sensor: str, base: str) -> tuple[int, dg.DagsterRun | None, bool]:
    """The first attempt of run key `base` (1: `base`, n: `base#n`) with no failed run, the last
    failed run before it (None: the key never failed), and whether that attempt has a run (queued,
    running or done: the daemon skips it, `wire tick` skips it once it succeeded)."""
    attempt, last = 1, None
    while attempt <= MAX_ATTEMPTS:
        key = base if attempt == 1 else f"{base}#{attempt}"
        runs = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: key, SENSOR_NAME_TAG: sensor}), limit=1)
        if not runs:
            return attempt, last, False
        if runs[0].status not in FAILED:
            return attempt, last, True
        last, attempt = runs[0], attempt + 1
    return attempt, last, False


def forget_failed_plan(instance: dg.DagsterInstance, sensor: str, cursor: str | None) -> str | None:
    """The cursor without its planned backlog run if that run failed: the epochs it committed
    before failing are then requested as committed epochs, so some run still reports them."""
    state = json.loads(cursor) if cursor else None
    planned = state.get("planned") if state else None
    if not state or not planned or "key" not in planned:
        return cursor
    attempt, _, has_run = _attempt(instance, sensor, planned["key"])
    if attempt == 1 or has_run:  # never failed, or its retry is queued, running or done
        return cursor
    return json.dumps({k: v for k, v in state.items() if k != "planned"})


def retry_keys(
    instance: dg.DagsterInstance, sensor: str, reqs: list[dg.RunRequest], now: float | None = None, log=None
) -> list[dg.RunRequest]:
    """The requests with the run key of their next attempt: a request whose key ran and failed
    (FAILURE or CANCELED, the sensor's run or `wire tick`'s) gets `<key>#<n>`, the first attempt
    with no failed run; it is held back (left out of this evaluation) until `retry_delay` has
    passed since the last failure. A key with a run queued, running or done keeps its key, which
    the daemon then skips."""
    now = time.time() if now is None else now
    out = []
    for rr in reqs:
        base = rr.run_key
        assert base is not None  # run_requests keys every request
        attempt, last, has_run = _attempt(instance, sensor, base)
        if attempt > MAX_ATTEMPTS:
            if log is not None:
                log.error(f"{base}: {MAX_ATTEMPTS} runs failed; not retried again")
            continue
        if last is not None and not has_run and not BY_TICK.get():
            rec = instance.get_run_record_by_id(last.run_id)
            # when it ended (a run failed before it started has no end time: its last update)
            ended = (rec.end_time or rec.update_timestamp.timestamp()) if rec is not None else now
            wait = ended + retry_delay(attempt - 1) - now
            if wait > 0:
                if log is not None:
                    log.info(f"{base}: run {last.run_id[:8]} failed; attempt {attempt} in {wait:.0f} s")
                continue
        if attempt > 1:
            rr = dg.RunRequest(run_key=f"{base}#{attempt}", partition_key=rr.partition_key, tags=rr.tags)
        out.append(rr)
    return out


def run_requests(spec: Pipeline, store, cursor: str | None) -> tuple[list[dg.RunRequest], str, str]:
    """The run requests of one evaluation (one per epoch: a partition, or a range of them, as
    Dagster's single-run backfills tag it), the new cursor, and a one-line summary."""
    p = plan(store, spec, cursor)
    reqs = []
    for s in p.runs:
        tags = {
            **pipeline_tags(spec),
            SENSOR_NAME_TAG: sensor_name(spec),
            "wire/epoch": s.epochs,
            REASON_TAG: ",".join(s.reasons),
        }
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
        instance, sensor = context.instance, sensor_name(spec)
        cursor = forget_failed_plan(instance, sensor, shared_cursor(spec, instance, context.cursor))
        store = wire_store.get_store()
        adopted = adopt(store, spec)  # landing prefixes (DESIGN §4 Sources): adopted before planning
        reqs, cursor, summary = run_requests(spec, store, cursor)
        reqs = retry_keys(instance, sensor, reqs, log=context.log)
        if not BY_TICK.get():
            save_cursor(spec, instance, cursor)
        context.log.info(summary)
        return dg.SensorResult(run_requests=reqs, cursor=cursor, asset_events=landing_observations(spec, adopted))

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
