"""`wire demo` (what `make demo` runs) end to end, its runs booting a local Spark JVM of their own."""

from __future__ import annotations

import re

from conftest import run_wire


def test_the_demo_commits_every_batch_with_a_local_spark_session(cli_env, s3_env) -> None:
    # WIRE_SPARK_MASTER comes before the embedded server in the resolution: the runs launch a classic
    # local session, in the demo's own process (its Dagster runs are in-process).
    env = dict(cli_env, WIRE_DEMO_BUCKET=s3_env["WIRE_S3_BUCKET"], WIRE_SPARK_MASTER="local[2]")
    env.pop("WIRE_SPARK_REMOTE", None)
    p = run_wire(["demo"], env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]

    landed = [
        (int(n), int(bad))
        for n, bad in re.findall(r"^batch \d+: (\d+) events to segment \S+, (\d+) malformed$", p.stdout, re.MULTILINE)
    ]
    assert len(landed) >= 2, p.stdout
    ticks = re.findall(r"tick: (\d+) runs \(([A-Z, -]*)\)", p.stdout)
    assert ticks and all("FAILURE" not in statuses for _, statuses in ticks), p.stdout
    final = re.search(r"closed the stream; tick: \d+ runs; W = (\S+), epoch (\d+)", p.stdout)
    assert final and int(final.group(2)) >= 1, p.stdout
    # Every line the demo landed is in the committed totals (events_in counts the malformed ones too).
    tot = re.search(
        r"^conservation: in=(\d+) counted=(.*) late=(.*) duplicate=(\d+) malformed=(\d+) balanced=(\w+)$",
        p.stdout,
        re.MULTILINE,
    )
    assert tot, p.stdout
    assert tot.group(6) == "True", tot.group(0)
    assert int(tot.group(1)) == sum(n + bad for n, bad in landed), (tot.group(0), landed)
    assert int(tot.group(5)) == sum(bad for _, bad in landed), (tot.group(0), landed)
