"""The real NEXMark queries q5, q7, q8, q11: Wire vs Spark Structured Streaming vs DuckDB.

    .venv/bin/python benchmarks/nexmark_queries.py [--events 1M[,10M]] [--keys 1K[,100K]] \
        [--queries q5,q7,q8,q11] [--pairings cold,warm] [--graph]

For every size and key count, benchmarks/nexmark.py writes one seeded event set (persons,
auctions, bids in the 1:3:46 mix). Then:

- **Wire** runs the example pipelines of pipelines/nexmark/ as files, as a user runs them:
  the three shared streams produced once (`wire produce --stream S --close` of every segment's
  file, one process per stream: appended, then closed), then for each query its stages in
  dependency order (q5: q5_counts → q5_max → q5; q7: q7_max → q7, whose tick first ticks the
  pipeline reading its raw bids, nexmark_q7__bids; q8: q8_persons,
  q8_auctions → q8; q11: one stage), each stage `wire tick`ed until its sensor requests no
  run (one tick process at a time; the last, empty tick is reported apart). With `--graph`, each
  query is instead `wire tick --pipeline <its last stage> --upstream`ed until it requests no run:
  every stage of the graph in one process (its time is reported on the last stage). The
  results are the committed ones (results.read_results, untimed).
- **Spark Structured Streaming** (nexmark_sql.py spark): the same queries, AvailableNow,
  Parquet sink in append mode; where Spark refuses a query, the report prints its error's first
  line and that query is compared with DuckDB alone.
- **DuckDB** (nexmark_sql.py duckdb): the reference SQL of tests/test_nexmark_queries.py over
  the same files, one batch: the floor.

Two pairings (issue 26: both in every table): **cold/cold**, every `wire tick` booting its own
local Spark (WIRE_SPARK_MASTER=local[N]) against a Spark SS process that starts its JVM (its
whole wall time); **warm/warm**, Wire's commands typed into one `wire shell --warm`
(`--wire-warm shell`, the default: one process keeps Python, the definitions and the Spark
session between commands), its runs attached to Wire's embedded Spark server, the shell and the
server started before the timed commands as the S3 server is, against the query's second run in
one already started Spark SS session. `--wire-warm process` runs each warm command as its own
attached `wire` process instead (the warm pairing before the shell existed). Each pairing has
its own bucket and Dagster instance. Every engine's output is compared with DuckDB's as a
multiset of rows in the same run (exit 1 if any differs).
The report goes to stdout and benchmarks/results/nexmark-<date>-<HHMM>.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import (
    CMD_TIMEOUT,
    WIRE,
    LoadSampler,
    Measured,
    Runner,
    Servers,
    WireShell,
    bench_servers,
    comma_list,
    cpu_count,
    log,
    machine,
    md_table,
    parse_sides,
    peer_env,
    process_runner,
    run_measured,
    save_report,
    software_line,
    tick_until_idle,
)
from benchmarks.nexmark import AUCTION_SCHEMA, BID_SCHEMA, PERSON_SCHEMA, Config, fmt_count, parse_count, write_dataset
from benchmarks.nexmark_sql import QUERIES, row_diff, rows

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NEXMARK = ROOT / "pipelines" / "nexmark"
STREAMS = {"bids": BID_SCHEMA, "persons": PERSON_SCHEMA, "auctions": AUCTION_SCHEMA}
#: `--graph`: the extra arguments of the one tick per query (its last stage's, `--upstream`)
GRAPH: list[str] = []
DELAY_MS = 4000  # Spark's watermark delay = the pipelines' max_out_of_orderness (4 s) + allowed lateness (0)
PAIRINGS = {
    "cold": "cold/cold: each `wire tick` boots local Spark; Spark SS process with its JVM start",
    "warm": "warm/warm: Wire's commands in one `wire shell`, attached to its running Spark server; Spark SS query's "
    "2nd run in a started session",
}


def uptime() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{datetime.now(UTC):%H:%M:%S} UTC load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


# ---------------------------------------------------------------------------
# The event set, laid out for every engine


def lay_out(cfg: Config, data: Path) -> dict:
    """write_dataset, plus spark/<stream>/: the stream's files (hard links; bids by rounds, the
    others one file per segment) in modification-time order, then a one-event sentinel a day past
    the last event, with a later mtime: Spark's watermark passes every real window on it."""
    man = write_dataset(cfg, data)
    for stream, schema in STREAMS.items():
        d = data / "spark" / stream
        d.mkdir(parents=True)
        src = sorted((data / "bids").glob("r*.parquet")) if stream == "bids" else []
        src = src or sorted((data / "wire").glob(f"{stream}-s*.parquet"))
        for i, f in enumerate(src):
            os.link(f, d / f.name)
            os.utime(d / f.name, (1_700_000_000 + i, 1_700_000_000 + i))
        cols = {f.name: pa.array([-1] if pa.types.is_integer(f.type) else ["sentinel"], f.type) for f in schema}
        cols["date_time"] = pa.array([man["bid_time_max"] + 86_400_000], pa.int64())
        s = d / "zz-sentinel.parquet"
        pq.write_table(pa.table(cols, schema=schema), s)
        os.utime(s, (1_700_000_000 + len(src) + 10, 1_700_000_000 + len(src) + 10))
    man["sentinel_ms"] = man["bid_time_max"] + 86_400_000
    return man


