"""One representation of time: int64 milliseconds since the Unix epoch, UTC.

Intervals are half-open `[start, end)` everywhere; the last instant of a window
is `end - 1` (Flink's `TimeWindow.max_timestamp()`). Durations are integer ms.
No naive datetimes: a time without a zone is refused.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from .errors import WireInputError

#: +infinity for watermarks (a sealed segment, a closed stream). Chosen far
#: below int64 max so `end + lateness` can never overflow in Spark's longs.
INF = 2**62
#: -infinity for a watermark that has seen nothing yet.
NEG_INF = -(2**62)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_UNITS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")


def parse_duration(value: object, field: str) -> int:
    """`"5s"` -> 5000. Integers are milliseconds. Raises WireInputError naming `field`."""
    if isinstance(value, bool):
        raise WireInputError(f"{field}: expected a duration like 5s, 1m or 250ms, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise WireInputError(f"{field}: duration must be >= 0, got {value}")
        return value
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return int(m.group(1)) * _UNITS[m.group(2)]
    raise WireInputError(f"{field}: bad duration {value!r}; use an integer with a unit: ms, s, m, h or d (e.g. 30s)")


def format_duration(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNITS[unit] == 0:
            return f"{ms // _UNITS[unit]}{unit}"
    return f"{ms}ms"


def parse_iso(text: str, assume_utc: bool = False) -> int:
    """ISO-8601 with a zone -> epoch ms. Raises ValueError for unparsable times, and for naive
    ones unless `assume_utc` (then a time without a zone is UTC)."""
    s = text.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        if not assume_utc:
            raise ValueError("naive time (no zone)")
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // timedelta(milliseconds=1)


#: A Dagster partition key of Wire's time partitions (assets/partitions.py PARTITION_FMT), UTC.
_PARTITION_KEY = re.compile(r"^(\d{4}-\d{2}-\d{2})-(\d{2}:\d{2})$")


def parse_time(text: str) -> int:
    """A time typed on the command line -> epoch ms: ISO-8601 (a time without a zone is UTC), or a
    partition key as the Dagster UI shows it (`2026-01-01-00:05`: the partition's start, UTC).
    Raises ValueError for anything else."""
    m = _PARTITION_KEY.match(text.strip())
    if m:
        return parse_iso(f"{m.group(1)}T{m.group(2)}:00", assume_utc=True)
    return parse_iso(text, assume_utc=True)


def iso(ms: int) -> str:
    """Epoch ms -> ISO-8601 UTC with milliseconds, `+inf`/`-inf` for the sentinels."""
    if ms >= INF:
        return "+inf"
    if ms <= NEG_INF:
        return "-inf"
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def now_ms() -> int:
    """Processing time: used for idleness, timeouts and metrics only, never for results."""
    return int(datetime.now(tz=UTC).timestamp() * 1000)
