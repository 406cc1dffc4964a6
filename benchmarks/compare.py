"""NEXMark-like queries side by side: Wire end to end vs Spark Structured Streaming vs DuckDB.

    .venv/bin/python benchmarks/compare.py [--sizes 1M[,10M]] [--keys 1K[,100K]] [--queries q5,q7,q11]

For every size (all events, the 1:3:46 mix) and key count, `nexmark.py` writes one seeded data
set; then, query by query (Q5-like sliding 10 s / 2 s bids per auction, Q7-like tumbling 10 s
highest price, Q11-like 10 s sessions per bidder), the three sides run one after the other,
each from cold processes, and their final results are compared for equality (the command exits 1
and says where if they differ):

- **Wire** end to end, as a user runs it: one `wire produce` of every segment's bid file into the
  pipeline's stream in the embedded S3 server, `wire close`, then `wire tick` (a real sensor
  evaluation and real Dagster runs, DAGSTER_HOME a temporary directory) until the sensor
  requests no run. The results are the committed ones (`wire read --format parquet`). Twice
  (`--wire-spark local,server`): each `wire tick` booting local Spark in its own process, and
  every run attaching to Wire's embedded Spark server (`wire spark start`, started before the
  timed commands, as the S3 server is), each in its own bucket and Dagster instance.
- **Spark Structured Streaming** (`peers.py spark`): a fresh `local[N]` session (JVM start
  included), `readStream` of the same bids as local Parquet, `withWatermark`,
  `window`/`session_window`, `Trigger.AvailableNow`, Parquet sink in append mode.
- **DuckDB** (`peers.py duckdb`): the same windows in SQL over the same files: the floor.

Memory is the peak RSS of each side's process tree (psutil, sampled every 100 ms: the Python
process, its Spark JVM and Python workers); the S3 server is reported apart. The report (Markdown)
goes to stdout and to benchmarks/results/compare-<date>.md (compare-<date>-<HHMM>.md if that
exists). See BENCHMARKS.md for the choices (watermarks, budgets, partitions) and how to read the
figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from benchmarks.common import (
    WIRE,
    LoadSampler,
    Measured,
    bench_servers,
    comma_list,
    cpu_count,
    log,
    machine,
    mb,
    md_table,
    parse_sides,
    peer_env,
    process_runner,
    run_measured,
    save_report,
    software_line,
    tick_until_idle,
)
from benchmarks.nexmark import (
    PIPELINE_START,
    Config,
    fmt_count,
    parse_count,
    write_dataset,
    write_sentinel,
)
from benchmarks.peers import QUERIES, Query, counted_bids, diff, normalize, read_spark_output

if TYPE_CHECKING:
    import pyarrow as pa

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def parse_duration_ms(s: str) -> int:
    from wire_dagster.timeutil import parse_duration

    return parse_duration(s, "duration")


# ---------------------------------------------------------------------------
# Pipelines


@dataclass(frozen=True)
class Settings:
    ooo_ms: int  # Wire's max_out_of_orderness: the generator's disorder bound, rounded up to whole seconds
    lateness_ms: int  # Wire's allowed lateness
    partition: str
    epoch_chunks: int  # Wire max_chunks_per_epoch == Spark maxFilesPerTrigger
    dedup: bool
    master: str
    bounded: bool = True  # give the pipelines an `end` (the data set's event-time range, whole days)
    produce_per_segment: bool = False  # one `wire produce` process per segment (else one for every segment's file)

    @property
    def spark_delay_ms(self) -> int:
        """Spark's watermark delay: a window is emitted when Spark's watermark passes its end, which is
        when Wire makes it final (W >= end + allowed lateness, W = max - out_of_orderness)."""
        return self.ooo_ms + self.lateness_ms


def event_time_end(cfg: Config) -> str:
    """The pipelines' `end`: whole days from their start covering every bid and its windows."""
    from wire_dagster.timeutil import iso, parse_iso

    start = parse_iso(PIPELINE_START)
    last = cfg.start_ms + cfg.events * 1000 // cfg.rate + 120_000  # past the last event's windows and partition
    days = -(-(last - start) // 86_400_000)
    return iso(start + days * 86_400_000)


def pipeline_dict(q: Query, cfg: Config, st: Settings) -> dict:
    w: dict = {"name": q.window_name, "type": q.kind, "aggregates": {q.column: q.agg}}
    if q.kind == "session":
        w["gap"] = f"{q.gap_ms}ms"
    else:
        w["size"] = f"{q.size_ms}ms"
        if q.kind == "sliding":
            w["slide"] = f"{q.slide_ms}ms"
    event = {"time": "date_time"}
    if q.key:
        event["key"] = q.key
    if st.dedup:
        event["id"] = "bid_id"
    return {
        "name": q.name,
        "stream": f"bids_{q.name}",
        "event": event,
        "watermark": {"max_out_of_orderness": f"{st.ooo_ms}ms", "idle_timeout": "1m"},
        "lateness": {"allowed": f"{st.lateness_ms}ms"},
        "partition": st.partition,
        "start": PIPELINE_START,
        **({"end": event_time_end(cfg)} if st.bounded else {}),
        "limits": {"chunk_rows": cfg.chunk_rows, "max_chunks_per_epoch": st.epoch_chunks},
        "windows": [w],
    }


def side_pipeline(name: str, key: str, cfg: Config) -> dict:
    """persons / auctions: pipelines only so that their streams can be produced (no query reads them)."""
    return {
        "name": name,
        "stream": name,
        "event": {"time": "date_time", "key": key, "id": "id"},
        "watermark": {"max_out_of_orderness": "4s"},
        "partition": "1m",
        "start": PIPELINE_START,
        "end": event_time_end(cfg),
        "limits": {"chunk_rows": cfg.chunk_rows},
        "windows": [{"name": "per_10s", "type": "tumbling", "size": "10s", "aggregates": {"n": "count"}}],
    }


# ---------------------------------------------------------------------------
# Wire


@dataclass
class WireRun:
    # close, read and result are set by run_wire, the only maker, before it returns the run.
    produce: list[Measured] = field(default_factory=list)
    close: Measured = field(init=False)
    ticks: list[Measured] = field(default_factory=list)
    final_tick: Measured | None = None  # the one that requested nothing (confirmation)
    read: Measured = field(init=False)
    status: dict = field(default_factory=dict)
    result: pa.Table = field(init=False)  # NORMAL
    breakdown: list[dict] = field(default_factory=list)  # per tick

    @property
    def timed(self) -> list[Measured]:
        """The commands end to end counts: produce, close and the ticks that launched runs."""
        return [*self.produce, self.close, *self.ticks]

    @property
    def e2e(self) -> float:
        return sum(m.wall for m in self.timed)

    @property
    def cpu(self) -> float:
        return sum(m.cpu for m in self.timed)

    @property
    def peak(self) -> int:
        return max(m.peak for m in self.timed)

    @property
    def server_peak(self) -> int:
        return max(m.server_peak for m in self.timed)

    @property
    def with_server_peak(self) -> int:
        return max(m.with_server_peak for m in self.timed)


def run_wire(
    q: Query, cfg: Config, st: Settings, data: Path, env: dict[str, str], tmp: Path, server_pids: list[int]
) -> WireRun:
    import pyarrow.parquet as pq

    r = WireRun()
    files = [(data / "wire" / f"bids-s{s}.parquet", s) for s in range(cfg.segments)]
    args = [a for f, s in files if f.exists() for a in ("--file", str(f), "--segment", str(s))]
    # One command for every segment's file (as a user with several files runs it); --produce-per-segment
    # runs one process per segment (what the reports before 2026-11-24 06:30 measured).
    cmds = [args[i : i + 4] for i in range(0, len(args), 4)] if st.produce_per_segment else [args]
    for a in cmds:
        r.produce.append(run_measured([WIRE, "produce", "--pipeline", q.name, *a], env, tmp, server_pids))
    log(
        f"  wire produce: {sum(m.wall for m in r.produce):.1f} s ({len(args) // 4} segments, {len(r.produce)} "
        "processes)"
    )
    r.close = run_measured([WIRE, "close", "--pipeline", q.name], env, tmp, server_pids)
    r.ticks, r.final_tick = tick_until_idle(
        q.name,
        process_runner(env, tmp, server_pids),
        on_tick=lambda n, m: log(f"  wire tick {n}: {m.wall:.1f} s, {m.stdout.count('SUCCESS')} runs"),
    )
    out = tmp / f"wire-{q.name}.parquet"
    r.read = run_measured(
        [WIRE, "read", "--pipeline", q.name, "--window", q.window_name, "--format", "parquet", "-o", str(out)],
        env,
        tmp,
        server_pids,
    )
    r.result = normalize(pq.read_table(out), q.column)
    status = run_measured([WIRE, "status", "--pipeline", q.name, "--json"], env, tmp, server_pids)
    r.status = json.loads(status.stdout)
    return r


def wire_breakdown(r: WireRun, q: Query, dagster_home: Path) -> list[dict]:
    """Where each tick's time went, from the Dagster instance's run records and event logs: a run
    logs "epoch N: <chunks>, W ..." as it plans each epoch (reclock.plan_job), and "epoch N
    committed ..." for every epoch once its `process` returned (runs.log_epochs: after the last
    commit, its publish and GC). The logs date the epochs whatever the store still holds (the
    manifests would not: `keep_epochs` garbage-collects all but the last few)."""
    import dagster as dg

    inst = dg.DagsterInstance.from_config(str(dagster_home))
    runs = inst.get_runs(filters=dg.RunsFilter(tags={"wire/pipeline": q.name}))
    stats = {run.run_id: inst.get_run_stats(run.run_id) for run in runs}
    rows = []
    for i, tick in enumerate(r.ticks):
        mine = sorted(
            (st.start_time, st.end_time or st.start_time, rid)
            for rid, st in stats.items()
            if st.start_time and tick.t_start <= st.start_time <= tick.t_end
        )
        per_run = []  # (wall, epochs, before first epoch, first epoch -> last commit)
        for s, e, rid in mine:
            step_start = first_epoch = last_commit = None
            epochs = set()
            for ev in inst.all_logs(rid):
                if ev.dagster_event is not None and ev.dagster_event.event_type_value == "STEP_START":
                    step_start = ev.timestamp
                words = (ev.user_message or "").split()
                if len(words) < 3 or words[0] != "epoch":
                    continue
                if words[1].endswith(":") and first_epoch is None:  # the first epoch planned
                    first_epoch = ev.timestamp
                elif words[2] == "committed":
                    epochs.add(int(words[1]))
                    last_commit = ev.timestamp
            before = span = 0.0
            if first_epoch is not None and last_commit is not None and step_start is not None:
                before = first_epoch - step_start
                span = last_commit - first_epoch
            per_run.append((e - s, len(epochs), before, span))
        proc = [x for x in per_run if x[1]]
        rep = [x for x in per_run if not x[1]]
        first_is_rep = bool(per_run) and not per_run[0][1]
        rest = rep[1:] if first_is_rep else rep
        run_s = sum(x[0] for x in per_run)
        rows.append(
            {
                "tick": i + 1,
                "wall": tick.wall,
                "runs": len(per_run),
                "run_s": run_s,
                "epochs": sum(x[1] for x in proc),
                "epochs_s": sum(x[3] for x in proc),
                "before_first_epoch_s": sum(x[2] for x in proc),
                "proc_after_s": sum(x[0] - x[2] - x[3] for x in proc),
                "first_report_run_s": rep[0][0] if first_is_rep else None,
                "report_runs": len(rest),
                "report_runs_s": sum(x[0] for x in rest),
                "outside_runs_s": tick.wall - run_s,
            }
        )
    return rows


# ---------------------------------------------------------------------------
# Peers


@dataclass
class PeerRun:
    wall: float
    cpu: float
    peak: int
    info: dict
    result: pa.Table  # NORMAL


def peer_cmd(engine: str, q: Query, data: Path, out: Path, st: Settings) -> list[str]:
    """`peers.py <engine>` of `q` over the bids of `data` into `out`, de-duplicating as Wire does."""
    cmd = [sys.executable, str(HERE / "peers.py"), engine, "--query", q.name, "--src", str(data / "bids")]
    return cmd + ["--out", str(out)] + (["--dedup"] if st.dedup else [])


def run_spark_peer(q: Query, data: Path, st: Settings, env: dict[str, str], tmp: Path, warm: bool) -> PeerRun:
    """The cold run: one process (JVM start, the query, stop) measured whole. With `warm`, a second
    process runs the query twice in one session and only its second query's time is kept (its
    first run's result must equal the cold run's too)."""

    def cmd(out: Path, warm_run: bool) -> list[str]:
        c = peer_cmd("spark", q, data, out, st)
        c += ["--delay-ms", str(st.spark_delay_ms), "--max-files", str(st.epoch_chunks), "--master", st.master]
        return c + (["--warm"] if warm_run else [])

    out = tmp / f"spark-{q.name}-{uuid.uuid4().hex[:6]}"
    m = run_measured(cmd(out, False), env, tmp, [])
    info = m.last_json()
    res = normalize(read_spark_output(out / "cold"), q.column)
    if warm:
        out2 = tmp / f"spark-{q.name}-{uuid.uuid4().hex[:6]}"
        m2 = run_measured(cmd(out2, True), env, tmp, [])
        info2 = m2.last_json()
        for sub in ("cold", "warm"):
            if not normalize(read_spark_output(out2 / sub), q.column).equals(res):
                raise SystemExit(
                    f"Spark {q.name}: the result of the warm process's {sub} run differs from the cold run's"
                )
        info["warm"] = info2["warm"]
        info["second_cold_seconds"] = info2["seconds"]
    return PeerRun(m.wall, m.cpu, m.peak, info, res)


def run_duckdb_peer(q: Query, data: Path, st: Settings, env: dict[str, str], tmp: Path) -> PeerRun:
    import pyarrow.parquet as pq

    out = tmp / f"duckdb-{q.name}.parquet"
    m = run_measured(peer_cmd("duckdb", q, data, out, st), env, tmp, [])
    info = m.last_json()
    return PeerRun(m.wall, m.cpu, m.peak, info, normalize(pq.read_table(out), q.column))


def drop_sentinel(t: pa.Table, sentinel_ms: int, q: Query) -> tuple[pa.Table, int]:
    """Spark's result without the sentinel's windows (none is expected: its window never closes)."""
    import pyarrow.compute as pc

    keep = pc.less(t["window_start"], sentinel_ms - max(q.size_ms, q.gap_ms))  # pyright: ignore[reportAttributeAccessIssue]  generated at import
    return t.filter(keep), t.num_rows - t.filter(keep).num_rows


# ---------------------------------------------------------------------------
# Report


#: How Wire's runs get Spark: each `wire tick` boots local Spark in its own process, or every run
#: attaches to the embedded Spark server (`wire spark start`, started before the timed commands,
#: like the S3 server).
WIRE_SPARK_MODES = {"local": "local Spark per tick", "server": "Spark server (warm)"}


#: The columns naming a case, first in every table of the report (Case.cells).
CASE_HEAD = ["events", "keys", "query", "Wire's Spark"]


@dataclass
class Case:
    cfg: Config
    q: Query
    manifest: dict
    mode: str = "local"  # a WIRE_SPARK_MODES key
    wire: WireRun | None = None
    spark: PeerRun | None = None
    duck: PeerRun | None = None
    equal: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    t_start: float = 0.0
    t_end: float = 0.0
    load: float | None = None  # mean 1-minute load average while the case ran

    @property
    def cells(self) -> list[str]:
        """The case's CASE_HEAD cells."""
        return [fmt_count(self.cfg.events), fmt_count(self.cfg.keys), self.q.name, WIRE_SPARK_MODES[self.mode]]


def rate(n: int, s: float) -> str:
    return f"{n / s:,.0f}" if s > 0 else "-"


def report(cases: list[Case], st: Settings, args, t_total: float, load: LoadSampler, gen_notes: list[str]) -> str:
    out = []
    now = datetime.now(UTC)
    out.append(f"# NEXMark-like comparison: Wire vs Spark Structured Streaming vs DuckDB — {now:%Y-%m-%d %H:%M} UTC\n")
    command = " ".join(["benchmarks/compare.py", *sys.argv[1:]])  # `make bench` ran it until 2026-11-26
    out.append(f"- command: `{command}`")
    out.append(
        f"- machine: {machine()}; 1-minute load average during the run: mean {load.mean() or 0:.1f}, max "
        f"{load.max():.1f} ({cpu_count()} cores: above {cpu_count()} the sides share CPUs with other work); total "
        f"{t_total / 60:.1f} min"
    )
    out.append(software_line())
    c0 = cases[0].cfg if cases else Config()
    out.append(
        f"- generator: rate {c0.rate:,} events/s of event time, seed {c0.seed}, {c0.segments} segments, chunks of "
        f"{c0.chunk_rows:,} bids, out-of-order groups of {c0.ooo_group} events, {c0.delay_fraction:.0%} of events "
        f"delayed by up to {c0.max_delay_ms} ms: disorder bound {c0.disorder_bound_ms()} ms"
    )
    bounded = " (event-time range bounded by `end`, whole days)" if st.bounded else " (no `end`: open-ended)"
    out.append(
        f"- Wire: max_out_of_orderness {st.ooo_ms} ms (>= the bound: no event is late), allowed lateness "
        f"{st.lateness_ms} ms, partition {st.partition}{bounded}, "
        f"{st.epoch_chunks} chunks per epoch, id field {'bid_id (de-duplication on)' if st.dedup else 'none'}; Spark "
        f"`{st.master}`"
    )
    out.append(
        f"- Spark SS: withWatermark delay {st.spark_delay_ms} ms (= out-of-orderness + allowed lateness), "
        f"maxFilesPerTrigger {st.epoch_chunks}, Trigger.AvailableNow, Parquet sink "
        f"(append){', dropDuplicatesWithinWatermark(bid_id)' if st.dedup else ''}"
    )
    for q in sorted({c.q.name: c.q for c in cases}.values(), key=lambda q: int(q.name[1:])):
        out.append(f"- {q.name}: {q.title} (Wire window `{q.window_name}`, column `{q.column}`)")
    for n in gen_notes:
        out.append(f"- {n}")
    out.append("")
    out.append(
        "Times are wall seconds from cold processes. Wire = `wire produce` ("
        + ("one process per segment" if st.produce_per_segment else "one process for every segment's file")
        + ") + `wire close` + the `wire tick`s "
        "that launched runs (the last tick, which requested nothing, is not counted), with Wire's Spark either local "
        "(each tick boots its own JVM) or the embedded Spark server (runs attach to it; it was started before, as the "
        "S3 server was); Spark SS = one process: JVM start, query, stop; warm (with --warm) = the query's second run "
        "in one session of another process. Throughput counts bids (the only stream these queries read). **Wire ÷ X** "
        "is Wire's throughput over X's (> 1: Wire faster; the goal vs Spark SS is >= 2). Peak memory: the largest "
        "process tree of the side (Wire: its largest command; the servers it needs, the S3 server and in server mode "
        "the Spark server, are in the last columns, and their CPU during Wire's commands is in Wire's CPU).\n"
    )
    head = [
        *CASE_HEAD,
        "bids",
        "result rows",
        "equal",
        "Wire s",
        "Wire bids/s",
        "Spark SS s",
        "Spark SS bids/s",
        "Spark warm s",
        "DuckDB s",
        "DuckDB bids/s",
        "Wire ÷ Spark SS",
        "Wire ÷ DuckDB",
        "Wire MB",
        "Spark MB",
        "DuckDB MB",
        "servers MB",
        "Wire + servers MB",
        "load",
    ]
    rows = []
    for c in cases:
        n = c.cfg.bids
        w, s, d = c.wire, c.spark, c.duck
        first = w or s or d
        warm = s.info.get("warm", {}).get("seconds") if s else None
        rows.append(
            [
                *c.cells,
                f"{n:,}",
                f"{first.result.num_rows:,}" if first else "-",
                "yes" if c.equal and all(c.equal.values()) else ("**NO**" if c.equal else "-"),
                f"{w.e2e:.1f}" if w else "-",
                rate(n, w.e2e) if w else "-",
                f"{s.wall:.1f}" if s else "-",
                rate(n, s.wall) if s else "-",
                f"{warm:.1f}" if warm else "-",
                f"{d.wall:.1f}" if d else "-",
                rate(n, d.wall) if d else "-",
                f"{s.wall / w.e2e:.2f}" if (w and s) else "-",
                f"{d.wall / w.e2e:.3f}" if (w and d) else "-",
                mb(w.peak) if w else "-",
                mb(s.peak) if s else "-",
                mb(d.peak) if d else "-",
                mb(w.server_peak) if (w and w.server_peak) else "-",
                mb(w.with_server_peak) if (w and w.server_peak) else "-",
                f"{c.load:.1f}" if c.load is not None else "-",
            ]
        )
    out.append(md_table(head, rows, "llllrrlrrrrrrrrrrrrrrr"))
    problems = [f"{fmt_count(c.cfg.events)}/{fmt_count(c.cfg.keys)}/{c.q.name}: {p}" for c in cases for p in c.problems]
    if problems:
        out.append("\n**Results differ:**\n")
        out += [f"- {p}" for p in problems]

    out.append(
        "\n## CPU seconds (user + system of each side's processes; steadier than wall time on a shared machine)\n"
    )
    rows = []
    for c in cases:
        rows.append(
            [
                *c.cells,
                f"{c.wire.cpu:.0f}" if c.wire else "-",
                f"{c.spark.cpu:.0f}" if c.spark else "-",
                f"{c.duck.cpu:.1f}" if c.duck else "-",
                f"{c.spark.info.get('session_seconds', 0):.1f}" if c.spark else "-",
                f"{c.spark.info['seconds']:.1f}" if c.spark else "-",
                str(c.spark.info["batches"]) if c.spark else "-",
            ]
        )
    out.append(
        md_table(
            [
                *CASE_HEAD,
                "Wire CPU s",
                "Spark SS CPU s",
                "DuckDB CPU s",
                "Spark session start s",
                "Spark query s (cold)",
                "Spark batches",
            ],
            rows,
            "llllrrrrrr",
        )
    )

    wires = [(c, c.wire) for c in cases if c.wire is not None]
    if wires:
        out.append("\n## Where Wire's time goes\n")
        out.append(
            "First the commands (wall s). Then per tick (from the Dagster instance's run records and event logs, and "
            "the manifests' creation times): the tick process's time outside runs (interpreter start, Dagster and "
            "PySpark imports, definitions, sensor evaluation, run bookkeeping); the runs it launched (one per "
            "requested partition) and their summed wall time; in the run that committed epochs: the time before its "
            "first epoch (reading offsets; the Spark session and JVM start too where runs create the session eagerly: "
            "where they start Spark on first use, it falls in the first epoch), from the first epoch's start to the "
            "last commit (Spark kernel, staging, manifest, commit, publish: all epochs; the run commits every pending "
            "epoch), and after it (partition report, watermark chart, metadata); a tick's first run when it had "
            "nothing to process (with an eager session, it paid the JVM start); and the other runs, which only report "
            "their partition (Dagster run overhead, publish check, chart).\n"
        )
        rows = []
        for c, w in wires:
            rows.append(
                [
                    *c.cells,
                    f"{sum(m.wall for m in w.produce):.1f}",
                    f"{w.close.wall:.1f}",
                    " + ".join(f"{m.wall:.1f}" for m in w.ticks),
                    f"{w.final_tick.wall:.1f}" if w.final_tick else "-",
                    f"{w.read.wall:.1f}",
                    f"{w.e2e:.1f}",
                ]
            )
        out.append(
            md_table(
                [
                    *CASE_HEAD,
                    "produce s",
                    "close s",
                    "ticks s",
                    "last (empty) tick s",
                    "read s",
                    "end to end s",
                ],
                rows,
                "llllrrlrrr",
            )
        )
        out.append("")
        rows = []
        for c, w in wires:
            for b in w.breakdown:
                rows.append(
                    [
                        *c.cells,
                        b["tick"],
                        f"{b['wall']:.1f}",
                        f"{b['outside_runs_s']:.1f}",
                        b["runs"],
                        f"{b['run_s']:.1f}",
                        b["epochs"],
                        f"{b['before_first_epoch_s']:.1f}" if b["epochs"] else "-",
                        f"{b['epochs_s']:.1f}" if b["epochs"] else "-",
                        f"{b['proc_after_s']:.1f}" if b["epochs"] else "-",
                        f"{b['first_report_run_s']:.1f}" if b["first_report_run_s"] is not None else "-",
                        b["report_runs"],
                        f"{b['report_runs_s'] / b['report_runs']:.2f}" if b["report_runs"] else "-",
                    ]
                )
        out.append(
            md_table(
                [
                    *CASE_HEAD,
                    "tick",
                    "tick s",
                    "outside runs s",
                    "runs",
                    "runs s",
                    "epochs",
                    "processing run: before epoch 1 s",
                    "epochs s",
                    "after the last commit s",
                    "first run (no epoch) s",
                    "reporting runs",
                    "reporting run mean s",
                ],
                rows,
                "llllrrrrrrrrrrrr",
            )
        )
        tot = sum(w.e2e for _, w in wires)
        tot_runs = sum(b["runs"] for _, w in wires for b in w.breakdown)

        def part(label: str, v: float) -> str:
            return f"{label} {v:.0f} s ({100 * v / tot:.0f}%)"

        bs = [b for _, w in wires for b in w.breakdown]
        parts = [
            part("`wire produce`", sum(sum(m.wall for m in w.produce) for _, w in wires)),
            part("`wire close`", sum(w.close.wall for _, w in wires)),
            part(
                "tick processes outside runs (start-up, imports, definitions, sensor)",
                sum(b["outside_runs_s"] for b in bs),
            ),
            part("processing runs before their first epoch", sum(b["before_first_epoch_s"] for b in bs)),
            part("epochs (kernel and commit)", sum(b["epochs_s"] for b in bs)),
            part("processing runs after their last commit", sum(b["proc_after_s"] for b in bs)),
            part("first run of a tick with nothing to process", sum(b["first_report_run_s"] or 0 for b in bs)),
            part("the other reporting runs", sum(b["report_runs_s"] for b in bs)),
        ]
        out.append(
            f"\nSummed over the Wire cases above ({tot:.0f} s end to end, {tot_runs} Dagster runs): "
            + "; ".join(parts)
            + "."
        )

    sizes = sorted({c.cfg.events for c in cases})
    if len(sizes) > 1:
        out.append(
            f"\n## Scale {fmt_count(sizes[0])} → {fmt_count(sizes[-1])} events (time ratio; goal for Wire: <= "
            f"{1.1 * sizes[-1] / sizes[0]:.0f}×; peak memory should stay flat)\n"
        )
        rows = []
        by = {(c.cfg.events, c.cfg.keys, c.q.name, c.mode): c for c in cases}
        for (n, k, qn, mode), big in sorted(by.items()):
            if n != sizes[-1] or (sizes[0], k, qn, mode) not in by:
                continue
            small = by[(sizes[0], k, qn, mode)]

            def ratio(a, b):
                return f"{a / b:.1f}×" if a and b else "-"

            rows.append(
                [
                    fmt_count(k),
                    qn,
                    WIRE_SPARK_MODES[mode],
                    ratio(big.wire and big.wire.e2e, small.wire and small.wire.e2e),
                    ratio(big.spark and big.spark.wall, small.spark and small.spark.wall),
                    ratio(big.duck and big.duck.wall, small.duck and small.duck.wall),
                    f"{mb(small.wire.peak)} → {mb(big.wire.peak)}" if big.wire and small.wire else "-",
                    f"{mb(small.spark.peak)} → {mb(big.spark.peak)}" if big.spark and small.spark else "-",
                ]
            )
        out.append(
            md_table(
                ["keys", "query", "Wire's Spark", "Wire", "Spark SS", "DuckDB", "Wire peak MB", "Spark peak MB"],
                rows,
                "lllrrrrr",
            )
        )
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sizes", default="1M", help="comma-separated event counts (all kinds): 1M, 10M, 20K ...")
    ap.add_argument("--keys", default="1K", help="comma-separated key counts (auctions and bidders): 1K, 100K")
    ap.add_argument("--queries", default="q5,q7,q11")
    ap.add_argument("--seed", type=int, default=Config.seed)
    ap.add_argument("--rate", type=int, default=Config.rate, help="events per second of event time")
    ap.add_argument("--segments", type=int, default=Config.segments)
    ap.add_argument("--chunk-rows", type=int, default=Config.chunk_rows, help="bids per chunk (Wire chunk, Spark file)")
    ap.add_argument(
        "--epoch-chunks",
        type=int,
        default=0,
        help="Wire max_chunks_per_epoch = Spark maxFilesPerTrigger "
        "(a multiple of --segments; default 2 rounds = 2 x segments)",
    )
    ap.add_argument("--partition", default="1m", help="Wire's event-time partition (Dagster partition) size")
    ap.add_argument("--lateness", default="5s", help="Wire's allowed lateness (Spark's delay adds it)")
    ap.add_argument("--no-dedup", action="store_true", help="no id field in Wire, no de-duplication in the peers")
    ap.add_argument(
        "--no-end", action="store_true", help="Wire pipelines without `end` (open-ended event-time partitions)"
    )
    ap.add_argument(
        "--warm",
        action="store_true",
        help="also time Spark warm: a second process runs each query twice in one "
        "session (the second run is the warm figure)",
    )
    ap.add_argument("--sides", default="wire,spark,duckdb", help="which sides to run (development)")
    ap.add_argument(
        "--wire-spark",
        default="local,server",
        help="Wire's Spark, comma-separated: local (each `wire tick` boots "
        "local Spark) and/or server (runs attach to the embedded Spark server, started before the timed commands)",
    )
    ap.add_argument(
        "--produce-per-segment",
        action="store_true",
        help="one `wire produce` process per segment (default: one command for every segment's file)",
    )
    ap.add_argument("--master", default=f"local[{cpu_count()}]")
    ap.add_argument("--results", type=Path, default=HERE / "results", help="directory of the Markdown report")
    args = ap.parse_args()

    try:
        sizes = [parse_count(s) for s in comma_list(args.sizes)]
        keys = [parse_count(s) for s in comma_list(args.keys)]
        queries = [QUERIES[x] for x in comma_list(args.queries)]
        sides = parse_sides(args.sides)
        modes = comma_list(args.wire_spark)
        if not modes or not set(modes) <= set(WIRE_SPARK_MODES):
            raise ValueError("--wire-spark: choose among local, server")
        epoch_chunks = args.epoch_chunks or 2 * args.segments
        if epoch_chunks % args.segments:
            raise ValueError(
                "--epoch-chunks: must be a multiple of --segments (whole rounds, so that Spark's batches "
                "never hold a later round's file before an earlier one's)"
            )
        cfgs = [
            Config(events=n, keys=k, seed=args.seed, rate=args.rate, segments=args.segments, chunk_rows=args.chunk_rows)
            for n in sizes
            for k in keys
        ]
        bound = cfgs[0].disorder_bound_ms()
        st = Settings(
            ooo_ms=-(-bound // 1000) * 1000,
            lateness_ms=parse_duration_ms(args.lateness),
            partition=args.partition,
            epoch_chunks=epoch_chunks,
            dedup=not args.no_dedup,
            master=args.master,
            bounded=not args.no_end,
            produce_per_segment=args.produce_per_segment,
        )
        from wire_dagster.spec import pipeline_from_dict

        for q in queries:
            pipeline_from_dict(pipeline_dict(q, cfgs[0], st))  # validates --partition etc. before anything runs
    except (ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # WireInputError from the pipeline check
        if e.__class__.__name__ == "WireInputError":
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise

    t_all = time.perf_counter()
    load = LoadSampler().start()
    cases: list[Case] = []
    gen_notes: list[str] = []
    with bench_servers("wire-nexmark-", st.master, "wire" in sides and "server" in modes, gen_notes) as srv:
        tmp = srv.tmp
        for cfg in cfgs:
            data = tmp / f"data-{fmt_count(cfg.events)}-{fmt_count(cfg.keys)}"
            t0 = time.perf_counter()
            man = write_dataset(cfg, data)
            sentinel_ms = man["bid_time_max"] + 86_400_000
            write_sentinel(data, sentinel_ms, len(man["bid_files"]))
            gen_notes.append(
                f"{cfg.label}: generated in {time.perf_counter() - t0:.1f} s: {man['counts']['persons']:,} persons, "
                f"{man['counts']['auctions']:,} auctions, {man['counts']['bids']:,} bids over "
                f"{(man['bid_time_max'] - man['bid_time_min']) / 1000:,.0f} s of event time; measured disorder "
                f"{man['bid_disorder_ms']} ms (bound {man['disorder_bound_ms']} ms)"
            )
            log(gen_notes[-1])
            pdir = tmp / f"pipelines-{fmt_count(cfg.events)}-{fmt_count(cfg.keys)}"
            pdir.mkdir()
            for q in queries:
                (pdir / f"{q.name}.yaml").write_text(yaml.safe_dump(pipeline_dict(q, cfg, st), sort_keys=False))
            for name, key in (("persons", "state"), ("auctions", "category")):
                (pdir / f"{name}.yaml").write_text(yaml.safe_dump(side_pipeline(name, key, cfg), sort_keys=False))
            # a fresh bucket and Dagster instance per data set and Wire mode
            wire_envs = {}
            for mode in modes if "wire" in sides else []:
                dhome = tmp / f"dagster-{fmt_count(cfg.events)}-{fmt_count(cfg.keys)}-{mode}"
                store, env = srv.side(pdir, dhome, mode == "server", st.master)
                t0 = time.perf_counter()
                _land_side_streams(store, cfg, data, pdir)
                if not gen_notes[-1].startswith(f"{cfg.label}: persons"):
                    gen_notes.append(
                        f"{cfg.label}: persons and auctions landed in their own streams ({cfg.segments} segments "
                        f"each, `streams.produce`, not timed with the queries) in {time.perf_counter() - t0:.1f} s"
                    )
                wire_envs[mode] = (env, dhome)
            peers_env = peer_env()
            for q in queries:
                log(f"{cfg.label}, {q.name}:")
                per_mode = []
                for mode in modes if "wire" in sides else ["local"]:
                    c = Case(cfg, q, man, mode=mode, t_start=time.time())
                    if mode in wire_envs:
                        env, dhome = wire_envs[mode]
                        c.wire = run_wire(q, cfg, st, data, env, tmp, srv.pids(mode == "server"))
                        c.wire.breakdown = wire_breakdown(c.wire, q, dhome)
                        _check_wire_counts(c, c.wire, cfg)
                        log(f"  wire ({WIRE_SPARK_MODES[mode]}): {c.wire.e2e:.1f} s end to end")
                    per_mode.append(c)
                spark = duck = None
                if "spark" in sides:
                    spark = run_spark_peer(q, data, st, peers_env, tmp, warm=args.warm)
                    spark.result, n_sentinel = drop_sentinel(spark.result, sentinel_ms, q)
                    if n_sentinel:
                        per_mode[0].problems.append(f"Spark SS emitted {n_sentinel} sentinel window(s)")
                    log(
                        f"  spark: {spark.wall:.1f} s (query {spark.info['seconds']:.1f} s, {spark.info['batches']} "
                        "batches)"
                    )
                if "duckdb" in sides:
                    duck = run_duckdb_peer(q, data, st, peers_env, tmp)
                    log(f"  duckdb: {duck.wall:.1f} s")
                for c in per_mode:
                    c.spark, c.duck = spark, duck
                    c.t_end = time.time()
                    c.load = load.mean(c.t_start, c.t_end)
                    _compare(c)
                    cases.append(c)
                    for p in c.problems:
                        log(f"  PROBLEM: {p}")
    load.stop()
    text = report(cases, st, args, time.perf_counter() - t_all, load, gen_notes)
    now = datetime.now(UTC)
    path = args.results / f"compare-{now:%Y-%m-%d}.md"
    if path.exists():  # a second run on the same day keeps the first one's report
        path = args.results / f"compare-{now:%Y-%m-%d-%H%M}.md"
    return save_report(text, path, failed=any(c.problems for c in cases))


def _land_side_streams(store, cfg: Config, data: Path, pdir: Path) -> None:
    from wire_dagster.spec import load_pipeline
    from wire_dagster.streams import close_stream, produce

    for name in ("persons", "auctions"):
        spec = load_pipeline(pdir / f"{name}.yaml")
        for s in range(cfg.segments):
            f = data / "wire" / f"{name}-s{s}.parquet"
            if f.exists():
                rep = produce(store, spec, f, segment=str(s))
                if rep.malformed:
                    raise SystemExit(f"{name} segment {s}: {rep.malformed} malformed records")
        close_stream(store, spec)


def _check_wire_counts(c: Case, wire: WireRun, cfg: Config) -> None:
    """Conservation, and the choice of watermark: every bid counted, none late, none duplicate."""
    tot = wire.status.get("totals", {})
    w = c.q.window_name
    want = cfg.bids
    got = (
        tot.get("events_in"),
        tot.get("counted", {}).get(w),
        tot.get("late", {}).get(w, 0),
        tot.get("duplicate", 0),
        tot.get("malformed", 0),
    )
    if got != (want, want, 0, 0, 0):
        c.problems.append(
            f"Wire counts (in, counted, late, duplicate, malformed) = {got}, expected ({want}, {want}, 0, 0, 0)"
        )
    pending = wire.status.get("pending_chunks", 0)
    if pending:
        c.problems.append(
            f"the sensor requested no more runs while {pending} chunks of the closed stream were still unread "
            f"(last committed epoch: {wire.status.get('epoch')})"
        )


def _compare(c: Case) -> None:
    sides = [(n, r.result) for n, r in (("Wire", c.wire), ("Spark SS", c.spark), ("DuckDB", c.duck)) if r is not None]
    for i in range(len(sides)):
        for j in range(i + 1, len(sides)):
            (na, a), (nb, b) = sides[i], sides[j]
            d = diff(a, b)
            c.equal[f"{na}={nb}"] = not d
            if d:
                c.problems.append(f"{na} vs {nb}: " + "; ".join(d))
    if sides and sides[0][1].num_rows == 0:
        c.problems.append("empty result")
    if c.q.agg == "count":  # conservation: every bid counted once per window it belongs to
        for name, r in (("Wire", c.wire), ("Spark SS", c.spark), ("DuckDB", c.duck)):
            if r is not None and counted_bids(c.q, r.result) != c.cfg.bids:
                c.problems.append(f"{name} counted {counted_bids(c.q, r.result):,.0f} bids of {c.cfg.bids:,}")


if __name__ == "__main__":
    sys.exit(main())
