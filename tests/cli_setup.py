"""The `wire` CLI tests' set-up: a directory of pipeline files and the environment pointing at it.

A CLI test writes its pipeline dicts into `<tmp_path>/pipelines` (the directory WIRE_PIPELINES
names, so `--pipeline <name>` finds them), loads them for its own checks, and runs `wire` with
a private DAGSTER_HOME. Where Spark runs is the caller's choice, made by the base environment it
passes: `local_spark` here, `commit_scenario.subprocess_env` (which also drops the fault-injection
variables and caps the driver at 1 GB), or the plain `cli_env`.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import yaml

from wire_dagster.spec import Pipeline, load_pipeline


def local_spark(cli_env: dict[str, str], spark_remote: str | None = None) -> dict[str, str]:
    """`cli_env` with the runs on the session's Spark Connect server when `spark_remote` names
    one, else booting local[2]: a WIRE_SPARK_REMOTE inherited from the test's own environment is
    dropped, so a test without a server never attaches to someone else's."""
    env = dict(cli_env, WIRE_SPARK_MASTER="local[2]")
    env.pop("WIRE_SPARK_REMOTE", None)
    if spark_remote:
        env["WIRE_SPARK_REMOTE"] = spark_remote
    return env


class CliSetup(NamedTuple):
    """What `pipeline_env` made: the loaded specs (in the order given), the environment, the
    pipelines directory and the DAGSTER_HOME it names (not created: `wire` creates it)."""

    specs: list[Pipeline]
    env: dict[str, str]
    pdir: Path
    home: Path


def pipeline_env(
    tmp_path: Path, base: dict[str, str], *pipelines: dict, home: Path | None = None, **extra: str
) -> CliSetup:
    """Write each pipeline dict to `<tmp_path>/pipelines/<name>.yaml` (a new directory) and load
    it; the environment is `base` with WIRE_PIPELINES naming that directory, DAGSTER_HOME `home`
    (default `<tmp_path>/dagster-home`) and the `extra` entries."""
    pdir = tmp_path / "pipelines"
    specs = write_pipelines(pdir, *pipelines)
    home = home or tmp_path / "dagster-home"
    env = dict(base, WIRE_PIPELINES=str(pdir), DAGSTER_HOME=str(home), **extra)
    return CliSetup(specs, env, pdir, home)


def write_pipelines(pdir: Path, *pipelines: dict) -> list[Pipeline]:
    """Make the directory `pdir` (it must not exist yet: one set-up per test), write each pipeline
    dict to `<pdir>/<name>.yaml` and return them loaded, in the order given."""
    pdir.mkdir()
    specs = []
    for raw in pipelines:
        path = pdir / f"{raw['name']}.yaml"
        path.write_text(yaml.safe_dump(raw))
        specs.append(load_pipeline(path))
    return specs
