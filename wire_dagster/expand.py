"""Raw inputs of a dataflow stage (DESIGN §4 "Dataflow forms", §6), by expansion at load time.

A stage that joins inputs, or reads another pipeline's window (a derived input), is recomputed
from committed files (derived.py). When such a stage also reads raw streams — a windowed join
of two raw streams (`clicks ⋈ views`), or a raw input beside a derived one (DESIGN §4's
`user_minutes`: `clicks` and `minutes`) — each raw input `i` of stage `s` is expanded, where
pipeline files are loaded (spec.py's loader: `find_pipeline`, `load_all`, `readers_of`, so the
Dagster code location, the CLI and the tests see the same pipelines), into:

1. a generated pipeline `s__i`, declared by the same file: it reads the raw stream with the
   input's time, id, key and `where`, and the stage's watermark, lateness, partition,
   start/end, limits, `fields:` and `dagster:` settings, and commits every accepted record as
   its output `records` (the pass-through computation, passthrough.py). A record is accepted
   once: a duplicate id, a record behind W by more than the allowed lateness, a malformed or
   filtered one is a dead letter (or filtered count) of `s__i`, as in the window engine;
2. the stage itself, with the raw input rewritten as the derived input
   `{name: i, pipeline: s__i, output: records, key: <i's key>}`: its windows and joins see
   the raw records' own fields, at their own event time (derived.py reads `records` as records,
   not as result rows), and its W is the minimum of its inputs' as for every derived stage.

`s__i` is a pipeline like any other: `wire status --pipeline s__i`, `wire dlq --pipeline s__i`
(its dead letters), `wire read --pipeline s__i --window records`; in the Dagster asset graph
the lineage is stream -> `s__i/records` -> the stage's windows; `wire tick --pipeline s`
ticks the generated pipelines first (cli.py), so one command brings `s` up to date.

Lateness is per record here: a raw record counts when `t >= W_prev - allowed lateness` (its
own instant, the window `[t, t + 1)`, is still within lateness). The window engine keeps a
late record for each window whose `end + lateness > W_prev`, which for a record behind W
can be more: declare the lateness the stage's records may have (or a disorder bound in
`watermark:` that holds) rather than relying on a window's length.

A file that declares windows and `computations:` (DESIGN §4's `user_minutes`) is split first
(`split`): its windows stay the file's pipeline (expanded as above if they need it), and each
computation `c` becomes a generated pipeline `<file's name>__<c>` that reads the computation's
input — one of the file's raw inputs (with the file's watermark, lateness and `fields:`), one
of its derived inputs, or one of the file's own windows (as a derived input of the file's
pipeline) — and produces the computation's outputs. A computation's output is then read by the
file's name (`wire read --pipeline user_minutes --window alerts`: spec.owner), and
`wire tick --pipeline user_minutes` ticks the computations after the windows (spec.generated_with).

A file that needs no expansion — only raw inputs and no join, or only derived inputs — loads
as it always did (same pipeline, same fingerprint).
"""

from __future__ import annotations

from .errors import WireInputError

#: Between a stage's name and its raw input's in the generated pipeline's name: `q7__bids`.
SEP = "__"
#: The generated pipeline's computation, its code (passthrough.py) and its one output.
COMPUTATION = "records"
PASS_THROUGH = "wire_dagster.passthrough:Records"
OUTPUT = "records"
#: What a generated pipeline takes from its stage's file as is.
_SHARED = ("watermark", "lateness", "partition", "start", "end", "limits", "fields", "dagster")


def _is_derived(m: object) -> bool:
    return isinstance(m, dict) and ("pipeline" in m or "output" in m)


def _joins(raw: dict) -> bool:
    wins = raw.get("windows")
    return isinstance(wins, list) and any(isinstance(w, dict) and w.get("type") == "join" for w in wins)


def needs_expansion(raw: object) -> bool:
    """Whether a pipeline file's mapping is a stage with raw inputs: a join (of any inputs) or
    a derived input, beside at least one raw stream."""
    if not isinstance(raw, dict):
        return False
    inputs = raw.get("inputs")
    if not isinstance(inputs, list):  # stream + event: one raw input; a join of it with itself
        return "inputs" not in raw and isinstance(raw.get("event"), dict) and _joins(raw)
    has_raw = any(isinstance(i, dict) and not _is_derived(i) for i in inputs)
    return has_raw and (_joins(raw) or any(_is_derived(i) for i in inputs))


def expand(raw: dict) -> list[dict]:
    """The mappings of the generated pipelines (one per raw input) and, last, of the stage with
    its raw inputs rewritten as derived inputs of them (module doc). `raw` needs expansion, and
    its name and its raw inputs' names were checked (spec.pipelines_from_dict)."""
    stage_name = raw["name"]
    inputs = _file_inputs(raw)
    stage = {k: v for k, v in raw.items() if k not in ("stream", "event", "inputs")}
    rewritten: list[object] = []
    generated: list[dict] = []
    for inp in inputs:
        if not isinstance(inp, dict) or _is_derived(inp):
            rewritten.append(inp)  # checked where the stage is parsed
            continue
        label = inp["name"]
        name = generated_name(stage_name, label)
        generated.append(_generated(raw, name, inp))
        derived: dict[str, object] = {"name": label, "pipeline": name, "output": OUTPUT}
        if inp.get("key") not in (None, ""):
            derived["key"] = inp["key"]
        rewritten.append(derived)
    stage["inputs"] = rewritten
    return [*generated, stage]


