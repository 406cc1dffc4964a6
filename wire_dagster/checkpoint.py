"""Checkpoint manifests with two-phase commit in the object store (DESIGN §3).

Per pipeline::

    pipelines/<p>/epochs/<N:010d>/<run-id>.json   prepare: one manifest per attempt
    pipelines/<p>/epochs/<N:010d>/_COMMITTED      commit: names the winning run (create-if-absent)
    pipelines/<p>/staging/<run-id>/...            outputs, state, dead letters of an attempt
    pipelines/<p>/output/<window>/<partition>.parquet
                                                  published copies for outside readers

Prepare stages every file under the run's prefix, then writes the run's
manifest; commit creates the marker with `If-None-Match: *`, so exactly one run
wins an epoch. Readers and restarts trust only epochs whose marker exists, and
the committed manifest is the desired content of the output: published copies
that differ from it are rewritten from the staged files it names (Materialize's
persist sink), never the other way round. What a manifest holds is manifest.py.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager

from pydantic import ValidationError

from .errors import (
    CommitConflict,
    CommitStateUnknown,
    CorruptManifest,
    ObjectExists,
    ObjectNotFound,
    ObjectStoreError,
)
from .faults import fault
from .manifest import FileRef, Manifest, Marker, Step, sha256
from .objectstore import ObjectStore, ObjInfo
from .spec import check_name
from .timeutil import now_ms

STAGING_THREADS = 4  # files staged side by side (object-store round trips, Parquet, merges)
_STAGING_POOL: ThreadPoolExecutor | None = None
_STAGING_LOCK = threading.Lock()


@contextmanager
def staged(fn: Callable, items: list) -> Iterator[Iterator]:
    """`fn` over `items` on the process's staging threads, results in order: an epoch's files
    (partitions, state) staged side by side, since reads, merges, Parquet encoding and uploads
    release the GIL; the same manifest as one after the other. The threads live as long as the
    process, and with them each one's DuckDB connection (~12 ms to open: a pool per epoch opened
    2 x 23 of them for a 10 M backlog). On leaving, the items not started are cancelled and the
    started ones waited for, as a pool of one's own would on shutdown."""
    global _STAGING_POOL
    with _STAGING_LOCK:
        if _STAGING_POOL is None:
            _STAGING_POOL = ThreadPoolExecutor(max_workers=STAGING_THREADS, thread_name_prefix="wire-staging")
    futures = [_STAGING_POOL.submit(fn, x) for x in items]
    try:
        yield (f.result() for f in futures)
    finally:
        for f in futures:
            f.cancel()
        wait(futures)


PUBLISH_THREADS = 8  # partitions published side by side (each a few round trips to the store)


