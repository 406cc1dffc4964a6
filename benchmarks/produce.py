"""Benchmark: `streams.produce` (and the `wire produce` CLI) on 1 M events, JSONL and Parquet.

    .venv/bin/python benchmarks/produce.py [--events 1000000 | --sizes 1M,5M] [--seed 7] [--no-cli]
        [--code DIR]

`--sizes` measures each size in turn (its own files, its own processes), so the peak RSS
column shows whether memory grows with the input. `--code DIR` runs the measured processes
with PYTHONPATH=DIR (e.g. an older commit exported by `git archive C | tar -x -C DIR`), to
measure code before a change against the same files and store.

Uses WIRE_S3_ENDPOINT (and WIRE_S3_ACCESS_KEY/SECRET_KEY) when set, else starts its
own embedded S3 server (SeaweedFS) in a temporary directory and stops it at the end.
Each measured run is its own process, so its peak memory is the process's max RSS
(`os.wait4` rusage), not the benchmark's. Linux counts in a child's max RSS the parent's
RSS at the fork (the exec records the memory it leaves), so the input files are generated
by a child too and this process stays smaller than any measured one; the streams.produce
child also prints its own VmHWM (/proc, the exec'd image only) to stderr as a cross-check.
CPU s is the process CPU time of the produce call (streams.produce row: every thread,
DuckDB's included) or of the whole command (wire produce row: interpreter start and imports
included); unlike wall time it barely moves when other work shares the machine. "open s" is
the `ingest.open_input` part of the streams.produce row: the check of the whole file before
anything is written. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import WIRE, bench_store, md_table

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "pipelines" / "clicks.yaml"


def generate(n: int, seed: int, out: Path) -> tuple[Path, Path]:
    """n clickstream events (seeded), a little out of order, as JSONL and Parquet with the same rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wire_dagster.spec import load_pipeline

    spec = load_pipeline(PIPELINE)
    rng = np.random.default_rng(seed)
    ts = spec.start + np.sort(rng.integers(0, 6 * 3_600_000, n)) + rng.integers(-4_000, 4_000, n)
    ts = np.maximum(ts, spec.start)
    users = rng.integers(0, 10_000, n)
    amounts = np.round(rng.gamma(2.0, 10.0, n), 2)
    table = pa.table(
        {
            "ts": pa.array(ts, pa.int64()),
            "user_id": pa.array([f"u{u}" for u in users]),
            "event_id": pa.array([f"e{seed}-{i}" for i in range(n)]),
            "amount": pa.array(amounts, pa.float64()),
        }
    )
    pq_path = out / "events.parquet"
    pq.write_table(table, pq_path)
    jl_path = out / "events.jsonl"
    with jl_path.open("w") as f:
        for t, u, i, a in zip(ts.tolist(), users.tolist(), range(n), amounts.tolist(), strict=True):
            f.write(f'{{"ts": {t}, "user_id": "u{u}", "event_id": "e{seed}-{i}", "amount": {a}}}\n')
    return jl_path, pq_path


