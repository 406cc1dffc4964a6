"""A reference implementation of Wire's event-time semantics, in plain Python.

Small, slow and obviously correct; used only by tests to check the Spark kernel,
the commit protocol and the Dagster runs. It follows DESIGN §1 literally:

- an event processed in epoch N is judged against W_{N-1};
- it counts toward each of its windows with ``end + L > W_{N-1}`` (a session
  event: its one-event window, or any open session of its key it touches);
- a window fires in the first epoch with ``W >= end`` and re-fires when an
  epoch changes it; a fired session that merges into another is retracted;
- state is purged once ``W >= end + L``; a repeated id is a duplicate while it is
  remembered: until ``t + extent + L``, or longer while a session holding it is open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from wire_dagster.aggregates import py_add, py_empty, py_finalize, py_merge
from wire_dagster.spec import INPUT_SEP, Pipeline, WindowSpec, field_column
from wire_dagster.windows import assign, merge


@dataclass
class RefState:
    windows: dict[str, dict[tuple, dict]] = field(default_factory=dict)  # name -> {(key, start, end): partials}
    ids: dict[str, tuple] = field(default_factory=dict)  # id -> (expires, key, t)
    watermark: int = -(2**62)
    # the reader's view: name -> {(key, start, end): finalized row}
    view: dict[str, dict[tuple, dict]] = field(default_factory=dict)
    counts: dict = field(default_factory=lambda: {"in": 0, "duplicate": 0})
    window_counts: dict = field(default_factory=dict)  # name -> {"counted", "late"}
    dead: list = field(default_factory=list)


def _gap(w: WindowSpec, ev: dict) -> int:
    if w.gap_field:
        g = ev.get(field_column(w.gap_field))
        if g is not None and g > 0:
            return g
    return w.gap


def run_epoch(spec: Pipeline, st: RefState, events: list[dict], w_new: int) -> dict[str, list[dict]]:
    """Apply one epoch; returns the rows emitted per window (results and retractions)."""
    L = spec.allowed_lateness
    w_prev = st.watermark
    w_new = max(w_prev, w_new)
    events = sorted(events, key=lambda e: (e["_seg"], e["_seq"], e["_row"]))
    st.counts["in"] += len(events)
    if spec.id_field:
        kept, seen_now = [], set()
        for e in events:
            if e["_id"] in st.ids or e["_id"] in seen_now:
                st.counts["duplicate"] += 1
                st.dead.append(("duplicate", None, e))
            else:
                seen_now.add(e["_id"])
                kept.append(e)
        for e in kept:
            ext = max([spec.max_extent] + [e.get(field_column(g)) or 0 for g in spec.gap_fields]) + L
            st.ids[e["_id"]] = (e["_t"] + ext, e["_key"], e["_t"])
        events = kept
    emitted: dict[str, list[dict]] = {}
    every = events
    for w in spec.windows:
        wc = st.window_counts.setdefault(w.name, {"counted": 0, "late": 0, "other": 0})
        events = every
        if w.input is not None and spec.inputs:  # a window with `input:` reads that input's events only
            events = [e for e in every if e["_seg"].startswith(w.input + INPUT_SEP)]
            wc["other"] += len(every) - len(events)
        state = st.windows.setdefault(w.name, {})
        touched: set[tuple] = set()
        retracted: list[tuple] = []
        if w.type != "session":
            for e in events:
                wins = [x for x in assign(w, e["_t"]) if x[1] + L > w_prev]
                if not wins:
                    wc["late"] += 1
                    st.dead.append(("late", w.name, e))
                    continue
                wc["counted"] += 1
                for s, en in wins:
                    k = (e["_key"], s, en)
                    state.setdefault(k, py_empty(w))
                    py_add(w, state[k], e)
                    touched.add(k)
        else:
            old = dict(state)
            pieces_by_key: dict = {}
            for e in events:
                s, en = assign(w, e["_t"], _gap(w, e))[0]
                ok = en + L > w_prev or any(k[0] == e["_key"] and k[1] <= en and s <= k[2] for k in old)
                if not ok:
                    wc["late"] += 1
                    st.dead.append(("late", w.name, e))
                    continue
                wc["counted"] += 1
                p = py_empty(w)
                py_add(w, p, e)
                pieces_by_key.setdefault(e["_key"], []).append(((s, en), p))
            for key, new_pieces in pieces_by_key.items():
                olds = [((k[1], k[2]), v, k) for k, v in old.items() if k[0] == key]
                allp = [(b, p, k) for b, p, k in olds] + [(b, p, None) for b, p in new_pieces]
                for (ms, me), idx in merge([b for b, _, _ in allp]):
                    acc = py_empty(w)
                    for i in idx:
                        acc = py_merge(w, acc, allp[i][1])
                    for i in idx:
                        okey = allp[i][2]
                        if okey is not None:
                            del state[okey]
                            if okey[2] <= w_prev and (okey[1], okey[2]) != (ms, me):
                                retracted.append(okey)
                    state[(key, ms, me)] = acc
                    if any(allp[i][2] is None for i in idx):  # an event of this epoch joined it
                        touched.add((key, ms, me))
        rows = []
        for k, p in state.items():
            if k[2] <= w_new and (k in touched or k[2] > w_prev):
                rows.append(
                    {"key": k[0], "window_start": k[1], "window_end": k[2], **py_finalize(w, p), "retract": False}
                )
        for k in retracted:
            rows.append({"key": k[0], "window_start": k[1], "window_end": k[2], "retract": True})
        view = st.view.setdefault(w.name, {})
        for r in rows:
            ident = (r["key"], r["window_start"], r["window_end"])
            if r["retract"]:
                view.pop(ident, None)
            else:
                view[ident] = {x: y for x, y in r.items() if x != "retract"}
        st.windows[w.name] = {k: v for k, v in state.items() if k[2] + L > w_new}
        emitted[w.name] = rows
    # An id is remembered while a window that counted it is live: t + extent + L, or
    # longer while the session holding it (its key, start <= t < end) is still open.
    for i, (x, key, t) in list(st.ids.items()):
        for w in spec.windows:
            if w.type == "session":
                x = max([x] + [k[2] + L for k in st.windows[w.name] if k[0] == key and k[1] <= t < k[2]])
        st.ids[i] = (x, key, t)
    st.ids = {i: v for i, v in st.ids.items() if v[0] > w_new}
    st.watermark = w_new
    return emitted


def batch(spec: Pipeline, w: WindowSpec, events: list[dict]) -> dict[tuple, dict]:
    """A plain batch aggregation over all events (closed stream, nothing late)."""
    acc: dict[tuple, dict] = {}
    if w.type != "session":
        for e in events:
            for s, en in assign(w, e["_t"]):
                acc.setdefault((e["_key"], s, en), py_empty(w))
                py_add(w, acc[(e["_key"], s, en)], e)
    else:
        by_key: dict = {}
        for e in events:
            by_key.setdefault(e["_key"], []).append(e)
        for key, evs in by_key.items():
            wins = [assign(w, e["_t"], _gap(w, e))[0] for e in evs]
            for (s, en), idx in merge(wins):
                p = py_empty(w)
                for i in idx:
                    py_add(w, p, evs[i])
                acc[(key, s, en)] = p
    return {k: {"key": k[0], "window_start": k[1], "window_end": k[2], **py_finalize(w, v)} for k, v in acc.items()}


# ------------------------------------------------------------------ comparing committed results


def batch_of_clicks(spec: Pipeline, events: list[dict], fields: tuple[str, ...] = ("amount",)) -> dict[str, list[dict]]:
    """`batch` of every window over events of the test pipelines' shape (`ts`, `user` and `fields`),
    each window's rows in (key, start, end) order."""
    evs = [{"_t": e["ts"], "_key": e["user"], **{field_column(f): e[f] for f in fields}} for e in events]
    return {w.name: [r for _, r in sorted(batch(spec, w, evs).items())] for w in spec.windows}


def same_value(got: Any, want: Any) -> bool:
    """An aggregate equal to the reference's: sums and averages are decimal(38, 9), so to 9 places."""
    import pytest

    if got is None or want is None or isinstance(got, str) or isinstance(want, str):
        return got == want  # (the value aggregates' text)
    return float(got) == pytest.approx(float(want), rel=1e-12, abs=1e-9)


def assert_same_rows(spec: Pipeline, got: dict[str, list[dict]], want: dict[str, list[dict]]) -> None:
    """Per window: the same (key, start, end) rows in the same order, each aggregate `same_value`."""
    for w in spec.windows:
        rows, expected = got[w.name], want[w.name]
        assert [(r["key"], r["window_start"], r["window_end"]) for r in rows] == [
            (r["key"], r["window_start"], r["window_end"]) for r in expected
        ], w.name
        for g, x in zip(rows, expected, strict=True):
            for a in w.aggregates:
                assert same_value(g[a.name], x[a.name]), (w.name, a.name, g, x)
