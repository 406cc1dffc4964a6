"""Transcript tests for the Spark window kernel (Beam's trigger_transcripts style).

Each `tests/transcripts/*.yaml` is one transcript: a pipeline, then epochs of input
events and the watermark to advance to, with *every* firing expected in that epoch
(on-time and late results, retractions), every dead letter, and optionally the open
window state afterwards. The harness runs `kernel.run_epoch` epoch by epoch, carrying
state and id memory, and compares exactly; conservation is checked in every epoch.

Transcripts with `expect_failure: "<message>"` hold a wrong expectation on purpose:
the harness must raise `TranscriptMismatch` naming it — proof that it fails when it should.

Format::

    pipeline: {...}                  # as in a pipeline file (spec.pipeline_from_dict)
    epochs:
      - events: [{t, key, id, <field>: value, seg?, seq?}]   # seq defaults to the epoch index
        w_new: 20                    # int ms, or inf
        fire:                        # per window, exhaustive (a window left out fires nothing)
          <window>: {on_time: [row], late: [row], retract: [{key, start, end}]}
        dead: [{reason, window?, t, id?}]   # exhaustive
        open: {<window>: [[key, start, end]]}  # optional: the state after the epoch
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest
import yaml

from kernel_harness import KernelRun, check_balance, dead_letter_event, diff_rows, event
from wire_dagster.spec import pipeline_from_dict
from wire_dagster.timeutil import INF

HERE = Path(__file__).parent / "transcripts"
TRANSCRIPTS = sorted(HERE.glob("*.yaml"))


class TranscriptMismatch(AssertionError):
    """The kernel did not do what the transcript says."""


class TranscriptError(ValueError):
    """The transcript itself is malformed (a typo must never make a transcript pass)."""


_TOP = {"description", "pipeline", "epochs", "expect_failure"}
_EPOCH = {"events", "w_new", "fire", "dead", "open"}
_FIRE = {"on_time", "late", "retract"}
_DEAD = {"reason", "window", "t", "id"}
_EVENT = {"t", "key", "id", "seg", "seq"}

# Kernel results by (pipeline, inputs of epochs 1..n): transcripts that share inputs
# (a must-fail transcript and its passing twin) share one kernel run per epoch.
_RUNS: dict[str, tuple] = {}


def _keys(d: object, allowed: set[str], where: str) -> dict:
    if not isinstance(d, dict):
        raise TranscriptError(f"{where}: expected a mapping, got {d!r}")
    extra = set(d) - allowed
    if extra:
        raise TranscriptError(f"{where}: unknown key(s) {sorted(extra)}; allowed: {sorted(allowed)}")
    return d


def _w(v: object, where: str) -> int:
    if v in ("inf", "+inf"):
        return INF
    if not isinstance(v, int) or isinstance(v, bool):
        raise TranscriptError(f"{where}.w_new: expected an int or inf, got {v!r}")
    return v


def _events(spec, raw: list, epoch_index: int, where: str) -> list[dict]:
    payload = {f for w in spec.windows for a in w.aggregates if a.field for f in [a.field]} | set(spec.gap_fields)
    rows: Counter = Counter()
    out = []
    for j, e in enumerate(raw or []):
        _keys(e, _EVENT | payload, f"{where}.events[{j}]")
        if "t" not in e:
            raise TranscriptError(f"{where}.events[{j}]: missing t")
        seg, seq = str(e.get("seg", "0")), int(e.get("seq", epoch_index))
        fields = {f: e[f] for f in payload if f in e}
        out.append(event(spec, e["t"], e.get("key"), e.get("id"), seg=seg, seq=seq, row=rows[(seg, seq)], **fields))
        rows[(seg, seq)] += 1
    return out


def _rows(raw: list | None, window, kind: str, where: str) -> list[dict]:
    out = []
    aggs = {a.name for a in window.aggregates}
    for j, r in enumerate(raw or []):
        allowed = {"key", "start", "end"} | (aggs if kind != "retract" else set())
        _keys(r, allowed, f"{where}.{kind}[{j}]")
        if not {"key", "start", "end"} <= set(r):
            raise TranscriptError(f"{where}.{kind}[{j}]: needs key, start and end")
        if kind != "retract" and set(r) != allowed:
            raise TranscriptError(f"{where}.{kind}[{j}]: give every aggregate ({sorted(aggs)})")
        row = {"key": r["key"], "window_start": r["start"], "window_end": r["end"], "retract": kind == "retract"}
        row.update({a: r[a] for a in aggs if a in r and kind != "retract"})
        out.append(row)
    return out


def parse(doc: dict):
    """Validate a whole transcript before any Spark work: (spec, [epoch expectations])."""
    _keys(doc, _TOP, "transcript")
    spec = pipeline_from_dict(doc["pipeline"])
    names = {w.name for w in spec.windows}
    if not doc.get("epochs"):
        raise TranscriptError("transcript: no epochs")
    epochs = []
    for i, ep in enumerate(doc["epochs"], start=1):
        where = f"epochs[{i}]"
        _keys(ep, _EPOCH, where)
        fire = _keys(ep.get("fire") or {}, names, f"{where}.fire")
        want = {}
        for w in spec.windows:
            exp = _keys(fire.get(w.name) or {}, _FIRE, f"{where}.fire.{w.name}")
            want[w.name] = {
                k: _rows(exp.get(k), w, k, f"{where}.fire.{w.name}") for k in ("on_time", "late", "retract")
            }
        dead: Counter = Counter()
        for j, d in enumerate(ep.get("dead") or []):
            _keys(d, _DEAD, f"{where}.dead[{j}]")
            dead[(d["reason"], d.get("window"), d["t"], str(d["id"]) if "id" in d else None)] += 1
        opened = {w: {tuple(x) for x in v} for w, v in _keys(ep.get("open") or {}, names, f"{where}.open").items()}
        epochs.append(
            {
                "raw": [ep.get("events"), ep.get("w_new")],
                "events": _events(spec, ep.get("events"), i - 1, where),
                "w_new": _w(ep.get("w_new"), where),
                "fire": want,
                "dead": dead,
                "open": opened,
            }
        )
    return spec, epochs


def run_transcript(spark, doc: dict) -> None:
    """Run a transcript; raises TranscriptMismatch listing every difference of the first bad epoch."""
    spec, epochs = parse(doc)
    run = KernelRun(spec)
    prefix: list = [doc["pipeline"]]
    for i, ep in enumerate(epochs, start=1):
        w_prev = run.watermark
        prefix.append(ep["raw"])
        key = json.dumps(prefix, sort_keys=True, default=str)
        if key in _RUNS:
            res, snap = _RUNS[key]
            run.state, run.ids, run.watermark = dict(snap[0]), snap[1], snap[2]
        else:
            res = run.epoch(spark, ep["events"], ep["w_new"])
            _RUNS[key] = (res, (dict(run.state), run.ids, run.watermark))

        problems = [f"epoch {i}: {p}" for p in check_balance(spec, res)]
        for w in spec.windows:
            got = res.windows[w.name].outputs.to_pylist()
            kinds = {
                "on_time": [r for r in got if not r["retract"] and r["window_end"] > w_prev],
                "late": [r for r in got if not r["retract"] and r["window_end"] <= w_prev],
                "retract": [r for r in got if r["retract"]],
            }
            for kind, rows in kinds.items():
                problems += diff_rows(rows, ep["fire"][w.name][kind], f"epoch {i}: {w.name} {kind}")

        got_dead: Counter = Counter()
        for d in res.dead_letters.to_pylist():
            ev = dead_letter_event(d)
            if int(ev[spec.time_field]) != d["event_time"]:
                problems.append(f"epoch {i}: dead letter event {ev} does not match its event_time {d['event_time']}")
            got_dead[(d["reason"], d["window"], d["event_time"], ev.get(spec.id_field) if spec.id_field else None)] += 1
        want_dead = ep["dead"]
        for k in sorted(set(want_dead) | set(got_dead), key=repr):
            if want_dead[k] > got_dead[k]:
                problems.append(f"epoch {i}: dead letters: missing {k}")
            elif got_dead[k] > want_dead[k]:
                problems.append(f"epoch {i}: dead letters: unexpected {k}")

        for wname, want_open in ep["open"].items():
            got_open = {(r["key"], r["start"], r["end"]) for r in run.state[wname].to_pylist()}
            problems += [f"epoch {i}: {wname} open: missing {k}" for k in sorted(want_open - got_open, key=repr)]
            problems += [f"epoch {i}: {wname} open: unexpected {k}" for k in sorted(got_open - want_open, key=repr)]
        if problems:
            raise TranscriptMismatch("\n".join(problems))


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[p.stem for p in TRANSCRIPTS])
def test_transcript(spark, path):
    doc = _load(path)
    expected = doc.get("expect_failure")
    if not expected:
        run_transcript(spark, doc)
        return
    with pytest.raises(TranscriptMismatch) as err:
        run_transcript(spark, doc)
    assert str(expected) in str(err.value), f"failed, but not for the expected reason:\n{err.value}"


def test_there_are_transcripts_that_must_fail():
    docs = [_load(p) for p in TRANSCRIPTS]
    assert sum(1 for d in docs if d.get("expect_failure")) >= 5
    assert sum(1 for d in docs if not d.get("expect_failure")) >= 8


def test_malformed_transcripts_are_errors_not_passes():
    good = _load(HERE / "purge_boundary.yaml")
    for mutate, msg in [
        (lambda d: d["epochs"][0]["fire"]["tum"].update(on_tme=[]), "unknown key"),
        (lambda d: d["epochs"][0].update(fires={}), "unknown key"),
        (lambda d: d["epochs"][0]["fire"].update(nosuch={}), "unknown key"),
        (lambda d: d["epochs"][0]["fire"]["tum"]["on_time"][0].pop("n"), "every aggregate"),
        (lambda d: d["epochs"][0].update(w_new="soon"), "w_new"),
        (lambda d: d["epochs"][0]["events"][0].update(amount=3), "unknown key"),
    ]:
        doc = copy.deepcopy(good)
        mutate(doc)
        # malformed transcripts are refused before any Spark work (spark=None would fail otherwise)
        with pytest.raises(TranscriptError, match=msg):
            run_transcript(None, doc)