class Checkpoints:
    """The commit protocol of one pipeline over an object store."""

    def __init__(self, store: ObjectStore, pipeline: str):
        self.store = store
        self.pipeline = check_name(pipeline, "pipeline")
        self.root = f"pipelines/{pipeline}/"

    # -- keys ---------------------------------------------------------------
    def epoch_prefix(self, n: int) -> str:
        return f"{self.root}epochs/{n:010d}/"

    def marker_key(self, n: int) -> str:
        return self.epoch_prefix(n) + "_COMMITTED"

    def manifest_key(self, n: int, run_id: str) -> str:
        return self.epoch_prefix(n) + f"{check_name(run_id, 'run id')}.json"

    def staging_prefix(self, run_id: str) -> str:
        return f"{self.root}staging/{check_name(run_id, 'run id')}/"

    def published_key(self, window: str, partition: int) -> str:
        from .timeutil import iso

        return f"{self.root}output/{window}/{iso(partition).replace(':', '')}.parquet"

    def timeline_key(self, upto: int) -> str:
        return f"{self.root}timeline/upto-{upto:010d}.json"

    # -- reading committed state ---------------------------------------------
    def _listing(self) -> dict[int, set[str]]:
        """Epoch -> names of its objects (manifests `<run>.json`, the marker `_COMMITTED`), in one LIST.

        A flat listing of objects, not of "directories": some servers (SeaweedFS) keep
        listing a prefix whose objects were all deleted, and an epoch garbage collection
        removed must not come back (nor make every later listing grow).
        """
        prefix = f"{self.root}epochs/"
        out: dict[int, set[str]] = {}
        for i in self.store.list(prefix):
            n, _, name = i.key[len(prefix) :].partition("/")
            out.setdefault(int(n), set()).add(name)
        return out

    def epochs(self) -> list[int]:
        """Epoch numbers that hold an object (a manifest or a marker; committed or not), ascending."""
        return sorted(self._listing())

    def marker(self, n: int) -> Marker | None:
        try:
            d = json.loads(self.store.get(self.marker_key(n)))
        except ObjectNotFound:
            return None
        return Marker(d["run_id"], d["manifest"], d["sha256"])

    def committed(self) -> list[int]:
        """Epochs whose commit marker exists, ascending (one LIST, no GET per epoch)."""
        return sorted(n for n, names in self._listing().items() if "_COMMITTED" in names)

    def load(self, n: int) -> Manifest:
        """The committed manifest of epoch n (verified against its marker)."""
        m = self.marker(n)
        if m is None:
            raise ObjectNotFound(self.marker_key(n))
        data = self.store.get(m.manifest)
        if sha256(data) != m.sha256:
            raise CorruptManifest(f"manifest of epoch {n} does not match its commit marker checksum")
        try:
            return Manifest.model_validate_json(data)
        except ValidationError as e:
            raise CorruptManifest(f"manifest of epoch {n} is invalid: {e.errors()[0]['msg']}") from None

    def _compacted(self) -> tuple[int, list[Step]]:
        """The timeline garbage collection saved before deleting epochs: (last epoch it covers, steps)."""
        files = sorted(i.key for i in self.store.list(f"{self.root}timeline/") if i.key.endswith(".json"))
        if not files:
            return 0, []
        d = json.loads(self.store.get(files[-1]))
        return int(d["upto"]), [
            Step(int(x["epoch"]), {k: int(v) for k, v in x["remap"].items()}, int(x["watermark"])) for x in d["steps"]
        ]

    def timeline(self, upto: int) -> list[Step]:
        """The processing epochs that led to epoch `upto`, oldest first: a rewind cuts the
        timeline back to the epoch it restored; backfill epochs read nothing. Epochs garbage
        collection deleted come from the compacted timeline it saved first.
        Raises ObjectNotFound if a manifest it needs is gone without having been compacted."""
        base, steps = self._compacted()
        steps = [st for st in steps if st.epoch <= upto]
        for n in range(base + 1, upto + 1):
            if self.marker(n) is None:
                continue
            m = self.load(n)
            if m.kind == "rewind":
                steps = [st for st in steps if st.epoch <= (m.rewound_to or 0)]
            elif m.kind == "process":
                steps.append(Step(n, dict(m.remap), m.watermark))
        return steps

    def _compact(self, upto: int) -> None:
        """Save the timeline up to epoch `upto` before GC deletes those epochs (backfills replay it)."""
        base, _ = self._compacted()
        if upto <= base:
            return
        steps = self.timeline(upto)
        body = {
            "upto": upto,
            "steps": [{"epoch": st.epoch, "remap": st.remap, "watermark": st.watermark} for st in steps],
        }
        try:
            self.store.create_if_absent(self.timeline_key(upto), json.dumps(body, sort_keys=True).encode())
        except ObjectExists:
            pass  # a concurrent GC saved the same (deterministic) timeline
        older = [i.key for i in self.store.list(f"{self.root}timeline/") if i.key < self.timeline_key(upto)]
        self.store.delete_many(older)

    def latest(self) -> Manifest | None:
        """The last committed epoch's manifest; uncommitted epochs are ignored."""
        committed = self.committed()
        return self.load(committed[-1]) if committed else None

    # -- prepare and commit ----------------------------------------------------
    def stage(self, run_id: str, rel: str, data: bytes, rows: int, epoch: int) -> FileRef:
        key = self.staging_prefix(run_id) + rel
        self.store.put(key, data)
        return FileRef(
            key=key, sha256=sha256(data), rows=rows, bytes=len(data), epoch=epoch, md5=hashlib.md5(data).hexdigest()
        )

    def stage_dead_letters(self, run_id: str, epoch: int, letters, before: list[FileRef]) -> list[FileRef]:
        """The dead-letter files an epoch's manifest names: the previous epoch's (`before`), plus
        this epoch's `letters` (a pyarrow Table, stamped with the epoch) staged as one file."""
        if not letters.num_rows:
            return list(before)
        import pyarrow as pa

        from .parquetio import parquet_bytes

        fault("during-dead-letters")
        t = letters.append_column("epoch", pa.array([epoch] * letters.num_rows, pa.int64()))
        return [*before, self.stage(run_id, "dead_letters.parquet", parquet_bytes(t), t.num_rows, epoch)]

    def prepare_and_commit(self, manifest: Manifest) -> Manifest:
        """Both phases of an epoch's commit, as every engine commits: the manifest, then its marker.
        A run that lost the race collects its own staging and raises CommitConflict."""
        self.prepare(manifest)
        fault("after-manifest")
        try:
            self.commit(manifest)
        except CommitConflict:
            self.abort(manifest.run_id)
            raise
        return manifest

    def prepare(self, manifest: Manifest) -> str:
        key = self.manifest_key(manifest.epoch, manifest.run_id)
        self.store.put(key, manifest.to_bytes())
        return key

    def commit(self, manifest: Manifest) -> None:
        """Create the commit marker. Idempotent for the run that won; CommitConflict for a loser.

        A lost answer is resolved by reading the marker back (CommitStateUnknown only
        if the store stays unreachable).
        """
        key = self.manifest_key(manifest.epoch, manifest.run_id)
        body = json.dumps({"run_id": manifest.run_id, "manifest": key, "sha256": sha256(manifest.to_bytes())}).encode()
        fault("before-marker")
        self._fence(manifest)
        try:
            self.store.create_if_absent(self.marker_key(manifest.epoch), body)
        except ObjectExists:
            pass
        except ObjectStoreError as e:
            try:
                won = self.marker(manifest.epoch)
            except ObjectStoreError:
                raise CommitStateUnknown(f"epoch {manifest.epoch}: commit marker state unknown ({e})") from None
            if won is None:
                raise CommitStateUnknown(f"epoch {manifest.epoch}: commit marker not written ({e})") from None
        won = self.marker(manifest.epoch)
        if won is None or won.run_id != manifest.run_id:
            raise CommitConflict(
                f"epoch {manifest.epoch} of {self.pipeline} was committed by run {won.run_id if won else '?'}; "
                "this run aborts"
            )
        fault("after-marker")

    def _fence(self, manifest: Manifest) -> None:
        """A zombie cannot commit an epoch the timeline has moved past.

        The marker's create-if-absent decides between rivals for epoch N while N's
        marker exists; once garbage collection has deleted it, N's slot would be free
        again, so a later committed epoch also means this attempt lost.
        """
        own = self.marker(manifest.epoch)
        if own is not None and own.run_id == manifest.run_id:
            return  # already won: commit stays idempotent
        for n in reversed(self.committed()):
            if n <= manifest.epoch:
                break
            won = self.marker(n)
            if won is not None:
                raise CommitConflict(
                    f"epoch {manifest.epoch} of {self.pipeline}: epoch {n} is already committed (run {won.run_id}); "
                    "this run aborts"
                )

    def abort(self, run_id: str) -> int:
        """Collect a losing or failed attempt's staging (never a committed run's, never a file the
        latest committed manifest names)."""
        listing = self._listing()
        for n, names in listing.items():
            if f"{run_id}.json" in names and "_COMMITTED" in names:
                m = self.marker(n)
                if m and m.run_id == run_id:
                    return 0
        latest = max((n for n, names in listing.items() if "_COMMITTED" in names), default=None)
        named = {f.key for f in self._files_of(latest)} if latest is not None else set()
        return self.store.delete_many(i.key for i in self.store.list(self.staging_prefix(run_id)) if i.key not in named)

    def _files_of(self, n: int) -> list[FileRef]:
        try:
            return self.load(n).files()
        except ObjectNotFound:  # collected meanwhile: it names nothing any more
            return []

    # -- publishing and self-correction --------------------------------------
    def publish(self, manifest: Manifest, windows_partitions: dict[str, list[int]] | None = None) -> list[str]:
        """Make the published copies equal to the manifest (all, or the given partitions).

        Compares checksums and rewrites only what differs; returns the keys it wrote.
        Refuses to publish an epoch that is no longer the latest committed one.
        """
        latest = self.latest()
        if latest is None or latest.epoch != manifest.epoch:
            return []
        fixed = self._publish(manifest, windows_partitions)
        # A newer epoch committed while we wrote (we were a slow publisher): what we wrote
        # may be older than its content, so make the output equal to the newest manifest.
        newest = self.latest()
        if newest is not None and newest.epoch != manifest.epoch:
            fixed += self.publish(newest)
        return fixed

    def _publish(self, manifest: Manifest, windows_partitions: dict[str, list[int]] | None) -> list[str]:
        # Published copies (sizes and ETags) by key, from listings: every one when all are checked
        # (one listing, which also finds the strays), else a window's when a listing takes fewer
        # requests (1,000 keys a page) than a HEAD for each of its partitions to publish.
        listed: dict[str, ObjInfo] = {}
        if windows_partitions is None:
            listed = {i.key: i for i in self.store.list(f"{self.root}output/")}
        jobs = []
        for window, parts in manifest.outputs.items():
            wanted = windows_partitions.get(window) if windows_partitions is not None else None
            todo = [(window, int(p), ref) for p, ref in parts.items() if wanted is None or int(p) in wanted]
            by_listing = windows_partitions is None
            if todo and not by_listing and len(parts) // 1000 + 1 < len(todo):
                listed.update((i.key, i) for i in self.store.list(f"{self.root}output/{window}/"))
                by_listing = True
            jobs += [(w, p, ref, by_listing) for w, p, ref in todo]

        def one(job: tuple[str, int, FileRef, bool]) -> str | None:
            """The partition's published key if its copy had to be written."""
            window, p, ref, was_listed = job
            pkey = self.published_key(window, p)
            info = listed.get(pkey) if was_listed else self.store.head(pkey)
            if info is not None and info.size == ref.bytes:
                if ref.md5 is not None and info.etag == ref.md5:
                    return None  # the copy's MD5 (the ETag of its PUT) is the staged file's
                # No MD5 recorded, or an ETag that is not one (multipart, encryption): the bytes decide.
                if sha256(self.store.get(pkey)) == ref.sha256:
                    return None
            fault("during-publish")
            if ref.md5 is not None:
                # Copied inside the store, if the staged file still has the MD5 it was staged with.
                intact = self.store.copy(ref.key, pkey, if_match=ref.md5)
            else:
                data = self.store.get(ref.key)
                intact = sha256(data) == ref.sha256
                if intact:
                    self.store.put(pkey, data)
            if not intact:
                raise CorruptManifest(f"staged file {ref.key} no longer matches its committed checksum")
            return pkey

        # Partitions side by side: each is a round trip or two to the store (a backlog's run
        # publishes hundreds); the keys come back in the manifest's order.
        with ThreadPoolExecutor(max_workers=PUBLISH_THREADS) as pool:
            fixed = [k for k in pool.map(one, jobs) if k is not None]
        # Published files no committed manifest names (a zombie, a hand-made file) are removed.
        names = {self.published_key(w, int(p)) for w, parts in manifest.outputs.items() for p in parts}
        if windows_partitions is None:
            stray = [k for k in listed if k not in names]
        else:
            # A requested partition the manifest no longer names (a retraction or a backfill left it
            # empty) has no published copy any more either.
            stray = [
                k
                for w, ps in windows_partitions.items()
                for p in ps
                if (k := self.published_key(w, int(p))) not in names and self.store.head(k) is not None
            ]
        self.store.delete_many(stray)
        fixed += stray
        return fixed

    def verify(self, manifest: Manifest) -> list[str]:
        """Staged files of a committed manifest that are missing or altered (should be none)."""
        bad = []
        for ref in manifest.files():
            try:
                if sha256(self.store.get(ref.key)) != ref.sha256:
                    bad.append(ref.key)
            except ObjectNotFound:
                bad.append(ref.key)
        return bad

    # -- garbage collection ---------------------------------------------------
    def gc(self, keep: int = 5, grace_s: float = 600.0, current_run: str | None = None) -> dict[str, int]:
        """Keep the last `keep` committed epochs; never delete a file a kept manifest names.

        Deletes: epochs older than the kept ones (the marker first); staged files
        of committed runs that no kept manifest names; staging of runs that never
        committed once older than `grace_s` (younger ones may still be preparing).
        """
        listing = self._listing()  # one LIST for what is committed and what goes
        committed = sorted(n for n, names in listing.items() if "_COMMITTED" in names)
        kept = committed[-keep:] if keep > 0 else committed
        manifests = [self.load(n) for n in kept]
        referenced = {f.key for m in manifests for f in m.files()}
        committed_runs = {m.run_id for m in (self.marker(n) for n in committed) if m}
        doomed = [n for n in committed if kept and n < kept[0]]
        if doomed:
            self._compact(doomed[-1])  # before any marker goes: backfills still replay these epochs
        gone = [n for n in sorted(listing) if kept and (n < kept[0] or (n < kept[-1] and n not in committed))]
        keys = [self.epoch_prefix(n) + name for n in gone for name in sorted(listing[n])]
        # The markers go first: a crash half-way leaves uncommitted epochs (collected next time),
        # never a committed marker whose manifest is gone.
        markers = {k for k in keys if k.endswith("/_COMMITTED")}
        for batch in ([k for k in keys if k in markers], [k for k in keys if k not in markers]):
            if batch:
                fault("during-gc")
                self.store.delete_many(batch)
        deleted_epochs = len(gone)
        cutoff = now_ms() - int(grace_s * 1000)
        stale = []
        for info in self.store.list(f"{self.root}staging/"):
            run = info.key[len(f"{self.root}staging/") :].split("/", 1)[0]
            if info.key in referenced or run == current_run:
                continue
            if run in committed_runs or info.last_modified_ms < cutoff:
                stale.append(info.key)
        self.store.delete_many(stale)
        return {"epochs": deleted_epochs, "files": len(stale)}


def new_run_id() -> str:
    import uuid

    return time.strftime("%Y%m%dt%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:12]
