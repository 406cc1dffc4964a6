"""Pipeline files (DESIGN §4): YAML parsed and validated into typed objects.

Every mistake raises `WireInputError` with one line naming the field and the
fix. Validation happens at construction (pydantic), never later.

A file may declare more than one pipeline: a stage with a join or a derived input that also
reads raw streams is expanded where files load (`load_pipelines`, the one loader of
`find_pipeline`, `readers_of` and `load_all`) into a generated pipeline `<stage>__<input>` per
raw input, committing that stream's accepted records, and the stage reading those as derived
inputs (expand.py). Every other file declares one pipeline, as it always did.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from .errors import WireInputError
from .sqlexpr import expression_columns, quote_sides
from .timeutil import parse_duration, parse_iso

NAME_RE = re.compile(r"^[a-z0-9_-]{1,64}$")
_F = r"([A-Za-z_][A-Za-z0-9_.]*)"
# The second argument: a field (arg_max's `by`) or a number (approx_quantile's `q`), checked apart.
AGG_RE = re.compile(rf"^\s*([a-z_]+)\s*(?:\(\s*{_F}\s*(?:,\s*([A-Za-z0-9_.+-]+)\s*)?\))?\s*$")
AggFunc = Literal[
    "count",
    "sum",
    "min",
    "max",
    "avg",
    "count_distinct",
    "arg_max",
    "arg_min",
    "first",
    "last",
    "approx_count_distinct",
    "approx_quantile",
]
AGG_FUNCS: tuple[str, ...] = get_args(AggFunc)
#: Aggregates kept as a sketch (Apache DataSketches, wire_dagster/sketches.py): HLL, t-digest.
SKETCH_FUNCS = ("approx_count_distinct", "approx_quantile")
#: Aggregates whose result is a value of their field, as text (a key is text too): arg_max(f, by),
#: arg_min(f, by) (ties: the smallest f), first(f) and last(f) (by event time, then position).
VALUE_FUNCS = ("arg_max", "arg_min", "first", "last")
FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
NAME_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a derived field: top level, no dots


def check_name(value: str, what: str) -> str:
    """Pipeline, stream, segment and window names: `[a-z0-9_-]`, 1–64 chars; no `../`, no slashes."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise WireInputError(
            f"{what}: bad name {value!r}; use 1-64 characters from a-z, 0-9, '_' and '-' (no slashes, no '..')"
        )
    return value


class Aggregate(BaseModel):
    """One output column: `func(field)` (`count` has no field; `arg_max(field, by)`)."""

    model_config = ConfigDict(frozen=True)
    name: str
    func: AggFunc
    field: str | None = None
    by: str | None = None  # arg_max, arg_min: the number whose extreme picks the event
    q: float | None = None  # approx_quantile: the quantile, in [0, 1]

    @property
    def numeric(self) -> bool:
        return self.func in ("sum", "min", "max", "avg", "approx_quantile")


class JoinColumn(BaseModel):
    """One output column of a windowed join: `name: left.column` or `right.column`."""

    model_config = ConfigDict(frozen=True)
    name: str
    side: Literal["left", "right"]
    column: str


class WindowSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    # "output": a computation's output (computestage.py), a record at t as the row [t, t + 1)
    type: Literal["tumbling", "sliding", "session", "join", "output"]
    size: int = 0  # ms; tumbling and sliding
    slide: int = 0  # ms; sliding (tumbling: == size)
    offset: int = 0  # ms; alignment to the epoch plus offset
    gap: int = 0  # ms; session
    gap_field: str | None = None  # session: per-event gap (ms) field
    aggregates: tuple[Aggregate, ...]
    # join: pairs of `left` and `right` records with equal keys in the same tumbling or sliding
    # window (`size`, `slide`, `offset`), as `select` columns, where the optional `where` (SQL over left./right.) holds
    left: str | None = None
    right: str | None = None
    select: tuple[JoinColumn, ...] = ()
    where: str | None = None
    input: str | None = None  # tumbling, sliding, session: the one input it reads (None: every input)

    @property
    def extent(self) -> int:
        """How far past an event's time its windows can end (upper bound, ms)."""
        return self.gap if self.type == "session" else self.size

    @property
    def step(self) -> int:
        """The alignment step partitions must be a multiple of."""
        return {"tumbling": self.size, "sliding": self.slide, "join": self.slide}.get(self.type, 0)


class Orchestration(BaseModel):
    """How Dagster drives a pipeline (not part of the results' fingerprint)."""

    model_config = ConfigDict(frozen=True)
    # Dagster's sensor daemon visits the sensors every 5 s and evaluates one whose last tick
    # started at least this long ago; at 5 s a visit that comes a few ms early skips to the next
    # (11 of 36 gaps were 10 s), at 4 s every visit evaluates (0 of 41): BENCHMARKS.md, latency.
    sensor_interval_s: int = 4
    sensor_running: bool = True
    schedule: str | None = None  # cron; default: every partition
    max_watermark_lag: int = 300_000  # ms, asset check bound
    max_dead_letter_rate: float = 0.25  # asset check bound
    keep_epochs: int = 10
    max_epochs_per_run: int = 100


class Input(BaseModel):
    """One input of a pipeline of several, or of a derived stream (DESIGN §4 `inputs:`): a raw
    stream, read with its own key and filter (its time and id are the stream's), or another
    pipeline's committed window (`pipeline`, `output`: a derived stream, whose records are the
    window's result rows with event time `window_time` = window_end - 1)."""

    model_config = ConfigDict(frozen=True)
    name: str
    stream: str  # "" for a derived stream
    time_field: str
    id_field: str | None
    key_fields: tuple[str, ...]
    where: str | None = None
    pipeline: str | None = None  # a derived stream: the pipeline whose window it reads ...
    output: str | None = None  # ... and the window
    # A landing prefix (DESIGN §4 Sources): objects other tools write there are adopted into the
    # stream (wire_dagster/landing.py); segment_by names their segment by a regex on the key.
    landing: str | None = None
    segment_by: str | None = None
    rescan: int | None = None  # ms between full listings of a landing segment (late flushes, rewrites)


