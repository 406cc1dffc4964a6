"""MillWheel's spike detector (the Zeitgeist example), per key: a model of the expected count
per minute, and an anomaly record when the observed count exceeds it.

Per key, the state holds the current minute and its count, and the model: an exponentially
weighted mean of the counts of past minutes (minutes with no event count as zero). A timer at
the minute's last instant fires once the watermark has passed the minute, i.e. once its count
is final: then the count is compared with the model (a spike is more than FACTOR times the
expected count, and at least MIN_COUNT), and the model learns the count.

The model is the detector's own count per minute, from the raw stream (not from a window's
derived stream: a computation over a derived stream is not built yet).
"""

from __future__ import annotations

from wire_dagster.computation import Computation, Context, Timer

MINUTE = 60_000
ALPHA = 0.3  # weight of the newest minute in the model
FACTOR = 3.0
MIN_COUNT = 5
WARMUP = 3  # minutes the model learns before it judges


class SpikeDetector(Computation):
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
        minute, count = s["minute"], s["count"]
        seen, expected = s.get("seen", 0), s.get("expected", 0.0)
        last = s.get("last_minute")
        if last is not None:  # the minutes with no event since the last one counted as zero
            expected *= (1 - ALPHA) ** ((minute - last) // MINUTE - 1)
        if seen >= WARMUP and count >= MIN_COUNT and count > FACTOR * expected:
            ctx.produce({"key": ctx.key, "minute": minute, "observed": count, "expected": round(expected, 6)}, "spikes")
        s["expected"] = ALPHA * count + (1 - ALPHA) * expected if seen else float(count)
        s["seen"], s["last_minute"] = seen + 1, minute
        del s["minute"], s["count"]
