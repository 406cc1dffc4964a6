"""User computations (DESIGN §4 "Computation API", §6): MillWheel's per-key code with persistent
state and event-time timers, run inside Wire's exactly-once epochs.

A computation is a class with two methods, called one key at a time::

    from wire_dagster.computation import Computation

    class QuietAlert(Computation):
        def process_record(self, ctx, record):      # record: dict of the event's fields
            ctx.state["last"] = max(ctx.state.get("last", ctx.time), ctx.time)
            ctx.set_timer("quiet", ctx.state["last"] + 1_800_000)   # replaces the timer "quiet"
        def process_timer(self, ctx, timer):        # timer.tag, timer.time; fires once W > time
            ctx.produce({"user": ctx.key, "quiet_since": ctx.state["last"]}, "alerts")

MillWheel's names: `ProcessRecord` = `process_record`, `ProcessTimer` = `process_timer`,
`SetTimer` = `ctx.set_timer`, `ProduceRecord` = `ctx.produce`, `MutablePersistentState` =
`ctx.state` (a dict of JSON-serialisable values, per key, committed with the epoch).

The guarantees, one sentence each (`run_key` implements them, for one key and one epoch):

- A record is delivered once the watermark has passed its time (`t < W`): records at or after
  `W` wait in the key's carried buffer for a later epoch, so on-time records are delivered in
  (event time, source position) order whatever the epoch splits.
- A record that arrives already behind the previous watermark (`t < W_prev`: *late*) is
  delivered in the epoch it arrives, in that order among the epoch's records, with
  `ctx.is_late` true: the user decides what it means.
- A timer at T fires once `W > T`, after the records with time <= T and before those with time
  > T; timers due together fire in (time, tag) order; `set_timer` replaces the key's timer of
  the same tag, `clear_timer` removes it. At a closed stream (W = +inf) every timer fires.
- Per key, calls are serial; state, timers and produced records of a call that raises are
  rolled back to before it, and the record (or timer) becomes a dead letter
  `error: <Type>: <message>`; the next record goes on.
- A produced record's id is (computation, what caused it: the input record's source position
  or the timer's own origin, its index in that call): the same on every retry, restart, rewind
  and backfill, and independent of epoch splits.
- The computation's output watermark is min(input W, its oldest pending timer): no record it
  will still produce from a timer is older than that (buffered records are all at or after W).

**Over a derived stream** (the input is another pipeline's window, DESIGN §6): a record is a
result row of the window — `key`, `window_start`, `window_end`, its aggregates, the pipeline's
derived fields — at event time `window_end - 1`, keyed by the input's `key:`, and `_update`:

- A row is delivered once its window fires upstream (the stage's W is the upstream's: it is
  then behind W, never buffered), in event-time order per key, exactly once.
- A late firing upstream replaces a row: the row is delivered again with its new values and
  `_update: true` (late: `ctx.is_late`); a row gone upstream (a session merged into another,
  a row the input's filter now refuses) is delivered once more, its last values, with
  `_update: true, _retract: true`. This is what Flink's DataStream API gives a function after
  a window with allowed lateness (every firing, late ones included, is an element downstream;
  Flink's Table API marks them UPDATE_AFTER / DELETE, which `_update` / `_retract` mirror) and
  Spark's update output mode: the row is known as soon as the window fires, not only once the
  upstream's lateness has passed, and user code cannot be un-run, so the change is told to it.
  A computation that wants final rows only keeps the row in `ctx.state` and sets a timer at
  `window_end + the upstream's allowed lateness`: it fires once no late firing can change it.
- Ids: a delivery's origin is the row's identity (input, key, window) and how many times it was
  delivered before, so a produced record's id is the same on every retry, restart and rewind
  (the sync replays the recorded upstream epochs: computestage.py).

Nothing here imports Spark or Dagster: `run_key` is a pure function the Spark task calls per
key (computestage.py) and tests call directly.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

#: Timer firings per key per epoch at most: a timer that re-arms itself at or before W (a periodic
#: timer at a closed stream, W = +inf) would fire forever. The timers left wait for the next epoch
#: and hold the output watermark back (a pending timer), never silently dropped.
MAX_FIRINGS_PER_KEY = 10_000


class Timer(NamedTuple):
    """A firing timer: its tag (one timer per tag and key) and its event time (ms)."""

    tag: str
    time: int


class Computation:
    """Base class of user computations (MillWheel's `Computation`). Override either method; the
    default does nothing. One instance serves many keys: keep per-key data in `ctx.state`."""

    def process_record(self, ctx: Context, record: dict) -> None:
        """Called once per record of key `ctx.key`, in event-time order (see the module doc)."""

    def process_timer(self, ctx: Context, timer: Timer) -> None:
        """Called once a timer of `ctx.key` is due (the watermark passed `timer.time`)."""


@dataclass(frozen=True)
class Item:
    """A record of the input, as delivered to a computation: its event time, source position
    (segment, chunk, row: unique in the stream, and the tie-break of equal times) and fields.
    A row of a derived stream has no source position: `oid` names it instead (computestage's
    `sync_changes`: the row's identity and how many times it was delivered before), and its
    position is (input, window_start, delivery)."""

    t: int
    seg: str
    seq: int
    row: int
    record: dict
    oid: str = ""

    @property
    def origin(self) -> str:
        return self.oid or f"r:{self.seg}/{self.seq}/{self.row}"

    def to_json(self) -> list:
        body = [self.t, self.seg, self.seq, self.row, self.record]
        return [*body, self.oid] if self.oid else body

    @classmethod
    def from_json(cls, x: list) -> Item:
        return cls(int(x[0]), str(x[1]), int(x[2]), int(x[3]), x[4], str(x[5]) if len(x) > 5 else "")


@dataclass
class KeyState:
    """What a key carries from one epoch to the next: the user's state, the pending timers
    (tag -> (time, origin)), and the records not yet delivered (time >= W)."""

    state: dict = field(default_factory=dict)
    timers: dict[str, tuple[int, str]] = field(default_factory=dict)
    buffer: list[Item] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.state and not self.timers and not self.buffer

    def to_json(self) -> str:
        body = {
            "state": self.state,
            "timers": sorted([tag, t, o] for tag, (t, o) in self.timers.items()),
            "buffer": [i.to_json() for i in sorted(self.buffer, key=_order)],
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> KeyState:
        if not text:
            return cls()
        d = json.loads(text)
        return cls(
            d.get("state") or {},
            {tag: (int(t), o) for tag, t, o in d.get("timers") or []},
            [Item.from_json(x) for x in d.get("buffer") or []],
        )


@dataclass(frozen=True)
class Produced:
    """One record a computation produced: its output, key, event time, stable id and fields."""

    output: str
    key: Any
    time: int
    id: str
    record: dict


@dataclass(frozen=True)
class Failure:
    """A record or timer the user's code raised on: a dead letter `error: <Type>: <message>`."""

    reason: str
    item: Item | None  # the record, or None for a timer
    timer: Timer | None


@dataclass
class KeyResult:
    carried: KeyState
    produced: list[Produced]
    failures: list[Failure]
    delivered: int = 0  # records delivered (the late ones included, and the ones that raised)
    late: int = 0  # of them, records that arrived behind W_prev
    fired: int = 0  # timers fired (the ones that raised included)
    #: The event time of each delivered record and each fired timer, in the order of the calls.
    delivered_at: list[int] = field(default_factory=list)
    fired_at: list[int] = field(default_factory=list)

    @property
    def pending_timer(self) -> int | None:
        """The oldest pending timer's time (None: none)."""
        return min((t for t, _ in self.carried.timers.values()), default=None)


class Context:
    """What `process_record` and `process_timer` see of the key they run for."""

    def __init__(self, name: str, key: Any, watermark: int, outputs: tuple[str, ...], ks: KeyState):
        self.key = key
        #: The epoch's input watermark W: every record before it is delivered by the end of the
        #: epoch. Results that read it depend on how the input was split into epochs.
        self.watermark = watermark
        #: Whether the record being processed arrived behind the previous watermark (late).
        self.is_late = False
        #: The event time of the record being processed, or of the firing timer.
        self.time = 0
        self.state: dict = ks.state
        self._name, self._outputs, self._ks = name, outputs, ks
        self._origin = ""
        self._firing: Timer | None = None
        self._produced: list[Produced] = []

    def set_timer(self, tag: str, time: int) -> None:
        """Fire `process_timer(Timer(tag, time))` once the watermark passes `time`; replaces this
        key's timer of the same tag."""
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"set_timer: the tag must be a non-empty string, got {tag!r}")
        if isinstance(time, bool) or not isinstance(time, int):
            raise TypeError(f"set_timer: the time must be int milliseconds, got {type(time).__name__}")
        origin = "t:" + hashlib.sha256(f"{self._origin}\x00{tag}\x00{time}".encode()).hexdigest()[:20]
        self._ks.timers[tag] = (time, origin)

    def clear_timer(self, tag: str) -> None:
        """Remove this key's timer `tag`, if any."""
        self._ks.timers.pop(tag, None)

    def produce(self, record: dict, output: str, time: int | None = None) -> None:
        """Emit `record` (a dict of JSON-serialisable values) into `output`, at event time `time`
        (default: the record's or the firing timer's)."""
        if output not in self._outputs:
            raise ValueError(
                f"produce: {output!r} is not an output of computation {self._name!r}; "
                f"declare it in outputs: {list(self._outputs)}"
            )
        if not isinstance(record, dict):
            raise TypeError(f"produce: the record must be a dict, got {type(record).__name__}")
        if time is not None and (isinstance(time, bool) or not isinstance(time, int)):
            raise TypeError(f"produce: the time must be int milliseconds, got {type(time).__name__}")
        body = json.loads(json.dumps(record))  # a copy, and a TypeError for what JSON cannot hold
        rid = f"{self._name}|{self._origin}|{len(self._produced)}"
        self._produced.append(Produced(output, self.key, self.time if time is None else time, rid, body))


_SCALARS = frozenset((str, int, float, bool, type(None)))


def _flat(d: dict) -> bool:
    """Whether `d` reads back from its JSON as itself: text keys, scalar values (the common state)."""
    return all(type(k) is str and type(v) in _SCALARS for k, v in d.items())


def _order(i: Item) -> tuple:
    return (i.t, i.seg, i.seq, i.row, i.oid)


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"error: {type(e).__name__}: {text}"[:1000]


def run_key(
    comp: Computation,
    name: str,
    outputs: tuple[str, ...],
    key: Any,
    carried: KeyState | None,
    records: list[Item],
    w_prev: int,
    w_new: int,
) -> KeyResult:
    """One key's epoch: the records of the epoch (`records`, any order) and the key's carried
    state, timers and buffer → the new carried state, produced records and failures (see the
    module doc for the order of calls). The carried state given is not modified."""
    ks = KeyState.from_json(carried.to_json()) if carried is not None else KeyState()
    pending = ks.buffer + list(records)
    due = sorted((i for i in pending if i.t < w_new), key=_order)
    ks.buffer = sorted((i for i in pending if i.t >= w_new), key=_order)
    ctx = Context(name, key, w_new, outputs, ks)
    out = KeyResult(ks, [], [])
    fired = 0

    # The state as JSON after the last call that succeeded: the snapshot a failing call rolls back
    # to, and the check that the state stays JSON (one dumps per call, no deep copy).
    snap = json.dumps(ks.state)

    def call(origin: str, t: int, fn, arg, item: Item | None, timer: Timer | None) -> None:
        nonlocal snap
        before_timers = dict(ks.timers)
        ctx._origin, ctx.time, ctx._produced = origin, t, []
        try:
            fn(ctx, arg)
            if ctx.state is not ks.state and not isinstance(ctx.state, dict):  # the user rebound it
                raise TypeError(f"ctx.state must stay a dict, got {type(ctx.state).__name__}")
            after = json.dumps(ctx.state)  # a TypeError if the state is no longer JSON
        except Exception as e:  # the user's code: a dead letter, and the key goes on
            ks.state, ks.timers = json.loads(snap), before_timers
            ctx.state = ks.state
            out.failures.append(Failure(_reason(e), item, timer))
            return
        finally:
            ctx._firing = None
        # As the next epoch would read it back (int keys become text, tuples lists): the same state
        # whether the next call is in this epoch or a later one (a flat dict of text keys and
        # scalars already is).
        if not _flat(ctx.state):
            ctx.state = json.loads(after)
        ks.state, snap = ctx.state, after
        out.produced.extend(ctx._produced)

    def fire_until(limit: int) -> None:
        """Fire the due timers with time < limit, in (time, tag) order (new ones included)."""
        nonlocal fired
        while ks.timers and fired < MAX_FIRINGS_PER_KEY:
            t, tag = min((t, tag) for tag, (t, _) in ks.timers.items())  # the next in (time, tag) order
            if t >= limit:
                return
            _, origin = ks.timers.pop(tag)
            timer = Timer(tag, t)
            fired += 1
            out.fired_at.append(t)
            ctx.is_late = False
            ctx._firing = timer
            call(origin, t, comp.process_timer, timer, None, timer)

    for item in due:
        fire_until(min(item.t, w_new))
        ctx.is_late = item.t < w_prev
        out.delivered += 1
        out.delivered_at.append(item.t)
        out.late += ctx.is_late
        call(item.origin, item.t, comp.process_record, dict(item.record), item, None)
    fire_until(w_new)
    out.fired = fired
    return out


# ---------------------------------------------------------------------------
# Loading the user's class


def load_class(code: str, directory: str | None, where: str) -> type:
    """The class `module:Class` names; one line naming `where` (the pipeline file and the code
    reference) when it cannot be imported, is not a class, or lacks `process_record` or
    `process_timer`.

    A module beside the pipeline file (`directory/module.py`, or a package there) is loaded from
    that file under a name of its own (`wire_user_<hash of its path and source>`), not through
    the import cache: two pipeline directories may each hold a `quiet.py`, and an edited module
    is loaded afresh. The directory is also put on the import path, for the modules it imports.
    Anything else is imported by its name (an installed package)."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    from .errors import WireInputError

    module, _, cls = code.partition(":")
    if directory and directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        mod = _load_beside(module, Path(directory)) if directory else None
        if mod is None:
            mod = importlib.import_module(module)
    except Exception as e:
        raise WireInputError(f"{where}: cannot import module {module!r} ({_reason(e)[7:]})") from None
    obj = getattr(mod, cls, None)
    if not isinstance(obj, type):
        raise WireInputError(f"{where}: module {module!r} has no class {cls!r}")
    missing = [m for m in ("process_record", "process_timer") if not callable(getattr(obj, m, None))]
    if missing:
        raise WireInputError(
            f"{where}: class {cls!r} has no method {' or '.join(missing)}; subclass "
            "wire_dagster.computation.Computation and define process_record / process_timer"
        )
    return obj


def _load_beside(module: str, directory) -> Any:
    """Module `module` from its file under `directory` (None: no such file there)."""
    import importlib.util
    import sys

    base = directory.joinpath(*module.split("."))
    path = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
    if path is None:
        return None
    source = path.read_bytes()
    digest = hashlib.sha256(str(path.resolve()).encode() + b"\x00" + source).hexdigest()[:16]
    name = f"wire_user_{digest}_{module.replace('.', '_')}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod
