"""MillWheel's spike detector (the Zeitgeist example), per key: a model of the expected count
per minute, and an anomaly record when the observed count exceeds it.

The model, per key: an exponentially weighted mean of the counts of past minutes (minutes with
no event count as zero). A minute's count is judged once it is final: a spike is more than
FACTOR times the expected count, and at least MIN_COUNT, after WARMUP minutes of learning; then
the model learns the count (`judge`).

Two detectors share the model:

- `CountSpikeDetector` (spikes.yaml, the example): its input is a window's derived stream, the
  clicks per user per minute of user_clicks.yaml (a record per user and minute: key,
  window_start, window_end, clicks). Each record is a final count (the window fired once the
  watermark passed the minute), delivered in event-time order per user: no timer is needed.
  A late firing of the window would deliver the minute again with `_update: true`: the model
  has learnt that minute already and keeps it (a detector cannot un-raise an alert).
- `SpikeDetector`: the same over the raw clicks, counting each minute itself and judging it
  from an event-time timer at the minute's last instant (it fires once the watermark passed the
  minute). benchmarks/computations.py runs it against Spark 4's transformWithStateInPandas.
"""

from __future__ import annotations

from wire_dagster.computation import Computation, Context, Timer

MINUTE = 60_000
ALPHA = 0.3  # weight of the newest minute in the model
FACTOR = 3.0
MIN_COUNT = 5
WARMUP = 3  # minutes the model learns before it judges


def judge(ctx: Context, minute: int, count: int) -> None:
    """Judge the final count of `minute` against the key's model (a spike into "spikes"), then
    let the model learn it."""
    s = ctx.state
    seen, expected = s.get("seen", 0), s.get("expected", 0.0)
    last = s.get("last_minute")
    if last is not None:  # the minutes with no event since the last one counted as zero
        expected *= (1 - ALPHA) ** ((minute - last) // MINUTE - 1)
    if seen >= WARMUP and count >= MIN_COUNT and count > FACTOR * expected:
        ctx.produce({"key": ctx.key, "minute": minute, "observed": count, "expected": round(expected, 6)}, "spikes")
    s["expected"] = ALPHA * count + (1 - ALPHA) * expected if seen else float(count)
    s["seen"], s["last_minute"] = seen + 1, minute


class CountSpikeDetector(Computation):
    """Over a derived stream of counts per key and minute (a tumbling 1m window's rows)."""

    def process_record(self, ctx: Context, record: dict) -> None:
        if record.get("_update"):
            return  # a late firing of a minute already judged: the model keeps its first count
        judge(ctx, record["window_start"], record["clicks"])


class SpikeDetector(Computation):
    """Over the raw clicks: its own count per minute, judged by a timer once the minute is final."""

    def process_record(self, ctx: Context, record: dict) -> None:
        minute = ctx.time - ctx.time % MINUTE
        s = ctx.state
        if s.get("last_minute") is not None and minute <= s["last_minute"] or minute < s.get("minute", minute):
            return  # a late click of a minute already judged, or before the open one: ignored
        if s.get("minute") != minute:  # the first event of a minute: its count starts
            s["minute"], s["count"] = minute, 0
            ctx.set_timer("minute", minute + MINUTE - 1)
        s["count"] += 1

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        s = ctx.state
        minute, count = s.pop("minute"), s.pop("count")
        judge(ctx, minute, count)