class ComputationSpec(BaseModel):
    """A user computation (DESIGN §4 `computations:`): `code` (`module:Class`, imported with the
    pipeline file's directory on the path) run per key of `input`, producing into `outputs`."""

    model_config = ConfigDict(frozen=True)
    name: str
    input: str
    code: str
    outputs: tuple[str, ...]


#: The event time of a derived stream's records: their window's last instant (Flink's window_time).
WINDOW_TIME = "window_time"


#: Between an input's name and its segment's in a pipeline of several inputs: `bids.0`.
INPUT_SEP = "."


class Pipeline(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    stream: str
    key_fields: tuple[str, ...]  # the key: one field, several (a composite key), or none
    time_field: str
    id_field: str | None
    max_out_of_orderness: int
    idle_timeout: int
    clock: Literal["event", "ingestion"] = "event"
    max_event_time_lag: int = 0
    allowed_lateness: int
    partition: int
    start: int  # first partition's start (epoch ms)
    end: int | None = None  # end of the last partition (epoch ms); None: open-ended
    max_future: int  # events more than this past ingestion time are malformed (out of range)
    chunk_rows: int
    chunk_bytes: int  # a chunk's records' bytes at most (ingest.InputFile.end_within), but one record
    max_chunks_per_epoch: int
    max_record_bytes: int
    windows: tuple[WindowSpec, ...]
    where: str | None = None  # a SQL boolean over the record: the records it is not true for are filtered out
    fields: tuple[tuple[str, str], ...] = ()  # derived fields: (name, SQL expression over the record)
    # Several raw inputs (a union): each its stream, key and filter; the fields above are the
    # first's. Empty for a pipeline of one input, whose segments keep their own names.
    inputs: tuple[Input, ...] = ()
    # The landing prefix of a pipeline of one input (landing.py); of several: each Input's.
    landing: str | None = None
    segment_by: str | None = None
    rescan: int | None = None
    # User computations (computestage.py); their outputs are the pipeline's windows of type "output".
    computations: tuple[ComputationSpec, ...] = ()
    orchestration: Orchestration = Orchestration()
    source: str | None = None  # the file it came from (not part of the fingerprint)

    @property
    def key_field(self) -> str | None:
        """The key's one field (None without a key; a composite key: `key_fields`)."""
        return self.key_fields[0] if len(self.key_fields) == 1 else None

    def for_input(self, inp: Input) -> Pipeline:
        """The pipeline as it reads input `inp` (its stream, time, id, key and filter)."""
        return self.model_copy(
            update={
                "stream": inp.stream,
                "time_field": inp.time_field,
                "id_field": inp.id_field,
                "key_fields": inp.key_fields,
                "where": inp.where,
                "inputs": (),
                "landing": inp.landing,
                "segment_by": inp.segment_by,
                "rescan": inp.rescan,
            }
        )

    @property
    def derived(self) -> tuple[Input, ...]:
        """The pipeline's derived inputs (other pipelines' windows); then it has no raw one (a
        file's raw inputs beside derived ones, or joined, are read through generated pipelines
        and rewritten as derived inputs of them when the file loads: expand.py)."""
        return tuple(i for i in self.inputs if i.pipeline)

    @property
    def readers(self) -> dict[str, Pipeline]:
        """How the pipeline reads each raw input, by the prefix of its segments' names in the
        remap (`<input>.`; "" for a pipeline of one input, whose segments keep their names)."""
        if not self.inputs:
            return {"": self}
        return {i.name + INPUT_SEP: self.for_input(i) for i in self.inputs if not i.pipeline}

    def reader_of(self, segment: str) -> Pipeline:
        """How the pipeline reads the input a (remap) segment belongs to."""
        for prefix, spec in self.readers.items():
            if segment.startswith(prefix):
                return spec
        raise KeyError(segment)

    def own_stream(self, action: str) -> str:
        """The one raw stream the pipeline reads, to `action` (produce to, close) by the pipeline's
        name; one line naming what it reads instead (several streams, or other pipelines' windows)."""
        from .expand import feeders

        if fed := feeders(self):  # a stage's raw inputs, read through generated pipelines (expand.py)
            raise WireInputError(
                f"--pipeline: {self.name!r} reads its raw streams through {', '.join(fed)}; "
                f"{action} each stream with --stream (or --pipeline {fed[0]})"
            )
        if self.derived:
            raise WireInputError(
                f"--pipeline: {self.name!r} reads other pipelines' windows, not a stream; {action} their streams"
            )
        if self.inputs:
            raise WireInputError(
                f"--pipeline: {self.name!r} reads several streams ({', '.join(i.stream for i in self.inputs)}); "
                f"{action} each of them with --stream"
            )
        return self.stream

    def stream_level(self) -> Pipeline:
        """What every reader of the pipeline's stream shares, as a pipeline: its time and id, and
        the producer's limits. `wire produce` checks records against this only (a record is in the
        stream, or a dead letter of it, for every pipeline alike); the key, filter, fields and the
        value checks of the windows' fields are each pipeline's own, applied where it reads."""
        return self.model_copy(
            update={"key_fields": (), "windows": (), "where": None, "fields": (), "start": 0, "end": None}
        )

    def window(self, name: str) -> WindowSpec:
        for w in self.windows:
            if w.name == name:
                return w
        raise WireInputError(
            f"--window: pipeline {self.name!r} has no window {name!r}; choose one of: "
            + ", ".join(w.name for w in self.windows)
        )

    @property
    def numeric_fields(self) -> list[str]:
        return sorted(
            {a.field for w in self.windows for a in w.aggregates if a.field and a.numeric}
            | {a.by for w in self.windows for a in w.aggregates if a.by}
        )

    @property
    def distinct_fields(self) -> list[str]:
        """The fields read as text: count_distinct's values, and arg_max/arg_min/first/last's."""
        return sorted(
            {
                a.field
                for w in self.windows
                for a in w.aggregates
                if a.field and (a.func in ("count_distinct", "approx_count_distinct") or a.func in VALUE_FUNCS)
            }
        )

    @property
    def gap_fields(self) -> list[str]:
        return sorted({w.gap_field for w in self.windows if w.gap_field})

    @property
    def max_extent(self) -> int:
        return max(w.extent for w in self.windows)

    @property
    def dedups(self) -> bool:
        """Whether events are de-duplicated by id: some input declares an id field (an input of a
        union that declares none has events with no id, which are never duplicates)."""
        return bool(self.id_field) or any(i.id_field for i in self.inputs)

    def fingerprint(self) -> str:
        """Hash of everything that decides results (not of where the file lives). A pipeline of
        one key field and no filter or derived field hashes as it did before those existed."""
        body = self.model_dump(
            exclude={"source", "orchestration", "key_fields", "where", "fields", "inputs"}
            | {"landing", "segment_by", "rescan"}  # where records come from decides no result
        )
        if not body.get("computations"):  # as before computations existed, for a pipeline without
            body.pop("computations", None)
        for w in body["windows"]:  # as before `by` and joins existed, for what does not use them
            for a in w["aggregates"]:
                for k in ("by", "q"):
                    if a.get(k) is None:
                        a.pop(k, None)
            for k in ("left", "right", "select", "where", "input"):
                if not w.get(k):
                    w.pop(k, None)
        body["key_field"] = self.key_field
        if len(self.key_fields) > 1:
            body["key_fields"] = list(self.key_fields)
        if self.where is not None:
            body["where"] = self.where
        if self.fields:
            body["fields"] = [list(f) for f in self.fields]
        if self.inputs:  # where a stream's records come from (landing) decides nothing of the results
            body["inputs"] = [
                i.model_dump(mode="json", exclude={"landing", "segment_by", "rescan"}) for i in self.inputs
            ]
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def field_column(field: str) -> str:
    """The column a payload field is stored under in normalized chunks (`amount` -> `f_amount`)."""
    return "f_" + field.replace(".", "__")


def _req(d: dict, key: str, where: str):
    if key not in d or d[key] in (None, ""):
        raise WireInputError(f"{where}.{key}: missing; add it to the pipeline file")
    return d[key]


def _field(value: object, where: str) -> str:
    if not isinstance(value, str) or not FIELD_RE.match(value):
        raise WireInputError(f"{where}: bad field name {value!r}; use a name like user_id")
    return value


def _aggregates(raw: object, where: str) -> tuple[Aggregate, ...]:
    if not isinstance(raw, dict) or not raw:
        raise WireInputError(f"{where}.aggregates: missing; give a mapping like {{events: count, total: sum(amount)}}")
    out = []
    for name, expr in raw.items():
        if not isinstance(name, str) or not FIELD_RE.match(name) or name in ("key", "window_start", "window_end"):
            raise WireInputError(f"{where}.aggregates: bad output column name {name!r}")
        m = AGG_RE.match(str(expr))
        if not m or m.group(1) not in AGG_FUNCS:
            raise WireInputError(
                f"{where}.aggregates.{name}: unknown aggregate {expr!r}; use one of count, sum(f), min(f), max(f), "
                "avg(f), count_distinct(f), arg_max(f, by), arg_min(f, by), first(f), last(f), "
                "approx_count_distinct(f), approx_quantile(f, q)"
            )
        func, field, by = m.group(1), m.group(2), m.group(3)
        if func == "count" and field:
            raise WireInputError(f"{where}.aggregates.{name}: count takes no field; write `count`")
        if func != "count" and not field:
            raise WireInputError(f"{where}.aggregates.{name}: {func} needs a field name, e.g. {func}(amount)")
        q = None
        if func == "approx_quantile":
            q, by = _quantile(by, f"{where}.aggregates.{name}", field), None
        elif func in ("arg_max", "arg_min") and by is not None and not FIELD_RE.match(by):
            raise WireInputError(f"{where}.aggregates.{name}: bad field name {by!r}; use a name like amount")
        if func in ("arg_max", "arg_min") and not by:
            raise WireInputError(
                f"{where}.aggregates.{name}: {func} needs the field to return and the number to compare, "
                f"e.g. {func}(page, amount)"
            )
        if by and func not in ("arg_max", "arg_min"):
            raise WireInputError(f"{where}.aggregates.{name}: {func} takes one field, e.g. {func}({field})")
        out.append(Aggregate.model_validate({"name": name, "func": func, "field": field, "by": by, "q": q}))
    return tuple(out)


def _quantile(text: str | None, where: str, field: str | None) -> float:
    """approx_quantile's `q`: a number in [0, 1]."""
    try:
        q = float(text) if text is not None else None
    except ValueError:
        q = None
    if q is None or not 0 <= q <= 1:
        got = "no q" if text is None else f"q {text}"
        raise WireInputError(
            f"{where}: approx_quantile needs a q between 0 and 1 (got {got}), e.g. approx_quantile({field}, 0.95)"
        )
    return q


def _window(raw: object, i: int) -> WindowSpec:
    where = f"windows[{i}]"
    if not isinstance(raw, dict):
        raise WireInputError(f"{where}: expected a mapping with name, type and aggregates")
    name = check_name(_req(raw, "name", where), f"{where}.name")
    where = f"windows.{name}"
    wtype = _req(raw, "type", where)
    if wtype == "join":
        return _join(raw, name, where)
    known = {
        "tumbling": {"size", "offset", "input"},
        "sliding": {"size", "slide", "offset", "input"},
        "session": {"gap", "gap_field", "input"},
    }
    if wtype not in known:
        raise WireInputError(f"{where}.type: unknown window type {wtype!r}; use tumbling, sliding or session")
    extra = set(raw) - known[wtype] - {"name", "type", "aggregates"}
    if extra:
        raise WireInputError(
            f"{where}: unknown key(s) {sorted(extra)} for a {wtype} window; allowed: {sorted(known[wtype])}"
        )
    aggs = _aggregates(raw.get("aggregates"), where)
    inp = check_name(raw["input"], f"{where}.input") if raw.get("input") is not None else None
    if wtype == "session":
        gap = parse_duration(_req(raw, "gap", where), f"{where}.gap")
        if gap <= 0:
            raise WireInputError(f"{where}.gap: must be > 0")
        gap_field = _field(raw["gap_field"], f"{where}.gap_field") if raw.get("gap_field") else None
        return WindowSpec(name=name, type="session", gap=gap, gap_field=gap_field, aggregates=aggs, input=inp)
    size, slide, offset = _extent(raw, wtype, where)
    return WindowSpec(name=name, type=wtype, size=size, slide=slide, offset=offset, aggregates=aggs, input=inp)


def _extent(raw: dict, wtype: str, where: str) -> tuple[int, int, int]:
    """(size, slide, offset) of a tumbling or sliding window (`raw`: its mapping)."""
    size = parse_duration(_req(raw, "size", where), f"{where}.size")
    if size <= 0:
        raise WireInputError(f"{where}.size: must be > 0")
    slide = parse_duration(_req(raw, "slide", where), f"{where}.slide") if wtype == "sliding" else size
    if slide <= 0:
        raise WireInputError(f"{where}.slide: must be > 0")
    if slide > size:
        raise WireInputError(
            f"{where}.slide: {raw.get('slide')} is longer than size {raw.get('size')}; "
            "there would be gaps between windows — make slide <= size"
        )
    if size % slide:
        raise WireInputError(f"{where}.size: must be a multiple of slide so every event is in size/slide windows")
    offset = parse_duration(raw.get("offset", 0), f"{where}.offset")
    if offset >= slide:
        raise WireInputError(f"{where}.offset: must be shorter than the {'slide' if wtype == 'sliding' else 'size'}")
    return size, slide, offset


_SIDE_RE = re.compile(r"^\s*(left|right)\.([A-Za-z_][A-Za-z0-9_]*)\s*$")


def _join(raw: dict, name: str, where: str) -> WindowSpec:
    """`type: join`: `left`, `right` (inputs), `window: {type: tumbling|sliding, size[, slide]}`,
    `select`, `where`."""
    extra = set(raw) - {"name", "type", "left", "right", "window", "select", "where"}
    if extra:
        raise WireInputError(
            f"{where}: unknown key(s) {sorted(extra)} for a join; allowed: left, right, window, select, where"
        )
    left = check_name(_req(raw, "left", where), f"{where}.left")
    right = check_name(_req(raw, "right", where), f"{where}.right")
    win = _req(raw, "window", where)
    if (
        not isinstance(win, dict)
        or win.get("type") not in ("tumbling", "sliding")
        or set(win) - {"type", "size", "slide", "offset"}
    ):
        raise WireInputError(
            f"{where}.window: a join's window is tumbling or sliding, e.g. {{type: tumbling, size: 10s}} "
            "or {type: sliding, size: 10s, slide: 5s}"
        )
    size, slide, offset = _extent(win, str(win["type"]), f"{where}.window")
    sel = raw.get("select")
    if not isinstance(sel, dict) or not sel:
        raise WireInputError(f"{where}.select: give the output columns, e.g. {{name: left.name, n: right.n}}")
    cols = []
    for col, ref in sel.items():
        m = _SIDE_RE.match(str(ref))
        if not isinstance(col, str) or not NAME_FIELD_RE.match(col) or col in ("key", "window_start", "window_end"):
            raise WireInputError(f"{where}.select: bad output column name {col!r}")
        if not m:
            raise WireInputError(f"{where}.select.{col}: {ref!r} is not left.<column> or right.<column>")
        cols.append(JoinColumn(name=col, side=m.group(1), column=m.group(2)))  # pyright: ignore[reportArgumentType]  the pattern admits left|right only
    cond = raw.get("where")
    if cond is not None:
        if not isinstance(cond, str):
            raise WireInputError(f"{where}.where: expected a SQL expression, e.g. left.num >= right.maxn")
        expression_columns(quote_sides(cond), f"{where}.where")
    return WindowSpec(
        name=name,
        type="join",
        size=size,
        slide=slide,
        offset=offset,
        aggregates=(),
        left=left,
        right=right,
        select=tuple(cols),
        where=cond,
    )


def pipeline_from_dict(raw: object, source: str | None = None) -> Pipeline:
    """The pipeline a file's mapping declares; a stage with raw inputs that needs a derived
    stage's semantics (a join, or a derived input beside them) as the loader expands it
    (expand.py): its raw inputs read through the generated pipelines, which are checked too."""
    return pipelines_from_dict(raw, source)[-1]


def pipelines_from_dict(raw: object, source: str | None = None) -> list[Pipeline]:
    """Every pipeline a file's mapping declares: the one, or the pipelines generated for a
    stage's raw inputs and for its computations beside windows (expand.py), and last the stage."""
    from .expand import expand, needs_expansion, needs_split, split

    if needs_split(raw):
        assert isinstance(raw, dict)
        check_name(_req(raw, "name", "pipeline"), "name")  # the generated pipelines' names are made of it
        stage, generated = split(raw)
        *fed, own = pipelines_from_dict(stage, source)
        return [*fed, *(_pipeline_from_dict(g, source) for g in generated), own]
    if needs_expansion(raw):
        assert isinstance(raw, dict)
        # the names the generated pipelines' names are made of, checked before they are used
        check_name(_req(raw, "name", "pipeline"), "name")
        for n, inp in enumerate(raw.get("inputs") or []):
            if isinstance(inp, dict) and "pipeline" not in inp and "output" not in inp:
                check_name(_req(inp, "name", f"inputs[{n}]"), f"inputs[{n}].name")
        return [_pipeline_from_dict(d, source) for d in expand(raw)]
    return [_pipeline_from_dict(raw, source)]


def _pipeline_from_dict(raw: object, source: str | None = None) -> Pipeline:
    if not isinstance(raw, dict):
        raise WireInputError("pipeline file: expected a YAML mapping with name, stream, event, windows")
    allowed = {
        "name",
        "stream",
        "event",
        "inputs",
        "fields",
        "watermark",
        "lateness",
        "partition",
        "windows",
        "computations",
        "start",
        "end",
        "limits",
        "dagster",
    }
    extra = set(raw) - allowed
    if extra:
        raise WireInputError(f"pipeline: unknown key(s) {sorted(extra)}; allowed: {sorted(allowed)}")
    name = check_name(_req(raw, "name", "pipeline"), "name")
    inputs = _inputs(raw, name)
    first = inputs[0]
    stream, time_field, key_fields, id_field, where = (
        first.stream,
        first.time_field,
        first.key_fields,
        first.id_field,
        first.where,
    )
    fields = _derived(raw.get("fields"))
    wm = raw.get("watermark") or {}
    if not isinstance(wm, dict):
        raise WireInputError("watermark: expected a mapping (max_out_of_orderness, idle_timeout)")
    clock = wm.get("clock", "event")
    if clock not in ("event", "ingestion"):
        raise WireInputError(f"watermark.clock: unknown clock {clock!r}; use event or ingestion")
    lateness = raw.get("lateness") or {}
    if not isinstance(lateness, dict):
        raise WireInputError("lateness: expected a mapping like {allowed: 30s}")
    computations = _computations(raw, inputs) if "computations" in raw else ()
    wins = raw.get("windows") if not computations else _output_windows(raw, computations)
    if not isinstance(wins, list) or not wins:
        raise WireInputError("windows: missing; list at least one tumbling, sliding or session window")
    windows = tuple(w if isinstance(w, WindowSpec) else _window(w, i) for i, w in enumerate(wins))
    names = [w.name for w in windows]
    if len(set(names)) != len(names):
        raise WireInputError("windows: two windows share a name; give each a unique name")
    for w in windows:
        if w.input is not None and w.input not in {i.name for i in inputs}:
            raise WireInputError(
                f"windows.{w.name}.input: no input named {w.input!r}; choose one of: "
                + ", ".join(i.name for i in inputs)
            )
        if w.type != "join":
            continue
        # (a join of raw streams never reaches here: the loader expands its raw inputs, expand.py)
        for side, which in ((w.left, "left"), (w.right, "right")):
            if side not in {i.name for i in inputs}:
                raise WireInputError(
                    f"windows.{w.name}.{which}: no input named {side!r}; a join's sides are inputs of the "
                    "pipeline, choose one of: " + ", ".join(i.name for i in inputs)
                )
    if inputs[0].pipeline and any(w.type == "session" for w in windows):
        raise WireInputError(
            "windows: a session window over a derived stream is not built yet; use tumbling or sliding windows"
        )
    partition = parse_duration(_req(raw, "partition", "pipeline"), "partition")
    if partition <= 0:
        raise WireInputError("partition: must be > 0")
    for w in windows:
        if w.step and partition % w.step:
            raise WireInputError(
                f"partition: {raw['partition']} is not a multiple of window {w.name}'s "
                f"{'size' if w.type == 'tumbling' else 'slide'}; make it a multiple"
            )
    start_raw = raw.get("start", "2020-01-01T00:00:00Z")
    try:
        start = parse_iso(str(start_raw))
    except ValueError:
        raise WireInputError(
            f"start: bad time {start_raw!r}; use ISO-8601 with a zone, e.g. 2024-01-01T00:00:00Z"
        ) from None
    if start % partition:
        raise WireInputError("start: must be aligned to the partition size")
    end = None
    if raw.get("end") is not None:
        try:
            end = parse_iso(str(raw["end"]))
        except ValueError:
            raise WireInputError(
                f"end: bad time {raw['end']!r}; use ISO-8601 with a zone, e.g. 2024-02-01T00:00:00Z"
            ) from None
        if end <= start or (end - start) % partition:
            raise WireInputError("end: must be after start and a whole number of partitions after it")
    limits = raw.get("limits") or {}
    if not isinstance(limits, dict):
        raise WireInputError("limits: expected a mapping")

    def _posint(key: str, default: int) -> int:
        v = limits.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise WireInputError(f"limits.{key}: expected a positive integer, got {v!r}")
        return v

    orch = _orchestration(raw.get("dagster") or {})
    try:
        return Pipeline(
            name=name,
            stream=stream,
            key_fields=key_fields,
            time_field=time_field,
            id_field=id_field,
            max_out_of_orderness=parse_duration(wm.get("max_out_of_orderness", 0), "watermark.max_out_of_orderness"),
            idle_timeout=parse_duration(wm.get("idle_timeout", "1m"), "watermark.idle_timeout"),
            clock=clock,
            max_event_time_lag=parse_duration(wm.get("max_event_time_lag", 0), "watermark.max_event_time_lag"),
            allowed_lateness=parse_duration(lateness.get("allowed", 0), "lateness.allowed"),
            partition=partition,
            start=start,
            end=end,
            max_future=parse_duration(limits.get("max_future", "1d"), "limits.max_future"),
            chunk_rows=_posint("chunk_rows", 100_000),
            chunk_bytes=_posint("chunk_bytes", 128 << 20),
            max_chunks_per_epoch=_posint("max_chunks_per_epoch", 1_000),
            max_record_bytes=_posint("max_record_bytes", 1_048_576),
            windows=windows,
            where=where,
            fields=fields,
            inputs=tuple(inputs) if len(inputs) > 1 or inputs[0].pipeline else (),
            landing=first.landing,
            segment_by=first.segment_by,
            rescan=first.rescan,
            computations=computations,
            orchestration=orch,
            source=source,
        )
    except ValidationError as e:  # defensive: our checks above should catch everything first
        first = e.errors()[0]
        raise WireInputError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


CODE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def _computations(raw: dict, inputs: list[Input]) -> tuple[ComputationSpec, ...]:
    """`computations:` a list of `{name, input, code: "module:Class", outputs: [...]}`."""
    comps = raw["computations"]
    if not isinstance(comps, list) or not comps:
        raise WireInputError("computations: expected a list of {name, input, code: module:Class, outputs: [...]}")
    if len(inputs) > 1:
        raise WireInputError(
            "computations: a computation over several inputs is not built yet; read one raw stream "
            "(stream + event, or one input) or one derived stream (an input with pipeline and output)"
        )
    out: list[ComputationSpec] = []
    for i, c in enumerate(comps):
        if not isinstance(c, dict):
            raise WireInputError(f"computations[{i}]: expected a mapping with name, input, code, outputs")
        extra = set(c) - {"name", "input", "code", "outputs"}
        if extra:
            raise WireInputError(
                f"computations[{i}]: unknown key(s) {sorted(extra)}; allowed: code, input, name, outputs"
            )
        name = check_name(_req(c, "name", f"computations[{i}]"), f"computations[{i}].name")
        where = f"computations.{name}"
        inp = c.get("input") or inputs[0].name
        if inp not in {x.name for x in inputs}:
            raise WireInputError(
                f"{where}.input: no input named {inp!r}; choose one of: " + ", ".join(x.name for x in inputs)
            )
        code = _req(c, "code", where)
        if not isinstance(code, str) or not CODE_RE.match(code):
            raise WireInputError(f"{where}.code: {code!r} is not module:Class, e.g. quiet:QuietAlert")
        outs = c.get("outputs")
        if not isinstance(outs, list) or not outs:
            raise WireInputError(f"{where}.outputs: give the output streams it produces into, e.g. [alerts]")
        outputs = tuple(check_name(o, f"{where}.outputs") for o in outs)
        if any(x.name == name for x in out):
            raise WireInputError(f"computations: two computations are named {name!r}; give each a unique name")
        out.append(ComputationSpec(name=name, input=inp, code=code, outputs=outputs))
    return tuple(out)


def _output_windows(raw: dict, comps: tuple[ComputationSpec, ...]) -> list[WindowSpec]:
    """The computations' outputs as the pipeline's windows (type "output": read, published and
    partitioned like windows); an output name is unique in the pipeline."""
    del raw
    out: list[WindowSpec] = []
    for c in comps:
        for o in c.outputs:
            if any(w.name == o for w in out):
                raise WireInputError(
                    f"computations.{c.name}.outputs: {o!r} is produced by two computations; "
                    "give each computation its own outputs"
                )
            out.append(WindowSpec(name=o, type="output", size=1, slide=1, aggregates=()))
    return out


_INPUT_KEYS = {"name", "stream", "time", "id", "key", "where", "pipeline", "output", "landing", "segment_by", "rescan"}


def _inputs(raw: dict, name: str) -> list[Input]:
    """The pipeline's raw inputs, from `stream` + `event` (one) or from `inputs:` (DESIGN §4,
    dataflow forms); each with its time, id, key and filter."""
    if "inputs" not in raw:
        stream = check_name(raw.get("stream") or name, "stream")
        event = _req(raw, "event", "pipeline")
        if not isinstance(event, dict):
            raise WireInputError("event: expected a mapping with time (and key, id, where)")
        extra = set(event) - {"time", "key", "id", "where"}
        if extra:
            raise WireInputError(f"event: unknown key(s) {sorted(extra)}; allowed: ['id', 'key', 'time', 'where']")
        return [_raw_input(stream, stream, event, "event")]
    if "stream" in raw or "event" in raw:
        raise WireInputError("pipeline: give either inputs or stream + event, not both")
    inputs = raw["inputs"]
    if not isinstance(inputs, list) or not inputs:
        raise WireInputError("inputs: expected a list of inputs, each a mapping with name and stream")
    out: list[Input] = []
    for i, inp in enumerate(inputs):
        if not isinstance(inp, dict):
            raise WireInputError(f"inputs[{i}]: expected a mapping with name, stream, time, key")
        extra = set(inp) - _INPUT_KEYS
        if extra:
            raise WireInputError(f"inputs[{i}]: unknown key(s) {sorted(extra)}; allowed: {sorted(_INPUT_KEYS)}")
        label = check_name(_req(inp, "name", f"inputs[{i}]"), f"inputs[{i}].name")
        if any(o.name == label for o in out):
            raise WireInputError(f"inputs: two inputs are named {label!r}; give each a unique name")
        if "pipeline" in inp or "output" in inp:
            out.append(_derived_input(label, inp, f"inputs.{label}"))
            continue
        stream = check_name(inp.get("stream") or label, f"inputs.{label}.stream")
        out.append(_raw_input(label, stream, inp, f"inputs.{label}"))
    # (raw and derived inputs in one stage never reach here: the loader expands them, expand.py)
    return out


def _derived_input(label: str, m: dict, where_at: str) -> Input:
    """An input `{pipeline: P, output: W, key: ...}`: P's committed window W as a stream."""
    extra = set(m) - {"name", "pipeline", "output", "key", "where"}
    if extra:
        raise WireInputError(
            f"{where_at}: {sorted(extra)} do not apply to a derived stream (its time is window_end - 1, "
            "its rows have no id); allowed: key, where"
        )
    pipeline = check_name(_req(m, "pipeline", where_at), f"{where_at}.pipeline")
    output = check_name(_req(m, "output", where_at), f"{where_at}.output")
    where = m.get("where")
    if where is not None:
        expression_columns(where, f"{where_at}.where")
    return Input(
        name=label,
        stream="",
        time_field=WINDOW_TIME,
        id_field=None,
        key_fields=_key(m.get("key"), f"{where_at}.key"),
        where=where,
        pipeline=pipeline,
        output=output,
    )


_RESERVED = ("streams/", "pipelines/")  # Wire's own prefixes in the bucket


def check_landing(prefix: object, segment_by: object, where: str) -> str:
    """A landing prefix (wire_dagster/landing.py) as given in a pipeline file, checked (one line
    naming the fix); it ends in '/'. `segment_by`: a regex of at most one group."""
    if not isinstance(prefix, str) or not prefix.strip("/"):
        raise WireInputError(f"{where}.landing: expected a prefix in the bucket, e.g. topics/clicks/")
    if prefix.startswith("/") or ".." in prefix.split("/") or "//" in prefix:
        raise WireInputError(f"{where}.landing: bad prefix {prefix!r}; use a relative key prefix like topics/clicks/")
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    if prefix.startswith(_RESERVED):
        raise WireInputError(f"{where}.landing: {prefix!r} is under Wire's own prefixes {_RESERVED}; land elsewhere")
    if segment_by is not None:
        if not isinstance(segment_by, str) or not segment_by:
            raise WireInputError(f"{where}.segment_by: expected a regex like 'partition=(\\d+)'")
        try:
            rx = re.compile(segment_by)
        except re.error as e:
            raise WireInputError(f"{where}.segment_by: bad regex {segment_by!r} ({e})") from None
        if rx.groups > 1:
            raise WireInputError(f"{where}.segment_by: {segment_by!r} has {rx.groups} groups; use one (the segment)")
    return prefix


def _raw_input(label: str, stream: str, m: dict, where_at: str) -> Input:
    where = m.get("where")
    if where is not None:
        expression_columns(where, f"{where_at}.where")
    if m.get("landing") is None and ("segment_by" in m or "rescan" in m):
        raise WireInputError(f"{where_at}: segment_by and rescan apply to a landing prefix; add landing: <prefix>/")
    landing = check_landing(m["landing"], m.get("segment_by"), where_at) if m.get("landing") is not None else None
    return Input(
        name=label,
        stream=stream,
        time_field=_field(_req(m, "time", where_at), f"{where_at}.time"),
        id_field=_field(m["id"], f"{where_at}.id") if m.get("id") else None,
        key_fields=_key(m.get("key"), f"{where_at}.key"),
        where=where,
        landing=landing,
        segment_by=m.get("segment_by"),
        rescan=parse_duration(m["rescan"], f"{where_at}.rescan") if m.get("rescan") is not None else None,
    )


def _key(value: object, where: str) -> tuple[str, ...]:
    """A key: one field, or a list of fields (a composite key); none without one."""
    if value is None or value == "":
        return ()
    if isinstance(value, list):
        if not value:
            raise WireInputError(f"{where}: an empty list; name one field or several, e.g. [auction, channel]")
        fields = tuple(_field(v, where) for v in value)
        if len(set(fields)) != len(fields):
            raise WireInputError(f"{where}: a field is listed twice in {list(fields)}")
        return fields
    return (_field(value, where),)


def _derived(raw: object) -> tuple[tuple[str, str], ...]:
    """`fields:` a mapping of new field names to SQL expressions over the record."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise WireInputError("fields: expected a mapping of field names to SQL expressions, e.g. {usd: price * 0.9}")
    out = []
    for fname, expr in raw.items():
        if not isinstance(fname, str) or not NAME_FIELD_RE.match(fname):
            raise WireInputError(f"fields: bad field name {fname!r}; use a name like price_usd")
        if isinstance(expr, (int, float)) and not isinstance(expr, bool):
            expr = str(expr)
        expression_columns(expr, f"fields.{fname}")
        out.append((fname, expr))
    return tuple(out)


def _orchestration(raw: object) -> Orchestration:
    if not isinstance(raw, dict):
        raise WireInputError("dagster: expected a mapping (sensor_interval, sensor_running, schedule, ...)")
    allowed = {
        "sensor_interval",
        "sensor_running",
        "schedule",
        "max_watermark_lag",
        "max_dead_letter_rate",
        "keep_epochs",
        "max_epochs_per_run",
    }
    extra = set(raw) - allowed
    if extra:
        raise WireInputError(f"dagster: unknown key(s) {sorted(extra)}; allowed: {sorted(allowed)}")
    out: dict = {}
    if "sensor_interval" in raw:
        ms = parse_duration(raw["sensor_interval"], "dagster.sensor_interval")
        if ms < 1000 or ms % 1000:
            raise WireInputError("dagster.sensor_interval: use whole seconds, at least 1s")
        out["sensor_interval_s"] = ms // 1000
    if "sensor_running" in raw:
        if not isinstance(raw["sensor_running"], bool):
            raise WireInputError("dagster.sensor_running: expected true or false")
        out["sensor_running"] = raw["sensor_running"]
    if raw.get("schedule") is not None:
        cron = str(raw["schedule"])
        if len(cron.split()) != 5:
            raise WireInputError(f"dagster.schedule: {cron!r} is not a 5-field cron expression")
        out["schedule"] = cron
    if "max_watermark_lag" in raw:
        out["max_watermark_lag"] = parse_duration(raw["max_watermark_lag"], "dagster.max_watermark_lag")
    if "max_dead_letter_rate" in raw:
        r = raw["max_dead_letter_rate"]
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
            raise WireInputError("dagster.max_dead_letter_rate: expected a number between 0 and 1")
        out["max_dead_letter_rate"] = float(r)
    for k in ("keep_epochs", "max_epochs_per_run"):
        if k in raw:
            v = raw[k]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise WireInputError(f"dagster.{k}: expected a positive integer")
            out[k] = v
    return Orchestration(**out)


def load_pipeline(path: str | Path) -> Pipeline:
    """The pipeline a file declares (a stage with raw inputs: as expanded, expand.py)."""
    return load_pipelines(path)[-1]


def load_pipelines(path: str | Path) -> list[Pipeline]:
    """Every pipeline a file declares: its own, preceded by those generated for a stage's raw
    inputs (expand.py). The one loader of `find_pipeline`, `readers_of` and `load_all`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WireInputError(f"cannot read pipeline file {str(p)!r}: {e.__class__.__name__}") from None
    return list(_parsed(str(p), text))


@functools.lru_cache(maxsize=256)
def _parsed(path: str, text: str) -> tuple[Pipeline, ...]:
    """A pipeline file's pipelines: a function of its path and text alone (frozen models), so each
    content is parsed once per process, however often it is read — `derived.upstreams` reads
    every file of a directory for each input it resolves (52 ms for NEXMark q8's graph of nine
    files, called several times by each tick). A file that fails is parsed again when read again."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise WireInputError(f"pipeline file {Path(path).name}: invalid YAML{where}") from None
    return tuple(pipelines_from_dict(raw, source=path))


def generated_with(stage: Pipeline) -> tuple[list[Pipeline], list[Pipeline]]:
    """The pipelines generated from `stage`'s file (expand.py), from one load of it: those reading
    its raw inputs (ticked before the stage) and those running its computations (expand.split;
    ticked after it), each in the file's order. A generated pipeline has none."""
    from .expand import feeders

    if not stage.source:
        return [], []
    *others, own = load_pipelines(stage.source)
    if own.name != stage.name:
        return [], []
    fed = set(feeders(stage))
    return [p for p in others if p.name in fed], [p for p in others if p.name not in fed]


def owner(stage: Pipeline, window: str) -> Pipeline:
    """The pipeline holding `window` for `--pipeline <stage> --window <window>`: the stage, or the
    generated pipeline of one of its file's computations that produces it."""
    if any(w.name == window for w in stage.windows):
        return stage
    return next((p for p in generated_with(stage)[1] if any(w.name == window for w in p.windows)), stage)


def pipelines_dir(default: str | None = None) -> Path:
    import os

    return Path(os.environ.get("WIRE_PIPELINES") or default or "pipelines")


def find_pipeline(name_or_path: str, directory: Path | None = None) -> Pipeline:
    """`--pipeline P`: a path to a YAML file, or a pipeline name looked up in WIRE_PIPELINES
    (a file there that does not load is passed over; two that declare the name are refused)."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise WireInputError(f"--pipeline: no such file {name_or_path!r}")
        return load_pipeline(p)
    check_name(name_or_path, "--pipeline")
    d = directory or pipelines_dir()
    found = []
    for cand in _pipeline_files(d):
        try:
            specs = load_pipelines(cand)
        except WireInputError:
            continue
        found += [s for s in specs if s.name == name_or_path]
    if not found:
        raise WireInputError(
            f"--pipeline: no pipeline named {name_or_path!r} in {str(d)!r}; pass a YAML path or set WIRE_PIPELINES"
        )
    return _unique(found)[0]


def readers_of(stream: str, directory: Path | None = None) -> list[Pipeline]:
    """The pipelines in `directory` (WIRE_PIPELINES) that read `stream`, each as it reads it (a
    pipeline of several inputs: as that input; a file there that does not load is passed over,
    as `find_pipeline` does)."""
    check_name(stream, "--stream")
    found = []
    for cand in _pipeline_files(directory or pipelines_dir()):
        try:
            specs = load_pipelines(cand)
        except WireInputError:
            continue
        found += [r for spec in specs for r in spec.readers.values() if r.stream == stream]  # as each reads it
    return found


def stream_spec(stream: str, time_field: str, id_field: str | None, like: Pipeline | None = None) -> Pipeline:
    """What `wire produce --stream` checks records against: the stream's time and id, and the
    producer's limits of pipeline `like` (a reader of the stream) or the defaults."""
    if like is None:
        like = pipeline_from_dict(
            {
                "name": stream,
                "stream": stream,
                "event": {"time": time_field, "id": id_field},
                "partition": "1m",
                "windows": [{"name": "w", "type": "tumbling", "size": "1m", "aggregates": {"n": "count"}}],
            }
        )
    return like.stream_level().model_copy(update={"stream": stream, "time_field": time_field, "id_field": id_field})


def load_all(path: Path) -> list[Pipeline]:
    """Every pipeline file in a directory, or the one file `path` names; a bad file raises (the
    code location must not hide it), and so do two files that declare the same pipeline name."""
    path = Path(path)
    return _unique([s for p in ([path] if path.is_file() else _pipeline_files(path)) for s in load_pipelines(p)])


def _pipeline_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.y*ml")) if directory.is_dir() else []


def _unique(specs: list[Pipeline]) -> list[Pipeline]:
    """`specs`, unless two of them (two files) declare one pipeline name: a name is the pipeline's
    prefix in the store and its assets' key, so neither file can be chosen silently."""
    from .expand import is_generated

    first: dict[str, Pipeline] = {}
    for s in specs:
        other = first.setdefault(s.name, s)
        if other is not s and (is_generated(s) or is_generated(other)):
            gen, decl = (s, other) if is_generated(s) else (other, s)
            raise WireInputError(
                f"pipeline {s.name!r}, generated by {gen.source} to read a stage's raw input (expand.py), "
                f"is also declared by {decl.source}; rename that pipeline, the stage or its input"
            )
        if other is not s:
            raise WireInputError(
                f"pipeline {s.name!r} is declared by two files, {other.source} and {s.source}; "
                "give each pipeline a unique name"
            )
    return specs
