"""Pipeline files: the examples load; every mistake is a WireInputError whose one line names the field."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from wire_dagster.errors import WireInputError
from wire_dagster.spec import check_name, field_column, find_pipeline, load_pipeline, pipeline_from_dict

ROOT = Path(__file__).resolve().parent.parent


#: The pipeline of DESIGN §4, as a file would hold it; each mistake below mutates one field of it.
BASE: dict[str, Any] = yaml.safe_load(
    """
name: clicks
stream: clicks
event: {key: user_id, time: ts, id: event_id}
watermark: {max_out_of_orderness: 5s, idle_timeout: 1m}
lateness: {allowed: 30s}
partition: 5m
start: "2026-01-01T00:00:00Z"
windows:
  - {name: clicks_per_minute, type: tumbling, size: 1m,
     aggregates: {events: count, total: sum(amount), top: max(amount)}}
  - {name: clicks_5m_every_1m, type: sliding, size: 5m, slide: 1m, aggregates: {events: count, mean: avg(amount)}}
  - {name: sessions, type: session, gap: 30s, aggregates: {events: count, total: sum(amount)}}
"""
)


def test_design_example_parses() -> None:
    p = pipeline_from_dict(copy.deepcopy(BASE))
    assert (p.name, p.stream, p.key_field, p.time_field, p.id_field) == (
        "clicks",
        "clicks",
        "user_id",
        "ts",
        "event_id",
    )
    assert (p.max_out_of_orderness, p.idle_timeout, p.allowed_lateness, p.partition) == (5_000, 60_000, 30_000, 300_000)
    assert p.start == 1_767_225_600_000  # 2026-01-01T00:00:00Z
    tumbling, sliding, session = p.windows
    assert (tumbling.type, tumbling.size, tumbling.slide, tumbling.offset) == ("tumbling", 60_000, 60_000, 0)
    assert (sliding.type, sliding.size, sliding.slide) == ("sliding", 300_000, 60_000)
    assert (session.type, session.gap) == ("session", 30_000)
    assert [(a.name, a.func, a.field) for a in tumbling.aggregates] == [
        ("events", "count", None),
        ("total", "sum", "amount"),
        ("top", "max", "amount"),
    ]
    assert p.numeric_fields == ["amount"] and field_column("amount") == "f_amount"
    # Where the file lives is not part of the results' fingerprint; a result-relevant change is.
    assert pipeline_from_dict(copy.deepcopy(BASE), source="/elsewhere.yaml").fingerprint() == p.fingerprint()
    other = copy.deepcopy(BASE)
    other["lateness"]["allowed"] = "31s"
    assert pipeline_from_dict(other).fingerprint() != p.fingerprint()


@pytest.mark.parametrize("name", ["clicks", "bids"])
def test_example_pipelines_load(name: str) -> None:
    path = ROOT / "pipelines" / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    p = load_pipeline(path)
    assert p.name == raw["name"] == name and p.source == str(path)
    assert [(w.name, w.type) for w in p.windows] == [(w["name"], w["type"]) for w in raw["windows"]]
    assert find_pipeline(name, ROOT / "pipelines") == p


def _set(*path: Any, value: Any) -> Callable[[dict], None]:
    def mut(d: dict) -> None:
        for p in path[:-1]:
            d = d[p]
        d[path[-1]] = value

    return mut


def _drop(*path: Any) -> Callable[[dict], None]:
    def mut(d: dict) -> None:
        for p in path[:-1]:
            d = d[p]
        del d[path[-1]]

    return mut


def _agg(value: Any) -> Callable[[dict], None]:
    return _set("windows", 0, "aggregates", "x", value=value)


# (mutation of clicks.yaml, the field the message must name, another word it must contain)
MISTAKES: dict[str, tuple[Callable[[dict], object], str, str]] = {
    "unknown window type": (_set("windows", 0, "type", value="hopping"), "windows.clicks_per_minute.type", "hopping"),
    "slide > size": (_set("windows", 1, "slide", value="10m"), "windows.clicks_5m_every_1m.slide", "size"),
    "size not a multiple of slide": (
        _set("windows", 1, "size", value="150s"),
        "windows.clicks_5m_every_1m.size",
        "multiple",
    ),
    "bad duration": (_set("windows", 0, "size", value="5 minutes"), "windows.clicks_per_minute.size", "duration"),
    "negative duration": (_set("windows", 0, "size", value="-5s"), "windows.clicks_per_minute.size", "duration"),
    "zero size": (_set("windows", 0, "size", value=0), "windows.clicks_per_minute.size", "> 0"),
    "boolean duration": (
        _set("watermark", "max_out_of_orderness", value=True),
        "watermark.max_out_of_orderness",
        "duration",
    ),
    "bad lateness": (_set("lateness", "allowed", value="soon"), "lateness.allowed", "duration"),
    "fractional duration": (_set("watermark", "idle_timeout", value="1.5s"), "watermark.idle_timeout", "duration"),
    "unknown aggregate": (_agg("median(amount)"), "windows.clicks_per_minute.aggregates.x", "median"),
    "sum without field": (_agg("sum"), "windows.clicks_per_minute.aggregates.x", "needs a field"),
    "avg without field": (_agg("avg"), "windows.clicks_per_minute.aggregates.x", "needs a field"),
    "count with a field": (_agg("count(amount)"), "windows.clicks_per_minute.aggregates.x", "count"),
    "aggregate not a string": (_agg(5), "windows.clicks_per_minute.aggregates.x", "aggregate"),
    "aggregate output named key": (
        _set("windows", 0, "aggregates", value={"key": "count"}),
        "windows.clicks_per_minute.aggregates",
        "key",
    ),
    "no aggregates": (_set("windows", 0, "aggregates", value={}), "windows.clicks_per_minute.aggregates", "missing"),
    "partition not a multiple of size": (_set("partition", value="90s"), "partition", "clicks_per_minute"),
    "partition not a multiple of slide": (
        lambda d: (d.__setitem__("partition", "150s"), d["windows"].pop(0)),
        "partition",
        "clicks_5m_every_1m",
    ),
    "missing partition": (_drop("partition"), "partition", "missing"),
    "name with ../": (_set("name", value="../x"), "name", "'../x'"),
    "name with a slash": (_set("name", value="a/b"), "name", "'a/b'"),
    "empty name": (_set("name", value=""), "name", "missing"),
    "upper-case name": (_set("name", value="Clicks"), "name", "'Clicks'"),
    "stream with ../": (_set("stream", value="../s"), "stream", "'../s'"),
    "window name with a slash": (_set("windows", 0, "name", value="w/1"), "windows[0].name", "'w/1'"),
    "window name ..": (_set("windows", 0, "name", value=".."), "windows[0].name", "'..'"),
    "empty window name": (_set("windows", 0, "name", value=""), "windows[0].name", "missing"),
    "duplicate window names": (lambda d: d["windows"].append(copy.deepcopy(d["windows"][0])), "windows", "unique"),
    "no windows": (_set("windows", value=[]), "windows", "missing"),
    "missing time field": (_drop("event", "time"), "event.time", "missing"),
    "bad key field name": (_set("event", "key", value="a b"), "event.key", "'a b'"),
    "time field with ../": (_set("event", "time", value="../ts"), "event.time", "'../ts'"),
    "event not a mapping": (_set("event", value="ts"), "event", "mapping"),
    "unknown top-level key": (_set("windowz", value=[]), "pipeline", "windowz"),
    "unknown window key": (_set("windows", 2, "size", value="1m"), "windows.sessions", "size"),
    "zero session gap": (_set("windows", 2, "gap", value="0s"), "windows.sessions.gap", "> 0"),
    "sliding without slide": (_drop("windows", 1, "slide"), "windows.clicks_5m_every_1m.slide", "missing"),
    "offset >= size": (_set("windows", 0, "offset", value="1m"), "windows.clicks_per_minute.offset", "shorter"),
    "naive start": (_set("start", value="2026-01-01T00:00:00"), "start", "zone"),
    "unaligned start": (_set("start", value="2026-01-01T00:00:07Z"), "start", "aligned"),
    "unknown clock": (_set("watermark", "clock", value="wall"), "watermark.clock", "wall"),
    "bad limit": (_set("limits", value={"max_record_bytes": 0}), "limits.max_record_bytes", "positive"),
    "bad max_future": (_set("limits", value={"max_future": "x"}), "limits.max_future", "duration"),
}


@pytest.mark.parametrize("case", list(MISTAKES))
def test_pipeline_mistake_names_the_field(case: str) -> None:
    mutate, field, word = MISTAKES[case]
    raw = copy.deepcopy(BASE)
    mutate(raw)
    with pytest.raises(WireInputError) as ei:
        pipeline_from_dict(raw)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    assert msg.startswith((f"{field}:", f"pipeline.{field}:")), msg
    assert word in msg, msg


def test_the_unmutated_base_is_valid() -> None:
    """The harness can fail: the same base without a mutation loads (so each mistake above is the cause)."""
    assert pipeline_from_dict(copy.deepcopy(BASE)).name == "clicks"


@pytest.mark.parametrize("bad", ["", "..", "../x", "a/b", "/abs", "a\\b", "x" * 65, "A", "a b", "é", None, 5])
def test_check_name_refuses(bad: Any) -> None:
    with pytest.raises(WireInputError, match="--segment: bad name"):
        check_name(bad, "--segment")


@pytest.mark.parametrize("good", ["0", "a", "clicks_2", "seg-1", "x" * 64])
def test_check_name_accepts(good: str) -> None:
    assert check_name(good, "--segment") == good


def test_load_pipeline_file_errors(tmp_path: Path) -> None:
    (tmp_path / "syntax.yaml").write_text("name: clicks\nwindows: [\n  - a\n  b: c\n")
    with pytest.raises(WireInputError, match=r"syntax.yaml: invalid YAML at line \d+"):
        load_pipeline(tmp_path / "syntax.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(WireInputError, match="expected a YAML mapping"):
        load_pipeline(tmp_path / "list.yaml")
    with pytest.raises(WireInputError, match="cannot read pipeline file"):
        load_pipeline(tmp_path / "missing.yaml")
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    with pytest.raises(WireInputError, match="cannot read pipeline file"):
        load_pipeline(tmp_path / "latin1.yaml")


def test_bad_pipeline_file_via_cli_exits_2(cli_env: dict[str, str], tmp_path: Path) -> None:
    from conftest import run_wire

    raw = copy.deepcopy(BASE)
    raw["windows"][1]["slide"] = "10m"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    p = run_wire(["status", "--pipeline", str(bad)], cli_env)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: windows.clicks_5m_every_1m.slide:"), p.stderr


def test_a_rewritten_pipeline_file_is_read_anew(tmp_path: Path) -> None:
    """Parses are kept per file content (spec._parsed): a file rewritten with other windows — the
    same size and, written at once, maybe the same mtime — loads as written; a file made invalid
    is refused even though its earlier content loaded."""
    base = yaml.safe_load((Path(__file__).resolve().parent.parent / "pipelines" / "clicks.yaml").read_text())
    path = tmp_path / "clicks.yaml"
    first = copy.deepcopy(base)
    first["windows"] = [{"name": "aaaa", "type": "tumbling", "size": "1m", "aggregates": {"n": "count"}}]
    second = copy.deepcopy(first)
    second["windows"][0]["name"] = "bbbb"
    texts = [yaml.safe_dump(first), yaml.safe_dump(second)]
    assert len(texts[0]) == len(texts[1])
    for text, name in zip([*texts, texts[0]], ["aaaa", "bbbb", "aaaa"], strict=True):
        path.write_text(text)
        assert [w.name for w in load_pipeline(path).windows] == [name]
        assert [w.name for w in find_pipeline(base["name"], tmp_path).windows] == [name]
    path.write_text(texts[1].replace("tumbling", "tumbled"))
    with pytest.raises(WireInputError, match="tumbled"):
        load_pipeline(path)
