"""`wire shell` killed with kill -9 mid-tick never blocks a two-stage graph.

test_tick_kill kills separate `wire tick` processes of one pipeline; here the process killed is a
long-lived `wire shell` (one Spark session and one Dagster instance for all its commands) ticking
a derived stage with its upstream (`tick --pipeline down --upstream`): test_derived_tick's `up`
(per-minute counts of a raw stream) and `down` (2-minute windows over up's committed rows), over
test_tick_kill's closed stream of 20,000 events in EPOCHS epochs of one run each (nothing late,
nothing duplicated), runs attached to the session's Spark Connect server when there is one (the
JVM outlives the kill, as a shared server does), else to the shell's own local Spark.

    shell ─ tick (cold: C s) ─ tick (warm: D s)
          ─▶ { kill -9 the shell's process group at a random moment of its next tick:
                 warm:   in [0.1 D, D] of a tick of a shell that already ticked
                 cold:   in [0.1 C, C] of a new shell's first tick (`--warm` or not): often
                         before any run started
                 in-run: up to 0.4 D after the tick's first or second run (up's or down's) started
               a new shell's tick ─▶ exit 0 within max(120 s, 5 C) }   × KILLS (3; WIRE_SHELL_KILLS)
          ─▶ a new shell held between two staged files of its run (WIRE_PAUSE=mid-staging), kill -9,
             a new shell's tick as above: its staged files are left for `wire gc`
          ─▶ ticks until the sensors request nothing ─▶ both stages = the reference ─▶ wire gc

Checked after every kill: each run the killed shell left unfinished (up's or down's) is named by
the next shell's tick ("marked run <id> ... failed") and ends FAILURE; no run of either stage stays
unfinished and no pool slot stays claimed. At the end: up's results are the plain batch
aggregation of the events, down's the batch of its windows over those rows (tests/reference.py;
DESIGN §2 invariant 5, §6: a composed result equals the composition of the final upstream
results), conservation balances on both, no run key succeeded twice, and after `wire gc --grace 0`
every staged object left is one a kept committed manifest names: the held kill's staged files, no
manifest's, are there until it and gone after.

WIRE_CRASH_SEEDS=n runs n seeds (other kill moments, other events).
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import random
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest

from cli_setup import pipeline_env
from commit_scenario import Expected, assert_committed_sound, assert_results, seeds, subprocess_env, wait_for, wire
from reference import RefState, batch
from test_derived_tick import COMMON, DOWN, UP
from test_shell import STATUS, Shell
from test_tick_kill import EVENTS, expected, make_events, new_home, produce_closed
from wire_dagster.checkpoint import Checkpoints
from wire_dagster.spec import field_column

KILLS = int(os.environ.get("WIRE_SHELL_KILLS") or 3)
MODES = ("warm", "cold", "in-run")
#: Up's epochs: two chunks (one per segment) each, enough that every kill (which may commit an
#: epoch of its own before it dies) and the tick after it find work left.
CHUNK_ROWS = math.ceil(EVENTS // 2 / (3 * KILLS + 4))
EPOCHS = math.ceil(EVENTS // 2 / CHUNK_ROWS)  # 13 for 3 kills
TICK = f"tick --pipeline {DOWN['name']} --upstream"
PIPELINES = (UP["name"], DOWN["name"])
UNFINISHED = ("NOT_STARTED", "STARTING", "STARTED", "CANCELING")

UP_FILE = {
    **UP,
    **COMMON,
    "limits": {"chunk_rows": CHUNK_ROWS, "max_chunks_per_epoch": 2},
    "dagster": {"max_epochs_per_run": 1},
}
DOWN_FILE = {**DOWN, **COMMON, "dagster": {"max_epochs_per_run": 1}}


class PipedShell(Shell):
    """test_shell's `Shell` whose stderr a thread reads, so that every wait for a status line is
    bounded (a stuck tick fails the test, it never hangs it) and a kill moment can be a wait."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        super().__init__(args, env)
        self.born = time.monotonic()
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._seen: list[str] = []
        self.statuses = 0  # status lines read so far (by the thread)
        self._drain_err = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain_err.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.statuses += bool(STATUS.match(line.rstrip("\n")))
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def status_within(self, timeout: float) -> tuple[int, list[str]] | None:
        """The running command's exit code and the stderr lines before its status line, or None
        if it has not ended within `timeout` s (it goes on)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                raise AssertionError(f"the shell ended (exit {self.proc.wait()}) without a status line: {self._seen}")
            m = STATUS.match(line)
            if m is None:
                self._seen.append(line)
                continue
            seen, self._seen = self._seen, []
            return int(m.group(1)), seen

    def finish(self, bound: float, what: str) -> tuple[list[str], float]:
        """The running command's stderr lines and its seconds; it must end with exit 0 within
        `bound` s (else its threads' stacks (SIGUSR1, cli.entry) go into the failure)."""
        t = time.monotonic()
        res = self.status_within(bound)
        if res is None:
            os.kill(self.proc.pid, signal.SIGUSR1)  # stuck, or only slow?
            with contextlib.suppress(AssertionError):
                self.status_within(5)
            stacks = self._seen[-200:]
            self.kill()
            raise AssertionError(f"{what} did not finish within {bound:.0f} s; stderr: {stacks}")
        code, err = res
        assert code == 0, f"{what} exited {code}; stderr: {err[-40:]}"
        return err, time.monotonic() - t

    def end(self) -> None:
        """End of input: the shell must exit 0 (no command failed)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0, self._seen
        self._drain_err.join(timeout=10)


def runs_of(inst, **tags: str) -> list[dict]:
    """Runs of the two stages in the shells' Dagster instance (optionally only those with `tags`)."""
    return [
        {"id": r.run_id, "pipeline": name, "status": r.status.value, "key": r.tags.get("dagster/run_key")}
        for name in PIPELINES
        for r in inst.get_runs(filters=dg.RunsFilter(tags={"wire/pipeline": name, **tags}))
    ]


def assert_settled(inst) -> list[dict]:
    """No run of either stage unfinished, no pool slot claimed or waited for, no run key
    succeeded twice; returns the runs."""
    runs = runs_of(inst)
    left = [r for r in runs if r["status"] in UNFINISHED]
    assert not left, f"runs left unfinished: {left}"
    for name in PIPELINES:
        info = inst.event_log_storage.get_concurrency_info(f"wire_{name}")
        claims = [("claimed", s.run_id) for s in info.claimed_slots] + [
            ("pending", s.run_id) for s in info.pending_steps
        ]
        assert claims == [], f"pool wire_{name} still claimed: {claims}"
    twice = [k for k, n in Counter(r["key"] for r in runs if r["status"] == "SUCCESS").items() if n > 1]
    assert not twice, f"run keys that succeeded twice: {twice}"
    return runs


def expected_down(down, up_view: dict[tuple, dict]) -> Expected:
    """Down's windows over up's reference rows, each an event at its window_end - 1 (DESIGN §6),
    as a batch: the composition of the final upstream results."""
    evs = [
        {"_t": r["window_end"] - 1, "_key": r["key"], field_column("n"): r["n"], field_column("total"): r["total"]}
        for r in up_view.values()
    ]
    st = RefState()
    st.view = {w.name: batch(down, w, evs) for w in down.windows}
    return Expected(st, [], len(evs), 0)


def kill_during(sh: PipedShell, inst, rng: random.Random, mode: str, span: float, since: float) -> float | None:
    """Send the shell a tick, wait for a random moment of it (module doc), then kill -9 the shell's
    process group; returns the moment (s after `since`), or None if the tick ended first (exit 0)."""
    known, ended = {r["id"] for r in runs_of(inst)}, sh.statuses
    sh.write(TICK)
    if mode == "in-run":
        nth = rng.choice((1, 2))  # up's run, or down's

        def started() -> bool:
            return len({r["id"] for r in runs_of(inst, **{"wire/pid": str(sh.proc.pid)})} - known) >= nth

        while not started():  # polled: a run appears within the tick
            if sh.statuses > ended or sh.proc.poll() is not None:
                break  # it ended: its status line is read below
            assert time.monotonic() - since < max(60.0, 10 * span), "the tick never started a run"
            time.sleep(0.05)
        at = time.monotonic() - since + rng.uniform(0.0, 0.4) * span
    else:
        at = rng.uniform(0.1, 1.0) * span
    res = sh.status_within(max(0.0, at - (time.monotonic() - since)))
    if res is not None:
        assert res[0] == 0, res
        return None
    sh.kill()
    return at


@pytest.mark.parametrize("seed", seeds())
def test_a_shell_killed_mid_tick_never_blocks_a_two_stage_graph(
    seed: int, store, cli_env, spark_remote, tmp_path: Path
) -> None:
    rng = random.Random(f"shell-kill-{seed}")
    (up, down), env, _, home = pipeline_env(
        tmp_path, subprocess_env(cli_env, spark_remote), UP_FILE, DOWN_FILE, home=new_home(tmp_path)
    )
    assert (up.name, down.name) == PIPELINES
    events = make_events(rng)
    produce_closed(store, up, events, tmp_path)
    with dg.DagsterInstance.from_config(str(home)) as inst:  # the shells' instance, read between and during ticks
        shells: list[PipedShell] = []
        leftovers: set[str] = set()
        (tmp_path / "pause").mkdir()
        try:
            _kill_shells(rng, store, up, down, env, inst, shells, tmp_path / "pause", leftovers)
        finally:
            for sh in shells:
                sh.kill()
    _final(store, up, down, events, env, leftovers)


def _kill_shells(
    rng: random.Random,
    store,
    up,
    down,
    env: dict[str, str],
    inst,
    shells: list[PipedShell],
    pause_dir: Path,
    leftovers: set[str],
) -> None:
    """The kills (module doc); `leftovers` gets the staged files the held kill left."""

    def new_shell(args: list[str], with_env: dict[str, str] | None = None) -> PipedShell:
        shells.append(PipedShell(args, with_env or env))
        return shells[-1]

    # C: a new shell's first tick (its start included); D: the same shell's next one. The kill
    # moments are drawn in them.
    sh = new_shell([])
    sh.write(TICK)
    sh.finish(600, "the first tick")
    cold = time.monotonic() - sh.born
    assert [Checkpoints(store, n).latest() is not None for n in PIPELINES] == [True, True]
    sh.write(TICK)
    _, warm = sh.finish(600, "the second tick")
    bound = max(120.0, 5 * cold)  # a tick after a kill: never minutes more than an uninterrupted one

    kills: list[tuple[str, float, list[str]]] = []  # (mode, moment, the pipelines of the runs it left unfinished)
    after_kill: list[float] = []

    def tick_after_kill(pid: int, left: list[dict], what: str) -> PipedShell:
        """A new shell's tick after a kill: it ends in time, names and fails each run the killed
        shell (`pid`) left unfinished (`left`), and leaves nothing unsettled."""
        sh = new_shell([])
        sh.write(TICK)
        err, took = sh.finish(bound, what)
        after_kill.append(round(took, 1))
        for r in left:  # what the killed shell left behind: named by the next tick, and failed
            assert any(
                re.search(rf"marked run {r['id'][:8]} \(wire tick, pid {pid} on [^)]*\) failed: its process is gone", e)
                for e in err
            ), (what, r, err[-40:])
        settled = {r["id"]: r for r in assert_settled(inst)}
        assert all(settled[r["id"]]["status"] == "FAILURE" for r in left), [settled[r["id"]] for r in left]
        return sh

    for attempt in range(3 * KILLS):
        if len(kills) == KILLS:
            break
        mode, label = MODES[attempt % len(MODES)], MODES[attempt % len(MODES)]
        if mode == "cold":
            sh.end()
            args = ["--warm"] if rng.random() < 0.5 else []
            sh, label = new_shell(args), " ".join([mode, *args])
        since = sh.born if mode == "cold" else time.monotonic()
        at = kill_during(sh, inst, rng, mode, cold if mode == "cold" else warm, since)
        if at is None:  # it finished before its kill moment: not a kill
            continue
        pid = sh.proc.pid
        left = [r for r in runs_of(inst, **{"wire/pid": str(pid)}) if r["status"] in UNFINISHED]
        kills.append((label, round(at, 1), [r["pipeline"] for r in left]))
        for spec in (up, down):  # right after the kill, readers see whole epochs
            assert_committed_sound(store, spec)

        what = f"the tick after kill {len(kills)} ({label}, at {at:.1f} s; C = {cold:.1f} s, D = {warm:.1f} s)"
        sh = tick_after_kill(pid, left, what)
    assert len(kills) == KILLS, f"only {len(kills)} ticks were still running at their kill moment: {kills}"
    assert any(n for _, _, n in kills), f"no kill left a run behind: {kills}"

    # One kill more where it leaves files behind (a random moment seldom lands there): a new shell
    # held between two staged files of its run (WIRE_PAUSE), then killed -9 like the others.
    sh.end()
    sh = new_shell([], {**env, "WIRE_PAUSE": "mid-staging", "WIRE_PAUSE_DIR": str(pause_dir)})
    sh.write(TICK)
    wait_for(
        lambda: (pause_dir / "mid-staging.paused").exists() or sh.statuses > 0, bound, None, "the held tick's staging"
    )
    assert (pause_dir / "mid-staging.paused").exists(), "the held tick ended without staging a file"
    pid = sh.proc.pid
    left = [r for r in runs_of(inst, **{"wire/pid": str(pid)}) if r["status"] in UNFINISHED]
    for spec in (up, down):
        cp = Checkpoints(store, spec.name)
        named = {f.key for n in cp.committed() for f in cp.load(n).files()}
        leftovers |= {i.key for i in store.list(f"{cp.root}staging/")} - named
    sh.kill()
    assert left and leftovers, (left, leftovers)  # a run, and what it staged that no manifest names
    kills.append(("held mid-staging", 0.0, [r["pipeline"] for r in left]))
    for spec in (up, down):
        assert_committed_sound(store, spec)
    sh = tick_after_kill(pid, left, f"the tick after the held kill (C = {cold:.1f} s, D = {warm:.1f} s)")

    # Ticks until the sensors ask for nothing more; each must finish within the bound too.
    for _ in range(4 * EPOCHS):
        known = {r["id"] for r in runs_of(inst)}
        printed = len(sh.stdout)
        sh.write(TICK)
        sh.finish(bound, "a tick after the kills")
        if not {r["id"] for r in runs_of(inst)} - known:
            wait_for(lambda n=printed: "sensor requested no run\n" in sh.stdout[n:], 10, None, "the tick's stdout")
            break
    else:
        raise AssertionError(f"the sensors still request runs after {4 * EPOCHS} ticks")
    sh.end()
    runs = assert_settled(inst)
    reported = " ".join(r["key"] for r in runs if r["status"] == "SUCCESS")
    assert all(f"up:e{n}:" in reported for n in range(1, EPOCHS + 1)), reported  # each up epoch reported
    print(
        f"C = {cold:.1f} s, D = {warm:.1f} s; kills (mode, moment s, runs left of): {kills}; "
        f"ticks after them: {after_kill} s"
    )


def _final(store, up, down, events: dict[str, list[dict]], env: dict[str, str], leftovers: set[str]) -> None:
    """Both stages equal the reference, conservation balances, and `wire gc --grace 0` leaves only
    what kept committed manifests name: the held kill's `leftovers` are there before it, gone after."""
    want_up = expected(up, events)
    want_down = expected_down(down, want_up.state.view["per_minute"])
    n_up_rows = want_down.lines

    def check_results() -> None:
        assert_results(store, up, want_up)
        assert_results(store, down, want_down)

    check_results()
    m_up, m_down = Checkpoints(store, "up").latest(), Checkpoints(store, "down").latest()
    assert m_up is not None and m_down is not None
    assert m_up.epoch == EPOCHS and m_down.remap == {"minutes": m_up.epoch}, (m_up.epoch, m_down.remap)
    t = m_up.totals
    assert t.balanced() and t.events_in == EVENTS and t.duplicate == 0 and t.malformed == 0, t
    assert t.counted == {"per_minute": EVENTS} and all(n == 0 for n in t.late.values()), t
    # A derived stage recomputes each window it fires from the upstream's committed rows, and
    # counts the rows each recomputation read (derived.py): a row is read once or more, how often
    # depends on the epoch splits (the kills change them), but every one is counted, none dead.
    t = m_down.totals
    assert t.balanced() and t.events_in >= n_up_rows and t.duplicate == 0 and t.malformed == 0, t
    assert t.counted == {"per_2m": t.events_in} and all(n == 0 for n in t.late.values()), t

    # What the kills staged and never committed, `wire gc` collects (no grace: nothing runs now);
    # never a file a kept committed manifest names.
    gone = set(leftovers)
    for spec in (up, down):
        cp = Checkpoints(store, spec.name)
        staged_before = {i.key for i in store.list(f"{cp.root}staging/")}
        mine = {k for k in leftovers if k.startswith(f"{cp.root}staging/")}
        assert mine <= staged_before, f"{spec.name}: the held kill's staging went before wire gc"
        out = wire(["gc", "--pipeline", spec.name, "--grace", "0"], env).stdout.strip()
        print(f"{spec.name}: {len(staged_before)} staged objects; wire gc --grace 0: {out!r}")
        kept = [cp.load(n) for n in cp.committed()]
        named = {f.key for m in kept for f in m.files()}
        staged = {i.key for i in store.list(f"{cp.root}staging/")}
        assert staged <= named, f"{spec.name}: uncommitted staging left by wire gc: {sorted(staged - named)[:5]}"
        assert staged <= staged_before
        gone -= mine - staged
        assert_committed_sound(store, spec)
    assert not gone, f"wire gc --grace 0 left the held kill's staging: {sorted(gone)[:5]}"
    check_results()  # gc took nothing a result needs
