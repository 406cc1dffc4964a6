"""A local Spark session started ahead of need (`sparksession.start_ahead`, wire_dagster/jvmlaunch.py).

Each session here is a real local[2] JVM in a process of its own (a session belongs to its
process). What must hold:
- the session started ahead is the one `get_spark` hands out, with its configuration, mapping
  the class archive (`-Xshare:on`: a JVM that cannot map its archives does not start);
- one nobody took is killed by its command's exit; none is started off the main thread or for a
  Spark Connect target;
- what fails ahead fails `get_spark` with the error the usual path gives, and leaves no JVM;
- `wire tick` killed with kill -9 (its process only, as an operator kills a pid) while its
  session starts ahead leaves no JVM behind, and the next tick commits everything, equal to the
  batch reference.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cli_setup import local_spark, pipeline_env
from commit_scenario import assert_results, seeds
from local_session import SESSION_FACTS, local_env, made_archive, python, session_facts
from test_tick_kill import PIPELINE, expected, finish, launched, new_home, produce_closed, start_tick
from wire_dagster.procgroup import group_members, wait_until


def test_the_session_started_ahead_is_the_one_get_spark_hands_out() -> None:
    archive = made_archive()
    code = "import wire_dagster.sparksession as ss; ss.start_ahead('wire-ahead-test')\n" + SESSION_FACTS
    facts = session_facts(code, local_env(SPARK_SUBMIT_OPTS="-Xshare:on"))
    # The app name start_ahead was given, not get_spark's default ("wire"): the session is that one,
    # in the JVM it launched (spark-submit execs the JVM: one pid).
    assert facts["app"] == "wire-ahead-test"
    assert facts["jvm_pid"] == facts["ahead_pid"]
    assert facts["count"] == 5 and facts["same"]
    # Started with -Xshare:on, so the archive named here was mapped (else the JVM would not have started).
    assert f"-XX:SharedArchiveFile={archive}" in facts["args"], facts["args"]


def test_a_session_nobody_took_ends_with_the_command() -> None:
    code = """
import os, threading, wire_dagster.sparksession as ss
t = threading.Thread(target=ss.start_ahead)
t.start(); t.join()
print("off the main thread:", ss._AHEAD)
os.environ["WIRE_SPARK_REMOTE"] = "sc://127.0.0.1:1"
ss.start_ahead()
print("remote:", ss._AHEAD)
del os.environ["WIRE_SPARK_REMOTE"]
ss.start_ahead()
proc = ss._AHEAD.proc
ss._AHEAD._thread.join()  # built and warm: a session nobody took
ss.stop_ahead()
print("stopped:", proc.returncode)
"""
    done = python(code, local_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "off the main thread: None" in done.stdout
    assert "remote: None" in done.stdout
    assert f"stopped: {-signal.SIGKILL}" in done.stdout, done.stdout


def test_what_fails_ahead_fails_get_spark_alike() -> None:
    code = """
import wire_dagster.sparksession as ss
if AHEAD:
    ss.start_ahead()
try:
    ss.get_spark()
except Exception as e:
    print("ERROR", type(e).__name__, e)
if AHEAD:
    print("JVM ended:", ss._AHEAD.proc.poll() is not None)
"""
    env = local_env(WIRE_SPARK_DRIVER_MEMORY="abc")  # -Xmxabc: the JVM cannot start
    usual = python("AHEAD = False\n" + code, env)
    ahead = python("AHEAD = True\n" + code, env)
    error = [x for x in usual.stdout.splitlines() if x.startswith("ERROR")]
    assert error and "JAVA_GATEWAY_EXITED" in error[0], usual.stdout + usual.stderr[-2000:]
    assert [x for x in ahead.stdout.splitlines() if x.startswith("ERROR")] == error, ahead.stdout
    assert "JVM ended: True" in ahead.stdout


def _java_in(pgid: int, driver: bool = False) -> list[int]:
    """The java processes of process group `pgid`; with `driver`, the Spark driver's only, not
    spark-submit's launcher (a JVM of its own for ~0.1 s that prints the command the script then
    execs: seen, it may be gone before the driver's shows)."""
    out = []
    for pid in group_members(pgid) or []:
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if os.path.basename(exe) == "java" and not (driver and b"org.apache.spark.launcher.Main" in args):
            out.append(pid)
    return out


def _kill_while_it_starts(p: subprocess.Popen, rng: random.Random, what: str) -> None:
    """Once the tick's JVM shows (launched before Dagster loads), kill -9 the tick's process only
    (as an operator kills a pid) at a random moment of the next 4 s: while its session starts, or
    while its run computes; then its JVM and Python workers must end by themselves."""
    wait_until(lambda: _java_in(p.pid, driver=True) or p.poll() is not None, 60, f"{what}: the JVM", every=0.05)
    assert _java_in(p.pid, driver=True), f"{what}: the tick ended ({p.poll()}) before its JVM showed"
    try:
        p.wait(timeout=rng.uniform(0.0, 4.0))
    except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGKILL)
    p.communicate()
    # The JVM ends when its stdin (the killed CLI's pipe) closes; its Python workers with it.
    wait_until(lambda: not group_members(p.pid), 60, f"{what}: the killed tick's processes to end")


