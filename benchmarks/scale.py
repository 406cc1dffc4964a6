"""The scale curve (issue 26): Wire end to end at 1 M → 10 M (→ 50 M) events, time and peak memory per step.

    .venv/bin/python benchmarks/scale.py [--sizes 1M,10M[,50M]] [--keys 100K] [--wire-spark server[,local]]

The workload of issue 26: NEXMark-like bids (`nexmark.py`'s seeded generator, as compare.py uses it;
`--sizes` counts all generated events, of which 46/50 are bids, the only stream produced), 100 K
keys (bidders), one pipeline with three windows: tumbling 1 m, sliding 2 m / 30 s, session 20 s,
each counting bids per bidder; watermark 5 s (max_out_of_orderness, above the generator's
disorder bound), allowed lateness 5 s, partition 1 m, de-duplication on `bid_id`, 8 chunks of
50 K bids per epoch. For every size, Wire runs as compare.py's Wire side does (`compare.run_wire`):
`wire produce` of every segment's file, `wire close`, then `wire tick` until the sensor requests
no run, each a new process, in a fresh bucket and Dagster instance; with `--wire-spark server`
(default: as under `wire dev`) every run attaches to Wire's embedded Spark server, started before
the timed commands, a fresh one for every size (a JVM's RSS never shrinks: a server kept from the
step before would carry its peak into the next); with `local` each tick boots local Spark in its
own process.

Measured per phase (`common.run_measured`): wall seconds and the peak RSS of the command's whole
process tree, and of the tree plus the servers it needs at the same instant (the S3 server and,
in server mode, the Spark server: compare.py's "Wire + servers"). The scale table gives, between
consecutive sizes, the time ratio (linear would be the event ratio) and the ratio of peak memory
(issue 26's "flat memory in backlog": 10× the events should need ≤ ~1.5× the memory).

Checked at every size: Wire's counts (`wire status`: every bid in, counted once by each window,
none late, duplicate or malformed, no chunk left unread) and each window's committed result
(`wire read`) conserving the bids (`peers.counted_bids`) and, up to `--duckdb-max` events (default
10 M: the comparison holds every result in this process, over 13 GB at 50 M), equal row for row to
DuckDB's over the same files (`peers.duckdb_sql`, compare.py's floor). The command exits 1 if a
check fails. The report goes to stdout and to benchmarks/results/scale-<date>-<HHMM>.md.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from benchmarks.common import (
    WIRE,
    LoadSampler,
    Measured,
    Servers,
    bench_servers,
    comma_list,
    cpu_count,
    log,
    machine,
    mb,
    md_table,
    run_measured,
    save_report,
    software_line,
    spark_server,
)
from benchmarks.compare import WIRE_SPARK_MODES, Settings, WireRun, pipeline_dict, run_wire, wire_breakdown
from benchmarks.nexmark import Config, fmt_count, parse_count, write_dataset
from benchmarks.peers import Query, counted_bids, diff, normalize, run_duckdb

if TYPE_CHECKING:
    import pyarrow as pa

HERE = Path(__file__).resolve().parent
FLAT = 1.5  # issue 26: 10x the events within ~1.5x the peak memory


@dataclass(frozen=True)
class WindowQuery(Query):
    """A peers.Query (what DuckDB computes, how results are normalised and counted) naming its Wire window."""

    wire_window: str = ""

    @property
    def window_name(self) -> str:
        return self.wire_window


#: The three windows of issue 26's workload, bids per bidder; the first is the one run_wire reads.
WINDOWS = [
    WindowQuery("scale", "tumbling 1 m", "bidder", "tumbling", size_ms=60_000, wire_window="per_minute"),
    WindowQuery(
        "scale", "sliding 2 m / 30 s", "bidder", "sliding", size_ms=120_000, slide_ms=30_000, wire_window="two_min"
    ),
    WindowQuery("scale", "session 20 s", "bidder", "session", gap_ms=20_000, wire_window="sessions"),
]


def scale_pipeline(cfg: Config, st: Settings) -> dict:
    """compare.py's pipeline for the first window, with all three windows."""
    d = pipeline_dict(WINDOWS[0], cfg, st)
    d["windows"] = [pipeline_dict(q, cfg, st)["windows"][0] for q in WINDOWS]
    return d


@dataclass
class Step:
    cfg: Config
    mode: str
    wire: WireRun
    gen_s: float
    duck_s: dict[str, float] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    reads: list[Measured] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    load: float | None = None
    duck_checked: bool = True  # compared with DuckDB (else the counts only: --duckdb-max)

    @property
    def bids(self) -> int:
        return self.cfg.bids

    def peak(self, ms: list[Measured], servers: bool) -> int:
        return max((m.with_server_peak if servers else m.peak) for m in ms) if ms else 0


