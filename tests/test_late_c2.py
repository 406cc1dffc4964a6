"""A local session's JVM holds its optimising compiler (C2) back (sparkconf.LATE_C2), read back
from the running JVM: on by default, on the path a command starts ahead too; a user's own
SPARK_SUBMIT_OPTS win; WIRE_SPARK_LATE_C2=false leaves the JVM's defaults."""

from __future__ import annotations

from local_session import SESSION_FACTS, local_env, session_facts

AHEAD = "import wire_dagster.sparksession as ss\nss.start_ahead('wire-test')\n"
JVM_DEFAULT = "5000"  # HotSpot 17's Tier4InvocationThreshold


def test_a_local_session_holds_c2_back() -> None:
    facts = session_facts(AHEAD + SESSION_FACTS, local_env())
    assert facts["ahead_pid"] == facts["jvm_pid"]  # the command's path: started ahead
    assert facts["tier4"] == "50000" and facts["count"] == 5


def test_a_users_own_flags_win_and_the_switch_turns_it_off() -> None:
    own = session_facts(SESSION_FACTS, local_env(SPARK_SUBMIT_OPTS="-XX:Tier4InvocationThreshold=7000"))
    assert own["tier4"] == "7000"
    off = session_facts(SESSION_FACTS, local_env(WIRE_SPARK_LATE_C2="false"))
    assert off["tier4"] == JVM_DEFAULT
    assert not any(a.startswith("-XX:Tier4") for a in off["args"]), off["args"]
