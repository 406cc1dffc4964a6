"""The pass-through computation of a raw input expanded out of a stage (expand.py).

A stage that joins raw streams, or mixes a raw input with a derived one, reads each raw input
through a generated pipeline `<stage>__<input>` (expand.py): it reads the stream with the
input's time, id, key and filter, and commits every accepted record — each once (duplicate ids
are dead letters `duplicate`), none behind W by more than the allowed lateness (dead letters
`late`) — as the record-preserving output `records`. This class is that pipeline's
computation: each record delivered is produced as is, at its own event time, under the
input's key. Delivery (computestage.py) brings the records in event-time order once W passes
them, de-duplicated by id; `late_dead_letters` asks it to turn the records behind
`W_prev - allowed lateness` into dead letters instead of delivering them (a user computation
receives late records, flagged `ctx.is_late`).
"""

from __future__ import annotations

from .computation import Computation, Context, Timer
from .expand import OUTPUT


class Records(Computation):
    """Every delivered record into `records`, unchanged, at its event time."""

    #: computestage.py: a record behind W_prev by more than the allowed lateness is a dead
    #: letter `late`, as in the window engine (DESIGN §1), not a delivery.
    late_dead_letters = True

    def process_record(self, ctx: Context, record: dict) -> None:
        ctx.produce(record, OUTPUT)

    def process_timer(self, ctx: Context, timer: Timer) -> None:  # no timers: nothing to fire
        del ctx, timer

    #: computestage.run_bucket calls this instead of delivering record by record: `bucket` below,
    #: vectorised, the same tables (the class is what computestage loads, so it never imports us).
    @staticmethod
    def bucket(loaded, events, carried, w_prev: int, w_new: int, threads: int = 1) -> dict:
        return bucket(loaded, events, carried, w_prev, w_new, threads)