# ---------------------------------------------------------------------------
# Wire


@dataclass
class Stage:
    name: str
    ticks: list[Measured] = field(default_factory=list)
    final_tick: Measured | None = None
    runs: int = 0

    @property
    def wall(self) -> float:
        return sum(m.wall for m in self.ticks)

    @property
    def cpu(self) -> float:
        return sum(m.cpu for m in self.ticks)


@dataclass
class WireSide:
    pairing: str
    env: dict[str, str]
    store: object
    servers: list[int]
    run: Runner  # one `wire` command, measured: a process each (cold), or the pairing's shell (warm)
    shell: WireShell | None = None
    ingest: dict[str, list[Measured]] = field(default_factory=dict)  # stream -> its `produce --close`
    stages: dict[str, Stage] = field(default_factory=dict)
    results: dict[str, list[tuple]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # query -> the failed command's cause

    def ingest_s(self, streams: list[str]) -> float:
        return sum(m.wall for s in streams for m in self.ingest.get(s, []))

    def ingest_cpu(self, streams: list[str]) -> float:
        return sum(m.cpu for s in streams for m in self.ingest.get(s, []))


def wire_ingest(w: WireSide, cfg: Config, data: Path, streams: list[str], tmp: Path) -> None:
    for s in streams:
        files = sorted((data / "wire").glob(f"{s}-s*.parquet"))
        args = [a for f in files for a in ("--file", str(f), "--segment", f.stem.rsplit("-s", 1)[1])]
        prod = w.run(["produce", "--stream", s, *args, "--chunk-rows", str(cfg.chunk_rows), "--close"])
        w.ingest[s] = [prod]
        log(f"  wire ({w.pairing}) produce --close {s}: {prod.wall:.1f} s")


def wire_query(w: WireSide, q: str, tmp: Path) -> None:
    from wire_dagster.results import read_results
    from wire_dagster.spec import load_pipeline

    meta = QUERIES[q]
    for name in meta["stages"]:
        st = Stage(name)
        pipeline = f"nexmark_{name}"
        if GRAPH and name != meta["stages"][-1]:
            w.stages[name] = st  # ticked by the last stage's `--upstream` tick, its time there
            continue
        st.ticks, st.final_tick = tick_until_idle(pipeline, w.run, GRAPH)
        st.runs = sum(m.stdout.count("SUCCESS") for m in st.ticks)
        w.stages[name] = st
        log(f"  wire ({w.pairing}) {name}: {st.wall:.1f} s in {len(st.ticks)} ticks, {st.runs} runs")
    spec = load_pipeline(NEXMARK / f"{meta['stages'][-1]}.yaml")
    w.results[q] = rows(read_results(w.store, spec, meta["window"]), meta["columns"])  # pyright: ignore[reportArgumentType]  an ObjectStore


def wire_counts(w: WireSide, man: dict, tmp: Path) -> list[str]:
    """Conservation on the raw stages: every event of the stream in and counted by the stage's
    window, none late, duplicate or malformed (`wire status --json`, untimed)."""
    problems = []
    want = man["counts"]
    raw = {
        "q11": ("bids", "sessions"),
        "q5_counts": ("bids", "auction_bids"),
        "q7_max": ("bids", "max_price"),
        "q7__bids": ("bids", "records"),  # generated for q7's raw input (expand.py): ticked by q7's tick
        "q8_persons": ("persons", "per_10s"),
        "q8_auctions": ("auctions", "per_10s"),
    }
    for name, (stream, window) in raw.items():
        if name.split("__")[0] not in w.stages:
            continue
        m = run_measured([WIRE, "status", "--pipeline", f"nexmark_{name}", "--json"], w.env, tmp, [])
        tot = json.loads(m.stdout).get("totals") or {}
        got = (
            tot.get("events_in"),
            (tot.get("counted") or {}).get(window),
            sum((tot.get("late") or {}).values()),
            tot.get("duplicate", 0),
            tot.get("malformed", 0),
        )
        if got != (want[stream], want[stream], 0, 0, 0):
            problems.append(
                f"Wire ({w.pairing}) nexmark_{name}: (in, counted, late, duplicate, malformed) = {got}, "
                f"expected ({want[stream]}, {want[stream]}, 0, 0, 0)"
            )
    return problems


# ---------------------------------------------------------------------------
# Peers


@dataclass
class Peer:
    wall: float | None = None  # cold: the process; warm: the second run's query time
    cpu: float | None = None
    info: dict = field(default_factory=dict)
    result: list[tuple] | None = None
    refused: str | None = None
    failed: str | None = None  # the process failed (out of memory, --peer-timeout): its cause's first line


def failure(e: SystemExit) -> str:
    """The first line naming a cause in a failed command's message (run_measured leads with them)."""
    lines = [ln.strip() for ln in str(e.code if e.code is not None else e).splitlines() if ln.strip()]
    causes = [ln for ln in lines[1:] if ln != "..."]
    return (causes[0] if causes else lines[0] if lines else "failed")[:300]


def spark_peer(q: str, data: Path, master: str, env: dict, tmp: Path, warm: bool, timeout: float) -> Peer:
    from benchmarks.peers import read_spark_output

    out = tmp / f"spark-{q}-{uuid.uuid4().hex[:6]}"
    cmd = [sys.executable, str(HERE / "nexmark_sql.py"), "spark", "--query", q, "--data", str(data)]
    cmd += ["--out", str(out), "--delay-ms", str(DELAY_MS), "--master", master] + (["--warm"] if warm else [])
    try:
        m = run_measured(cmd, env, tmp, [], timeout=timeout)
    except SystemExit as e:  # recorded, and the run goes on to the next side
        return Peer(failed=failure(e))
    info = m.last_json()
    if "refused" in info:
        return Peer(info=info, refused=info["refused"])
    cols = QUERIES[q]["columns"]
    res = rows(read_spark_output(out / "first"), cols)
    if warm:
        if "refused" in info.get("warm", {}):
            return Peer(info=info, refused="second run: " + info["warm"]["refused"])
        second = rows(read_spark_output(out / "warm"), cols)
        if second != res:
            return Peer(info=info, refused="the second run's result differs from the first's")
        return Peer(info["warm"]["seconds"], None, info, second)
    return Peer(m.wall, m.cpu, info, res)


def duckdb_peer(q: str, data: Path, env: dict, tmp: Path, timeout: float) -> Peer:
    out = tmp / f"duckdb-{q}-{uuid.uuid4().hex[:6]}.parquet"
    cmd = [sys.executable, str(HERE / "nexmark_sql.py"), "duckdb", "--query", q, "--data", str(data), "--out", str(out)]
    try:
        m = run_measured(cmd, env, tmp, [], timeout=timeout)
    except SystemExit as e:
        return Peer(failed=failure(e))
    info = m.last_json()
    return Peer(m.wall, m.cpu, info, rows(pq.read_table(out), QUERIES[q]["columns"]))


# ---------------------------------------------------------------------------
# One data set


@dataclass
class Case:
    cfg: Config
    man: dict
    gen_s: float
    wire: dict[str, WireSide] = field(default_factory=dict)  # pairing -> side
    spark: dict[tuple[str, str], Peer] = field(default_factory=dict)  # (pairing, query)
    duck: dict[str, Peer] = field(default_factory=dict)
    equal: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)  # (pairing, query, engine) -> diff
    problems: list[str] = field(default_factory=list)
    load: dict[str, tuple[float | None, str, str]] = field(default_factory=dict)  # query -> mean, uptime before/after


