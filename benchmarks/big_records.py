"""Check: big records commit, each once, whatever their size.

    .venv/bin/python benchmarks/big_records.py [--records 330000] [--record-bytes 1500] [--timeout 600]
        [--spacing-ms 10]

A stage of computations (the pass-through, as every join's raw input has) over one closed stream
of `--records` records, each with about `--record-bytes` of incompressible text. `wire process`,
attached to Wire's embedded Spark server (2 GB driver heap, as `wire dev` starts it), is run with
`--timeout`, then once more if it did not finish; a run commits every epoch it can.

- By default, 482 MB of packed results: under the 1 M-row bound one epoch of them would be more
  than Spark's driver holds; results beyond WIRE_DRIVER_RESULT_BYTES go through the store, and the
  32 MB byte bound (settings.COMPUTATION_EPOCH_BYTES) splits the epochs by chunk. Before both,
  both runs hung past 420 s (benchmarks/results/HISTORY.md).
- `--records 60000 --record-bytes 40000`: 2.3 GB of JSON. At d096ed7 (a chunk of 100,000 rows
  whatever their bytes) that was one chunk whose text passed one Arrow array's 2 GB: both runs
  failed ("offset overflow"), a Python worker past 12 GB. Now `limits.chunk_bytes` (128 MiB)
  makes chunks of ~3,300 records, and a column past 2 GB would still be gathered (bigarrow.py).
- `--spacing-ms 1` with the above: every record in one 1-minute partition of 2.3 GB, rewritten
  (merged with each epoch's records, sorted: computestage.merge_output) epoch after epoch.

Prints each run's exit and time, the stored bytes and epochs, and whether every record was
committed once (the output read back: one row per record id); exits 1 if not. The servers are
stopped by their process groups at the end (on SIGTERM too).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import bench_servers, log

PIPELINE = """name: big
stream: recs
event: {key: k, time: ts, id: id}
watermark: {max_out_of_orderness: 4s, idle_timeout: 1m}
partition: 1m
start: "2026-01-01T00:00:00Z"
end: "2026-01-02T00:00:00Z"
computations:
  - {name: records, input: recs, code: "wire_dagster.passthrough:Records", outputs: [records]}
"""
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--records", type=int, default=330_000)
    ap.add_argument("--record-bytes", type=int, default=1500)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--spacing-ms", type=int, default=10, help="event time between records (partitions are 1 m)")
    args = ap.parse_args()
    from wire_dagster import computestage
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.spec import load_pipeline
    from wire_dagster.streams import read_inputs

    notes: list[str] = []
    with bench_servers("big-", "local[2]", True, notes) as sv:
        d = sv.tmp / "pipelines"
        d.mkdir()
        (d / "big.yaml").write_text(PIPELINE)
        rnd = random.Random(1)
        f = sv.tmp / "recs.jsonl"
        with f.open("w") as out:
            for i in range(args.records):
                extra = base64.b64encode(rnd.randbytes(args.record_bytes * 3 // 4)).decode()
                out.write(
                    json.dumps({"ts": T0 + i * args.spacing_ms, "id": f"r{i}", "k": f"k{i % 1000}", "extra": extra})
                    + "\n"
                )
        log(f"{args.records} records, {f.stat().st_size >> 20} MB of JSON")
        store, env = sv.side(d, sv.tmp / "dagster", True, "local[2]")
        wire = str(Path(sys.executable).parent / "wire")
        for cmd in (["produce", "--stream", "recs", "--file", str(f)], ["close", "--stream", "recs"]):
            subprocess.run([wire, *cmd], env=env, check=True, capture_output=True)
        done = False
        for attempt in (1, 2):
            t = time.perf_counter()
            proc = subprocess.Popen(
                [wire, "process", "--pipeline", "big", "--max-epochs", "1000"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            try:
                _, err = proc.communicate(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
                log(f"`wire process` #{attempt}: still running after {args.timeout:.0f} s, killed")
                continue
            log(f"`wire process` #{attempt}: exit {proc.returncode} in {time.perf_counter() - t:.1f} s {err[-300:]}")
            if proc.returncode == 0:
                done = True
                break
        spec = load_pipeline(d / "big.yaml")
        chunks = [c for v in read_inputs(store, spec, {}).values() for c in v.chunks]
        last = Checkpoints(store, "big").latest()
        log(
            f"{len(chunks)} chunks, {sum(c.bytes for c in chunks) >> 20} MB stored; epochs: {last.epoch if last else 0}"
        )
        ids = [r["id"] for r in computestage.read_output(store, spec, "records")]
        whole = done and len(ids) == len(set(ids)) == args.records
        said = "every record once" if whole else "NOT every record once"
        log(f"committed {len(ids)} records, {len(set(ids))} ids: {said}")
        return 0 if whole else 1


if __name__ == "__main__":
    sys.exit(main())
