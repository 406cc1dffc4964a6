"""`wire demo` / `make demo`: the main job end to end on the embedded default.

Starts the embedded S3 server, produces a clickstream in batches over two
segments — out-of-order, late (within and past the allowed lateness),
duplicate and malformed events — ticks the pipeline's Dagster sensor after
each batch (real sensor evaluation, real asset runs, two-phase commits),
closes the stream, and prints the committed window results and dead letters.
The demo uses its own bucket and Dagster home, wiped at the start.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from .embedded import EmbeddedS3, default_home

BASE = 1767225600000  # 2026-01-01T00:00:00Z
USERS = ["ada", "bob", "cy", "dee"]
TIME_COLUMNS = ("window_start", "window_end")


def demo_batches(seed: int = 7) -> list[tuple[str, list[str]]]:
    """(segment, JSONL lines) per batch, deterministic for a seed."""
    rng = random.Random(seed)
    n = 0

    def ev(t: int, user: str | None = None, eid: str | None = None) -> str:
        nonlocal n
        n += 1
        return json.dumps(
            {
                "event_id": eid or f"e{n}",
                "user_id": user or rng.choice(USERS),
                "ts": t,
                "amount": round(rng.uniform(1, 50), 2),
            }
        )

    def span(lo_s: int, hi_s: int, step_ms: int) -> list[str]:
        out = []
        for t in range(BASE + lo_s * 1000, BASE + hi_s * 1000, step_ms):
            out.append(ev(t + rng.randint(0, 4000)))  # out of order by up to 4 s (< the 5 s bound)
        return out

    b1 = span(0, 330, 1500)
    dup = b1[10]  # a producer retry: the same event again
    b2 = span(330, 660, 1500) + [dup, dup]
    b2 += [
        "{not json",
        '{"user_id": "ada", "ts": "2026-01-01T00:06:00", "amount": 3}',
        '{"user_id": "bob", "amount": 1}',
    ]
    # Segment 0 holds the stream watermark at ~00:05:25 until batch 3 arrives in it.
    # 00:05:10 is behind W but its minute window [00:05, 00:06) has not fired: counted.
    # 00:02:00 is behind W by 3 min: past the 30 s lateness of its minute window
    # (dead letter `late` for clicks_per_minute), yet its 5-minute sliding windows and
    # cy's open session still take it (late firings).
    b3 = [ev(BASE + 310_000, "ada"), ev(BASE + 120_000, "cy")]
    b3 += span(660, 900, 2000)
    return [("0", b1), ("1", b2), ("0", b3)]


def run_demo(console, pipelines: Path, tick: Callable, seed: int = 7) -> None:
    from .objectstore import ObjectStore
    from .results import read_dead_letters, read_results
    from .spec import find_pipeline
    from .status import dead_letter_table, fit_table, pipeline_status
    from .streams import close_stream, produce

    home = default_home()
    demo_home = home / "demo"
    if demo_home.exists():
        shutil.rmtree(demo_home)
    os.environ["DAGSTER_HOME"] = str(demo_home / "dagster")
    # Its own bucket, whatever the endpoint: the demo wipes its pipeline's data at the start.
    os.environ["WIRE_S3_BUCKET"] = os.environ.get("WIRE_DEMO_BUCKET", "wire-demo")
    from .devstack import ensure_dagster_home
    from .embedded import resolve_s3

    ensure_dagster_home()
    started = None if os.environ.get("WIRE_S3_ENDPOINT") else EmbeddedS3(home / "s3")
    was_running = started.running() if started else True
    cfg = resolve_s3()
    store = ObjectStore(cfg)
    store.ensure_bucket()
    spec = find_pipeline("clicks", pipelines)
    store.delete_many(
        i.key for prefix in (f"streams/{spec.stream}/", f"pipelines/{spec.name}/") for i in store.list(prefix)
    )
    console.print(
        f"[bold]Wire demo[/bold]: pipeline {spec.name} on {cfg.endpoint} bucket {cfg.bucket}; "
        f"Dagster home {os.environ['DAGSTER_HOME']}"
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i, (segment, lines) in enumerate(demo_batches(seed), 1):
                f = Path(tmp) / f"batch{i}.jsonl"
                f.write_text("\n".join(lines) + "\n")
                rep = produce(store, spec, f, segment=segment)
                console.print(f"batch {i}: {rep.events} events to segment {segment}, {rep.malformed} malformed")
                runs = tick(spec)
                st = pipeline_status(store, spec)
                console.print(
                    f"  tick: {len(runs)} runs ({', '.join(r['status'] for r in runs) or '-'}); "
                    f"W = {st['watermark']}, epoch {st['epoch']}"
                )
            close_stream(store, spec)
            runs = tick(spec)
            st = pipeline_status(store, spec)
            console.print(f"closed the stream; tick: {len(runs)} runs; W = {st['watermark']}, epoch {st['epoch']}")
            failed = [r for r in runs if r["status"] == "FAILURE"]
            if failed:
                raise RuntimeError(f"{len(failed)} demo runs failed")
        # Tables as `wire read` and `wire dlq` print them: they fit 80 columns by wrapping, never by cutting.
        for w in spec.windows:
            t = read_results(store, spec, w.name)
            title = f"{spec.name}/{w.name} ({t.num_rows} rows; first 12)"
            console.print(fit_table(title, t.column_names, t.slice(0, 12).to_pylist(), times=TIME_COLUMNS))
        dl = read_dead_letters(store, spec)
        console.print(dead_letter_table(f"dead letters ({len(dl)}; first 20)", dl[:20]))
        tot = st["totals"]

        def per_window(d: dict) -> str:
            return ", ".join(f"{w} {n}" for w, n in d.items())

        console.print(
            f"conservation: in={tot['events_in']} counted={per_window(tot['counted'])} "
            f"late={per_window(tot['late'])} duplicate={tot['duplicate']} malformed={tot['malformed']} "
            f"balanced={st['balanced']}",
            markup=False,
            highlight=False,
        )
        console.print(
            "\nOpen the UI on these runs:\n"
            f"  WIRE_S3_BUCKET={cfg.bucket} DAGSTER_HOME={os.environ['DAGSTER_HOME']} .venv/bin/wire dev\n"
            "  then browse http://127.0.0.1:3000 (Assets → clicks)"
        )
    finally:
        if started is not None and not was_running:
            started.stop()
