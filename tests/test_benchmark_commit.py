"""The commit a benchmark report names (benchmarks/common.py `git_commit`): HEAD's, plus the code
files that differ from it; a report a benchmark wrote into benchmarks/results/ is not code."""

from __future__ import annotations

import subprocess
from pathlib import Path

import benchmarks.common as common


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.strip()


def test_a_report_in_the_tree_is_not_an_uncommitted_change_but_code_is(tmp_path, monkeypatch) -> None:
    root = tmp_path / "repo"
    (root / "wire_dagster").mkdir(parents=True)
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "wire_dagster" / "kernel.py").write_text("x = 1\n")
    (root / "benchmarks" / "results" / "old.md").write_text("# a report\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    head = _git(root, "rev-parse", "--short", "HEAD")
    monkeypatch.setattr(common, "ROOT", root)

    (root / "benchmarks" / "results" / "nexmark-new.md").write_text("# the run before\n")
    (root / "benchmarks" / "results" / "old.md").write_text("# edited\n")
    assert common.git_commit() == head

    (root / "wire_dagster" / "kernel.py").write_text("x = 2\n")
    got = common.git_commit()
    assert got.startswith(f"{head} (uncommitted changes in wire_dagster/kernel.py; diff sha256 ")
    assert "results" not in got
