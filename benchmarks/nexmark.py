"""A NEXMark-like event generator: Person / Auction / Bid in the 1:3:46 mix, seeded and deterministic.

    .venv/bin/python benchmarks/nexmark.py --events 20K --keys 1K --out /tmp/nx   # writes the files below

What is NEXMark-like (Beam's / Flink's NexmarkGenerator) and what is ours:

- Event number `e` (0, 1, 2, ...) decides everything about an event. In every 50 events, 1 is a
  Person, 3 are Auctions, 46 are Bids (`e % 50`: 0 person, 1-3 auction, 4-49 bid).
- Keys: bids name an auction and a bidder from a key space of `keys` ids (1000 .. 1000+keys-1).
  Half of the bids go to the *hot auction* (NEXMark's HOT_AUCTION_RATIO 2), the latest auction id
  rounded down to a multiple of 100 (mod keys), so the hot auction moves every 100 auctions;
  3/4 go to the *hot bidder* (HOT_BIDDER_RATIO 4), the latest person rounded down to a multiple
  of 100, plus 1 (mod keys). The others are uniform over the key space (NEXMark draws them among
  the recent auctions/persons; a uniform draw makes `keys` the number of groups, which is what a
  1 K vs 100 K keys benchmark is about).
- Price: `round(10^(6U) * 100)` (NEXMark's, U uniform in [0, 1)), an integer number of cents.
- Event time: `start + e * 1000 // rate` ms (a configured rate in events/s of event time).
- Disorder, two bounded kinds:
  * out-of-order groups (NEXMark's outOfOrderGroupSize): the stream is cut into groups of
    `ooo_group` consecutive positions and the event numbers are shuffled inside each group
    (a seeded permutation), so an event can precede up to `ooo_group - 1` events of lower time;
  * delayed events: a fraction `delay_fraction` of events carries a time up to `max_delay_ms`
    earlier than its number says (it arrives "late"), clamped at `start`.
  For any two events i before j in the stream, `t_i - t_j <= disorder_bound_ms()` (proof in
  `Config.disorder_bound_ms`). A subsequence (one stream, one segment, one file) keeps the bound.
- Randomness is a counter-based hash (splitmix64) of (seed, tag, event number or position):
  the output is a pure function of the configuration, whatever the block size.
- Ids are unique: a bid's `bid_id` is its event number, a person's `id` 1000 + person number,
  an auction's `id` 1000 + auction number. No duplicates are generated.

Files (`write_dataset`), every stream in stream order (position order), for `segments` segments:

    <out>/bids/r<round>-s<segment>.parquet     chunk `round` of segment `segment` (`chunk_rows` bids);
                                               the stream's bids i with i % segments == segment, in
                                               rounds of segments*chunk_rows consecutive bids;
                                               mtimes increase in (round, segment) order
    <out>/wire/bids-s<segment>.parquet         the same rows, one file per segment (for `wire produce`)
    <out>/wire/persons-s<segment>.parquet, <out>/wire/auctions-s<segment>.parquet
    <out>/manifest.json                        the configuration, counts, bounds and measured disorder
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

START_MS = 1_767_225_660_000  # 2026-01-01T00:01:00Z (one minute after the pipelines' start)
PIPELINE_START = "2026-01-01T00:00:00Z"
FIRST_ID = 1000
PROPORTIONS = (1, 3, 46)  # person, auction, bid in every 50 events
HOT_AUCTION_RATIO, HOT_BIDDER_RATIO = 2, 4
BLOCK = 1 << 20  # positions generated at a time (memory bound); rounded to whole groups
CHANNELS = np.array(["Google", "Facebook", "Baidu", "Apple"], dtype=object)
URLS = np.array(
    [f"https://www.nexmark.com/item.htm?query=1&channel_id={i}" for i in range(len(CHANNELS))], dtype=object
)
FIRST_NAMES = np.array(
    ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter"], dtype=object
)
LAST_NAMES = np.array(
    ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris"], dtype=object
)
CITIES = np.array(
    ["Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent", "Cheyenne"],
    dtype=object,
)
STATES = np.array(["AZ", "CA", "ID", "OR", "WA", "WY"], dtype=object)

BID_SCHEMA = pa.schema(
    [
        ("bid_id", pa.int64()),
        ("auction", pa.int64()),
        ("bidder", pa.int64()),
        ("price", pa.int64()),
        ("channel", pa.string()),
        ("url", pa.string()),
        ("date_time", pa.int64()),
    ]
)
PERSON_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("email_address", pa.string()),
        ("city", pa.string()),
        ("state", pa.string()),
        ("date_time", pa.int64()),
    ]
)
AUCTION_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("item_name", pa.string()),
        ("initial_bid", pa.int64()),
        ("reserve", pa.int64()),
        ("seller", pa.int64()),
        ("category", pa.int64()),
        ("expires", pa.int64()),
        ("date_time", pa.int64()),
    ]
)

# Hash tags: one independent stream of uniforms per decision.
T_PERM, T_DELAY, T_DELAY_AMT, T_HOT_A, T_AUCTION, T_HOT_B, T_BIDDER, T_PRICE, T_CHANNEL = range(1, 10)
T_NAME1, T_NAME2, T_CITY, T_INIT, T_RESERVE, T_SELLER, T_CATEGORY, T_EXPIRE = range(10, 18)


def parse_count(s: str | int) -> int:
    """20K, 1M, 10M, 1_000_000 -> int."""
    if isinstance(s, int):
        return s
    t = s.strip().upper().replace("_", "")
    mult = {"K": 1_000, "M": 1_000_000}.get(t[-1:], 1)
    try:
        v = float(t.rstrip("KM")) * mult
    except ValueError:
        raise ValueError(f"bad count {s!r}; use e.g. 20K, 1M or 1000000") from None
    if v <= 0 or v != int(v):
        raise ValueError(f"bad count {s!r}; must be a positive whole number")
    return int(v)


def fmt_count(n: int) -> str:
    for unit, div in (("M", 1_000_000), ("K", 1_000)):
        if n % div == 0 and n >= div:
            return f"{n // div}{unit}"
    return str(n)


@dataclass(frozen=True)
class Config:
    events: int = 1_000_000  # all three kinds together
    keys: int = 1_000  # auction and bidder ids per bid: 1000 .. 1000+keys-1
    seed: int = 7
    rate: int = 1_000  # events per second of event time
    segments: int = 4
    chunk_rows: int = 50_000  # bids per chunk (per segment file and per round)
    ooo_group: int = 500  # out-of-order group size (positions); 1 = none
    delay_fraction: float = 0.01
    max_delay_ms: int = 3_000
    start_ms: int = START_MS

    def __post_init__(self) -> None:
        for name in ("events", "keys", "rate", "segments", "chunk_rows", "ooo_group"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1")
        if not 0 <= self.delay_fraction <= 1:
            raise ValueError("delay_fraction: must be in [0, 1]")
        if self.max_delay_ms < 0:
            raise ValueError("max_delay_ms: must be >= 0")

    def disorder_bound_ms(self) -> int:
        """An upper bound on `t_i - t_j` for any events i before j in the stream.

        An event at position n has number e in its group [g0, g1] of positions (= of numbers),
        so `base(g0) - delay <= t <= base(g1)` with `base(e) = start + e*1000//rate` and
        `0 <= delay <= max_delay_ms` (clamping at `start` only raises t, and `base >= start`).
        For i before j: if in the same group, `t_i - t_j <= base(g1) - base(g0) + max_delay`;
        if i's group is earlier, `t_i <= base(g1_i) <= base(g0_j) <= t_j + max_delay`. And
        `base(g0 + G - 1) - base(g0) <= ceil((G-1)*1000/rate)` (floors differ by at most that).
        """
        return -(-(self.ooo_group - 1) * 1000 // self.rate) + self.max_delay_ms

    @property
    def bids(self) -> int:
        return count_kind(self.events, "bid")

    @property
    def label(self) -> str:
        return f"{fmt_count(self.events)} events, {fmt_count(self.keys)} keys"


def count_kind(n: int, kind: str) -> int:
    """How many of event numbers 0..n-1 are of `kind` (exact, from the 1:3:46 rule)."""
    full, rest = divmod(n, 50)
    if kind == "person":
        return full + min(rest, 1)
    if kind == "auction":
        return 3 * full + max(0, min(rest, 4) - 1)
    return 46 * full + max(0, rest - 4)


# ---------------------------------------------------------------------------
# Counter-based randomness


_GOLD = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = z + _GOLD
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def uniform(seed: int, tag: int, x: np.ndarray) -> np.ndarray:
    """U[0, 1) doubles, a pure function of (seed, tag, x)."""
    base = _mix(np.array([(seed & 0xFFFFFFFF) * 131 + tag], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        h = _mix(x.astype(np.uint64) ^ base)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


# ---------------------------------------------------------------------------
# Generation


def event_numbers(cfg: Config, lo: int, hi: int) -> np.ndarray:
    """Event number at each position lo..hi-1 (lo and hi on group boundaries, or hi = events):
    a seeded permutation of the numbers inside each out-of-order group."""
    pos = np.arange(lo, hi, dtype=np.int64)
    if cfg.ooo_group <= 1:
        return pos
    order = np.lexsort((uniform(cfg.seed, T_PERM, pos), pos // cfg.ooo_group))
    e = np.empty(hi - lo, dtype=np.int64)
    e[order] = pos  # the k-th smallest (group, hash) gets the k-th number: numbers stay in their group
    return e


def event_times(cfg: Config, e: np.ndarray) -> np.ndarray:
    base = cfg.start_ms + (e * 1000) // cfg.rate
    delayed = uniform(cfg.seed, T_DELAY, e) < cfg.delay_fraction
    amount = np.floor(uniform(cfg.seed, T_DELAY_AMT, e) * (cfg.max_delay_ms + 1)).astype(np.int64)
    return np.maximum(base - np.where(delayed, amount, 0), cfg.start_ms)


def _pick(arr: np.ndarray, u: np.ndarray) -> np.ndarray:
    return arr[np.minimum((u * len(arr)).astype(np.int64), len(arr) - 1)]


def _keys(u: np.ndarray, keys: int) -> np.ndarray:
    return FIRST_ID + np.minimum((u * keys).astype(np.int64), keys - 1)


def bids_of(cfg: Config, e: np.ndarray, t: np.ndarray) -> pa.Table:
    epoch = e // 50
    last_auction = 3 * epoch + 2  # auction numbers 0.. : the three of this block of 50 came first
    last_person = epoch
    hot_a = FIRST_ID + ((last_auction // 100) * 100) % cfg.keys
    hot_b = FIRST_ID + ((last_person // 100) * 100 + 1) % cfg.keys
    auction = np.where(
        uniform(cfg.seed, T_HOT_A, e) * HOT_AUCTION_RATIO >= 1, hot_a, _keys(uniform(cfg.seed, T_AUCTION, e), cfg.keys)
    )
    bidder = np.where(
        uniform(cfg.seed, T_HOT_B, e) * HOT_BIDDER_RATIO >= 1, hot_b, _keys(uniform(cfg.seed, T_BIDDER, e), cfg.keys)
    )
    price = np.floor(10.0 ** (uniform(cfg.seed, T_PRICE, e) * 6.0) * 100.0 + 0.5).astype(np.int64)
    ch = np.minimum((uniform(cfg.seed, T_CHANNEL, e) * len(CHANNELS)).astype(np.int64), len(CHANNELS) - 1)
    return pa.table(
        [
            pa.array(e),
            pa.array(auction),
            pa.array(bidder),
            pa.array(price),
            pa.array(CHANNELS[ch], pa.string()),
            pa.array(URLS[ch], pa.string()),
            pa.array(t),
        ],
        schema=BID_SCHEMA,
    )


def persons_of(cfg: Config, e: np.ndarray, t: np.ndarray) -> pa.Table:
    pid = FIRST_ID + e // 50
    first = _pick(FIRST_NAMES, uniform(cfg.seed, T_NAME1, e))
    last = _pick(LAST_NAMES, uniform(cfg.seed, T_NAME2, e))
    name = np.char.add(np.char.add(first.astype(str), " "), last.astype(str)).astype(object)
    email = np.char.add(np.char.add("p", pid.astype(str)), "@nexmark.example").astype(object)
    city_i = np.minimum((uniform(cfg.seed, T_CITY, e) * len(CITIES)).astype(np.int64), len(CITIES) - 1)
    return pa.table(
        [
            pa.array(pid),
            pa.array(name, pa.string()),
            pa.array(email, pa.string()),
            pa.array(CITIES[city_i], pa.string()),
            pa.array(STATES[city_i % len(STATES)], pa.string()),
            pa.array(t),
        ],
        schema=PERSON_SCHEMA,
    )


def auctions_of(cfg: Config, e: np.ndarray, t: np.ndarray) -> pa.Table:
    aid = FIRST_ID + 3 * (e // 50) + (e % 50) - 1
    initial = np.floor(10.0 ** (uniform(cfg.seed, T_INIT, e) * 6.0) * 100.0 + 0.5).astype(np.int64)
    reserve = initial + np.floor(10.0 ** (uniform(cfg.seed, T_RESERVE, e) * 6.0) * 100.0 + 0.5).astype(np.int64)
    seller = FIRST_ID + np.floor(uniform(cfg.seed, T_SELLER, e) * (e // 50 + 1)).astype(np.int64)
    category = 10 + np.floor(uniform(cfg.seed, T_CATEGORY, e) * 5).astype(np.int64)
    expires = t + 10_000 + np.floor(uniform(cfg.seed, T_EXPIRE, e) * 60_000).astype(np.int64)
    name = np.char.add("item-", (aid).astype(str)).astype(object)
    return pa.table(
        [
            pa.array(aid),
            pa.array(name, pa.string()),
            pa.array(initial),
            pa.array(reserve),
            pa.array(seller),
            pa.array(category),
            pa.array(expires),
            pa.array(t),
        ],
        schema=AUCTION_SCHEMA,
    )


def blocks(cfg: Config, block: int = BLOCK):
    """(persons, auctions, bids) tables of consecutive position blocks, in stream order."""
    step = max(cfg.ooo_group, (block // cfg.ooo_group) * cfg.ooo_group)
    for lo in range(0, cfg.events, step):
        hi = min(lo + step, cfg.events)
        e = event_numbers(cfg, lo, hi)
        t = event_times(cfg, e)
        off = e % 50
        kinds = (off < 1, (off >= 1) & (off < 4), off >= 4)
        yield (
            persons_of(cfg, e[kinds[0]], t[kinds[0]]),
            auctions_of(cfg, e[kinds[1]], t[kinds[1]]),
            bids_of(cfg, e[kinds[2]], t[kinds[2]]),
        )


def generate(cfg: Config) -> dict[str, pa.Table]:
    """Every event in memory (small configurations and tests): {persons, auctions, bids}."""
    parts = list(blocks(cfg))
    return {
        name: pa.concat_tables([p[i] for p in parts]) if parts else schema.empty_table()
        for i, (name, schema) in enumerate(
            (("persons", PERSON_SCHEMA), ("auctions", AUCTION_SCHEMA), ("bids", BID_SCHEMA))
        )
    }


def max_disorder(times: np.ndarray) -> int:
    """max over j of (max of the times before j) - t_j, 0 if in order."""
    if len(times) < 2:
        return 0
    prev_max = np.maximum.accumulate(times)[:-1]
    return int(max(0, (prev_max - times[1:]).max()))


# ---------------------------------------------------------------------------
# Writing the dataset


@dataclass
class _SegmentedWriter:
    """One stream split into segments (stream index i goes to segment i % S) and rounds of S*C rows."""

    root: Path
    stream: str
    schema: pa.Schema
    cfg: Config
    rounds_dir: Path | None = None  # also write per-(round, segment) files here
    rows: int = 0
    files: list[str] = field(default_factory=list)
    _buf: list[pa.Table] = field(default_factory=list)
    _buffered: int = 0
    _round: int = 0
    _writers: dict = field(default_factory=dict)
    _seg_tmax: dict = field(default_factory=dict)
    seg_disorder: dict = field(default_factory=dict)

    def add(self, t: pa.Table) -> None:
        self._buf.append(t)
        self._buffered += t.num_rows
        per_round = self.cfg.segments * self.cfg.chunk_rows
        while self._buffered >= per_round:
            self._flush(per_round)

    def _flush(self, n: int) -> None:
        whole = pa.concat_tables(self._buf)
        chunk, rest = whole.slice(0, n), whole.slice(n)
        self._buf, self._buffered = ([rest] if rest.num_rows else []), rest.num_rows
        idx = np.arange(self.rows, self.rows + n)
        seg_of = idx % self.cfg.segments
        for s in range(self.cfg.segments):
            part = chunk.filter(pa.array(seg_of == s))
            if part.num_rows == 0:
                continue
            self._track(s, part)
            if self.rounds_dir is not None:
                p = self.rounds_dir / f"r{self._round:05d}-s{s}.parquet"
                pq.write_table(part, p)
                # the file source of Spark Structured Streaming takes files in modification-time order
                mt = 1_700_000_000 + len(self.files)
                os.utime(p, (mt, mt))
                self.files.append(p.name)
            w = self._writers.get(s)
            if w is None:
                w = self._writers[s] = pq.ParquetWriter(self.root / f"{self.stream}-s{s}.parquet", self.schema)
            w.write_table(part)
        self.rows += n
        self._round += 1

    def _track(self, s: int, part: pa.Table) -> None:
        t = part["date_time"].to_numpy()
        prev = self._seg_tmax.get(s)
        seq = np.concatenate([[prev], t]) if prev is not None else t
        self.seg_disorder[s] = max(self.seg_disorder.get(s, 0), max_disorder(seq))
        self._seg_tmax[s] = int(seq.max())

    def close(self) -> None:
        if self._buffered:
            self._flush(self._buffered)
        for w in self._writers.values():
            w.close()


def write_dataset(cfg: Config, out: Path) -> dict:
    """Generate and write every file (see the module doc); returns the manifest (also written)."""
    t0 = time.perf_counter()
    out = Path(out)
    (out / "bids").mkdir(parents=True, exist_ok=True)
    (out / "wire").mkdir(parents=True, exist_ok=True)
    writers = {
        "persons": _SegmentedWriter(out / "wire", "persons", PERSON_SCHEMA, cfg),
        "auctions": _SegmentedWriter(out / "wire", "auctions", AUCTION_SCHEMA, cfg),
        "bids": _SegmentedWriter(out / "wire", "bids", BID_SCHEMA, cfg, rounds_dir=out / "bids"),
    }
    tmin, tmax, disorder, tail = None, None, 0, None
    for persons, auctions, bids in blocks(cfg):
        writers["persons"].add(persons)
        writers["auctions"].add(auctions)
        writers["bids"].add(bids)
        t = bids["date_time"].to_numpy()
        if len(t):
            seq = np.concatenate([[tail], t]) if tail is not None else t
            disorder = max(disorder, max_disorder(seq))
            tail = int(seq.max())
            tmin = int(t.min()) if tmin is None else min(tmin, int(t.min()))
            tmax = int(t.max()) if tmax is None else max(tmax, int(t.max()))
    for w in writers.values():
        w.close()
    bound = cfg.disorder_bound_ms()
    if disorder > bound:  # cannot happen (see Config.disorder_bound_ms); a generator bug must not pass silently
        raise AssertionError(f"measured disorder {disorder} ms exceeds the bound {bound} ms")
    man = {
        "config": asdict(cfg),
        "counts": {k: w.rows for k, w in writers.items()},
        "bid_files": writers["bids"].files,
        "bid_time_min": tmin,
        "bid_time_max": tmax,
        "disorder_bound_ms": bound,
        "bid_disorder_ms": disorder,
        "bid_segment_disorder_ms": {str(k): v for k, v in sorted(writers["bids"].seg_disorder.items())},
        "seconds": round(time.perf_counter() - t0, 2),
    }
    (out / "manifest.json").write_text(json.dumps(man, indent=1))
    return man


def write_sentinel(out: Path, t_ms: int, files_before: int) -> Path:
    """One bid far in event-time future, in its own file whose mtime sorts after every round file.

    Only Spark Structured Streaming reads it: its watermark (max event time - delay) then passes
    every real window, so the trailing windows are emitted by the query's last (no-data) batch.
    Its own key (-1) and window lie far from every real one and are excluded from the comparison."""
    p = Path(out) / "bids" / "zz-sentinel.parquet"
    t = pa.table(
        [
            pa.array([-1]),
            pa.array([-1]),
            pa.array([-1]),
            pa.array([0]),
            pa.array(["sentinel"]),
            pa.array(["-"]),
            pa.array([t_ms]),
        ],
        schema=BID_SCHEMA,
    )
    pq.write_table(t, p)
    mt = 1_700_000_000 + files_before + 10
    os.utime(p, (mt, mt))
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--events", default="20K")
    ap.add_argument("--keys", default="1K")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rate", type=int, default=Config.rate)
    ap.add_argument("--segments", type=int, default=Config.segments)
    ap.add_argument("--chunk-rows", type=int, default=Config.chunk_rows)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    try:
        cfg = Config(
            events=parse_count(a.events),
            keys=parse_count(a.keys),
            seed=a.seed,
            rate=a.rate,
            segments=a.segments,
            chunk_rows=a.chunk_rows,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    man = write_dataset(cfg, a.out)
    print(json.dumps({k: v for k, v in man.items() if k != "bid_files"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
