"""One asset per raw stream: the data the pipelines read, upstream of their windows (lineage).

A stream is external to Dagster (`wire produce` appends its chunks to the object store), so its
asset is an external AssetSpec, one per stream however many pipelines read it, built once per
code location (definitions.py). A run that commits new chunks of a stream reports it: an
AssetMaterialization of the stream with the chunks read per segment, the newest event time and
whether it is sealed, and a `version` that changes exactly when those do (a second reader of
the same chunks reports nothing new). The report carries no Dagster data version: the stream's
stays "INITIAL", so its growth does not mark every window partition "unsynced". Freshness: a
stream is stale when no reader has committed a new chunk of it for `dagster.max_watermark_lag`
+ one partition (the smallest over its readers).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import dagster as dg

from wire_dagster.assetview import raw_streams
from wire_dagster.landing import AdoptReport, landing_readers, observation
from wire_dagster.spec import Pipeline
from wire_dagster.timeutil import format_duration


def stream_key(stream: str) -> dg.AssetKey:
    return dg.AssetKey(["streams", stream])


def freshness_ms(spec: Pipeline) -> int:
    """The freshness window of a pipeline's assets: W must advance past a partition's end (and
    the run report it) within `max_watermark_lag` of the partition's end, so a live stream
    materializes a partition at least every max_watermark_lag + one partition (Dagster: >= 1 min)."""
    return max(60_000, spec.orchestration.max_watermark_lag + spec.partition)


def freshness_policy(ms: int) -> dg.FreshnessPolicy:
    return dg.FreshnessPolicy.time_window(fail_window=timedelta(milliseconds=ms))


def build_stream_specs(specs: Sequence[Pipeline]) -> list[dg.AssetSpec]:
    """The external asset of every raw stream the pipelines read, once each."""
    readers: dict[str, list[Pipeline]] = {}
    for spec in specs:
        for stream in raw_streams(spec):
            readers.setdefault(stream, []).append(spec)
    out = []
    for stream, ps in sorted(readers.items()):
        window = min(freshness_ms(p) for p in ps)
        landings = sorted({r.landing for p in ps for r in landing_readers(p) if r.stream == stream and r.landing})
        source = (
            f"adopted from the landing prefix {', '.join(landings)} (objects other tools write; each adoption "
            "is observed: objects, bytes, segment watermarks)"
            if landings
            else "written by `wire produce`"
        )
        out.append(
            dg.AssetSpec(
                stream_key(stream),
                description=(
                    f"Stream {stream}: append-only chunks in the object store (streams/{stream}/), "
                    f"{source}; read by {', '.join(sorted(p.name for p in ps))}. Reported (materialized) "
                    f"when a reader commits new chunks of it; stale after {format_duration(window)} without one."
                ),
                group_name="streams",
                kinds={"s3"},
                metadata={
                    "wire/stream": stream,
                    "wire/prefix": f"streams/{stream}/",
                    **({"wire/landing": ", ".join(landings)} if landings else {}),
                },
                freshness_policy=freshness_policy(window),
            )
        )
    return out


def landing_observations(spec: Pipeline, reports: Sequence[AdoptReport]) -> list[dg.AssetObservation]:
    """The stream assets' observations of one adoption (the sensor's evaluation): objects adopted,
    their bytes, events, dead letters, rewrites, and the segments' watermarks; none when nothing
    landed or changed (an idle evaluation records nothing)."""
    return [
        dg.AssetObservation(asset_key=stream_key(r.stream), metadata=observation(spec, r))
        for r in reports
        if r.adopted or r.changed
    ]