def run_case(cfg: Config, args, srv: Servers, sampler) -> Case:
    tmp = srv.tmp
    t0 = time.perf_counter()
    data = tmp / f"data-{fmt_count(cfg.events)}-{fmt_count(cfg.keys)}"
    man = lay_out(cfg, data)
    c = Case(cfg, man, time.perf_counter() - t0)
    log(f"{cfg.label}: generated in {c.gen_s:.1f} s: {man['counts']}")
    pdir = tmp / f"pipelines-{fmt_count(cfg.events)}-{fmt_count(cfg.keys)}"
    shutil.copytree(NEXMARK, pdir)
    streams = sorted({s for q in args.queries for s in QUERIES[q]["streams"]})
    for pairing in args.pairings if "wire" in args.sides else []:
        dhome = tmp / f"dagster-{fmt_count(cfg.events)}-{fmt_count(cfg.keys)}-{pairing}"
        store, env = srv.side(pdir, dhome, pairing == "warm", args.master)
        pids = srv.pids(pairing == "warm")
        w = c.wire[pairing] = WireSide(pairing, env, store, pids, process_runner(env, tmp, pids))
        if pairing == "warm" and args.wire_warm == "shell":
            w.shell = WireShell(env, tmp, pids)
            w.run = w.shell.run
            log(f"  wire (warm) shell started, Spark attached, in {w.shell.start_s:.1f} s (untimed)")
        wire_ingest(w, cfg, data, streams, tmp)
    peers_env = peer_env()
    for q in args.queries:
        log(f"{cfg.label}, {q}:")
        t_q, before = time.time(), uptime()
        for w in c.wire.values():
            try:
                wire_query(w, q, tmp)
            except SystemExit as e:  # recorded (the run exits 1), and the run goes on
                w.failed[q] = failure(e)
                c.problems.append(f"{q} Wire ({w.pairing}) failed: {w.failed[q]}")
                log(f"  wire ({w.pairing}) {q} FAILED: {w.failed[q]}")
        if "spark" in args.sides:
            for pairing in args.pairings:
                p = c.spark[(pairing, q)] = spark_peer(
                    q, data, args.master, peers_env, tmp, pairing == "warm", args.peer_timeout
                )
                log(f"  spark ({pairing}): {peer_line(p)}")
        if "duckdb" in args.sides:
            d = c.duck[q] = duckdb_peer(q, data, peers_env, tmp, args.peer_timeout)
            log(f"  duckdb: {peer_line(d)}")
        c.load[q] = (sampler.mean(t_q, time.time()), before, uptime())
        compare(c, q, args)
    for w in c.wire.values():
        if w.shell is not None:
            w.shell.close()
        c.problems += wire_counts(w, man, tmp)
    return c