def generated_name(stage: str, label: str, what: str = "inputs") -> str:
    """`<stage>__<label>`: the pipeline reading raw input `label` of `stage`, or running its
    computation `label` (`what` = "computations"); a pipeline name: at most 64 characters, one
    line naming the fix otherwise."""
    name = f"{stage}{SEP}{label}"
    if len(name) > 64:
        role = "reads this raw stream" if what == "inputs" else "runs this computation"
        raise WireInputError(
            f"{what}.{label}: the pipeline that {role} for stage {stage!r} is named "
            f"{name!r}, longer than 64 characters; shorten the pipeline's name or the {what[:-1]}'s"
        )
    return name


def _generated(raw: dict, name: str, inp: dict) -> dict:
    """A generated pipeline's mapping: the raw input as its one input, the stage's shared
    settings, and the pass-through computation."""
    body: dict[str, object] = {"name": name, "inputs": [dict(inp)]}
    body.update({k: raw[k] for k in _SHARED if k in raw})
    body["computations"] = [{"name": COMPUTATION, "input": inp["name"], "code": PASS_THROUGH, "outputs": [OUTPUT]}]
    return body


def is_generated(spec) -> bool:
    """Whether pipeline `spec` (spec.Pipeline) was generated for a stage's raw input."""
    return SEP in spec.name and len(spec.computations) == 1 and spec.computations[0].code == PASS_THROUGH


def feeders(stage) -> list[str]:
    """The names of the pipelines generated for `stage`'s raw inputs (spec.Pipeline), in input
    order: what `wire tick --pipeline <stage>` ticks first."""
    return [
        i.pipeline
        for i in stage.derived
        if i.output == OUTPUT
        and len(stage.name) + len(SEP) + len(i.name) <= 64
        and i.pipeline == f"{stage.name}{SEP}{i.name}"
    ]


# --- Windows and computations in one file -------------------------------------------------

#: What a computation's generated pipeline takes from the file as is, by what it reads: a raw
#: input is read as the file's windows read it; a derived input or one of the file's windows
#: carries its upstream's watermark.
_SHARED_DERIVED = ("partition", "start", "end", "limits", "dagster")


def needs_split(raw: object) -> bool:
    """Whether a pipeline file's mapping declares both windows and computations."""
    return isinstance(raw, dict) and bool(raw.get("windows")) and bool(raw.get("computations"))


def split(raw: dict) -> tuple[dict, list[dict]]:
    """The file's windows as its own pipeline (the file without `computations:`), and one
    generated pipeline per computation (module doc). The file's name was checked."""
    stage_name = raw["name"]
    inputs = _file_inputs(raw)
    by_name = {i["name"]: i for i in inputs if isinstance(i, dict) and isinstance(i.get("name"), str)}
    windows = {w["name"] for w in raw["windows"] if isinstance(w, dict) and isinstance(w.get("name"), str)}
    comps = raw["computations"]
    if not isinstance(comps, list):
        raise WireInputError("computations: expected a list of {name, input, code: module:Class, outputs: [...]}")
    expanded = needs_expansion({k: v for k, v in raw.items() if k != "computations"})
    raw_labels = {n for n, i in by_name.items() if not _is_derived(i)} if expanded else set()
    generated: list[dict] = []
    for n, c in enumerate(comps):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise WireInputError(f"computations[{n}]: expected a mapping with name, input, code, outputs")
        where = f"computations.{c['name']}"
        label = c.get("input")
        if label is None and len(by_name) == 1:
            label = next(iter(by_name))
        if label in windows and label in by_name:
            raise WireInputError(f"{where}.input: {label!r} is both an input and a window; rename one")
        if not isinstance(label, str) or label not in by_name and label not in windows:
            raise WireInputError(
                f"{where}.input: no input or window named {label!r}; choose one of: "
                + ", ".join([*by_name, *sorted(windows)])
            )
        for o in c.get("outputs") or []:
            if o in windows:
                raise WireInputError(
                    f"{where}.outputs: {o!r} is also a window of this file; give the output another name"
                )
        if c["name"] in raw_labels:
            raise WireInputError(
                f"{where}: a raw input is named {c['name']!r} too, and both would be read through a pipeline "
                f"named {stage_name}{SEP}{c['name']}; rename the computation"
            )
        generated.append(
            _computation_pipeline(raw, generated_name(stage_name, c["name"], "computations"), c, label, by_name)
        )
    names = [g["name"] for g in generated]
    if len(set(names)) != len(names):
        raise WireInputError("computations: two computations share a name; give each a unique name")
    return {k: v for k, v in raw.items() if k != "computations"}, generated


def _file_inputs(raw: dict) -> list:
    """A file's inputs as `inputs:` declares them (`stream` + `event`: one, named after its stream)."""
    if "inputs" in raw:
        return raw["inputs"] if isinstance(raw["inputs"], list) else []
    stream = raw.get("stream") or raw["name"]
    event = raw.get("event")
    return [{"name": stream, "stream": stream, **(event if isinstance(event, dict) else {})}]


def _computation_pipeline(raw: dict, name: str, comp: dict, label: str, inputs: dict[str, dict]) -> dict:
    """The generated pipeline of one computation: its input (a raw or derived input of the file,
    or one of the file's windows, read as a derived input: key, window_start, window_end and the
    aggregates), the file's settings for that kind of input, and the computation."""
    if label in inputs:
        inp = dict(inputs[label])
        shared = _SHARED_DERIVED + ("fields",) if _is_derived(inp) else _SHARED
    else:
        inp = {"name": label, "pipeline": raw["name"], "output": label, "key": "key"}
        shared = _SHARED_DERIVED
    body: dict[str, object] = {"name": name, "inputs": [inp]}
    body.update({k: raw[k] for k in shared if k in raw})
    body["computations"] = [{**comp, "input": label}]
    return body
