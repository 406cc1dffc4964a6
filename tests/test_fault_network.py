"""Wire through a flaky network: every `wire` command talks to the S3 server through a seeded
fault-injecting proxy (tests/faultproxy.py: lost answers after the write, 503 SlowDown, resets
before and after forwarding, 500 after the write, added latency, each on ~1 % of requests), and
the Spark executors read the chunks through it too (the runs hand them the store's endpoint,
the proxy's).

An operator produces two files per segment (several chunks each, some repeated ids, a few
malformed lines), ticks, produces the second halves, closes the stream and ticks until nothing
is pending, retrying every failed command as it is. The first seed also meets an outage longer
than a command's retries (503s from the close's first request on, for 25 s) and, with
WIRE_FAULT_MARKER_OUTAGE=<seconds>, a commit marker whose answer is lost followed by an outage
that leaves the run's commit state unknown. Then, reading the bucket directly:

- only the outages failed a command (once each): the retries absorb every random fault;
- the committed results equal a plain batch aggregation over the distinct valid events
  (tests/reference.py), each window identity once;
- conservation: events in = counted + late + duplicate + malformed for every window, every
  distinct valid event counted once per window, events in = the records of all chunks;
- every object created by a conditional PUT (commit markers, chunk claims, seals) is non-empty
  and well-formed, and every committed marker names its manifest by checksum;
- every failing command's stderr is one line beginning `error:`;
- the S3 credentials appear in no command's output and in no object of the bucket.

Small by default (WIRE_FAULT_SEEDS=1 seed at WIRE_FAULT_RATES=0.06); `make test-long`
raises both and adds the marker outage.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml

from commit_scenario import OOO, T0, assert_committed_sound, pipeline_dict, read_all, seeds, subprocess_env
from conftest import run_wire
from faultproxy import KINDS, FaultProxy, Faults
from reference import batch
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.errors import ObjectStoreError
from wire_dagster.objectstore import ObjectStore, redact
from wire_dagster.spec import field_column, load_pipeline
from wire_dagster.streams import read_stream
from wire_dagster.timeutil import INF

N_PER_SEGMENT = int(os.environ.get("WIRE_FAULT_EVENTS") or 1_000)
RATES = [float(r) for r in (os.environ.get("WIRE_FAULT_RATES") or "0.06").split(",")]
ATTEMPTS = 6  # an operator's patience: tries of one command before the test gives up
#: Seconds of 503s from the first request of `wire close`: longer than a command's retries (20 s).
CLOSE_OUTAGE = 25
#: Seconds of 503s after the first commit marker's answer is lost (0: none): longer than the commit's
#: retries and its read-back (2 x 20 s), so the run's commit state is unknown; `make test-long`: 45.
MARKER_OUTAGE = float(os.environ.get("WIRE_FAULT_MARKER_OUTAGE") or 0)

# ---------------------------------------------------------------------------
# Input: per segment, events in time order up to the 2 s bound (so no distinct event is ever
# late, whatever the epochs and however often a file is appended again), repeated ids, bad lines.


def make_segment(rng: random.Random, seg: str) -> tuple[list[str], list[dict]]:
    """(JSON lines, the distinct valid events) of one segment."""
    evs = []
    t = T0
    for i in range(N_PER_SEGMENT):
        t += rng.randrange(0, 400)
        evs.append({"user": f"u{rng.randrange(8)}", "ts": t, "eid": f"{seg}{i}", "amount": rng.randrange(1, 100)})
    # Out of order within the bound: sorted by time plus a jitter below OOO, each event is later
    # than every earlier line's time - OOO, so never behind the watermark.
    order = sorted(evs, key=lambda e: e["ts"] + rng.randrange(OOO))
    lines = [json.dumps(e) for e in order]
    for _ in range(N_PER_SEGMENT // 50):  # a producer's retried appends: the same record again, later
        i = rng.randrange(len(lines))
        lines.insert(rng.randrange(i, len(lines) + 1), lines[i])
    for k in range(N_PER_SEGMENT // 200):
        lines.insert(
            rng.randrange(len(lines) + 1), json.dumps({"user": "u1", "ts": "yesterday", "eid": f"{seg}bad{k}"})
        )
    lines.insert(rng.randrange(len(lines) + 1), "{not json")
    return lines, evs


def expected(spec, events: list[dict]) -> dict[str, dict[tuple, dict]]:
    evs = [{"_t": e["ts"], "_key": e["user"], field_column("amount"): e["amount"]} for e in events]
    return {w.name: batch(spec, w, evs) for w in spec.windows}


# ---------------------------------------------------------------------------
# The operator


@dataclass
class Operator:
    env: dict[str, str]
    secrets: tuple[str, ...]
    log: list[tuple[list[str], subprocess.CompletedProcess[str]]] = field(default_factory=list)  # commands, results

    def run(self, *args: str, timeout: float = 600):
        """Run `wire args` until it succeeds (at most ATTEMPTS times), as an operator would: a
        failure of the network (exit 1) is worth another try, a refused input (exit 2) is not."""
        for _ in range(ATTEMPTS):
            t0 = time.monotonic()
            p = run_wire(list(args), self.env, timeout=timeout)
            print(f"wire {args[0]}: rc {p.returncode} in {time.monotonic() - t0:.1f}s")
            self.log.append((list(args), p))
            if p.returncode == 0:
                return p
            assert p.returncode == 1, f"wire {' '.join(args)} exited {p.returncode}: {p.stderr[-3000:]}"
        raise AssertionError(f"wire {' '.join(args)} failed {ATTEMPTS} times; last stderr: {p.stderr[-3000:]}")

    def failures(self) -> list[tuple[list[str], subprocess.CompletedProcess[str]]]:
        return [(a, p) for a, p in self.log if p.returncode != 0]


def assert_one_line_errors(op: Operator) -> None:
    """Every failed command: exit 1 (the input is fine: only the network failed) and a stderr of
    exactly one line, `error: ...` naming the cause."""
    for args, p in op.failures():
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert p.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:"), (
            f"wire {' '.join(args)} exited {p.returncode} with {len(lines)} lines on stderr:\n" + "\n".join(lines[:40])
        )


def assert_no_secrets(op: Operator, store: ObjectStore) -> None:
    for args, p in op.log:
        for s in op.secrets:
            assert s not in p.stdout and s not in p.stderr, f"a credential in the output of wire {' '.join(args)}"
    for info in store.list(""):
        body = store.get(info.key)
        for s in op.secrets:
            assert s.encode() not in body, f"a credential stored in {info.key}"


def assert_well_formed_claims(store: ObjectStore, spec) -> int:
    """Every object created by a conditional PUT parses: commit markers name a manifest by checksum,
    chunk claims and seals carry their fields. Returns the number of commit markers."""
    markers = 0
    for info in store.list(""):
        key = info.key
        kind = (
            "marker"
            if key.endswith("/_COMMITTED")
            else "seal"
            if key.endswith("/_SEALED")
            else "claim"
            if "/index/" in key
            else None
        )
        if kind is None:
            continue
        body = store.get(key)
        assert body, f"empty {kind} {key}"
        d = json.loads(body)  # malformed JSON fails here
        if kind == "marker":
            markers += 1
            assert set(d) == {"run_id", "manifest", "sha256"} and re.fullmatch(r"[0-9a-f]{64}", d["sha256"]), (key, d)
            assert d["manifest"].startswith(key.rsplit("/", 1)[0] + "/") and d["run_id"] in d["manifest"], (key, d)
        elif kind == "seal":
            assert isinstance(d["last_seq"], int), (key, d)
        else:
            assert d["stream"] == spec.stream and isinstance(d["seq"], int) and isinstance(d["rows"], int), (key, d)
    assert_committed_sound(store, spec)  # every committed marker's manifest loads, checksum checked; files intact
    return markers


# ---------------------------------------------------------------------------


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("seed", seeds("WIRE_FAULT_SEEDS", 1))
def test_operator_through_a_flaky_network(
    store: ObjectStore, cli_env, spark_remote, tmp_path: Path, seed: int, rate: float
) -> None:
    pdir = tmp_path / "pipelines"
    pdir.mkdir()
    # Tumbling, sliding and session windows; Dagster's partitions are whole minutes.
    (pdir / "flaky.yaml").write_text(yaml.safe_dump({**pipeline_dict("flaky", chunk_rows=250), "partition": "1m"}))
    spec = load_pipeline(pdir / "flaky.yaml")
    rng = random.Random(seed)
    files: dict[str, list[Path]] = {}
    events: list[dict] = []
    lines_total = 0
    for seg in ("a", "b"):
        lines, evs = make_segment(rng, seg)
        events += evs
        lines_total += len(lines)
        half = len(lines) // 2
        for part, chunk in enumerate((lines[:half], lines[half:])):
            f = tmp_path / f"{seg}{part}.jsonl"
            f.write_text("\n".join(chunk) + "\n")
            files.setdefault(seg, []).append(f)

    with FaultProxy(store.cfg.endpoint, Faults.mixed(rate), seed=seed, max_faults=2_000) as proxy:
        env = subprocess_env(
            cli_env,
            spark_remote,
            WIRE_S3_ENDPOINT=proxy.endpoint,
            WIRE_PIPELINES=str(pdir),
            DAGSTER_HOME=str(tmp_path / "dagster-home"),
        )
        op = Operator(env, (store.cfg.secret_key, store.cfg.access_key))
        produce = ["produce", "--pipeline", "flaky"]
        op.run(*produce, "--file", str(files["a"][0]), "--segment", "a", "--file", str(files["b"][0]), "--segment", "b")
        if MARKER_OUTAGE and seed == 0:  # a commit marker written, its answer lost, then S3 down past every retry
            proxy.lose_then_outage("/_COMMITTED", MARKER_OUTAGE)
        op.run("tick", "--pipeline", "flaky")
        op.run(*produce, "--file", str(files["a"][1]), "--segment", "a", "--file", str(files["b"][1]), "--segment", "b")
        if seed == 0:  # S3 down for longer than a command's retries, from the close's first request: it fails, once
            proxy.outage(CLOSE_OUTAGE, from_next_request=True)
        op.run("close", "--pipeline", "flaky")
        cp = Checkpoints(store, spec.name)
        for _ in range(8):
            quiet = "sensor requested no run" in op.run("tick", "--pipeline", "flaky").stdout
            m = cp.latest()
            pending = sum(len(v.chunks) for v in read_stream(store, spec.stream, m.remap if m else {}).values())
            if quiet and pending == 0:
                break
        else:
            raise AssertionError(f"8 ticks left {pending} chunks pending")
    what = f"seed {seed}, {proxy!r}, {dict(proxy.stats)}, {len(op.failures())} failed commands"
    print(what)

    # The faults happened: every kind, over hundreds of requests (the Spark executors' reads included).
    assert proxy.stats["requests"] > 300 and all(proxy.stats[k] > 0 for k in KINDS), what
    assert proxy.stats["arrow requests"] > 0, what  # the executors read the chunks through the proxy too
    # The retries absorb every random fault: only the outages longer than them fail a command, once.
    failed = Counter(args[0] for args, _ in op.failures())
    assert failed == Counter({"close": seed == 0, "tick": seed == 0 and MARKER_OUTAGE > 0}), f"{failed}; {what}"
    assert_no_secrets(op, store)

    # The stream is closed and fully read.
    m = cp.latest()
    assert m is not None and m.watermark >= INF, what
    views = read_stream(store, spec.stream, {})
    chunks = [c for v in views.values() for c in v.chunks]
    assert all(v.sealed_at is not None for v in views.values()) and set(views) == {"a", "b"}
    assert {s: r.next_seq for s, r in m.segments.items()} == {s: len(v.chunks) for s, v in views.items()}, what

    # Exactly once: the batch aggregation over the distinct valid events.
    got, want = read_all(store, spec), expected(spec, events)
    for w in spec.windows:
        g, x = got[w.name], want[w.name]
        assert set(g) == set(x), (
            f"{w.name}: missing {sorted(set(x) - set(g))[:5]}, extra {sorted(set(g) - set(x))[:5]}; {what}"
        )
        for ident, row in x.items():
            for col, v in row.items():
                ok = (
                    math.isclose(g[ident][col], v, rel_tol=1e-9, abs_tol=1e-9)
                    if isinstance(v, float)
                    else g[ident][col] == v
                )
                assert ok, f"{w.name} {ident} {col}: {g[ident][col]} != reference {v}; {what}"

    # Conservation, against the chunks in the stream (a retried produce appends its files again).
    t = m.totals
    assert t.balanced(), f"{t}; {what}"
    assert t.events_in == sum(c.rows + c.malformed for c in chunks) >= lines_total, what
    assert t.malformed == sum(c.malformed for c in chunks), what
    assert t.counted == {w.name: len(events) for w in spec.windows}, f"{t}; {len(events)} distinct valid events; {what}"

    assert assert_well_formed_claims(store, spec) == m.epoch, what
    assert_one_line_errors(op)


# ---------------------------------------------------------------------------
# Redaction: whole tokens, so a short credential hides itself and nothing else.


def test_redact_replaces_whole_tokens_only() -> None:
    secrets = ("b", "ak")
    assert (
        redact("create bucket s3://t-1/k: HTTP 500 InternalError", secrets)
        == "create bucket s3://t-1/k: HTTP 500 InternalError"
    )
    assert (
        redact("key b, secret=b&x=1 'b' \"b\" (b) s3://b/k", secrets)
        == "key ***, secret=***&x=1 '***' \"***\" (***) s3://***/k"
    )
    assert (
        redact("Credential=ak/20260101/us-east-1/s3/aws4_request", secrets)
        == "Credential=***/20260101/us-east-1/s3/aws4_request"
    )
    assert redact("akak b-x x_b bx ab %2Fbucket", secrets) == "akak b-x x_b bx ab %2Fbucket"  # parts of longer words
    assert redact("path=%2Fb%2Fc q=%2fb", secrets) == "path=%2F***%2Fc q=%2f***"  # between URL escapes
    long = "wJal/K7+xY="
    for form in (long, "wJal%2FK7%2BxY%3D", "wJal%2fK7%2bxY%3d", "wJal/K7%2BxY%3D", "wJal%2FK7%2BxY%3D"):
        assert redact(f"a {form}, b", [long]) == "a ***, b", form
    assert redact("nothing to hide", []) == redact("nothing to hide", [""]) == "nothing to hide"


def test_a_one_character_secret_leaves_error_messages_readable(store: ObjectStore) -> None:
    """A server in trouble answers 500 and echoes the request's credentials (some quote the
    request): the store's one-line messages keep their own words ("create bucket", the bucket's
    name, the key) and hide each credential."""
    with FaultProxy(store.cfg.endpoint) as proxy:
        proxy.fail_requests, proxy.fail_status, proxy.fail_code = 1_000, 500, "InternalError"
        proxy.fail_message = "request by ak with secret b (b%2Fx) refused; bucket busy"
        weak = ObjectStore(replace(store.cfg, endpoint=proxy.endpoint, access_key="ak", secret_key="b"), retry_budget=0)
        with pytest.raises(ObjectStoreError) as ei:
            weak.ensure_bucket()  # a HEAD: its error has no body to echo
        assert str(ei.value) == f"create bucket s3://{store.bucket}: HTTP 500 500: Internal Server Error"
        with pytest.raises(ObjectStoreError) as ei:
            weak.put("data/k", b"v")
        assert str(ei.value) == (
            f"put s3://{store.bucket}/data/k: HTTP 500 InternalError: "
            "request by *** with secret *** (***%2Fx) refused; bucket busy"
        )
    assert proxy.stats["requests"] == 2


def test_fault_proxy_is_seeded_and_bounded(store: ObjectStore) -> None:
    """Two proxies with one seed inject the same faults in the same order; after max_faults,
    everything passes."""
    store.put("k", b"v")
    runs = []
    for _ in range(2):
        with FaultProxy(store.cfg.endpoint, Faults.mixed(0.5, max_latency=0.01), seed=7, max_faults=20) as proxy:
            flaky = ObjectStore(
                replace(store.cfg, endpoint=proxy.endpoint), retry_budget=30, backoff_initial=0.001, backoff_cap=0.01
            )
            for i in range(60):  # one request at a time: the same order of fates
                assert flaky.get("k") == b"v"
                flaky.put(f"w/{i}", b"x")
            runs.append(dict(proxy.stats))
    assert runs[0] == runs[1] and sum(runs[0].get(k, 0) for k in KINDS) == 20, runs
    assert sorted(i.key for i in store.list("w/")) == sorted(f"w/{i}" for i in range(60))
    with pytest.raises(ValueError, match="loopback"):
        FaultProxy("http://192.0.2.1:9000")