@pytest.mark.parametrize("seed", seeds())
def test_tick_killed_while_its_session_starts_ahead(seed: int, store, cli_env, tmp_path: Path) -> None:
    rng = random.Random(seed)
    home = new_home(tmp_path)
    (spec,), env, _, _ = pipeline_env(tmp_path, local_spark(cli_env), PIPELINE, home=home)
    events = {
        s: [
            {"user": f"u{rng.randrange(50)}", "ts": 1_767_225_600_000 + i * 120 + rng.randrange(1500), "eid": f"{s}{i}"}
            | {"amount": rng.randrange(1, 100)}
            for i in range(1250)
        ]
        for s in ("a", "b")
    }
    produce_closed(store, spec, events, tmp_path)
    for kill in range(2):
        _kill_while_it_starts(start_tick(env), rng, f"kill {kill}")
    out, err, _ = finish(start_tick(env), 600, "the tick after the kills")
    while launched(out):  # a closed stream: one evaluation requests what is left; then nothing
        out, err, _ = finish(start_tick(env), 600, "a later tick")
    assert "sensor requested no run" in out, out + err[-2000:]
    assert_results(store, spec, expected(spec, events))


def _tick_watching_java(env: dict[str, str]) -> tuple[str, bool]:
    """A `wire tick` to its end (rc 0), its process group sampled every 20 ms: (its stdout,
    whether a JVM ever showed in it). A JVM started ahead lives a second at least."""
    p = start_tick(env)
    seen = False
    while p.poll() is None:
        seen = seen or bool(_java_in(p.pid))
        time.sleep(0.02)  # sampling a live process group, not waiting for a condition
    out, err = p.communicate()
    assert p.returncode == 0, err[-3000:]
    return out, seen


def test_a_quiet_pipeline_s_tick_starts_no_jvm_ahead(store, cli_env, tmp_path: Path) -> None:
    """idleticks.py: a tick starts its JVM ahead unless the pipeline's last tick found nothing."""
    home = new_home(tmp_path)
    (spec,), env, _, _ = pipeline_env(tmp_path, local_spark(cli_env), PIPELINE, home=home)
    out, seen = _tick_watching_java(env)  # never ticked: ahead, though it finds nothing
    assert "sensor requested no run" in out and seen
    assert (home / "wire-idle" / spec.name).exists()
    out, seen = _tick_watching_java(env)  # its last tick found nothing: no JVM
    assert "sensor requested no run" in out and not seen
    events = {"a": [{"user": "u1", "ts": 1_767_225_600_000 + i * 1000, "eid": f"a{i}", "amount": 1} for i in range(50)]}
    produce_closed(store, spec, events, tmp_path)
    out, seen = _tick_watching_java(env)  # work after a quiet spell: the JVM when the run needs it
    assert launched(out) and seen
    assert not (home / "wire-idle" / spec.name).exists()
    out, seen = _tick_watching_java(env)  # its last tick found work: ahead again
    assert "sensor requested no run" in out and seen
    assert_results(store, spec, expected(spec, events))


def test_a_tick_killed_as_its_jvm_starts_leaves_no_directory_behind(store, cli_env, tmp_path: Path) -> None:
    """Killed before its JVM wrote the connection file: the file's directory is in the command's
    own JVM directory, which the next session's start sweeps (the killed pid is gone), not in
    the temporary directory for good."""
    home = new_home(tmp_path)
    (_spec,), env, _, _ = pipeline_env(tmp_path, local_spark(cli_env), PIPELINE, home=home)
    tmp, local = tmp_path / "tmp", tmp_path / "spark-local"
    tmp.mkdir()
    env = {**env, "TMPDIR": str(tmp), "WIRE_SPARK_LOCAL_DIR": str(local)}
    p = start_tick(env)  # never ticked: it starts its JVM ahead
    wait_until(lambda: _java_in(p.pid) or p.poll() is not None, 60, "the tick's JVM to start", every=0.01)
    os.kill(p.pid, signal.SIGKILL)  # the JVM takes ~1 s to write its connection file
    p.communicate()
    wait_until(lambda: not group_members(p.pid), 60, "the killed tick's processes to end")
    out, err, _ = finish(start_tick(env), 600, "the next tick")
    assert "sensor requested no run" in out, out + err[-2000:]
    left = [str(x.relative_to(tmp_path)) for d in (tmp, local) for x in d.rglob("*") if "gateway" in x.name]
    assert left == [], left
    assert not list(local.glob(f"jvm-{p.pid}-*")), "the killed command's JVM directory was not swept"