def check(step: Step, results: dict[str, pa.Table], data: Path, dedup: bool) -> None:
    """Wire's counts (every bid counted once per window, nothing late, duplicate, malformed or
    unread), and each window's result conserving the bids and (when `duck_checked`) equal to DuckDB's."""
    tot = step.wire.status.get("totals", {})
    n = step.bids
    if tot.get("events_in") != n:
        step.problems.append(f"events in {tot.get('events_in')}, expected {n:,}")
    for k in ("duplicate", "malformed"):
        if tot.get(k, 0):
            step.problems.append(f"{tot.get(k)} {k} events")
    if step.wire.status.get("pending_chunks", 0):
        step.problems.append(f"{step.wire.status['pending_chunks']} chunks left unread")
    for q in WINDOWS:
        w = q.window_name
        if tot.get("counted", {}).get(w) != n or tot.get("late", {}).get(w, 0):
            step.problems.append(
                f"{w}: counted {tot.get('counted', {}).get(w)}, late {tot.get('late', {}).get(w, 0)}; expected {n:,}, 0"
            )
        got = results[w]
        step.rows[w] = got.num_rows
        if counted_bids(q, got) != n:
            step.problems.append(f"{w}: the result counts {counted_bids(q, got):,.0f} bids of {n:,}")
        if not step.duck_checked:
            continue
        t, step.duck_s[w] = run_duckdb(q, data / "bids", dedup)
        d = diff(got, normalize(t, q.column))
        if d:
            step.problems.append(f"{w}: Wire vs DuckDB: " + "; ".join(d))


