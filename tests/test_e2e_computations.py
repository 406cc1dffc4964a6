"""Computations under `dagster dev` (issue 24): the "user went quiet" alert over a raw stream, and
MillWheel's spike detector over a window's derived stream (the clicks per user per minute),
declared in the counting pipeline's own file (DESIGN §4: windows and computations in one file;
the detector runs in the pipeline generated for it, expand.py), loaded into the running code
location. Producing the clicks (and closing the stream) makes the daemon's sensors run every
stage on their own, the spike detector after the counts it reads; each output is a partitioned
asset downstream of its input, and every partition holding records is materialized with the
computation's counters there as metadata. The committed records equal the reference executor's
(tests/test_computations.py): over the clicks for the alert, over the plain-Python counts per
user and minute for the detector.

    clicks ──▶ e2e_uclicks.minutes ──▶ e2e_uclicks__spikes.spikes   (a window of the same file)
          └──▶ e2e_quiet.alerts                                     (the raw stream)
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import yaml

from dagster_stack import SETTLE_TIMEOUT
from test_computations import _derived_origin, _positions, _sorted, reference
from wire_dagster.procgroup import wait_until

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "pipelines" / "computations"
T1 = 1_767_229_200_000  # 2026-01-01T01:00:00Z
STREAM = "e2e_clicks"
COMMON = {
    "start": "2026-01-01T00:00:00Z",
    "end": "2026-01-02T00:00:00Z",
    "partition": "5m",
    "dagster": {"sensor_interval": "2s"},
}
RAW = {
    "stream": STREAM,
    "event": {"key": "user_id", "time": "ts", "id": "event_id"},
    "watermark": {"max_out_of_orderness": "2s", "idle_timeout": "1h"},
}
COUNTS = {
    "name": "e2e_uclicks",
    **RAW,
    **COMMON,
    "windows": [{"name": "minutes", "type": "tumbling", "size": "1m", "aggregates": {"clicks": "count"}}],
    "computations": [{"name": "spikes", "input": "minutes", "code": "spike:CountSpikeDetector", "outputs": ["spikes"]}],
}
QUIET = {
    "name": "e2e_quiet",
    **RAW,
    **COMMON,
    "computations": [{"name": "quiet", "code": "quiet:QuietAlert", "outputs": ["alerts"]}],
}
SPIKES = "e2e_uclicks__spikes"  # the pipeline generated for the file's computation


def _clicks() -> list[dict]:
    """Four users over 12 minutes, 1-3 clicks a minute, two bursts (spikes), out of order < 2 s."""
    rnd = random.Random(24)
    rows = []
    for m in range(12):
        for u in range(4):
            n = 15 if (u, m) == (0, 8) else 12 if (u, m) == (1, 10) else rnd.randint(1, 3)
            rows += [{"ts": T1 + m * 60_000 + rnd.randrange(60_000), "user_id": f"u{u}"} for _ in range(n)]
    rows.sort(key=lambda r: r["ts"] + rnd.randrange(2_000))
    for i, r in enumerate(rows):
        r["event_id"] = f"c{i}"
    return rows


def _pk(ms: int) -> str:
    import time

    return time.strftime("%Y-%m-%d-%H:%M", time.gmtime(ms // 1000))


def test_the_sensors_run_computations_on_their_own_and_report_their_counters(dagster_stack, tmp_path: Path) -> None:
    from sensors import sensor_name
    from wire_dagster.checkpoint import Checkpoints
    from wire_dagster.computestage import read_output
    from wire_dagster.spec import ComputationSpec, load_pipelines, stream_spec
    from wire_dagster.streams import close_stream, produce
    from wire_dagster.timeutil import INF

    st = dagster_stack
    pdir = st.tmp / "pipelines"
    for f in ("quiet.py", "spike.py"):
        shutil.copy(EXAMPLES / f, pdir / f)
    (pdir / "e2e_quiet.yaml").write_text(yaml.safe_dump(QUIET))
    st.add_pipeline(COUNTS)  # one reload of the code location with all three
    specs = {s.name: s for f in ("e2e_uclicks", "e2e_quiet") for s in load_pipelines(pdir / f"{f}.yaml")}
    assert set(specs) == {"e2e_uclicks", "e2e_quiet", SPIKES}
    for spec in specs.values():
        assert st.sensor(sensor_name(spec)) is not None, spec.name
    # lineage: the detector's output downstream of the counts it reads
    assert ["e2e_uclicks", "minutes"] in [k["path"] for k in st.asset_node([SPIKES, "spikes"])["dependencyKeys"]]

    clicks = _clicks()
    f = tmp_path / "clicks.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in clicks))
    rep = produce(st.store, stream_spec(STREAM, "ts", "event_id", specs["e2e_quiet"]), f)
    assert rep.events == len(clicks)
    close_stream(st.store, STREAM)

    # the references: the quiet alerts over the clicks at their positions; the spikes over the
    # counts per user and minute (the window's rows, delivered once each, in time order)
    pos = _positions(st.store, specs["e2e_quiet"])
    quiet_cls = _load(pdir, "quiet:QuietAlert")
    quiet_c = ComputationSpec(name="quiet", input=STREAM, code="quiet:QuietAlert", outputs=("alerts",))
    alerts, _ = reference(
        quiet_cls,
        quiet_c,
        [{"t": r["ts"], "key": r["user_id"], "pos": pos[r["event_id"]], "rec": r} for r in clicks],
    )
    counts: dict = {}
    for r in clicks:
        k = (r["user_id"], r["ts"] - r["ts"] % 60_000)
        counts[k] = counts.get(k, 0) + 1
    rows = [
        {"key": u, "window_start": m, "window_end": m + 60_000, "clicks": n, "_update": False}
        for (u, m), n in counts.items()
    ]
    spike_c = ComputationSpec(name="spikes", input="minutes", code="spike:CountSpikeDetector", outputs=("spikes",))
    spikes, _ = reference(
        _load(pdir, spike_c.code),
        spike_c,
        [
            {"t": r["window_end"] - 1, "key": r["key"], "pos": ("minutes", r["window_start"], 0), "rec": r}
            | {"origin": _derived_origin(r, 0)}
            for r in rows
        ],
    )
    assert len(alerts) == 4 and len(spikes) == 2
    want = {("e2e_quiet", "alerts"): alerts, (SPIKES, "spikes"): spikes}
    delivered = {
        ("e2e_quiet", "alerts"): [r["ts"] for r in clicks],
        (SPIKES, "spikes"): [m + 59_999 for _, m in counts],
    }

    def materialized() -> bool:
        """Every stage committed its closed input, and every partition holding records is
        materialized with the counters of its records."""
        m = {n: Checkpoints(st.store, n).latest() for n in specs}
        if any(x is None or x.watermark < INF for x in m.values()):
            return False
        if m[SPIKES].remap != {"minutes": m["e2e_uclicks"].epoch}:  # pyright: ignore[reportOptionalMemberAccess]
            return False
        for (name, out), recs in want.items():
            for p in {t - t % 300_000 for _, _, t, _, _ in recs}:
                got = st.materialization([name, out], _pk(p))
                n = sum(1 for _, _, t, _, _ in recs if p <= t < p + 300_000)
                meta = got["meta"] if got is not None else {}
                records_in = sum(1 for t in delivered[(name, out)] if p <= t < p + 300_000)
                if (meta.get("computation/produced"), meta.get("computation/records_in")) != (n, records_in):
                    return False
                assert meta["computation/errors"] == 0
                assert meta["computation/computation"] == {"alerts": "quiet", "spikes": "spikes"}[out]
        return True

    wait_until(materialized, SETTLE_TIMEOUT, "the sensors committed and materialized every computation", st.alive)
    for (name, out), recs in want.items():
        got = [
            (out, r["key"], r["window_start"], r["id"], json.dumps(r["record"], sort_keys=True))
            for r in read_output(st.store, specs[name], out)
        ]
        assert got == _sorted(recs), name
    # every stage was run by its own sensor
    for spec in specs.values():
        runs = st.runs({"wire/pipeline": spec.name})
        assert runs and all(r["tags"].get("dagster/sensor_name") == sensor_name(spec) for r in runs), spec.name


def _load(d: Path, code: str) -> type:
    from wire_dagster.computation import load_class

    return load_class(code, str(d), code)