def run_measured(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """Run cmd as a child; (wall seconds, CPU seconds, peak RSS bytes of that child, stdout)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stderr is not None  # both are PIPE
    stdout = p.stdout.read()
    stderr = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}: {stderr.strip()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, stdout


def child(path: str, segment: str) -> None:
    """One timed produce in this process (called via --child); prints JSON."""
    from wire_dagster.ingest import open_input
    from wire_dagster.objectstore import ObjectStore, S3Config
    from wire_dagster.spec import load_pipeline
    from wire_dagster.streams import produce_input

    cfg = S3Config.from_env()
    if cfg is None:
        raise SystemExit("produce.py --child: WIRE_S3_ENDPOINT is not set (the parent passes its store)")
    store = ObjectStore(cfg)
    spec = load_pipeline(PIPELINE)
    t0, c0 = time.perf_counter(), time.process_time()  # process time: every thread (DuckDB's too)
    inp = open_input(Path(path))  # `streams.produce` in two steps, to time the check apart
    opened = time.perf_counter() - t0
    try:
        rep = produce_input(store, spec, inp, segment=segment)
    finally:
        getattr(inp, "close", lambda: None)()  # (the code before 2026-11-26 had nothing to close)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {"seconds": dt, "open": opened, "cpu": cpu, "events": rep.events, "malformed": rep.malformed}
    out["hwm"] = 1024 * int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0])  # kB
    print(json.dumps({**out, "chunks": len(rep.chunks)}))


def events_count(text: str) -> int:
    """`1M`, `500K`, `5000000` -> a number of events."""
    scale = {"K": 1_000, "M": 1_000_000}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def measure(n: int, seed: int, tmpd: Path, env: dict[str, str], cli: bool) -> list[tuple]:
    """The rows of one size: for each format, the streams.produce child and the `wire produce` command."""
    t0 = time.perf_counter()
    out = tmpd / f"in-{n}"
    out.mkdir()
    # A child generates the files: this process's RSS at each later fork stays small (module docstring).
    subprocess.run([sys.executable, __file__, "--generate", str(n), str(seed), str(out)], check=True)
    jl, pqf = out / "events.jsonl", out / "events.parquet"
    print(
        f"generated {n} events in {time.perf_counter() - t0:.1f}s: "
        f"JSONL {jl.stat().st_size / 1e6:.0f} MB, Parquet {pqf.stat().st_size / 1e6:.0f} MB",
        file=sys.stderr,
    )
    rows = []
    for fmt, path in (("JSONL", jl), ("Parquet", pqf)):
        seg = f"bench-{n}-{fmt.lower()}"
        size = path.stat().st_size
        _, _, rss, so = run_measured([sys.executable, __file__, "--child", str(path), seg + "-api"], env)
        res = json.loads(so.strip().splitlines()[-1])
        assert res["events"] == n and res["malformed"] == 0, res
        print(f"  {fmt}: max RSS {rss / 1e6:.0f} MB, the child's own VmHWM {res['hwm'] / 1e6:.0f} MB", file=sys.stderr)
        rows.append((n, fmt, "streams.produce", size, res["seconds"], res["open"], res["cpu"], res["chunks"], rss))
        if cli:
            cmd = [WIRE, "produce", "--pipeline", str(PIPELINE), "--file", str(path), "--segment", seg + "-cli"]
            wall, cpu, rss, _ = run_measured(cmd, env)
            rows.append((n, fmt, "wire produce (whole command)", size, wall, None, cpu, res["chunks"], rss))
        print(f"  {fmt} done", file=sys.stderr)
    for p in (jl, pqf):
        p.unlink()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--sizes", help="Comma-separated sizes (e.g. 1M,5M), each measured in turn; overrides --events.")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-cli", action="store_true", help="Skip timing the `wire produce` command.")
    ap.add_argument("--code", help="Run the measured processes with PYTHONPATH=CODE (another checkout's code).")
    ap.add_argument("--child", nargs=2, metavar=("FILE", "SEGMENT"), help=argparse.SUPPRESS)
    ap.add_argument("--generate", nargs=3, metavar=("N", "SEED", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return 0
    if args.generate:
        generate(int(args.generate[0]), int(args.generate[1]), Path(args.generate[2]))
        return 0
    sizes = [events_count(x) for x in args.sizes.split(",")] if args.sizes else [args.events]

    with tempfile.TemporaryDirectory(prefix="wire-bench-") as tmp, bench_store(Path(tmp)) as store:
        tmpd = Path(tmp)
        env = dict(os.environ, **store.cfg.export_env(), WIRE_HOME=str(tmpd / "home"))
        if args.code:
            env["PYTHONPATH"] = str(Path(args.code).resolve())
        rows = [r for n in sizes for r in measure(n, args.seed, tmpd, env, not args.no_cli)]
    load = os.getloadavg()[0]
    code = f", code {args.code}" if args.code else ""
    print(
        f"\n{', '.join(f'{n:,}' for n in sizes)} events (pipeline clicks, seed {args.seed}{code}), "
        f"{os.cpu_count()} CPUs, load average {load:.1f}\n"
    )
    head = ["events", "input", "measured", "file MB", "wall s", "events/s", "open s", "CPU s", "chunks", "peak RSS MB"]
    cells = [
        [
            f"{n:,}",
            fmt,
            what,
            f"{size / 1e6:.0f}",
            f"{sec:.2f}",
            f"{n / sec:,.0f}",
            "" if opened is None else f"{opened:.2f}",
            f"{cpu:.1f}",
            chunks,
            f"{rss / 1e6:.0f}",
        ]
        for n, fmt, what, size, sec, opened, cpu, chunks, rss in rows
    ]
    print(md_table(head, cells, "rllrrrrrrr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