def run_step(
    cfg: Config, st: Settings, mode: str, srv: Servers, data: Path, pdir: Path, gen_s: float, duckdb_max: int
) -> Step:
    """Wire end to end on one data set, then its checks (DuckDB's equality up to `duckdb_max` events)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = srv.tmp
    dhome = tmp / f"dagster-{fmt_count(cfg.events)}-{mode}"
    store, env = srv.side(pdir, dhome, mode == "server", st.master)
    pids = srv.pids(mode == "server")
    r = run_wire(WINDOWS[0], cfg, st, data, env, tmp, pids)
    r.breakdown = wire_breakdown(r, WINDOWS[0], dhome)
    step = Step(cfg, mode, r, gen_s)
    results: dict[str, pa.Table] = {WINDOWS[0].window_name: r.result}
    step.duck_checked = cfg.events <= duckdb_max
    for q in WINDOWS[1:]:
        out = tmp / f"wire-{q.window_name}.parquet"
        cmd = [WIRE, "read", "--pipeline", q.name, "--window", q.window_name, "--format", "parquet", "-o", str(out)]
        step.reads.append(run_measured(cmd, env, tmp, pids))
        if step.duck_checked:
            results[q.window_name] = normalize(pq.read_table(out), q.column)
        else:  # the counts only (conservation), not the rows: a 50 M sliding result holds ~40 M rows
            results[q.window_name] = pa.table({"value": pq.read_table(out, columns=[q.column])[q.column]})
        out.unlink()
    check(step, results, data, st.dedup)
    del results
    del r.result  # the checked result is not kept (10 M events: GBs)
    gc.collect()
    return step


# ---------------------------------------------------------------------------
# Report


def report(steps: list[Step], st: Settings, t_total: float, load: LoadSampler, notes: list[str]) -> str:
    now = datetime.now(UTC)
    out = [f"# Scale curve: Wire end to end, {' → '.join(dict.fromkeys(fmt_count(s.cfg.events) for s in steps))}"]
    out[0] += f" events — {now:%Y-%m-%d %H:%M} UTC\n"
    out.append(f"- command: `{' '.join(['benchmarks/scale.py', *sys.argv[1:]])}`")
    out.append(
        f"- machine: {machine()}; 1-minute load average during the run: mean {load.mean() or 0:.1f}, max "
        f"{load.max():.1f} ({cpu_count()} cores: above {cpu_count()} Wire shares CPUs with other work); total "
        f"{t_total / 60:.1f} min"
    )
    out.append(software_line())
    c0 = steps[0].cfg if steps else Config()
    out.append(
        f"- workload (issue 26): NEXMark-like bids (`nexmark.py`, seed {c0.seed}, {c0.rate:,} events/s of event time, "
        f"{c0.segments} segments, chunks of {c0.chunk_rows:,} bids, disorder bound {c0.disorder_bound_ms()} ms), "
        f"{fmt_count(c0.keys)} keys (bidders); one pipeline, three windows counting bids per bidder: "
        + ", ".join(q.title for q in WINDOWS)
        + f"; watermark (max_out_of_orderness) {st.ooo_ms / 1000:g} s, allowed lateness {st.lateness_ms / 1000:g} s, "
        f"partition {st.partition}, {st.epoch_chunks} chunks per epoch, de-duplication on bid_id; Spark `{st.master}`"
    )
    for n in notes:
        out.append(f"- {n}")
    out.append("")
    out.append(
        "Wire as compare.py runs it: `wire produce` (one process for every segment's file) → `wire close` → `wire "
        "tick` until the sensor requests no run (the last, empty tick is not counted), each a new process. "
        "Throughput counts bids (the stream's events). Peak memory: RSS of the command's whole process tree (the "
        "`wire` process, its Spark JVM and Python workers in local mode), largest over the phase; **+ servers** "
        "adds, at the same instant, the S3 server and in server mode the Spark server (JVM and its Python workers), "
        "as compare.py counts them. Checked: Wire's counts and each window's committed result against DuckDB.\n"
    )
    head = [
        "events",
        "bids",
        "Wire's Spark",
        "produce s",
        "close s",
        "ticks s",
        "end to end s",
        "bids/s",
        "CPU s",
        "epochs",
        "peak MB: produce / close / ticks",
        "peak + servers MB: produce / close / ticks",
        "result rows (tumbling / sliding / session)",
        "equal to DuckDB, counts right",
        "load",
    ]
    rows = []
    for s in steps:
        w = s.wire
        rows.append(
            [
                fmt_count(s.cfg.events),
                f"{s.bids:,}",
                WIRE_SPARK_MODES[s.mode],
                f"{sum(m.wall for m in w.produce):.1f}",
                f"{w.close.wall:.1f}",
                " + ".join(f"{m.wall:.1f}" for m in w.ticks),
                f"{w.e2e:.1f}",
                f"{s.bids / w.e2e:,.0f}" if w.e2e else "-",
                f"{w.cpu:.0f}",
                sum(b["epochs"] for b in w.breakdown),
                f"{mb(s.peak(w.produce, False))} / {mb(w.close.peak)} / {mb(s.peak(w.ticks, False))}",
                f"{mb(s.peak(w.produce, True))} / {mb(w.close.with_server_peak)} / {mb(s.peak(w.ticks, True))}",
                " / ".join(f"{s.rows.get(q.window_name, 0):,}" for q in WINDOWS),
                ("yes" if s.duck_checked else "counts right (DuckDB not run)") if not s.problems else "**NO**",
                f"{s.load:.1f}" if s.load is not None else "-",
            ]
        )
    out.append(md_table(head, rows, "lrlrrlrrrrrrllr"))
    problems = [f"{fmt_count(s.cfg.events)} ({s.mode}): {p}" for s in steps for p in s.problems]
    if problems:
        out.append("\n**Checks failed:**\n")
        out += [f"- {p}" for p in problems]

    out.append(
        f"\n## Scale: each step against the one before (flat memory in backlog: peak ratio ≤ {FLAT}× for 10× events)\n"
    )
    out.append(
        "Peak memory per phase, smaller step → larger step (ratio). The backlog is processed by the ticks: "
        "**flat** judges their peak, tree alone and with the servers; `wire produce` is reported apart (it lands "
        "the input files, one per segment, whose size grows with the step).\n"
    )

    def ratio(a: int, b: int) -> str:
        return f"{mb(a)} → {mb(b)} ({b / a:.2f}×)" if a else "-"

    rows = []
    for mode in dict.fromkeys(s.mode for s in steps):
        ms = [s for s in steps if s.mode == mode]
        for a, b in zip(ms, ms[1:], strict=False):
            ticks = (a.peak(a.wire.ticks, False), b.peak(b.wire.ticks, False))
            ticks_s = (a.peak(a.wire.ticks, True), b.peak(b.wire.ticks, True))
            flat = all(x and y / x <= FLAT for x, y in (ticks, ticks_s))
            rows.append(
                [
                    f"{fmt_count(a.cfg.events)} → {fmt_count(b.cfg.events)}",
                    WIRE_SPARK_MODES[mode],
                    f"{b.bids / a.bids:.1f}×",
                    f"{b.wire.e2e / a.wire.e2e:.2f}×",
                    f"{(b.bids / b.wire.e2e) / (a.bids / a.wire.e2e):.2f}×",
                    ratio(*ticks),
                    ratio(*ticks_s),
                    "yes" if flat else "**no**",
                    ratio(a.peak(a.wire.produce, False), b.peak(b.wire.produce, False)),
                    ratio(a.wire.peak, b.wire.peak),
                    ratio(a.wire.with_server_peak, b.wire.with_server_peak),
                ]
            )
    if rows:
        out.append(
            md_table(
                [
                    "step",
                    "Wire's Spark",
                    "bids",
                    "time",
                    "bids/s",
                    "ticks: peak MB (tree)",
                    "ticks: peak MB (+ servers)",
                    f"backlog memory flat (≤ {FLAT}×)",
                    "produce: peak MB (tree)",
                    "all phases: peak MB (tree)",
                    "all phases: peak MB (+ servers)",
                ],
                rows,
                "llrrrrrlrrr",
            )
        )
    else:
        out.append("(one size only: no ratio)")

    out.append("\n## Where Wire's time goes\n")
    out.append(
        "Per step, from the Dagster instance's run records and event logs (`compare.wire_breakdown`): `wire "
        "produce`, `wire close`, the tick processes outside their runs (interpreter start, imports, definitions, "
        "sensor), processing runs until their first epoch is planned, their epochs (from the first planned to "
        "the epoch report logged after the last commit, its publish and GC: Spark kernel, staging, manifests, "
        "commits), the rest of those runs (the partition report, materializations), and the runs that only "
        "report a partition.\n"
    )
    rows = []
    for s in steps:
        w, bs = s.wire, s.wire.breakdown
        tot = w.e2e or 1.0

        def cell(v: float, tot: float = tot) -> str:
            return f"{v:.1f} ({100 * v / tot:.0f}%)"

        rows.append(
            [
                fmt_count(s.cfg.events),
                WIRE_SPARK_MODES[s.mode],
                f"{w.e2e:.1f}",
                cell(sum(m.wall for m in w.produce)),
                cell(w.close.wall),
                cell(sum(b["outside_runs_s"] for b in bs)),
                cell(sum(b["before_first_epoch_s"] for b in bs)),
                cell(sum(b["epochs_s"] for b in bs)),
                cell(sum(b["proc_after_s"] for b in bs)),
                cell(sum((b["first_report_run_s"] or 0) + b["report_runs_s"] for b in bs)),
                sum(b["runs"] for b in bs),
                sum(b["epochs"] for b in bs),
                f"{s.bids / max(sum(b['epochs_s'] for b in bs), 1e-9):,.0f}",
                " / ".join(f"{s.duck_s.get(q.window_name, 0):.1f}" for q in WINDOWS),
            ]
        )
    out.append(
        md_table(
            [
                "events",
                "Wire's Spark",
                "end to end s",
                "produce s",
                "close s",
                "ticks outside runs s",
                "runs before epoch 1 s",
                "epochs s",
                "runs after last commit s",
                "reporting runs s",
                "runs",
                "epochs",
                "bids/s in epochs",
                "DuckDB s per window (floor, in-process)",
            ],
            rows,
            "llrrrrrrrrrrrr",
        )
    )
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--sizes", default="1M,10M", help="comma-separated event counts (all kinds): 1M, 10M, 50M ...")
    ap.add_argument("--keys", default="100K", help="bidders (and auctions)")
    ap.add_argument("--seed", type=int, default=Config.seed)
    ap.add_argument("--watermark", default="5s", help="max_out_of_orderness (>= the generator's disorder bound)")
    ap.add_argument("--lateness", default="5s", help="allowed lateness")
    ap.add_argument("--partition", default="1m")
    ap.add_argument("--epoch-chunks", type=int, default=8, help="max_chunks_per_epoch (chunks of 50 K bids)")
    ap.add_argument(
        "--wire-spark",
        default="server",
        help="comma-separated: server (runs attach to the embedded Spark server, as under `wire dev`) and/or local "
        "(each `wire tick` boots local Spark)",
    )
    ap.add_argument(
        "--duckdb-max",
        default="10M",
        help="compare each window's rows with DuckDB's up to this many events; above, check the counts only "
        "(the comparison holds every result in this process: tens of GB at 50 M)",
    )
    ap.add_argument("--master", default=f"local[{cpu_count()}]")
    ap.add_argument("--results", type=Path, default=HERE / "results", help="directory of the Markdown report")
    args = ap.parse_args()

    from wire_dagster.timeutil import parse_duration

    try:
        sizes = [parse_count(s) for s in comma_list(args.sizes)]
        duckdb_max = parse_count(args.duckdb_max)
        modes = comma_list(args.wire_spark)
        if not modes or not set(modes) <= set(WIRE_SPARK_MODES):
            raise ValueError("--wire-spark: choose among local, server")
        cfgs = [Config(events=n, keys=parse_count(args.keys), seed=args.seed) for n in sizes]
        st = Settings(
            ooo_ms=parse_duration(args.watermark, "--watermark"),
            lateness_ms=parse_duration(args.lateness, "--lateness"),
            partition=args.partition,
            epoch_chunks=args.epoch_chunks,
            dedup=True,
            master=args.master,
        )
        if st.ooo_ms < cfgs[0].disorder_bound_ms():
            raise ValueError(f"--watermark: below the generator's disorder bound ({cfgs[0].disorder_bound_ms()} ms)")
        from wire_dagster.spec import pipeline_from_dict

        pipeline_from_dict(scale_pipeline(cfgs[0], st))  # validates the options before anything runs
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # WireInputError from the pipeline check
        if e.__class__.__name__ == "WireInputError":
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise

    t_all = time.perf_counter()
    load = LoadSampler().start()
    steps: list[Step] = []
    notes: list[str] = []
    with bench_servers("wire-scale-", st.master, False, notes) as srv:
        tmp = srv.tmp
        for cfg in cfgs:
            data = tmp / f"data-{fmt_count(cfg.events)}"
            t0 = time.perf_counter()
            man = write_dataset(cfg, data)
            gen_s = time.perf_counter() - t0
            notes.append(
                f"{cfg.label}: generated in {gen_s:.1f} s (not timed): {man['counts']['bids']:,} bids over "
                f"{(man['bid_time_max'] - man['bid_time_min']) / 1000:,.0f} s of event time, measured disorder "
                f"{man['bid_disorder_ms']} ms"
            )
            log(notes[-1])
            pdir = tmp / f"pipelines-{fmt_count(cfg.events)}"
            pdir.mkdir()
            (pdir / "scale.yaml").write_text(yaml.safe_dump(scale_pipeline(cfg, st), sort_keys=False))
            for mode in modes:
                log(f"{cfg.label}, Wire ({WIRE_SPARK_MODES[mode]}):")
                # a fresh Spark server per step: a JVM's RSS never shrinks, so a server kept from the step
                # before would carry that step's peak into this one's
                with spark_server(tmp / "home" / "spark", st.master, mode == "server", notes) as (url, pid):
                    t_start = time.time()
                    step = run_step(
                        cfg, st, mode, replace(srv, spark_url=url, spark_pid=pid), data, pdir, gen_s, duckdb_max
                    )
                step.load = load.mean(t_start, time.time())
                log(
                    f"  {step.wire.e2e:.1f} s end to end, {step.bids / step.wire.e2e:,.0f} bids/s, peak "
                    f"{mb(step.wire.peak)} MB (+ servers {mb(step.wire.with_server_peak)} MB)"
                )
                for p in step.problems:
                    log(f"  PROBLEM: {p}")
                steps.append(step)
            _remove(data)
    load.stop()
    text = report(steps, st, time.perf_counter() - t_all, load, notes)
    path = args.results / f"scale-{datetime.now(UTC):%Y-%m-%d-%H%M}.md"
    return save_report(text, path, failed=any(s.problems for s in steps), raw=[raw(s) for s in steps])


def raw(s: Step) -> dict:
    """A step's measurements for the report's raw JSON (every command, without its output)."""

    def cmd(m: Measured) -> dict:
        keep = ("wall", "cpu", "peak", "server_peak", "with_server_peak", "t_start", "t_end")
        return {"cmd": " ".join(m.cmd[1:3])} | {k: round(getattr(m, k), 3) for k in keep}

    w = s.wire
    return {
        "events": s.cfg.events,
        "bids": s.bids,
        "keys": s.cfg.keys,
        "mode": s.mode,
        "produce": [cmd(m) for m in w.produce],
        "close": cmd(w.close),
        "ticks": [cmd(m) for m in w.ticks],
        "final_tick": cmd(w.final_tick) if w.final_tick else None,
        "reads": [cmd(m) for m in [w.read, *s.reads]],
        "breakdown": w.breakdown,
        "rows": s.rows,
        "duckdb_s": s.duck_s,
        "duckdb_checked": s.duck_checked,
        "generate_s": s.gen_s,
        "load": s.load,
        "problems": s.problems,
    }


def _remove(d: Path) -> None:
    """A step's data set, once every mode ran on it (50 M events: GBs in the temporary directory)."""
    import shutil

    shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