def bucket(loaded, events, carried, w_prev: int, w_new: int, threads: int = 1) -> dict:
    """`computestage.run_bucket` for a pipeline whose one computation is this pass-through, with
    no per-record Python call: DuckDB over the bucket's Arrow tables screens the records
    (duplicate ids, late records: `computestage.screen`'s rules), delivers those W passed and
    buffers the rest, and the produced rows, carried state, dead letters and counters are the
    tables `run_bucket` returns, row for row (tests/test_raw_joins.py compares both). Each
    record's JSON text arrives in the canonical form `ctx.produce` stores (sorted keys:
    computestage.read_records reads it so for this class, `computestage.vectorised`), so it is
    produced, and a dead letter's event, as it is: no record is parsed, but those waiting for W
    (carried as KeyState's JSON)."""
    import json

    import duckdb
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from .bigarrow import gather
    from .bucketkernel import _lit
    from .computation import Item, KeyState
    from .computestage import (
        CARRIED_SCHEMA,
        IDS_PREFIX,
        PRODUCED_SCHEMA,
        PSTATS,
        PSTATS_SCHEMA,
        STAT_NAMES,
        STATS_SCHEMA,
    )
    from .events import ERR, FILTERED, ID, JSON, KEY, ROW, SEG, SEQ, SRC, TIME
    from .kernel import DEAD_LETTER

    (comp,) = loaded.specs
    (output,) = comp.outputs
    drops_late = bool(getattr(loaded.classes[0], "late_dead_letters", False))
    lateness = loaded.lateness
    n = {"events_in": events.num_rows}
    err = events[ERR]
    filtered = pc.fill_null(pc.equal(err, FILTERED), False)  # pyright: ignore[reportAttributeAccessIssue]
    bad = events.filter(pc.and_(pc.is_valid(err), pc.invert(filtered)))  # pyright: ignore[reportAttributeAccessIssue]
    n["filtered"] = pc.sum(filtered).as_py() or 0  # pyright: ignore[reportAttributeAccessIssue]
    n["malformed"] = bad.num_rows
    # usually every record is good: then no copy of their texts (0.6 s sampled for 920,000 bids)
    good = events if err.null_count == events.num_rows else events.filter(pc.is_null(err))  # pyright: ignore[reportAttributeAccessIssue]

    # what the keys carry: records waiting for W (the pass-through keeps no state nor timers), ids
    buf: dict[str, list] = {c: [] for c in ("t", "k", "seg", "seq", "row", "j", "oid")}
    mem: dict[str, list] = {"k": [], "id": [], "expires": []}
    cd = carried.select(CARRIED_SCHEMA.names).to_pydict()
    for c, k, d in zip(cd["comp"], cd["key"], cd["data"], strict=True):
        if c == comp.name:
            for i in KeyState.from_json(d).buffer:
                j = json.dumps(i.record, sort_keys=True)  # canonical, as the records read (docstring)
                for col, v in zip(buf, (i.t, k, i.seg, i.seq, i.row, j, i.oid), strict=True):
                    buf[col].append(v)
        elif c == IDS_PREFIX + comp.name:
            for rid, exp in json.loads(d).items():
                mem["k"].append(k)
                mem["id"].append(rid)
                mem["expires"].append(exp)
    n_before = len(buf["t"])
    # the texts stay in Arrow: DuckDB moves each record's place `ix` in them (good's, then buf's),
    # and `gather` takes them back chunk by chunk (usually every record: good's chunks as they are)
    texts = [good[JSON], pa.array(buf.pop("j"), pa.string())]
    buf["ix"] = list(range(good.num_rows, good.num_rows + n_before))
    types = {"t": pa.int64(), "seq": pa.int64(), "row": pa.int64(), "expires": pa.int64(), "ix": pa.int64()}
    con = duckdb.connect(config={"threads": threads})  # the only task of a job: its cores (run_bucket)
    try:
        con.register("good", good.drop_columns([JSON]).append_column("ix", pa.array(np.arange(good.num_rows))))
        con.register("buf", pa.table({c: pa.array(v, types.get(c, pa.string())) for c, v in buf.items()}))
        con.register("mem", pa.table({c: pa.array(v, types.get(c, pa.string())) for c, v in mem.items()}))
        # A duplicate: a repeat of an earlier (key, id) of the bucket, or of one the keys remember.
        # The ordered window that finds the repeats runs only when a hash aggregate says there
        # are some (usually none: 0.18 s against the window's 0.47 s, for 920,000 bids).
        repeats = f"SELECT 1 FROM good WHERE {ID} IS NOT NULL GROUP BY {KEY}, {ID} HAVING count(*) > 1 LIMIT 1"
        again = f"row_number() OVER (PARTITION BY {KEY}, {ID} ORDER BY {SEG}, {SEQ}, {ROW}) > 1"
        known = f"EXISTS (SELECT 1 FROM mem m WHERE m.k IS NOT DISTINCT FROM good.{KEY} AND m.id = good.{ID})"
        dup = " OR ".join(([again] if con.execute(repeats).fetchall() else []) + ([known] if mem["id"] else []))
        late = f"NOT dup AND {'TRUE' if drops_late else 'FALSE'} AND t + {lateness} < {w_prev}"
        # one table of the bucket's records, and the accepted ones a view over it and the buffer
        # (two more copies of 920,000 rows took 0.29 s; a scan of them is cheaper)
        con.execute(f"""
            CREATE TEMP TABLE f AS
            SELECT *, {late} AS late FROM (
                SELECT {TIME} AS t, {KEY} AS k, {ID} AS id, {SEG} AS seg, {SEQ} AS seq, {ROW} AS row, ix,
                       '' AS oid, {f"{ID} IS NOT NULL AND ({dup})" if dup else "FALSE"} AS dup
                FROM good)""")
        con.execute("""
            CREATE TEMP VIEW acc AS
            SELECT t, k, seg, seq, row, ix, oid FROM f WHERE NOT dup AND NOT late
            UNION ALL SELECT t, k, seg, seq, row, ix, oid FROM buf""")
        # produced: each delivered record, at its time, under its key, its id that of `ctx.produce`
        # (no ORDER BY ix, 0.18 s: DuckDB keeps a scan's order, preserve_insertion_order, so
        # `gather` finds `ix` ascending all the same; merge_output sorts the rows)
        origin = "CASE WHEN oid = '' THEN 'r:' || seg || '/' || seq || '/' || row ELSE oid END"
        out_rows = con.sql(f"""
            SELECT k, t, seg, seq, row, ix, t < {w_prev} AS is_late, {_lit(comp.name + "|")} || {origin} || '|0' AS id
            FROM acc WHERE t < {w_new}""").to_arrow_table()
        waiting = con.sql(f"SELECT * FROM acc WHERE t >= {w_new} ORDER BY k, t, seg, seq, row").to_arrow_table()
        aside = con.sql("SELECT * FROM f WHERE dup OR late ORDER BY seg, seq, row").to_arrow_table()
        memory = con.sql(f"""
            SELECT k, '{{' || string_agg(to_json(id) || ':' || expires, ',' ORDER BY id) || '}}' AS data
            FROM (SELECT k, id, t + {lateness} + 1 AS expires FROM f WHERE NOT dup AND id IS NOT NULL
                  UNION ALL SELECT k, id, expires FROM mem)
            WHERE expires > {w_new} GROUP BY k""").to_arrow_table()
    finally:
        con.close()

    loads = json.loads
    produced = pa.table(
        {
            "output": pa.repeat(pa.scalar(output), out_rows.num_rows),
            "key": out_rows["k"],
            "window_start": out_rows["t"],
            "window_end": pc.add(out_rows["t"], 1),  # pyright: ignore[reportAttributeAccessIssue]
            "id": out_rows["id"],
            "record": gather(texts, out_rows["ix"], pa.string()),
        },
        schema=PRODUCED_SCHEMA,
    )

    # carried: each key's waiting records (KeyState's own JSON), then its id memory
    new_carried: list[dict] = []
    w = waiting.to_pydict()
    w["j"] = gather(texts, waiting["ix"], pa.string()).to_pylist()
    by_key: dict = {}
    for i in range(waiting.num_rows):
        item = Item(w["t"][i], w["seg"][i], w["seq"][i], w["row"][i], loads(w["j"][i]), w["oid"][i])
        by_key.setdefault(w["k"][i], []).append(item)
    for k, items in by_key.items():
        new_carried.append({"comp": comp.name, "key": k, "data": KeyState(buffer=items).to_json()})
    mm = memory.to_pydict()
    new_carried += [
        {"comp": IDS_PREFIX + comp.name, "key": k, "data": d} for k, d in zip(mm["k"], mm["data"], strict=True)
    ]

    # dead letters: malformed records, then duplicates and late ones
    dead = [
        {"reason": r[ERR], "window": None, "event": r[SRC], "event_time": r[TIME], "segment": r[SEG],
         "chunk": r[SEQ], "row": r[ROW]}
        for r in bad.select([ERR, SRC, TIME, SEG, SEQ, ROW]).to_pylist()
    ]  # fmt: skip
    a = aside.to_pydict()
    a["j"] = gather(texts, aside["ix"], pa.string()).to_pylist()
    for i in range(aside.num_rows):
        why = "duplicate" if a["dup"][i] else "late"
        dead.append(
            {
                "reason": why,
                "window": comp.name if why == "late" else None,
                "event": a["j"][i],
                "event_time": a["t"][i],
                "segment": a["seg"][i],
                "chunk": a["seq"][i],
                "row": a["row"][i],
            }
        )
    n_dup = sum(1 for x in a["dup"] if x) if aside.num_rows else 0
    st: dict[str, int] = dict.fromkeys(STAT_NAMES, 0)
    n_late = pc.sum(out_rows["is_late"]).as_py() if out_rows.num_rows else 0  # pyright: ignore[reportAttributeAccessIssue]
    st["delivered"] = st["produced"] = out_rows.num_rows
    st["late"] = int(n_late or 0)
    st["buffered"], st["buffered_before"], st["state_keys"] = waiting.num_rows, n_before, len(by_key)
    st["duplicate"], st["dropped_late"] = n_dup, aside.num_rows - n_dup
    # per event-time partition: records in (delivered) and produced, both at the record's time
    start, size = loaded.partitioning
    parts = pc.add(pc.multiply(pc.floor(pc.divide(pc.subtract(out_rows["t"], start), float(size))), size), start)  # pyright: ignore[reportAttributeAccessIssue]
    counted = pc.value_counts(pc.cast(parts, pa.int64())).to_pylist() if out_rows.num_rows else []  # pyright: ignore[reportAttributeAccessIssue]
    pstats = [
        {"comp": comp.name, "partition": v["values"], **dict.fromkeys(PSTATS, 0), "records_in": v["counts"],
         "produced": v["counts"]}
        for v in sorted(counted, key=lambda v: v["values"])
    ]  # fmt: skip
    return {
        ("produced", ""): produced,
        ("carried", ""): pa.Table.from_pylist(new_carried, CARRIED_SCHEMA),
        ("dead", ""): pa.Table.from_pylist(dead, DEAD_LETTER),
        ("stats", ""): pa.Table.from_pylist([{"comp": comp.name, **st, "pending_timer": None}], STATS_SCHEMA),
        ("pstats", ""): pa.Table.from_pylist(pstats, PSTATS_SCHEMA),
        ("n", ""): pa.table({k: pa.array([n[k]], pa.int64()) for k in ("events_in", "malformed", "filtered")}),
    }
