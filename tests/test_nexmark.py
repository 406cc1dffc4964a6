"""The NEXMark-like generator (benchmarks/nexmark.py) and the comparison's peers (benchmarks/peers.py).

Generator: deterministic, the 1:3:46 mix, unique ids, hot keys, the price formula, the disorder
bound, segment/round files. The three sides: on a tiny data set, Spark Structured Streaming,
DuckDB and Wire's engine (the benchmark's pipeline files; the end-to-end CLI path is what
compare.py runs) agree with an independent plain-Python computation of each query's final windows.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks import nexmark, peers
from benchmarks.nexmark import Config, count_kind, generate

SMALL = Config(
    events=5_000,
    keys=50,
    seed=3,
    rate=100,
    segments=3,
    chunk_rows=400,
    ooo_group=40,
    delay_fraction=0.05,
    max_delay_ms=1_500,
)


def test_deterministic_and_seed_dependent():
    a, b = generate(SMALL), generate(SMALL)
    for k in a:
        assert a[k].equals(b[k]), k
    c = generate(Config(**{**SMALL.__dict__, "seed": 4}))
    assert not c["bids"].equals(a["bids"])
    # a pure function of the configuration: the block size used to generate does not matter
    small_blocks = [x for x in nexmark.blocks(SMALL, block=SMALL.ooo_group * 3)]
    import pyarrow as pa

    assert pa.concat_tables([x[2] for x in small_blocks]).equals(a["bids"])


def test_mix_ids_keys_and_prices():
    t = generate(SMALL)
    n = SMALL.events
    assert (t["persons"].num_rows, t["auctions"].num_rows, t["bids"].num_rows) == (n // 50, 3 * n // 50, 46 * n // 50)
    assert count_kind(51, "person") == 2 and count_kind(51, "auction") == 3 and count_kind(55, "bid") == 47
    bids = t["bids"].to_pydict()
    assert len(set(bids["bid_id"])) == len(bids["bid_id"])  # no duplicate ids
    assert all(e % 50 >= 4 for e in bids["bid_id"])  # a bid's number is a bid's slot in the 1:3:46 cycle
    assert len(set(t["persons"]["id"].to_pylist())) == n // 50
    assert len(set(t["auctions"]["id"].to_pylist())) == 3 * n // 50
    for col in ("auction", "bidder"):
        assert min(bids[col]) >= 1000 and max(bids[col]) < 1000 + SMALL.keys
    # hot auction: half of the bids go to the auction of the latest multiple of 100 (mod keys)
    hot_a = [1000 + ((3 * (e // 50) + 2) // 100 * 100) % SMALL.keys for e in bids["bid_id"]]
    share_a = np.mean([a == h for a, h in zip(bids["auction"], hot_a, strict=True)])
    assert 0.45 < share_a < 0.60  # 1/2 hot, plus uniform draws that hit it
    hot_b = [1000 + ((e // 50) // 100 * 100 + 1) % SMALL.keys for e in bids["bid_id"]]
    share_b = np.mean([b == h for b, h in zip(bids["bidder"], hot_b, strict=True)])
    assert 0.72 < share_b < 0.82  # 3/4 hot
    # price = round(10^(6U) * 100): whole cents in [100, 10^8], log-uniform (median ~ 10^5)
    prices = np.array(bids["price"])
    assert prices.min() >= 100 and prices.max() <= 100_000_000
    assert 4.5 < np.log10(np.median(prices)) < 5.5


def test_event_times_disorder_and_delays():
    t = generate(SMALL)["bids"]
    e = np.array(t["bid_id"].to_pylist())
    ts = np.array(t["date_time"].to_pylist())
    base = SMALL.start_ms + e * 1000 // SMALL.rate
    assert (ts <= base).all() and (ts >= SMALL.start_ms).all()
    delayed = ts < base
    assert 0.02 < delayed.mean() < 0.08  # 5% delayed (a delay of 0 ms looks on time)
    assert (base - ts).max() <= SMALL.max_delay_ms
    d = nexmark.max_disorder(ts)
    assert 0 < d <= SMALL.disorder_bound_ms()
    # out-of-order groups: event numbers are shuffled, but only inside their group of positions
    assert not (np.diff(e) > 0).all()
    pos = nexmark.event_numbers(SMALL, 0, SMALL.events)
    assert sorted(pos) == list(range(SMALL.events))
    assert ((pos // SMALL.ooo_group) == (np.arange(SMALL.events) // SMALL.ooo_group)).all()


def test_dataset_files(tmp_path):
    man = nexmark.write_dataset(SMALL, tmp_path)
    bids = pq.read_table(tmp_path / "wire" / "bids-s0.parquet")
    per_seg = [pq.read_table(tmp_path / "wire" / f"bids-s{s}.parquet") for s in range(SMALL.segments)]
    assert sum(x.num_rows for x in per_seg) == man["counts"]["bids"] == 46 * SMALL.events // 50
    # round files: (round, segment) in mtime order, chunk_rows each except the last round
    files = sorted((tmp_path / "bids").glob("r*.parquet"), key=lambda p: p.stat().st_mtime)
    assert [p.name for p in files] == man["bid_files"] == sorted(man["bid_files"])
    assert pq.read_table(files[0]).num_rows == SMALL.chunk_rows
    # a segment file is its round files concatenated, and the stream order is kept
    seg0 = [pq.read_table(p) for p in files if p.name.endswith("-s0.parquet")]
    import pyarrow as pa

    assert pa.concat_tables(seg0).equals(bids)
    everything = generate(SMALL)["bids"]
    assert sorted(pa.concat_tables(per_seg)["bid_id"].to_pylist()) == sorted(everything["bid_id"].to_pylist())
    assert man["bid_disorder_ms"] <= man["disorder_bound_ms"]
    assert all(v <= man["disorder_bound_ms"] for v in man["bid_segment_disorder_ms"].values())


# ---------------------------------------------------------------------------
# The peers agree with a plain-Python computation of the final windows.


def _expected(q: peers.Query, bids: dict) -> list[tuple]:
    keys = bids[q.key] if q.key else [None] * len(bids["date_time"])
    rows = list(zip(bids["date_time"], bids["price"], keys, strict=True))
    acc: dict = defaultdict(list)
    if q.kind == "session":
        by_key = defaultdict(list)
        for t, p, k in rows:
            by_key[k].append((t, p))
        for k, evs in by_key.items():
            evs.sort()
            cur = [evs[0]]
            for t, p in evs[1:]:
                if t <= cur[-1][0] + q.gap_ms:  # exactly `gap` apart: one session (DESIGN §1)
                    cur.append((t, p))
                else:
                    acc[(k, cur[0][0], cur[-1][0] + q.gap_ms)] = cur
                    cur = [(t, p)]
            acc[(k, cur[0][0], cur[-1][0] + q.gap_ms)] = cur
    else:
        slide = q.slide_ms or q.size_ms
        for t, p, k in rows:
            start = t - t % slide
            while start > t - q.size_ms:
                acc[(k, start, start + q.size_ms)].append((t, p))
                start -= slide
    out = []
    for (k, s, e), evs in acc.items():
        v = len(evs) if q.agg == "count" else max(p for _, p in evs)
        out.append((None if k is None else str(k), s, e, v))
    return sorted(out, key=lambda r: (r[0] or "", r[1], r[2]))


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    cfg = Config(
        events=2_000,
        keys=20,
        seed=11,
        rate=50,
        segments=2,
        chunk_rows=500,
        ooo_group=25,
        delay_fraction=0.05,
        max_delay_ms=1_000,
    )
    d = tmp_path_factory.mktemp("nexmark")
    man = nexmark.write_dataset(cfg, d)
    nexmark.write_sentinel(d, man["bid_time_max"] + 86_400_000, len(man["bid_files"]))
    return cfg, d, man, generate(cfg)["bids"].to_pydict()


def _rows(t) -> list[tuple]:
    return sorted(
        ((r["key"], r["window_start"], r["window_end"], r["value"]) for r in t.to_pylist()),
        key=lambda r: (r[0] or "", r[1], r[2]),
    )


@pytest.mark.parametrize("qname", ["q5", "q7", "q11"])
def test_duckdb_matches_reference(tiny_data, qname):
    _cfg, d, _man, bids = tiny_data
    q = peers.QUERIES[qname]
    t, _ = peers.run_duckdb(q, d / "bids", dedup=True, threads=1)
    assert _rows(peers.normalize(t, q.column)) == _expected(q, bids)


def test_spark_structured_streaming_matches_reference(tiny_data, spark, tmp_path):
    """The three queries as streaming queries (AvailableNow, watermark, micro-batches of 2 files; run
    side by side in one session to keep the test short), with the sentinel flushing the trailing
    windows: equal to the reference, every bid counted, the sentinel's window never emitted."""
    cfg, d, man, bids = tiny_data
    delay = -(-cfg.disorder_bound_ms() // 1000) * 1000
    running = {
        qname: peers.spark_stream(
            spark, peers.QUERIES[qname], d / "bids", tmp_path / qname, tmp_path / f"ck-{qname}", delay, 2, dedup=True
        )
        for qname in ("q5", "q7", "q11")
    }
    for qname, sq in running.items():
        sq.awaitTermination()
        assert sq.exception() is None
        q = peers.QUERIES[qname]
        prog = sq.recentProgress
        assert len(prog) > 2 and sum(p["numInputRows"] for p in prog) == len(bids["bid_id"]) + 1  # and the sentinel
        got = peers.normalize(peers.read_spark_output(tmp_path / qname), q.column)
        real = [r for r in _rows(got) if r[1] < man["bid_time_max"] + 86_400_000 - 10_000]
        assert real == _rows(got), "the sentinel's window must never be emitted"
        assert real == _expected(q, bids), qname
        if q.agg == "count":
            assert peers.counted_bids(q, got) == len(bids["bid_id"])


def test_spark_loses_bids_when_the_delay_is_too_short(spark, tmp_path):
    """Why the comparison checks Spark's counts: with a watermark delay below the data's disorder,
    Spark drops late rows (its progress's numRowsDroppedByWatermark stays 0 here, so the metric
    cannot be the check; the sum of the counts can)."""
    cfg = Config(
        events=2_000,
        keys=20,
        seed=5,
        rate=50,
        segments=2,
        chunk_rows=200,
        ooo_group=25,
        delay_fraction=0.3,
        max_delay_ms=8_000,
    )
    man = nexmark.write_dataset(cfg, tmp_path / "d")
    q = peers.QUERIES["q5"]
    peers.run_spark(spark, q, tmp_path / "d" / "bids", tmp_path / "o", tmp_path / "ck", 0, 2, dedup=False)
    got = peers.normalize(peers.read_spark_output(tmp_path / "o"), q.column)
    # each bid is in 5 sliding windows; with no delay, the windows of late bids that had closed lose them
    assert 0 < peers.counted_bids(q, got) < man["counts"]["bids"]


def test_diff_reports_differences():
    import pyarrow as pa

    a = pa.table(
        {"key": ["1", "2"], "window_start": [0, 0], "window_end": [10, 10], "value": [3, 4]}, schema=peers.NORMAL
    )
    b = pa.table(
        {"key": ["1", "3"], "window_start": [0, 0], "window_end": [10, 10], "value": [5, 4]}, schema=peers.NORMAL
    )
    assert peers.diff(a, a) == []
    d = peers.diff(a, b)
    assert any("only in first" in x and "'2'" in x for x in d)
    assert any("only in second" in x and "'3'" in x for x in d)
    assert any("value differs" in x and "3 vs 5" in x for x in d)
    with pytest.raises(ValueError):
        peers.normalize(pa.table({"key": ["1"], "window_start": [0], "window_end": [1], "v": [1.5]}), "v")


def test_wire_engine_matches_reference(tiny_data, store, spark):
    """Wire's side on the same tiny data: the benchmark's pipeline files, bids produced into their
    segments, the stream closed, the epochs committed (q11: two, the budget being one round of
    chunks, so sessions cross an epoch; q5 and q7: one, to keep the test short); the committed
    results equal the reference, and no bid is late or duplicate."""
    from benchmarks import compare
    from wire_dagster.engine import process
    from wire_dagster.results import read_results
    from wire_dagster.spec import pipeline_from_dict
    from wire_dagster.streams import close_stream, produce

    cfg, d, _man, bids = tiny_data
    bound = cfg.disorder_bound_ms()
    for qname, rounds in (("q5", 2), ("q7", 2), ("q11", 1)):
        st = compare.Settings(
            ooo_ms=-(-bound // 1000) * 1000,
            lateness_ms=2_000,
            partition="1m",
            epoch_chunks=rounds * cfg.segments,
            dedup=True,
            master="local[2]",
        )
        q = peers.QUERIES[qname]
        spec = pipeline_from_dict(compare.pipeline_dict(q, cfg, st))
        for s in range(cfg.segments):
            assert produce(store, spec, d / "wire" / f"bids-s{s}.parquet", segment=str(s)).malformed == 0
        close_stream(store, spec)
        out = process(store, spec, spark, max_epochs=10)
        assert len(out.committed) == 2 // rounds and out.pending == 0
        assert out.manifest is not None
        tot = out.manifest.totals
        n = len(bids["bid_id"])
        assert (tot.events_in, tot.counted[q.window_name], tot.late[q.window_name], tot.duplicate) == (n, n, 0, 0)
        got = peers.normalize(read_results(store, spec, q.window_name), q.column)
        assert _rows(got) == _expected(q, bids), qname