def peer_line(p: Peer) -> str:
    if p.failed:
        return f"FAILED: {p.failed}"
    if p.refused:
        return f"refused: {p.refused}"
    return f"{f1(p.wall)} s, {len(p.result or []):,} rows"


def compare(c: Case, q: str, args) -> None:
    ref = c.duck.get(q)
    if ref is None or ref.result is None:
        return
    if not ref.result:
        c.problems.append(f"{q}: DuckDB's result is empty")
    sentinel_floor = c.man["sentinel_ms"] - 86_400_000 // 2
    for pairing in args.pairings:
        w = c.wire.get(pairing)
        if w is not None and q in w.results:
            d = row_diff(w.results[q], ref.result)
            c.equal[(pairing, q, "Wire")] = d
            c.problems += [f"{q} Wire ({pairing}) vs DuckDB: {x}" for x in d]
        s = c.spark.get((pairing, q))
        if s is not None and s.result is not None:
            cols = QUERIES[q]["columns"]
            tcol = (
                cols.index("starttime")
                if "starttime" in cols
                else cols.index("window_start" if "window_start" in cols else "date_time")
            )
            near = [r for r in s.result if r[tcol] >= sentinel_floor]
            if near:
                c.problems.append(f"{q} Spark SS ({pairing}): {len(near)} rows of the sentinel's windows")
            d = row_diff([r for r in s.result if r[tcol] < sentinel_floor], ref.result)
            c.equal[(pairing, q, "Spark SS")] = d
            c.problems += [f"{q} Spark SS ({pairing}) vs DuckDB: {x}" for x in d]


