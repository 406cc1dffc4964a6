"""Benchmark: `streams.produce` (and the `wire produce` CLI) on 1 M events, JSONL and Parquet.

    .venv/bin/python benchmarks/produce.py [--events 1000000] [--seed 7] [--no-cli]

Uses WIRE_S3_ENDPOINT (and WIRE_S3_ACCESS_KEY/SECRET_KEY) when set, else starts its
own embedded S3 server (SeaweedFS) in a temporary directory and stops it at the end.
Each measured run is its own process, so its peak memory is the process's max RSS
(`os.wait4` rusage), not the benchmark's. CPU s is the process CPU time of the produce
call (streams.produce row: every thread, DuckDB's included) or of the whole command
(wire produce row: interpreter start and imports included); unlike wall time it barely
moves when other work shares the machine. Prints a Markdown table.
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
    from wire_dagster.objectstore import ObjectStore, S3Config
    from wire_dagster.spec import load_pipeline
    from wire_dagster.streams import produce

    cfg = S3Config.from_env()
    if cfg is None:
        raise SystemExit("produce.py --child: WIRE_S3_ENDPOINT is not set (the parent passes its store)")
    store = ObjectStore(cfg)
    spec = load_pipeline(PIPELINE)
    t0, c0 = time.perf_counter(), time.process_time()  # process time: every thread (DuckDB's too)
    rep = produce(store, spec, Path(path), segment=segment)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(
        json.dumps(
            {"seconds": dt, "cpu": cpu, "events": rep.events, "malformed": rep.malformed, "chunks": len(rep.chunks)}
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-cli", action="store_true", help="Skip timing the `wire produce` command.")
    ap.add_argument("--child", nargs=2, metavar=("FILE", "SEGMENT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return 0

    with tempfile.TemporaryDirectory(prefix="wire-bench-") as tmp, bench_store(Path(tmp)) as store:
        tmpd = Path(tmp)
        env = dict(os.environ, **store.cfg.export_env(), WIRE_HOME=str(tmpd / "home"))
        t0 = time.perf_counter()
        jl, pqf = generate(args.events, args.seed, tmpd)
        print(
            f"generated {args.events} events in {time.perf_counter() - t0:.1f}s: "
            f"JSONL {jl.stat().st_size / 1e6:.0f} MB, Parquet {pqf.stat().st_size / 1e6:.0f} MB",
            file=sys.stderr,
        )
        rows = []
        for fmt, path in (("JSONL", jl), ("Parquet", pqf)):
            seg = f"bench-{fmt.lower()}"
            wall, cpu, rss, so = run_measured([sys.executable, __file__, "--child", str(path), seg + "-api"], env)
            res = json.loads(so.strip().splitlines()[-1])
            assert res["events"] == args.events and res["malformed"] == 0, res
            rows.append((fmt, "streams.produce", path.stat().st_size, res["seconds"], res["cpu"], res["chunks"], rss))
            if not args.no_cli:
                wall, cpu, rss, _ = run_measured(
                    [WIRE, "produce", "--pipeline", str(PIPELINE), "--file", str(path), "--segment", seg + "-cli"], env
                )
                rows.append((fmt, "wire produce (whole command)", path.stat().st_size, wall, cpu, res["chunks"], rss))
    load = os.getloadavg()[0]
    print(
        f"\n{args.events:,} events (pipeline clicks, seed {args.seed}), {os.cpu_count()} CPUs, load average "
        f"{load:.1f}\n"
    )
    head = ["input", "measured", "file MB", "wall s", "events/s", "CPU s", "chunks", "peak RSS MB"]
    cells = [
        [
            fmt,
            what,
            f"{size / 1e6:.0f}",
            f"{sec:.2f}",
            f"{args.events / sec:,.0f}",
            f"{cpu:.1f}",
            chunks,
            f"{rss / 1e6:.0f}",
        ]
        for fmt, what, size, sec, cpu, chunks, rss in rows
    ]
    print(md_table(head, cells, "llrrrrrr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
