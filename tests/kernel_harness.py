"""Driving the Spark kernel without the object store, and comparing it with expectations.

Events are dicts of chunk columns (`_t`, `_key`, `_id`, `_row`, `f_<field>`) plus the
source position `_seg`/`_seq` — the same dicts `tests/reference.py` takes. A
`KernelRun` carries window state, id memory and W from one epoch to the next exactly
as `engine.process` does, but feeds `kernel.run_epoch` an Arrow table built in memory.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from wire_dagster import kernel
from wire_dagster.events import chunk_schema
from wire_dagster.spec import Pipeline, field_column
from wire_dagster.timeutil import NEG_INF


def event(
    spec: Pipeline,
    t: int,
    key: str | None = None,
    id: str | None = None,
    *,
    seg: str = "0",
    seq: int = 0,
    row: int = 0,
    **fields,
) -> dict:
    """One event as chunk columns; `fields` are payload fields by their pipeline name."""
    e = {"_t": t, "_key": key, "_id": id, "_row": row, "_seg": seg, "_seq": seq}
    for name in chunk_schema(spec).names:
        if name.startswith("f_"):
            e[name] = None
    for f, v in fields.items():
        e[field_column(f)] = v
    return e


def events_table(spec: Pipeline, events: list[dict]) -> pa.Table:
    """The events as `kernel.Chunks` reads them: the chunk schema plus `_seg`, `_seq`."""
    schema = chunk_schema(spec).append(pa.field(kernel.SEG, pa.string())).append(pa.field(kernel.SEQ, pa.int64()))
    return pa.Table.from_pylist([{c: e.get(c) for c in schema.names} for e in events], schema=schema)


@dataclass
class KernelRun:
    """The kernel's state between epochs: window state, id memory and W."""

    spec: Pipeline
    state: dict = field(default_factory=dict)
    ids: pa.Table | None = None
    watermark: int = NEG_INF
    view: dict = field(default_factory=dict)  # name -> {(key, start, end): row}: the reader's view
    single_task: bool = False  # the kernel's single-task path (no shuffle) instead of key buckets

    def epoch(self, spark, events: list[dict], w_new: int) -> kernel.EpochResult:
        w_prev = self.watermark
        w_new = max(w_prev, w_new)
        res = kernel.run_epoch(
            spark,
            self.spec,
            events_table(self.spec, events),
            self.state,
            self.ids,
            w_prev,
            w_new,
            single_task=self.single_task,
        )
        self.state = {name: r.state for name, r in res.windows.items()}
        self.ids = res.ids
        self.watermark = w_new
        for name, r in res.windows.items():
            apply_rows(self.view.setdefault(name, {}), r.outputs.to_pylist())
        return res


def apply_rows(view: dict, rows: list[dict]) -> None:
    """What a reader sees: upserts by (key, start, end), retractions removed."""
    for r in rows:
        ident = (r["key"], r["window_start"], r["window_end"])
        if r.get("retract"):
            view.pop(ident, None)
        else:
            view[ident] = {k: v for k, v in r.items() if k != "retract"}


def same_value(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def diff_rows(got: list[dict], want: list[dict], what: str) -> list[str]:
    """Differences between two lists of result rows, matched by (key, start, end, retract).

    Retractions are compared by identity only (their aggregate columns carry the old value)."""

    def ident(r):
        return (r["key"], r["window_start"], r["window_end"], bool(r.get("retract", False)))

    out = []
    g = {ident(r): r for r in got}
    w = {ident(r): r for r in want}
    if len(g) != len(got):
        out.append(f"{what}: kernel emitted a window twice: {sorted(Counter(map(ident, got)).items())}")
    for k in sorted(set(g) | set(w), key=repr):
        if k not in g:
            out.append(f"{what}: missing {k} {w[k]}")
        elif k not in w:
            out.append(f"{what}: unexpected {k} {g[k]}")
        elif not k[3]:
            bad = {c: (g[k].get(c), v) for c, v in w[k].items() if c != "retract" and not same_value(g[k].get(c), v)}
            if bad:
                out.append(f"{what}: {k} differs (kernel, expected): {bad}")
    return out


def diff_views(got: dict, want: dict, what: str) -> list[str]:
    return diff_rows(list(got.values()), list(want.values()), what)


def dead_letter_keys(res: kernel.EpochResult) -> Counter:
    """Dead letters as (reason, window, segment, chunk, row)."""
    return Counter((d["reason"], d["window"], d["segment"], d["chunk"], d["row"]) for d in res.dead_letters.to_pylist())


def dead_letter_event(d: dict) -> dict:
    return json.loads(d["event"])


def check_balance(spec: Pipeline, res: kernel.EpochResult) -> list[str]:
    """Conservation per window: in == counted + late + other + duplicate (other: the events of
    the inputs a window with `input:` does not read); and the dead letters say so."""
    out = []
    dl = Counter((d["reason"], d["window"]) for d in res.dead_letters.to_pylist())
    if dl[("duplicate", None)] != res.duplicate:
        out.append(f"duplicate dead letters {dl[('duplicate', None)]} != duplicate count {res.duplicate}")
    for w in spec.windows:
        r = res.windows[w.name]
        if res.events != r.counted + r.late + r.other + res.duplicate:
            out.append(
                f"{w.name}: in {res.events} != counted {r.counted} + late {r.late} + other {r.other} "
                f"+ duplicate {res.duplicate}"
            )
        if dl[("late", w.name)] != r.late:
            out.append(f"{w.name}: late dead letters {dl[('late', w.name)]} != late count {r.late}")
    return out
