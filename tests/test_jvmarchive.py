"""The class archive every JVM Wire launches maps (wire_dagster/jvmarchive.py): named by the Java
runtime and the jars, mapped by local sessions and the embedded server (`-Xshare:on`: a JVM that
cannot map its archives does not start), left out with WIRE_SPARK_CDS=false; a damaged archive
only costs time, and a failed attempt to make one is one line, with nothing half-written."""

from __future__ import annotations

import sys
from pathlib import Path

from local_session import SESSION_FACTS, local_env, made_archive, session_facts
from wire_dagster import jvmarchive


def test_a_local_session_maps_the_archive() -> None:
    archive = made_archive()
    facts = session_facts(SESSION_FACTS, local_env(SPARK_SUBMIT_OPTS="-Xshare:on"))
    # Started with -Xshare:on, so the archive named was mapped (else the JVM would not have started).
    assert f"-XX:SharedArchiveFile={archive}" in facts["args"], facts["args"]
    assert facts["count"] == 5


def test_the_archive_is_named_by_java_and_the_jars(monkeypatch, tmp_path: Path) -> None:
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "a.jar").write_bytes(b"a")
    monkeypatch.setattr(jvmarchive, "spark_home", lambda: tmp_path / "spark")
    first = jvmarchive.archive_path()
    assert first is not None and first.name.startswith("spark-") and first.suffix == ".jsa"
    assert first.parent == Path(sys.prefix) / "share" / "wire"
    assert jvmarchive.archive_path() == first
    (jars / "a.jar").write_bytes(b"ab")  # an upgraded jar: another archive
    assert jvmarchive.archive_path() != first
    monkeypatch.setattr(jvmarchive, "java_binary", lambda: None)
    assert jvmarchive.archive_path() is None


def test_the_archive_is_mapped_unless_turned_off(monkeypatch, tmp_path: Path) -> None:
    archive = tmp_path / "spark-x.jsa"
    monkeypatch.setattr(jvmarchive, "archive_path", lambda: archive)
    monkeypatch.delenv("WIRE_SPARK_CDS", raising=False)
    assert "SharedArchiveFile" not in jvmarchive.launch_options("-Dx=1", tmp_path)  # none made yet
    archive.write_bytes(b"archive")
    opts = jvmarchive.launch_options("-Dx=1", tmp_path / "t")
    assert opts == f'-Dx=1 -Djava.io.tmpdir="{tmp_path / "t"}" -XX:SharedArchiveFile="{archive}"'
    monkeypatch.setenv("WIRE_SPARK_CDS", "false")
    assert "SharedArchiveFile" not in jvmarchive.launch_options(None, tmp_path)
    assert jvmarchive.make() == (None, "WIRE_SPARK_CDS=false: no class archive")


def test_a_damaged_archive_only_costs_time(tmp_path: Path) -> None:
    """A JVM that cannot use the archive (a damaged file, another Java) starts without it."""
    junk = tmp_path / "spark-junk.jsa"
    junk.write_bytes(b"not an archive" * 100)
    code = (
        "from pathlib import Path\nimport wire_dagster.jvmarchive as j\n"
        f"j.archive_path = lambda: Path({str(junk)!r})\n" + SESSION_FACTS
    )
    facts = session_facts(code, local_env())
    assert f"-XX:SharedArchiveFile={junk}" in facts["args"] and facts["count"] == 5


def test_a_failed_archive_run_is_one_line_and_leaves_nothing(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(jvmarchive, "archive_path", lambda: tmp_path / "share" / "spark-k.jsa")
    monkeypatch.setenv("SPARK_SUBMIT_OPTS", "-Xmxabc")  # the JVM cannot start
    monkeypatch.delenv("WIRE_SPARK_CDS", raising=False)
    path, said = jvmarchive.make(timeout=120)
    assert path is None
    assert said.startswith("no Spark class archive: its run failed (") and "\n" not in said, said
    assert sorted(p.name for p in (tmp_path / "share").iterdir()) == []  # no partial archive


def test_the_embedded_server_maps_the_archive_too(monkeypatch, tmp_path: Path) -> None:
    from wire_dagster.sparkserver import EmbeddedSpark

    archive = tmp_path / "spark-x.jsa"
    archive.write_bytes(b"archive")
    monkeypatch.setattr(jvmarchive, "archive_path", lambda: archive)
    monkeypatch.delenv("WIRE_SPARK_CDS", raising=False)
    _cmd, env = EmbeddedSpark(tmp_path / "spark")._command("local[2]", "1g", 15999, {})
    assert env["SPARK_SUBMIT_OPTS"].endswith(f'-XX:SharedArchiveFile="{archive}"'), env["SPARK_SUBMIT_OPTS"]


def test_an_archive_run_that_takes_too_long_is_stopped_with_its_jvm(monkeypatch, tmp_path: Path) -> None:
    """Stopped by its process group: its JVM cannot write the archive after `make` gave up."""
    monkeypatch.setattr(jvmarchive, "archive_path", lambda: tmp_path / "share" / "spark-k.jsa")
    monkeypatch.delenv("WIRE_SPARK_CDS", raising=False)
    path, said = jvmarchive.make(timeout=3)  # its local session alone takes longer
    assert (path, said) == (None, "no Spark class archive: its run took over 3 s")
    assert sorted(p.name for p in (tmp_path / "share").iterdir()) == []
    writers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(tmp_path).encode() in _cmdline(p)]
    assert writers == [], "a JVM still due to write the archive"


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
