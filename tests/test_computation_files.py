"""Windows and computations in one pipeline file (DESIGN §4's `user_minutes` form, issue 24).

The file's windows stay its pipeline; each computation runs in a pipeline generated from the
file, `<file's name>__<computation>` (expand.py), over the file's raw input, one of its derived
inputs, or one of its own windows. Through the real CLI, the user addresses the file by its
name only: `wire produce/close --pipeline users` feed its stream, `wire tick --pipeline users`
brings the windows and then the computations up to date, `wire read --pipeline users --window
alerts` reads a computation's output, `wire dlq` and `wire backfill --pipeline users` take all
of the file's pipelines. The results equal independent references: the counts per
user and minute by brute force, the alerts and spikes by the reference executor of
test_computations over the clicks and over those counts.

    clicks ──▶ users/per_minute ──▶ users__spikes/spikes     (a window of the file)
          └──▶ users__quiet/alerts                            (the file's raw input)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from test_computations import OOO, T0, _events, _loaded, _modules, reference
from wire_dagster.errors import WireInputError
from wire_dagster.spec import ComputationSpec, load_all, pipelines_from_dict

COMMON = {
    "partition": "5m",
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-02T00:00:00Z",
}
RAW = {
    "stream": "clicks",
    "event": {"key": "user_id", "time": "ts", "id": "event_id"},
    "watermark": {"max_out_of_orderness": f"{OOO}ms", "idle_timeout": "1h"},
}
PER_MINUTE = {"name": "per_minute", "type": "tumbling", "size": "1m", "aggregates": {"clicks": "count"}}
USERS = {
    "name": "users",
    **RAW,
    **COMMON,
    "windows": [PER_MINUTE],
    "computations": [
        {"name": "quiet", "code": "quiet:QuietAlert", "outputs": ["alerts"]},
        {"name": "spikes", "input": "per_minute", "code": "spike:CountSpikeDetector", "outputs": ["spikes"]},
        {"name": "zoo", "code": "zoo:TimerZoo", "outputs": ["zoo"]},  # raises at v % 1000 == 7
    ],
}

# DESIGN §4's `user_minutes`, its computation beside a join of raw streams and a derived input.
CLICKS_STATS = {"name": "clicks_stats", **RAW, **COMMON, "windows": [PER_MINUTE]}
USER_MINUTES = {
    "name": "user_minutes",
    **COMMON,
    "inputs": [
        {"name": "clicks", "stream": "clicks", "time": "ts", "id": "event_id", "key": "user_id", "where": "amount > 0"},
        {"name": "views", "stream": "views", "time": "ts", "id": "event_id", "key": "user_id"},
        {"name": "minutes", "pipeline": "clicks_stats", "output": "per_minute", "key": "key"},
    ],
    "fields": {"amount_eur": "amount * 0.92"},
    "windows": [
        {"name": "per_5m", "input": "minutes", "type": "tumbling", "size": "5m", "aggregates": {"peak": "max(clicks)"}},
        {
            "name": "clicks_with_views",
            "type": "join",
            "left": "clicks",
            "right": "views",
            "window": {"type": "tumbling", "size": "1m"},
            "select": {"amount": "left.amount", "page": "right.page"},
        },
    ],
    "computations": [
        {"name": "quiet", "input": "clicks", "code": "quiet:QuietAlert", "outputs": ["alerts"]},
        {"name": "peaks", "input": "per_5m", "code": "spike:CountSpikeDetector", "outputs": ["spikes"]},
        {"name": "minute_spikes", "input": "minutes", "code": "spike:CountSpikeDetector", "outputs": ["m_spikes"]},
    ],
}


def test_the_design_form_loads_as_the_windows_and_one_pipeline_per_computation(tmp_path: Path) -> None:
    d = _modules(tmp_path)
    for body in (CLICKS_STATS, USER_MINUTES):
        (d / f"{body['name']}.yaml").write_text(yaml.safe_dump(body))
    specs = {s.name: s for s in load_all(d)}
    assert set(specs) == {
        "clicks_stats",
        "user_minutes",
        "user_minutes__clicks",  # the join's raw inputs, read through their pass-throughs
        "user_minutes__views",
        "user_minutes__quiet",  # the computations
        "user_minutes__peaks",
        "user_minutes__minute_spikes",
    }
    stage = specs["user_minutes"]
    assert not stage.computations and [w.name for w in stage.windows] == ["per_5m", "clicks_with_views"]
    # over the raw input: the stream as the file reads it (its key, filter and fields)
    quiet = specs["user_minutes__quiet"]
    assert (quiet.stream, quiet.key_fields, quiet.where, quiet.derived) == ("clicks", ("user_id",), "amount > 0", ())
    assert [f[0] for f in quiet.fields] == ["amount_eur"]
    assert [(c.name, c.input, c.outputs) for c in quiet.computations] == [("quiet", "clicks", ("alerts",))]
    # over one of the file's windows, and over the file's derived input
    (peaks,) = specs["user_minutes__peaks"].derived
    assert (peaks.name, peaks.pipeline, peaks.output, peaks.key_fields) == (
        "per_5m",
        "user_minutes",
        "per_5m",
        ("key",),
    )
    (minutes,) = specs["user_minutes__minute_spikes"].derived
    assert (minutes.pipeline, minutes.output) == ("clicks_stats", "per_minute")
    # the generated pipelines share the file: its directory holds the computations' modules
    assert {s.source for n, s in specs.items() if n.startswith("user_minutes")} == {str(d / "user_minutes.yaml")}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            {"computations": [{"name": "q", "input": "nope", "code": "quiet:QuietAlert", "outputs": ["a"]}]},
            "computations.q.input: no input or window named 'nope'; choose one of: clicks, per_minute",
        ),
        (
            {"computations": [{"name": "q", "code": "quiet:QuietAlert", "outputs": ["per_minute"]}]},
            "computations.q.outputs: 'per_minute' is also a window of this file",
        ),
        (
            {"computations": [{"name": "q", "code": "quiet", "outputs": ["a"]}]},
            "computations.q.code: 'quiet' is not module:Class",
        ),
        (
            {"computations": [{"name": "q", "code": "quiet:QuietAlert", "outputs": ["a"]}] * 2},
            "computations: two computations share a name",
        ),
        ({"computations": ["quiet"]}, "computations[0]: expected a mapping with name, input, code, outputs"),
        ({"name": "u" * 60}, "computations.quiet: the pipeline that runs this computation for"),
    ],
)
def test_a_bad_computation_beside_windows_is_one_line(change: dict, says: str) -> None:
    with pytest.raises(WireInputError) as e:
        pipelines_from_dict({**USERS, **change})
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_computation_named_like_an_expanded_raw_input_is_refused() -> None:
    body = {
        **USER_MINUTES,
        "computations": [{"name": "views", "input": "clicks", "code": "quiet:QuietAlert", "outputs": ["a"]}],
    }
    with pytest.raises(WireInputError, match=r"computations.views: a raw input is named 'views' too"):
        pipelines_from_dict(body)


def _counts(events: list[dict]) -> dict[tuple[str, int], int]:
    out: dict = {}
    for e in events:
        k = (e["user_id"], e["ts"] - (e["ts"] - T0) % 60_000)
        out[k] = out.get(k, 0) + 1
    return out


def test_one_file_of_windows_and_computations_through_the_cli(cli_env, spark_remote, tmp_path: Path) -> None:
    """`wire tick --pipeline users` runs the windows, then both computations (the spike detector
    after the counts it reads); `wire read --pipeline users` reads all three outputs."""
    from commit_scenario import subprocess_env
    from conftest import run_wire

    d = _modules(tmp_path / "p")
    (d / "users.yaml").write_text(yaml.safe_dump(USERS))
    env = subprocess_env(cli_env, spark_remote, WIRE_PIPELINES=str(d))
    rnd = random.Random(24)
    events = _events(rnd, 300, users=3)
    for u in range(3):  # a burst per user: a minute of clicks well above the model (a spike)
        events += [
            {"ts": T0 + 3_600_000 + (20 + u) * 60_000 + j, "user_id": f"u{u}", "event_id": f"b{u}-{j}"}
            | {"op": "none", "tag": "a", "d": 0, "v": 1_000_000 + j}
            for j in range(30)
        ]
    f = tmp_path / "clicks.jsonl"
    bad = {"ts": "not a time", "user_id": "u0", "event_id": "bad"}  # a dead letter at produce
    f.write_text("".join(json.dumps(e) + "\n" for e in [*events, bad]))
    run_wire(["produce", "--pipeline", "users", "--file", str(f)], env)
    run_wire(["close", "--pipeline", "users"], env, check=True)
    p = run_wire(["tick", "--pipeline", "users"], env, check=True)
    ran = [line.split(":")[0] for line in p.stdout.splitlines() if line.startswith("run ")]
    assert ran and p.stdout.index("users__spikes") > p.stdout.index("users__quiet"), p.stdout

    def read(window: str) -> list[dict]:
        p = run_wire(["read", "--pipeline", "users", "--window", window, "--format", "jsonl"], env, check=True)
        return [json.loads(x) for x in p.stdout.splitlines() if x.strip()]

    counts = _counts(events)
    got_counts = {(r["key"], _ms(r["window_start"])): r["clicks"] for r in read("per_minute")}
    assert got_counts == counts

    comps = {c.name: c for c in _loaded(d).specs}
    positioned = [{"t": e["ts"], "key": e["user_id"], "pos": ("0", 0, i), "rec": e} for i, e in enumerate(events)]
    alerts, _ = reference(_loaded(d).classes[0], comps["quiet"], positioned)
    got = read("alerts")
    assert sorted((r["key"], json.loads(r["record"])["quiet_since"]) for r in got) == sorted(
        (k, json.loads(rec)["quiet_since"]) for _, k, _, _, rec in alerts
    )
    assert len({r["id"] for r in got}) == len(got) >= 3

    spike_c = ComputationSpec(name="spikes", input="per_minute", code="spike:CountSpikeDetector", outputs=("spikes",))
    rows = [
        {"key": u, "window_start": m, "window_end": m + 60_000, "clicks": n, "_update": False}
        for (u, m), n in counts.items()
    ]
    from wire_dagster.computation import load_class

    spikes, _ = reference(
        load_class(spike_c.code, str(d), spike_c.code),
        spike_c,
        [
            {"t": r["window_end"] - 1, "key": r["key"], "pos": ("per_minute", r["window_start"], 0), "rec": r}
            for r in rows
        ],
    )
    got = read("spikes")
    assert len(spikes) >= 3
    assert sorted(
        (r["key"], _ms(r["window_start"]), json.dumps(json.loads(r["record"]), sort_keys=True)) for r in got
    ) == sorted((k, t, json.dumps(json.loads(rec), sort_keys=True)) for _, k, t, _, rec in spikes)
    # the file's dead letters: the stream's once, the computation's errors (v = 7) by its pipeline
    p = run_wire(["dlq", "--pipeline", "users", "--format", "jsonl"], env, check=True)
    letters = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    kinds = {(d["pipeline"], d["reason"].split(":")[0], d["window"]) for d in letters}
    assert kinds == {("users", "malformed", None), ("users__zoo", "error", "zoo")}, letters
    assert sum(1 for d in letters if d["reason"].startswith("malformed")) == 1  # read by 4 pipelines
    assert "error: ValueError: boom at 7" in {d["reason"] for d in letters}
    # a backfill of the file: each of its pipelines, upstream first, every partition reproduced
    p = run_wire(["backfill", "--pipeline", "users", "--format", "jsonl"], env, check=True)
    done = [json.loads(x) for x in p.stdout.splitlines() if x.strip()]
    assert list(dict.fromkeys(r["pipeline"] for r in done)) == ["users", "users__quiet", "users__spikes", "users__zoo"]
    assert {r["result"] for r in done} == {"reproduced"}, done
    # the generated pipelines are pipelines like any other, by their own names
    st = json.loads(run_wire(["status", "--pipeline", "users__spikes", "--json"], env, check=True).stdout)
    assert "inf" in json.dumps(st).lower() and "generated" not in st
    # the file's status names what was generated from it, each at its last commit (the stream closed)
    st = json.loads(run_wire(["status", "--pipeline", "users", "--json"], env, check=True).stdout)
    assert [(g["pipeline"], g["watermark"]) for g in st["generated"]] == [
        (f"users__{c}", "+inf") for c in ("quiet", "spikes", "zoo")
    ], st["generated"]
    assert all(isinstance(g["epoch"], int) for g in st["generated"]), st["generated"]
    text = run_wire(["status", "--pipeline", "users"], env, check=True).stdout
    assert "generated from this file: users__zoo, last committed epoch" in text, text
    # a window neither the file nor its computations have: one line naming the choices
    p = run_wire(["read", "--pipeline", "users", "--window", "nope"], env)
    assert p.returncode == 2 and "per_minute" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def _ms(iso: str) -> int:
    from wire_dagster.timeutil import parse_iso

    return parse_iso(iso)


def test_an_output_read_downstream_keeps_its_records_json_types() -> None:
    """A computation's records read as a derived stream (derived.record_columns): each top-level
    field a column of its JSON type; ISO-8601 text stays text (pyarrow's reader alone makes it a
    timestamp); a field of several JSON types is typed as a stream's JSON lines type it (numbers
    win, the other values null), the other fields as ever."""
    import pyarrow as pa

    from wire_dagster.derived import record_columns

    recs = [
        {"when": "2026-01-01T00:00:00Z", "n": 1, "x": 1.5, "tags": ["a"], "ok": True},
        {"when": "2026-01-01 00:01:00", "n": 2, "x": None, "tags": [], "ok": False},
    ]
    rows = pa.table({"key": ["u0", "u1"], "record": [json.dumps(r) for r in recs]})
    t = record_columns(rows)
    assert t.schema.field("when").type == pa.string() and t["when"].to_pylist() == [r["when"] for r in recs]
    assert (t.schema.field("n").type, t.schema.field("x").type, t.schema.field("ok").type) == (
        pa.int64(),
        pa.float64(),
        pa.bool_(),
    )
    assert t["tags"].to_pylist() == [["a"], []]
    mixed = [{"v": 1, "u": "a"}, {"v": "one", "u": "b"}, {"v": 2.5, "u": "c"}]
    t = record_columns(pa.table({"key": ["u0", "u1", "u2"], "record": [json.dumps(r) for r in mixed]}))
    assert t.column_names == ["key", "record", "v", "u"]
    assert (t["v"].to_pylist(), t["u"].to_pylist()) == ([1.0, None, 2.5], ["a", "b", "c"])
