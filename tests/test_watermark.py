"""Watermarks (wire_dagster/watermark.py): per segment, min over active segments, never regressing.

Segments and chunks are built in memory (no object store): `advance` only sees
chunk metadata. Processing time enters only through the `now` argument, so every
idle decision here is made with a `now` far from the wall clock.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from wire_dagster.spec import pipeline_from_dict
from wire_dagster.streams import ChunkMeta, SegmentView
from wire_dagster.timeutil import INF, NEG_INF
from wire_dagster.watermark import SegmentClock, advance, select_chunks

OOO = 200
IDLE = 60_000
NOW0 = 10**9  # 1970-01-12: nowhere near the wall clock


def pipeline(**wm):
    return pipeline_from_dict(
        {
            "name": "p",
            "event": {"time": "t", "key": "k"},
            "watermark": {"max_out_of_orderness": OOO, "idle_timeout": IDLE, **wm},
            "partition": "1m",
            "start": "1970-01-01T00:00:00Z",
            "windows": [{"name": "w", "type": "tumbling", "size": "1m", "aggregates": {"n": "count"}}],
        }
    )


def chunk(seg: str, seq: int, max_t: int | None, ingest: int = NOW0, min_t: int | None = None) -> ChunkMeta:
    return ChunkMeta(
        stream="s",
        segment=seg,
        seq=seq,
        data_key=f"d/{seg}/{seq}",
        dlq_key=None,
        rows=1,
        malformed=0,
        min_t=min_t if min_t is not None else max_t,
        max_t=max_t,
        ingest_ms=ingest,
        bytes=1,
    )


class Stream:
    """A stream seen by a reader that takes every new chunk each epoch."""

    def __init__(self, spec, segments=("a",)):
        self.spec = spec
        self.chunks: dict[str, list[ChunkMeta]] = {s: [] for s in segments}
        self.sealed: dict[str, int | None] = {s: None for s in segments}
        self.clocks: dict[str, SegmentClock] = {}
        self.w = NEG_INF

    def append(self, seg: str, max_t: int | None, ingest: int = NOW0) -> None:
        self.chunks.setdefault(seg, [])
        self.sealed.setdefault(seg, None)
        self.chunks[seg].append(chunk(seg, len(self.chunks[seg]), max_t, ingest))

    def seal(self, seg: str) -> None:
        self.sealed[seg] = len(self.chunks[seg]) - 1

    def views(self) -> dict[str, SegmentView]:
        out = {}
        for s, cs in self.chunks.items():
            nxt = self.clocks.get(s, SegmentClock()).next_seq
            out[s] = SegmentView(s, [c for c in cs if c.seq >= nxt], self.sealed[s])
        return out

    def epoch(self, now: int, budget: int = 1000, decisions=None):
        views = self.views()
        taken = select_chunks(views, {}, budget)
        clock = advance(self.spec, self.clocks, self.w, views, taken, now, decisions)
        self.clocks, self.w = clock.segments, clock.watermark
        return clock


def test_bounded_out_of_orderness_and_never_backwards():
    s = Stream(pipeline())
    #  event time   0 ........ 800 ... 1000 ........ 1300 ... 1500
    #  max read                         1000                     1500
    #  W_a = max - 200          800                  1300
    s.append("a", 1000)
    assert s.epoch(NOW0).watermark == 800
    s.append("a", 900)  # older events: the max read stays 1000
    c = s.epoch(NOW0)
    assert c.watermark == 800 and c.segments["a"].max_t == 1000
    s.append("a", 1500)
    assert s.epoch(NOW0).watermark == 1300


def test_nothing_read_yet_is_minus_infinity():
    s = Stream(pipeline(), segments=("a", "b"))
    s.append("a", 1000)
    # b has read nothing: its last ingestion is -inf, so it is idle at once and does not hold W
    c = s.epoch(NOW0)
    assert c.decisions == {"a": "active", "b": "idle"}
    assert c.watermark == 800


def test_ingestion_clock_mode():
    s = Stream(pipeline(clock="ingestion", max_event_time_lag=100))
    # event times are ignored: W_s = last ingestion time - lag
    s.append("a", 5, ingest=NOW0 + 5000)
    assert s.epoch(NOW0 + 5000).watermark == NOW0 + 4900
    s.append("a", 10**12, ingest=NOW0 + 6000)
    assert s.epoch(NOW0 + 6000).watermark == NOW0 + 5900


def test_min_over_active_segments():
    s = Stream(pipeline(), segments=("a", "b"))
    s.append("a", 1000)
    s.append("b", 500)
    c = s.epoch(NOW0)
    assert c.segment_watermarks == {"a": 800, "b": 300}
    assert c.watermark == 300


def test_idle_segment_stops_holding_w_after_idle_timeout_of_now():
    s = Stream(pipeline(), segments=("a", "b"))
    s.append("a", 1000, ingest=NOW0)
    s.append("b", 500, ingest=NOW0)
    assert s.epoch(NOW0).watermark == 300
    s.append("a", 5000, ingest=NOW0 + 1000)
    # b got nothing for idle_timeout - 1 ms: still active, still holds W
    c = s.epoch(NOW0 + IDLE - 1)
    assert c.decisions == {"a": "active", "b": "active"} and c.watermark == 300
    # exactly idle_timeout since b's last chunk: idle, W follows a alone
    c = s.epoch(NOW0 + IDLE)
    assert c.decisions == {"a": "active", "b": "idle"} and c.watermark == 4800
    # b wakes up with old data: active again, but W does not go back
    s.append("b", 600, ingest=NOW0 + IDLE + 1)
    c = s.epoch(NOW0 + IDLE + 1)
    assert c.decisions["b"] == "active"
    assert c.watermark == 4800


def test_segment_with_unread_chunks_is_not_idle():
    s = Stream(pipeline(), segments=("a", "b"))
    s.append("a", 400)
    s.append("b", 500, ingest=NOW0)
    s.append("b", 900, ingest=NOW0)
    # budget 1: a's chunk starts first and is taken, b waits — and b is not idle however late `now` is
    views = s.views()
    taken = select_chunks(views, {}, 1)
    assert [c.seq for c in taken["a"]] == [0] and taken["b"] == []
    c = advance(s.spec, {}, NEG_INF, views, taken, NOW0 + 10 * IDLE)
    assert c.decisions == {"a": "active", "b": "active"}
    assert c.watermark == NEG_INF  # b has read nothing yet: it holds W at -inf


def test_all_segments_idle_w_does_not_move():
    s = Stream(pipeline(), segments=("a", "b"))
    s.append("a", 1000)
    s.append("b", 2000)
    assert s.epoch(NOW0).watermark == 800
    c = s.epoch(NOW0 + IDLE)
    assert c.decisions == {"a": "idle", "b": "idle"}
    assert c.watermark == 800


def test_sealed_and_fully_read_segment_is_infinite():
    s = Stream(pipeline(), segments=("a", "b"))
    s.append("a", 1000)
    s.append("b", 300)
    s.seal("b")
    c = s.epoch(NOW0)
    # b was read up to its seal in this epoch: +inf, so W = a's
    assert c.segments["b"].fully_sealed and c.segment_watermarks["b"] == INF
    assert c.decisions == {"a": "active", "b": "sealed"}
    assert c.watermark == 800


def test_sealed_but_not_fully_read_still_holds():
    s = Stream(pipeline(), segments=("a", "b"))
    s.append("a", 1000)
    s.append("b", 300)
    s.append("b", 400)
    s.seal("b")
    views = s.views()
    taken = {"a": views["a"].chunks, "b": views["b"].chunks[:1]}
    c = advance(s.spec, {}, NEG_INF, views, taken, NOW0)
    assert not c.segments["b"].fully_sealed
    assert c.decisions["b"] == "active" and c.watermark == 100


def test_closed_stream_is_infinite():
    s = Stream(pipeline(), segments=("a", "b"))
    s.append("a", 1000)
    s.append("b", 300)
    assert s.epoch(NOW0).watermark == 100
    s.seal("a")
    s.seal("b")
    c = s.epoch(NOW0)
    assert c.decisions == {"a": "sealed", "b": "sealed"}
    assert c.watermark == INF


def test_closed_stream_with_an_empty_segment():
    s = Stream(pipeline(), segments=("a", "b"))
    s.append("a", 1000)
    s.seal("a")
    s.seal("b")  # sealed with no chunk at all (last sequence -1)
    c = s.epoch(NOW0)
    assert c.watermark == INF


def test_recorded_decisions_are_replayed():
    s = Stream(pipeline(), segments=("a", "b"))
    s.append("a", 1000)
    s.append("b", 500)
    prev_clocks, prev_w = dict(s.clocks), s.w
    views = s.views()
    taken = select_chunks(views, {}, 1000)
    live = advance(s.spec, prev_clocks, prev_w, views, taken, NOW0)
    assert live.decisions == {"a": "active", "b": "active"} and live.watermark == 300
    # A replay runs at another processing time: with `now` alone it would decide otherwise ...
    other_now = NOW0 + 100 * IDLE
    b_only = {"a": views["a"], "b": SegmentView("b", [], None)}
    fresh = advance(s.spec, prev_clocks, prev_w, b_only, {"a": taken["a"]}, other_now)
    assert fresh.decisions["b"] == "idle"
    # ... but given the recorded decisions it takes the same ones and computes the same W.
    replay = advance(
        s.spec, prev_clocks, prev_w, b_only, {"a": taken["a"]}, other_now, decisions={"a": "active", "b": "idle"}
    )
    assert replay.decisions == {"a": "active", "b": "idle"} and replay.watermark == 800
    again = advance(s.spec, prev_clocks, prev_w, views, taken, other_now, decisions=dict(live.decisions))
    assert again == live


def test_select_chunks_round_robin_budget():
    views = {
        "a": SegmentView("a", [chunk("a", i, 1) for i in range(3)], None),
        "b": SegmentView("b", [chunk("b", i, 1) for i in range(1)], None),
        "c": SegmentView("c", [chunk("c", i, 1) for i in range(2)], None),
    }
    got = select_chunks(views, {}, 4)
    assert {s: [c.seq for c in cs] for s, cs in got.items()} == {"a": [0, 1], "b": [0], "c": [0]}
    assert sum(len(v) for v in select_chunks(views, {}, 100).values()) == 6


def test_select_chunks_keeps_segments_aligned_in_event_time():
    """Epoch after epoch with an odd budget, no segment runs ahead of the other: a fixed share
    per segment (round-robin from the first) would put `a` one chunk further ahead each epoch,
    and with it the window state the watermark (held by `b`) cannot purge yet."""
    chunks = {s: [chunk(s, i, i * 100 + 99, min_t=i * 100) for i in range(40)] for s in ("a", "b")}
    read = {"a": 0, "b": 0}
    for _ in range(12):
        views = {s: SegmentView(s, cs[read[s] :], None) for s, cs in chunks.items()}
        taken = select_chunks(views, read, 5)
        assert sum(len(v) for v in taken.values()) == 5
        for s, cs in taken.items():
            assert [c.seq for c in cs] == list(range(read[s], read[s] + len(cs)))
            read[s] += len(cs)
        assert abs(read["a"] - read["b"]) <= 1, read
    # a segment that is behind in event time is read first, whatever its name
    views = {"a": SegmentView("a", chunks["a"][10:], None), "b": SegmentView("b", chunks["b"][3:], None)}
    assert {s: len(v) for s, v in select_chunks(views, {}, 4).items()} == {"a": 0, "b": 4}


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", None]),  # segment to append to (None: no append)
            st.integers(-5000, 5000),  # chunk max_t
            st.integers(0, 3 * IDLE),  # processing time advances by
            st.integers(1, 4),  # read budget
            st.booleans(),  # seal the segment after appending
        ),
        max_size=15,
    )
)
def test_w_never_decreases_and_is_min_of_active(steps):
    s = Stream(pipeline(), segments=("a", "b", "c"))
    now = NOW0
    for seg, max_t, dt, budget, seal in steps:
        now += dt
        if seg is not None and s.sealed[seg] is None:
            s.append(seg, max_t, ingest=now)
            if seal:
                s.seal(seg)
        before = s.w
        c = s.epoch(now, budget=budget)
        assert c.watermark >= before
        # brute force: the min of the segment watermarks of non-idle segments, or +inf when all sealed
        segw = {}
        for name, clk in c.segments.items():
            segw[name] = INF if clk.fully_sealed else (clk.max_t - OOO if clk.max_t > NEG_INF else NEG_INF)
        active = [segw[n] for n, d in c.decisions.items() if d != "idle"]
        if all(d == "sealed" for d in c.decisions.values()):
            want = INF
        else:
            want = min(active) if active else NEG_INF
        assert c.watermark == max(before, want)
        for name, d in c.decisions.items():
            if d == "idle":
                assert now - c.segments[name].last_ingest >= IDLE and not s.views()[name].chunks
