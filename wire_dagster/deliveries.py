"""A computation's derived input (computestage.py): which rows of the upstream's partitions an
epoch delivers, and which set-aside (filtered, malformed) rows it counts.

A stage over a derived stream syncs to the upstream's committed epochs and reads again each
upstream partition whose content changed. Of those rows, per key, it delivers the ones that
appeared or changed (`sync_changes`: `_update` for a change, `_retract` for a row gone), and
counts a set-aside row once per version (`new_aside`), not each time its partition is read
again for another row. Both keep a small carried memory of the rows not final yet (a row is
final once the upstream's W passes its window end plus the upstream's allowed lateness), so
the memory is bounded by the upstream's open windows. Pure: no store, no Spark.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from .computation import Item
from .events import ERR, JSON, ROW, SEG, SEQ, TIME

#: The carried rows of a derived input's memory (`sync_changes`) are under this computation
#: name, which no computation can have (a name has 1 to 64 characters).
MEMORY = ""


@dataclass(frozen=True)
class Sync:
    """An epoch of a pipeline whose input is a derived stream (an upstream window): per input,
    the upstream partitions it read again (the ones whose content changed since the previous
    epoch, removed ones included), the upstream's allowed lateness and its partitioning."""

    read: dict[str, tuple[int, ...]]
    lateness: dict[str, int]
    partitioning: dict[str, tuple[int, int]]  # input -> (start, size) of the upstream's partitions

    def partition(self, inp: str, t: int) -> int:
        start, size = self.partitioning[inp]
        return start + ((t - start) // size) * size


def _identity(inp: str, rec: dict) -> str:
    """A derived row's identity: its input and window (key, start, end), as the upstream's."""
    return json.dumps([inp, rec.get("key"), rec.get("window_start"), rec.get("window_end")])


def _delivery(inp: str, ident: str, rec: dict, n: int, retract: bool = False) -> Item:
    """The n-th delivery (0: the first) of a derived row: its fields, `_update` (it replaces a
    row delivered before) and, for a row gone upstream, `_retract`; its id, from its identity
    and n, is the same on every replay."""
    body = {**rec, "_update": n > 0}
    if retract:
        body["_retract"] = True
    oid = "d:" + hashlib.sha256(ident.encode()).hexdigest()[:20] + f"/{n}"
    return Item(int(rec["window_end"]) - 1, inp, int(rec["window_start"]), n, body, oid)


def sync_changes(memory: dict, rows: list[Item], sync: Sync, w_prev: int, w_new: int) -> tuple[list[Item], dict]:
    """One key's upstream rows of an epoch (`rows`: the rows of the partitions it read again, as
    its input reads them) -> the deliveries (`_delivery`), and the key's memory after the epoch.

    A row is delivered when it first appears (its window fired upstream) and again, with
    `_update: true`, each time a late firing changes it; a row gone upstream (a session merged
    into another, a row the input's filter now refuses) is delivered once more with
    `_retract: true`. The memory holds, per row not yet final, its fields as last delivered and
    how many times it was delivered: a row is final once the upstream's W passes its
    window_end + the upstream's allowed lateness (no late firing can change it then), so the
    memory is bounded by the upstream's open windows, and a row final before the epoch is never
    delivered again (it was, when it appeared: it appears before it is final)."""
    mem = dict(memory)
    out: list[Item] = []
    present = set()
    for it in rows:
        rec, inp = it.record, it.seg
        if int(rec["window_end"]) + sync.lateness[inp] <= w_prev:
            continue  # final before this epoch: delivered when it appeared
        ident = _identity(inp, rec)
        present.add(ident)
        prior = mem.get(ident)
        if prior is not None and prior[0] == rec:
            continue  # unchanged (its partition changed for another row)
        n = 0 if prior is None else int(prior[1])
        out.append(_delivery(inp, ident, rec, n))
        mem[ident] = [rec, n + 1]
    for ident in sorted(memory):
        inp = json.loads(ident)[0]
        rec, n = memory[ident]
        if ident not in present and sync.partition(inp, int(rec["window_end"]) - 1) in sync.read.get(inp, ()):
            out.append(_delivery(inp, ident, rec, int(n), retract=True))
            del mem[ident]

    def live(ident: str) -> bool:
        return int(mem[ident][0]["window_end"]) + sync.lateness[json.loads(ident)[0]] > w_new

    return out, {i: mem[i] for i in sorted(mem) if live(i)}


def not_final(events: pa.Table, sync: Sync, w_prev: int) -> pa.Table:
    """The rows of a derived input's partitions read again whose window was not final before the
    epoch (`window_end + the upstream's lateness > W_prev`): a final one was delivered, filtered
    or made a dead letter when it appeared, and is not again when its partition changes for
    another row."""
    lateness = pa.array([sync.lateness[s] for s in events[SEG].to_pylist()], pa.int64())
    end_plus = pc.add(pc.add(events[TIME], 1), lateness)  # pyright: ignore[reportAttributeAccessIssue]
    keep = pc.greater(end_plus, pa.scalar(w_prev, pa.int64()))  # pyright: ignore[reportAttributeAccessIssue]
    return events.filter(pc.fill_null(keep, True))


#: The carried memory of a derived input's set-aside rows (`new_aside`): one row, this
#: computation name (no computation's: a name has no colon) and a null key (a set-aside row has
#: no key, so the rows and their memory meet in the null key's bucket).
ASIDE = "aside:"


def new_aside(events: pa.Table, memory: dict, sync: Sync, w_new: int) -> tuple[pa.Table, dict]:
    """A derived input's rows of the epoch (not final, `not_final`) less the malformed and
    filtered ones already counted, and the memory after the epoch: a set-aside row is counted
    (and a malformed one made a dead letter) once per version — when it appears, or when its
    content or reason changes — not each time its partition is read again for another row.

    The memory holds, per set-aside row not yet final, its window end and version (a digest of
    its reason and record): so it is bounded by the upstream's open windows, as `sync_changes`'s.
    A row leaves it once final, or once gone from a partition read again (an event now, or
    removed upstream: if it comes back set aside, that is a new version)."""
    err = events[ERR].to_pylist()
    if not memory and all(e is None for e in err):
        return events, {}
    d = events.select([SEG, SEQ, ROW, TIME, JSON]).to_pydict()
    mem, keep, present = dict(memory), [], set()
    for i, e in enumerate(err):
        if e is None:
            keep.append(True)
            continue
        inp, text = d[SEG][i], d[JSON][i]
        rec = json.loads(text) if text is not None else {}
        ident = _identity(inp, rec) if "window_end" in rec else json.dumps([inp, None, d[SEQ][i], d[ROW][i]])
        end = int(rec["window_end"]) if "window_end" in rec else int(d[TIME][i]) + 1
        version = hashlib.sha256(f"{e}\x00{text}".encode()).hexdigest()[:20]
        present.add(ident)
        keep.append(mem.get(ident) != [end, version])
        mem[ident] = [end, version]
    for ident in sorted(memory):
        inp = json.loads(ident)[0]
        if ident not in present and sync.partition(inp, int(memory[ident][0]) - 1) in sync.read.get(inp, ()):
            del mem[ident]
    live = {i: v for i, v in sorted(mem.items()) if int(v[0]) + sync.lateness[json.loads(i)[0]] > w_new}
    return events.filter(pa.array(keep, pa.bool_())), live