# ---------------------------------------------------------------------------
# Report


def f1(x: float | None) -> str:
    return f"{x:.1f}" if x is not None else "-"


def per_core(events: int, s: float | None) -> str:
    return f"{events / s / cpu_count():,.0f}" if s else "-"


def per_cpu(events: int, cpu: float | None) -> str:
    """NEXMark's Throughput/Cores: events / (cores used x time) = events per CPU second."""
    return f"{events / cpu:,.0f}" if cpu else "-"


def ratio(a: float | None, b: float | None) -> str:
    return f"**{b / a:.2f}**" if a and b else "-"


def report(cases: list[Case], args, t_total: float, sampler, notes: list[str]) -> str:
    now = datetime.now(UTC)
    out = [f"# NEXMark q5, q7, q8, q11: Wire vs Spark Structured Streaming vs DuckDB — {now:%Y-%m-%d %H:%M} UTC\n"]
    cmd = " ".join(["benchmarks/nexmark_queries.py", *sys.argv[1:]])
    out.append(f"- command: `{cmd}`")
    out.append(
        f"- machine: {machine()}; 1-minute load average during the run: mean {sampler.mean() or 0:.1f}, max "
        f"{sampler.max():.1f} ({cpu_count()} cores, shared with other work: the ratios within one run are what "
        f"count); total {t_total / 60:.1f} min"
    )
    out.append(software_line())
    out.append(
        "- Wire: the pipeline files of pipelines/nexmark/ unchanged (watermark 4 s on the raw stages, 0 s on the "
        "derived ones, no lateness, 1-minute partitions, ids de-duplicated, default budgets: an epoch reads every "
        f"chunk); streams produced with `--chunk-rows {cases[0].cfg.chunk_rows if cases else 0:,}`; "
        + (
            "**`--graph`**: each query's last stage `wire tick --upstream`ed until it requests no run (every stage "
            "of the query in one process; the time is shown on the last stage)"
            if GRAPH
            else "each stage `wire tick`ed until its sensor requests no run, stages in dependency order, one "
            "process at a time"
        )
    )
    out.append(
        f"- Spark SS: `{args.master}`, withWatermark {DELAY_MS} ms (= Wire's max_out_of_orderness + allowed "
        "lateness), maxFilesPerTrigger = the stream's real files (one batch, as Wire's one epoch), a sentinel file "
        "per stream (a later batch) that moves the watermark past every real window, Trigger.AvailableNow, Parquet "
        "sink in append mode; no de-duplication (no id repeats in the generated data)"
    )
    out.append("- DuckDB: tests/test_nexmark_queries.py's SQL (benchmarks/nexmark_sql.py) over the same Parquet files")
    for q in args.queries:
        out.append(f"- {q}: {QUERIES[q]['title']}; Wire stages {' → '.join(QUERIES[q]['stages'])}")
    out += [f"- {n}" for n in notes]
    out.append("")
    out.append(
        "**Wire s** = the `wire tick`s of the query's stages that launched runs + the `wire produce --close` of "
        "the streams the query reads (the ingest each query would pay alone; in the *all four* row each stream's "
        "ingest counts once); the last, empty tick of each stage is listed apart below. **Spark SS s**: cold = the "
        "whole process (JVM and session start, the query, stop); warm = the query's second run in one session. "
        "**DuckDB s**: the whole process. **÷**: the other engine's time over Wire's (> 1: Wire faster). **per core**: "
        "all generated events (persons + auctions + bids, as NEXMark counts them) per second per core "
        f"({cpu_count()} cores); **ev/CPU-s**: the same events per CPU second of the engine's processes (user + "
        "system; "
        "Wire's include the S3 server's, and in warm/warm the Spark server's, during its commands): NEXMark's own "
        "Throughput/Cores, which divides by the cores a system was measured to use; Spark SS warm has none (its "
        "process also ran the first run). **equal**: the engine's rows equal DuckDB's as a multiset, in this run.\n"
    )
    for c in cases:
        ev = c.cfg.events
        out.append(f"## {c.cfg.label}\n")
        out.append(
            f"Generated in {c.gen_s:.1f} s: {c.man['counts']['persons']:,} persons, {c.man['counts']['auctions']:,} "
            f"auctions, {c.man['counts']['bids']:,} bids; measured bid disorder {c.man['bid_disorder_ms']} ms (bound "
            f"{c.man['disorder_bound_ms']} ms).\n"
        )
        for pairing in args.pairings:
            title = PAIRINGS[pairing]
            if pairing == "warm" and args.wire_warm == "process":
                title = title.replace("Wire's commands in one `wire shell`", "each `wire` command a process")
            out.append(f"### {title}\n")
            head = ["query", "rows", "Wire s", "Spark SS s", "DuckDB s", "Spark SS ÷ Wire", "DuckDB ÷ Wire"]
            head += ["Wire ev/s/core", "Spark SS ev/s/core", "DuckDB ev/s/core"]
            head += ["Wire ev/CPU-s", "Spark SS ev/CPU-s", "DuckDB ev/CPU-s", "equal (Wire, Spark SS)", "load"]
            body = []
            tot_w = tot_d = cpu_w = cpu_d = 0.0
            tot_s: float | None = 0.0
            cpu_s: float | None = 0.0
            w = c.wire.get(pairing)
            for q in args.queries:
                meta = QUERIES[q]
                ok = w if w is not None and q not in w.failed else None  # the side, unless the query failed on it
                ws = (ok.ingest_s(meta["streams"]) + sum(ok.stages[s].wall for s in meta["stages"])) if ok else None
                sp = c.spark.get((pairing, q))
                ss = sp.wall if sp else None
                d = c.duck.get(q)
                ds = d.wall if d else None
                wc = (ok.ingest_cpu(meta["streams"]) + sum(ok.stages[s].cpu for s in meta["stages"])) if ok else None
                sc = sp.cpu if sp else None
                dc = d.cpu if d else None
                if ok:
                    tot_w += sum(ok.stages[s].wall for s in meta["stages"])
                    cpu_w += sum(ok.stages[s].cpu for s in meta["stages"])
                tot_s = tot_s + ss if (tot_s is not None and ss is not None) else None
                cpu_s = cpu_s + sc if (cpu_s is not None and sc is not None) else None
                tot_d += ds or 0
                cpu_d += dc or 0
                eq = []
                for eng in ("Wire", "Spark SS"):
                    if (pairing, q, eng) in c.equal:
                        eq.append("yes" if not c.equal[(pairing, q, eng)] else "**NO**")
                    elif eng == "Spark SS" and sp and sp.refused:
                        eq.append("refused")
                    else:
                        eq.append("-")
                load = c.load.get(q, (None, "", ""))[0]
                body.append(
                    [
                        q,
                        f"{len(d.result or []):,}" if d else "-",
                        "failed" if w is not None and ok is None else f1(ws),
                        "failed" if sp and sp.failed else "refused" if sp and sp.refused else f1(ss),
                        "failed" if d and d.failed else f1(ds),
                        ratio(ws, ss),
                        ratio(ws, ds),
                        per_core(ev, ws),
                        per_core(ev, ss),
                        per_core(ev, ds),
                        per_cpu(ev, wc),
                        per_cpu(ev, sc),
                        per_cpu(ev, dc),
                        ", ".join(eq),
                        f1(load),
                    ]
                )
            if w and not w.failed and len(args.queries) > 1:
                streams = sorted({s for q in args.queries for s in QUERIES[q]["streams"]})
                tot_w += w.ingest_s(streams)
                cpu_w += w.ingest_cpu(streams)
                body.append(
                    [
                        "all four" if len(args.queries) == 4 else "all",
                        "",
                        f1(tot_w),
                        f1(tot_s) if tot_s else "-",
                        f1(tot_d),
                        ratio(tot_w, tot_s) if tot_s else "-",
                        ratio(tot_w, tot_d),
                        per_core(ev, tot_w),
                        per_core(ev, tot_s) if tot_s else "-",
                        per_core(ev, tot_d),
                        per_cpu(ev, cpu_w),
                        per_cpu(ev, cpu_s) if tot_s else "-",
                        per_cpu(ev, cpu_d),
                        "",
                        "",
                    ]
                )
            out.append(md_table(head, body, "lrrrrrrrrrrrrll"))
            out.append("")
        failed = [f"- {q} Wire ({p}): `{why}`" for p, w in c.wire.items() for q, why in w.failed.items()]
        failed += [f"- {q} Spark SS ({p}): `{s.failed}`" for (p, q), s in c.spark.items() if s.failed]
        failed += [f"- {q} DuckDB: `{d.failed}`" for q, d in c.duck.items() if d.failed]
        if failed:
            out.append(
                "**Where a side failed** (out of memory, or still running after --peer-timeout "
                f"{args.peer_timeout:.0f} s; its cause's first line): its cells say failed\n"
            )
            out += failed
            out.append("")
        refused = {(p, q): s.refused for (p, q), s in c.spark.items() if s.refused}
        if refused:
            out.append("**Where Spark Structured Streaming refused a query** (its error's first line):\n")
            out += [f"- {q} ({p}): `{r}`" for (p, q), r in refused.items()]
            out.append("")
        if c.wire:
            out.append(
                "**Wire, per command** (wall s; CPU s of the command's processes and, during it, the servers')\n"
            )
            body = []
            for pairing, w in c.wire.items():
                for s, (prod,) in w.ingest.items():
                    body.append([pairing, f"produce --close {s}", "", f"{prod.wall:.1f}", "", f"{prod.cpu:.0f}"])
                for name, st in w.stages.items():
                    body.append(
                        [
                            pairing,
                            f"tick nexmark_{name}",
                            str(st.runs),
                            " + ".join(f"{m.wall:.1f}" for m in st.ticks),
                            f1(st.final_tick.wall if st.final_tick else None),
                            f"{st.cpu:.0f}",
                        ]
                    )
            out.append(
                md_table(["pairing", "command", "runs", "wall s (each tick)", "last empty tick s", "CPU s"], body)
            )
            out.append("")
        if c.spark:
            body = []
            for (pairing, q), s in c.spark.items():
                i = s.info
                first = i.get("seconds")
                body.append(
                    [
                        pairing,
                        q,
                        f1(i.get("session_seconds")),
                        f1(first),
                        f1(i.get("warm", {}).get("seconds")) if pairing == "warm" else "-",
                        str(i.get("batches", "-")),
                        f"{s.cpu:.0f}" if s.cpu is not None else "-",
                    ]
                )
            out.append("**Spark SS, inside its process** (s)\n")
            out.append(
                md_table(["pairing", "query", "session start", "first run", "second run", "batches", "CPU s"], body)
            )
            out.append("")
        out.append("**Load** (1-minute average, mean while the query's engines ran; `uptime` before and after)\n")
        out += [f"- {q}: mean {f1(m)}; before {b}; after {a}" for q, (m, b, a) in c.load.items()]
        out.append("")
    problems = [p for c in cases for p in c.problems]
    out.append("## Outputs compared\n")
    if problems:
        out.append("**Results differ or checks failed:**\n")
        out += [f"- {p}" for p in problems]
    else:
        n = sum(1 for c in cases for d in c.equal.values() if not d)
        out.append(
            f"All {n} comparisons equal: every Wire and Spark SS result listed above has exactly DuckDB's rows (as a "
            "multiset)"
            + (
                "; Wire's raw stages counted every event of their stream, none late, duplicate or malformed."
                if any(c.wire for c in cases)
                else "."
            )
        )
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--events", default="1M", help="comma-separated event counts (all kinds): 1M, 10M, 200K ...")
    ap.add_argument("--keys", default="1K", help="comma-separated key counts (auctions and bidders): 1K, 100K")
    ap.add_argument("--queries", default="q5,q7,q8,q11")
    ap.add_argument("--pairings", default="cold,warm", help="cold and/or warm (see the module doc)")
    ap.add_argument("--sides", default="wire,spark,duckdb", help="which engines to run (development)")
    ap.add_argument("--seed", type=int, default=Config.seed)
    ap.add_argument("--segments", type=int, default=Config.segments)
    ap.add_argument("--master", default=f"local[{cpu_count()}]")
    ap.add_argument("--results", type=Path, default=HERE / "results", help="directory of the Markdown report")
    ap.add_argument("--name", default="", help="suffix of the report's file name")
    ap.add_argument(
        "--graph", action="store_true", help="one `wire tick --upstream` of each query's last stage (one process)"
    )
    ap.add_argument(
        "--peer-timeout",
        type=float,
        default=CMD_TIMEOUT,
        metavar="S",
        help="stop a Spark SS or DuckDB run after S seconds and record it as failed (default: %(default)s)",
    )
    ap.add_argument(
        "--wire-warm",
        choices=("shell", "process"),
        default="shell",
        help="Wire's warm pairing: one `wire shell` for all its commands (default), or a process per command",
    )
    args = ap.parse_args()
    GRAPH[:] = ["--upstream"] if args.graph else []
    try:
        sizes = [parse_count(s) for s in comma_list(args.events)]
        keys = [parse_count(s) for s in comma_list(args.keys)]
        args.queries = comma_list(args.queries)
        args.pairings = comma_list(args.pairings)
        args.sides = parse_sides(args.sides)
        if not args.queries or not set(args.queries) <= set(QUERIES):
            raise ValueError(f"--queries: choose among {', '.join(QUERIES)}")
        if not args.pairings or not set(args.pairings) <= set(PAIRINGS):
            raise ValueError("--pairings: choose among cold, warm")
        cfgs = [Config(events=n, keys=k, seed=args.seed, segments=args.segments) for n in sizes for k in keys]
        if cfgs and cfgs[0].disorder_bound_ms() > DELAY_MS:
            raise ValueError("the generator's disorder bound exceeds the pipelines' 4 s out-of-orderness")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    t_all = time.perf_counter()
    sampler = LoadSampler().start()
    notes = [f"uptime at the start: {uptime()}"]
    cases = []
    want_server = "wire" in args.sides and "warm" in args.pairings
    with bench_servers("wire-nexmark-q-", args.master, want_server, notes) as srv:
        for cfg in cfgs:
            cases.append(run_case(cfg, args, srv, sampler))
    sampler.stop()
    notes.append(f"uptime at the end: {uptime()}")
    text = report(cases, args, time.perf_counter() - t_all, sampler, notes)
    now = datetime.now(UTC)
    path = args.results / f"nexmark-{now:%Y-%m-%d-%H%M}{('-' + args.name) if args.name else ''}.md"
    return save_report(text, path, failed=any(c.problems for c in cases))


if __name__ == "__main__":
    sys.exit(main())
