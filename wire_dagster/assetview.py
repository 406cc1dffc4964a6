"""What Wire's Dagster assets report, as plain data: a partition's own facts, the checks' verdicts
(with the reason a person reads on failure), the per-epoch progress line of the run log, the
streams' state as their readers committed it, and where the watermark chart is kept.

No Dagster here (DESIGN §5): `assets/` turns these into metadata values, check evaluations and
log lines. One meaning of lag everywhere (checks, chart, freshness): the event-time lag of the
watermark, `now - W` in event time, where "now" is the newest event time read (the stream's own
present, not the wall clock: a replay of last year's data is not a year late).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from . import partitions
from .checkpoint import Checkpoints
from .errors import WireError
from .manifest import Counts, Manifest
from .objectstore import ObjectStore, s3_client
from .results import output_schema
from .sparkconf import env_switch
from .spec import Aggregate, Pipeline
from .status import describe_epoch, size_text, watermark_lag
from .timeutil import INF, NEG_INF, format_duration, iso

# -- columns ---------------------------------------------------------------------------------


def aggregate_text(a: Aggregate) -> str:
    """An aggregate as the spec writes it, e.g. `sum(amount)`, `arg_max(page, amount)`,
    `approx_quantile(amount, 0.95)`, `count()`."""
    q = None if a.q is None else format(a.q, ".15g")
    return f"{a.func}({', '.join(x for x in (a.field, a.by, q) if x)})"


def output_columns(spec: Pipeline, window: str) -> list[tuple[str, str, str]]:
    """(name, type, description) of each column of a window's committed output, in file order."""
    w = spec.window(window)
    key = (
        f"the key: field {spec.key_fields[0]}"
        if len(spec.key_fields) == 1
        else ("the key: the JSON array of fields " + ", ".join(spec.key_fields) if spec.key_fields else "the key")
    )
    about = {
        "key": key,
        "window_start": "window start, epoch ms UTC (inclusive)",
        "window_end": "window end, epoch ms UTC (exclusive)",
    }
    for a in w.aggregates:
        about[a.name] = aggregate_text(a)
    for c in w.select:
        about[c.name] = f"{c.side}.{c.column} (typed as that input's column)"
    return [(f.name, str(f.type), about.get(f.name, "")) for f in output_schema(spec, window)]


# -- a partition's own facts -----------------------------------------------------------------


def counts_json(c: Counts) -> dict:
    return {
        "events_in": c.events_in,
        "counted": dict(c.counted),
        "late": dict(c.late),
        "duplicate": c.duplicate,
        "malformed": c.malformed,
        "filtered": c.filtered,
    }


class EpochCounts:
    """The counts of committed epochs, each loaded once (a range run's partitions share writers).
    None for an epoch garbage collection removed."""

    def __init__(self, store: ObjectStore, spec: Pipeline, latest: Manifest | None):
        self._cp = Checkpoints(store, spec.name)
        self._seen: dict[int, Counts | None] = {latest.epoch: latest.counts} if latest else {}

    def get(self, epoch: int) -> Counts | None:
        if epoch not in self._seen:
            try:
                self._seen[epoch] = self._cp.load(epoch).counts
            except WireError:
                self._seen[epoch] = None
        return self._seen[epoch]


@dataclass(frozen=True)
class WindowPartition:
    """One window's committed content in one partition, as the latest manifest names it."""

    window: str
    partition: int
    rows: int  # the partition's own rows (0: no committed content)
    window_rows: int  # the window's rows over every committed partition (the whole table)
    published_key: str | None  # the published copy outside readers read (None: no content)
    written_by_epoch: int | None  # the epoch that wrote this content
    writer_counts: dict | None  # that epoch's counts (over every partition it touched), if kept

    def uri(self, bucket: str) -> str | None:
        return f"s3://{bucket}/{self.published_key}" if self.published_key else None


def window_partition(
    store: ObjectStore,
    spec: Pipeline,
    m: Manifest | None,
    window: str,
    partition: int,
    counts: EpochCounts,
    window_rows: int | None = None,
) -> WindowPartition:
    """`window`'s content in `partition` as manifest `m` names it (`window_rows`: the window's
    rows over all partitions, if the caller has summed them already)."""
    parts = m.outputs.get(window, {}) if m else {}
    ref = parts.get(str(partition))
    writer = counts.get(ref.epoch) if ref is not None else None
    return WindowPartition(
        window=window,
        partition=partition,
        rows=ref.rows if ref else 0,
        window_rows=window_rows if window_rows is not None else sum(r.rows for r in parts.values()),
        published_key=Checkpoints(store, spec.name).published_key(window, partition) if ref else None,
        written_by_epoch=ref.epoch if ref else None,
        writer_counts=(
            {
                "epoch": ref.epoch,
                "scope": "the whole epoch (every partition it wrote), not this partition alone",
                **counts_json(writer),
            }
            if ref is not None and writer is not None
            else None
        ),
    )


