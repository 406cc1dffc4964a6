""" "User went quiet": an alert when a user has had no click for 30 minutes of event time.

Each click moves the key's timer to last activity + 30 min (`set_timer` replaces a timer of the
same tag); the timer fires only once the watermark passes it, i.e. once no click of that user
within the 30 minutes can still arrive. The alert carries when the user was last seen.
"""

from __future__ import annotations

from wire_dagster.computation import Computation, Context, Timer

QUIET_MS = 30 * 60_000


class QuietAlert(Computation):
    def process_record(self, ctx: Context, record: dict) -> None:
        last = max(ctx.state.get("last", ctx.time), ctx.time)
        ctx.state["last"] = last
        ctx.set_timer("quiet", last + QUIET_MS)

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        ctx.produce({"user": ctx.key, "quiet_since": ctx.state["last"], "alert_at": timer.time}, "alerts")
        ctx.state.clear()  # nothing kept for a quiet user: the key's state is gone until it clicks again