def lag_ms(m: Manifest | None) -> int | None:
    """The watermark's event-time lag: the newest event time read minus W (ms). None before any
    event or watermark, and once the stream is closed (W = +inf: nothing is waiting). The one
    definition (`status.watermark_lag`), for the checks, the metadata, the log and the chart."""
    return watermark_lag(m)


def newest_event(m: Manifest | None) -> int | None:
    if m is None:
        return None
    t = max([r.max_t for r in m.segments.values()] + [NEG_INF])
    return t if NEG_INF < t < INF else None


# -- checks ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A check's evaluation: passed, a sentence saying why (always; the UI shows it on failure),
    and plain metadata (numbers, text, JSON-able dicts)."""

    passed: bool
    description: str
    metadata: dict


def partition_status(spec: Pipeline, w: int, p: int) -> str:
    return "final" if partitions.final(spec, w, p) else ("provisional" if partitions.ready(spec, w, p) else "not ready")


def check_partition_complete(spec: Pipeline, m: Manifest | None, p: int) -> Verdict:
    w = m.watermark if m else NEG_INF
    end, final_at = p + spec.partition, p + spec.partition + spec.allowed_lateness
    status = partition_status(spec, w, p)
    span = f"[{iso(p)}, {iso(end)})"
    if status == "final":
        text = f"final: W = {iso(w)} >= partition end + allowed lateness = {iso(final_at)}; no event can change it"
    elif status == "provisional":
        text = (
            f"provisional: W = {iso(w)} passed the partition's end {iso(end)}, not yet end + allowed lateness "
            f"({format_duration(spec.allowed_lateness)}) = {iso(final_at)}: late events may still change it"
        )
    else:
        text = f"not ready: W = {iso(w)} < the partition's end {iso(end)}; on-time events may still arrive"
    return Verdict(
        status == "final",
        text,
        {"status": status, "partition": span, "watermark": iso(w), "final_once_watermark_reaches": iso(final_at)},
    )


def check_watermark_lag(spec: Pipeline, m: Manifest | None) -> Verdict:
    bound = spec.orchestration.max_watermark_lag
    lag = lag_ms(m)
    md: dict = {"max_lag_s": bound / 1000, "watermark": iso(m.watermark) if m else "-inf"}
    newest = newest_event(m)
    if newest is not None:
        md["newest_event"] = iso(newest)
    if lag is None:
        why = "the stream is closed (W = +inf)" if m is not None and m.watermark >= INF else "no event read yet"
        return Verdict(True, f"no lag: {why}", md)
    md["lag_s"] = lag / 1000
    rel = "<=" if lag <= bound else ">"
    text = (
        f"event-time lag of the watermark (newest event read - W) = {human_duration(lag)} {rel} "
        f"{human_duration(bound)} (dagster.max_watermark_lag)"
    )
    if lag > bound:
        text += f": W = {iso(m.watermark) if m else '-inf'} trails the newest event {iso(newest or NEG_INF)}"
    return Verdict(lag <= bound, text, md)


def _unbalanced(c: Counts) -> list[str]:
    out = []
    for w in sorted(c.counted):
        rhs = c.counted.get(w, 0) + c.late.get(w, 0) + c.other.get(w, 0) + c.duplicate + c.malformed + c.filtered
        if rhs != c.events_in:
            # `other`: the events of the inputs a window with `input:` does not read (shown if any)
            other = f" + other {c.other[w]}" if c.other.get(w) else ""
            out.append(
                f"{w}: in {c.events_in} != counted {c.counted.get(w, 0)} + late {c.late.get(w, 0)}{other} + "
                f"duplicate {c.duplicate} + malformed {c.malformed} + filtered {c.filtered} = {rhs}"
            )
    return out


def check_conservation(m: Manifest | None) -> Verdict:
    if m is None:
        return Verdict(True, "nothing committed yet", {})
    bad = [f"epoch {m.epoch}: {x}" for x in _unbalanced(m.counts)] + [f"total: {x}" for x in _unbalanced(m.totals)]
    md = {"epoch": m.epoch, "epoch_counts": counts_json(m.counts), "total_counts": counts_json(m.totals)}
    if bad:
        return Verdict(False, "events lost or counted twice: " + "; ".join(bad), md)
    return Verdict(
        True,
        f"in = counted + late + duplicate + malformed + filtered for every window, in epoch {m.epoch} "
        f"({m.counts.events_in} in) and in total ({m.totals.events_in} in)",
        md,
    )


def dead_letters(c: Counts) -> int:
    """Events that went to the dead letters (a late event counts once, for the window it was latest for)."""
    return c.duplicate + c.malformed + max(c.late.values(), default=0)


def check_dead_letter_rate(spec: Pipeline, m: Manifest | None) -> Verdict:
    bound = spec.orchestration.max_dead_letter_rate
    tot = m.totals if m else Counts()
    n = dead_letters(tot)
    rate = n / tot.events_in if tot.events_in else 0.0
    md = {"rate": rate, "max_rate": bound, "dead_letters": n, "events_in": tot.events_in}
    rel = "<=" if rate <= bound else ">"
    text = (
        f"dead letters / events since epoch 0 = {n} / {tot.events_in} = {rate:.2%} {rel} {bound:.2%} "
        f"(dagster.max_dead_letter_rate): late {dict(tot.late)}, duplicate {tot.duplicate}, malformed {tot.malformed}"
    )
    return Verdict(rate <= bound, text, md)


# -- the run log: one line per committed epoch (a streaming query's progress) ------------------


def human_duration(ms: float) -> str:
    """`850 ms`, `12.5 s`, `3 min 20 s`, `2 h 5 min`, `3 d 4 h`."""
    ms = max(0.0, float(ms))
    if ms < 1000:
        return f"{ms:.0f} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.3g} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    if s < 86400:
        return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"
    return f"{int(s // 86400)} d {int(s % 86400 // 3600)} h"


def _late_text(late: Mapping[str, int]) -> str:
    vals = set(late.values())
    if not late or vals == {0}:
        return "late 0"
    if len(vals) == 1:
        return f"late {vals.pop()}"
    return "late " + ", ".join(f"{w} {n}" for w, n in sorted(late.items()))


def epoch_line(m: Manifest, seconds: float | None) -> str:
    """What epoch `m` did, on one line: events read and where they went, the rows it wrote, the
    rate, the watermark it reached, and the window state it carries forward. `seconds`: the
    wall time it took (from the previous commit, or the run's start), if known."""
    c = m.counts
    wrote = {(w, p): ref.rows for w, parts in m.outputs.items() for p, ref in parts.items() if ref.epoch == m.epoch}
    state_rows = sum(r.rows for r in m.state.values()) + (m.ids.rows if m.ids else 0)
    state_bytes = sum(r.bytes for r in m.state.values()) + (m.ids.bytes if m.ids else 0)
    rate = f"{c.events_in / seconds:,.0f} events/s in {seconds:.2f} s" if seconds and seconds > 0 else "rate -"
    counted = sorted(set(c.counted.values()))
    counted_text = (
        f"counted {counted[0]:,}"
        if len(counted) == 1
        else "counted " + ", ".join(f"{w} {n:,}" for w, n in sorted(c.counted.items()))
    )
    lag = lag_ms(m)
    w = f"W {iso(m.watermark)}" + (f" (lag {human_duration(lag)})" if lag is not None else "")
    return (
        f"epoch {m.epoch} committed ({describe_epoch(m)}): {c.events_in:,} events in, {counted_text}, "
        f"{_late_text(c.late)}, duplicate {c.duplicate}, malformed {c.malformed}, filtered {c.filtered}; "
        f"{sum(wrote.values()):,} rows in {len(wrote)} partition files; {rate}; {w}; "
        f"state {state_rows:,} rows / {size_text(state_bytes)}"
    )


# -- the streams a pipeline reads, as its committed epochs saw them --------------------------


def stream_states(spec: Pipeline, m: Manifest | None) -> dict[str, dict]:
    """Per raw stream the pipeline reads: per segment (the stream's own names) the chunks its
    committed epochs have read, the newest event time and chunk ingestion time, and whether it is
    sealed; plus a `version` that changes exactly when any of that does."""
    out: dict[str, dict] = {}
    for prefix, reader in spec.readers.items():
        if reader.derived or not reader.stream:
            continue
        segs = {}
        for s, r in sorted((m.segments if m else {}).items()):
            if not s.startswith(prefix):
                continue
            segs[s[len(prefix) :]] = {
                "chunks": r.next_seq,
                "newest_event_ms": r.max_t if NEG_INF < r.max_t < INF else None,
                "last_chunk_ms": r.last_ingest if NEG_INF < r.last_ingest < INF else None,
                "sealed": r.sealed_at is not None,
            }
        out[reader.stream] = {"segments": segs, "version": _version(segs)}
    return out


def _version(segs: Mapping[str, dict]) -> str:
    return hashlib.sha256(
        json.dumps({k: [v["chunks"], v["sealed"]] for k, v in segs.items()}, sort_keys=True).encode()
    ).hexdigest()[:32]


def _later(x: int | None, y: int | None) -> int | None:
    return max(x, y) if x is not None and y is not None else (x if x is not None else y)


def advance_stream(reported: Mapping[str, dict] | None, mine: Mapping[str, dict]) -> dict | None:
    """What a stream's next report holds, given the segments its last report held (None: never
    reported) and a reader's: per segment the further of the two (more chunks read, sealed once
    either saw the seal, the newer times), with its version; None when the reader saw nothing
    the last report did not, so readers at different offsets never report the stream back."""
    reported = dict(reported or {})
    merged: dict[str, dict] = {}
    ahead = False
    for seg in sorted(set(reported) | set(mine)):
        prev, cur = reported.get(seg, {}), mine.get(seg)
        if cur is None:
            merged[seg] = dict(prev)
            continue
        if cur["chunks"] > prev.get("chunks", 0) or (cur["sealed"] and not prev.get("sealed")):
            ahead = True
        merged[seg] = {
            "chunks": max(cur["chunks"], prev.get("chunks", 0)),
            "sealed": bool(cur["sealed"] or prev.get("sealed")),
            "newest_event_ms": _later(cur.get("newest_event_ms"), prev.get("newest_event_ms")),
            "last_chunk_ms": _later(cur.get("last_chunk_ms"), prev.get("last_chunk_ms")),
        }
    if not ahead:
        return None
    return {"segments": merged, "version": _version(merged)}


def raw_streams(spec: Pipeline) -> list[str]:
    """The raw streams a pipeline reads (none for a stage over derived streams)."""
    return sorted({r.stream for r in spec.readers.values() if r.stream and not r.derived})


# -- the chart, kept beside the pipeline's epochs ---------------------------------------------

#: How long a chart link stays valid (SigV4 allows 7 days at most); each materialization has its own.
CHART_URL_SECONDS = 7 * 24 * 3600
#: The S3 endpoint the browser reaches, when it is not the one the runs use (a container's name).
PUBLIC_ENDPOINT_ENV = "WIRE_S3_PUBLIC_ENDPOINT"
#: `0` (or `off`): no chart link in the metadata. A link is a presigned GET of one PNG: it carries
#: the access key *id* (an identifier, not the secret) and a signature, and lets whoever holds it
#: read that one object for 7 days; a deployment that wants no such capability in Dagster's
#: storage turns it off and the chart is shown by its path only.
CHART_LINKS_ENV = "WIRE_CHART_LINKS"


def chart_links() -> bool:
    return env_switch(CHART_LINKS_ENV)


def chart_key(spec: Pipeline, epoch: int) -> str:
    """Beside the pipeline's epochs (`Checkpoints.root`); garbage collection never lists charts/."""
    return f"pipelines/{spec.name}/charts/watermarks-e{epoch:010d}.png"


def keep_chart(store: ObjectStore, spec: Pipeline, png: bytes, epoch: int) -> str:
    """Store the chart drawn for the committed epochs up to `epoch` (once: it never changes) and
    remove the charts of epochs garbage collection no longer keeps. Returns its key."""
    key = chart_key(spec, epoch)
    if store.head(key) is None:
        store.put(key, png)
    kept = Checkpoints(store, spec.name).committed()
    oldest = kept[0] if kept else epoch
    prefix = f"pipelines/{spec.name}/charts/"
    stale = [i.key for i in store.list(prefix) if i.key != key and _chart_epoch(i.key, prefix) < oldest]
    if stale:
        store.delete_many(stale)
    return key


def _chart_epoch(key: str, prefix: str) -> int:
    name = key[len(prefix) :]
    try:
        return int(name.removeprefix("watermarks-e").removesuffix(".png"))
    except ValueError:
        return -1


def chart_url(store: ObjectStore, key: str, seconds: int = CHART_URL_SECONDS) -> str:
    """A presigned GET URL of `key` a browser can load (an <img> in the Dagster UI), signed for
    WIRE_S3_PUBLIC_ENDPOINT if set (the address the browser reaches), else the store's endpoint.
    It grants reading that one object for `seconds`, and carries no secret."""
    cfg = store.cfg
    client = _signer(
        os.environ.get(PUBLIC_ENDPOINT_ENV, "").strip() or cfg.endpoint, cfg.access_key, cfg.secret_key, cfg.region
    )
    return client.generate_presigned_url(
        "get_object", Params={"Bucket": store.bucket, "Key": key}, ExpiresIn=min(seconds, CHART_URL_SECONDS)
    )


@functools.lru_cache(maxsize=4)
def _signer(endpoint: str, access_key: str, secret_key: str, region: str):
    """An S3 client that only signs (presigning sends no request); one per endpoint and key."""
    from botocore.config import Config

    return s3_client(
        endpoint_url=endpoint,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        region_name=region,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
