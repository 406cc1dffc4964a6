"""ObjectStore against the real embedded S3 server (SeaweedFS); faults come from tests/faultproxy.py."""

from __future__ import annotations

import os
import pickle
import socket
import threading
import time
from dataclasses import replace
from typing import TypedDict, Unpack

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from faultproxy import FaultProxy
from wire_dagster.errors import ObjectExists, ObjectNotFound, ObjectStoreError, WireInputError
from wire_dagster.objectstore import ObjectStore, S3Config, arrow_fs_from_options


# --------------------------------------------------------------------- proxy
@pytest.fixture
def proxy(store: ObjectStore):
    p = FaultProxy(store.cfg.endpoint)
    yield p
    p.close()


class _Retries(TypedDict, total=False):
    retry_budget: float
    backoff_initial: float
    backoff_cap: float


def _via(proxy: FaultProxy, store: ObjectStore, **kw: Unpack[_Retries]) -> ObjectStore:
    return ObjectStore(replace(store.cfg, endpoint=proxy.endpoint), **kw)


# --------------------------------------------------------------------- config
def test_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WIRE_S3_ENDPOINT", raising=False)
    assert S3Config.from_env() is None
    env = {"WIRE_S3_ENDPOINT": "http://127.0.0.1:9000/", "WIRE_S3_ACCESS_KEY": "ak", "WIRE_S3_SECRET_KEY": "sk"}
    cfg = S3Config.from_env(env)
    assert cfg is not None
    assert cfg == S3Config("http://127.0.0.1:9000", "ak", "sk", "wire", "us-east-1")
    assert S3Config.from_env(cfg.export_env()) == cfg
    assert cfg.host_port == "127.0.0.1:9000"
    with pytest.raises(WireInputError, match="WIRE_S3_SECRET_KEY"):
        S3Config.from_env({"WIRE_S3_ENDPOINT": "http://x:1", "WIRE_S3_ACCESS_KEY": "ak"})
    with pytest.raises(WireInputError, match="WIRE_S3_ENDPOINT"):
        S3Config("127.0.0.1:9000", "ak", "sk")


def test_no_secret_in_repr(store: ObjectStore) -> None:
    secret = store.cfg.secret_key
    assert secret not in repr(store.cfg)
    assert secret not in str(store.cfg)
    assert secret not in repr(store)
    assert store.cfg.endpoint in repr(store)


def test_store_sees_env(store: ObjectStore) -> None:
    assert S3Config.from_env() == store.cfg
    assert os.environ["WIRE_S3_BUCKET"] == store.bucket


# ------------------------------------------------------------------ basic ops
def test_put_get_head_delete(store: ObjectStore) -> None:
    etag = store.put("a/b.bin", b"hello")
    assert etag and '"' not in etag
    assert store.get("a/b.bin") == b"hello"
    info = store.head("a/b.bin")
    assert info is not None
    assert (info.key, info.size, info.etag) == ("a/b.bin", 5, etag)
    assert abs(info.last_modified_ms - time.time() * 1000) < 120_000
    assert store.exists("a/b.bin")
    assert store.get_range("a/b.bin", 1, 3) == b"ell"
    assert store.get_range("a/b.bin", 3, 100) == b"lo"
    assert store.get_range("a/b.bin", 10, 5) == b""
    store.put("a/b.bin", b"")  # overwrite, empty object
    assert store.get("a/b.bin") == b""
    store.delete("a/b.bin")
    store.delete("a/b.bin")  # idempotent
    assert store.head("a/b.bin") is None
    assert not store.exists("a/b.bin")
    with pytest.raises(ObjectNotFound) as ei:
        store.get("a/b.bin")
    assert ei.value.key == "a/b.bin"
    with pytest.raises(ObjectNotFound):
        store.get_range("a/b.bin", 0, 1)


def test_ensure_bucket_idempotent(store: ObjectStore) -> None:
    store.ensure_bucket()
    store.ensure_bucket()
    other = ObjectStore(replace(store.cfg, bucket=store.bucket + "-x"))
    with pytest.raises(ObjectStoreError, match="does not exist"):
        other.put("k", b"1")  # no auto-creation, as on MinIO
    other.ensure_bucket()
    other.put("k", b"1")
    assert other.get("k") == b"1"


# Keys chosen so that S3 (byte) order differs from SeaweedFS's path-component order.
TRICKY = ["a-c", "a/b", "a/b/c", "a/b-d", "a0", "a/b/c/d", "a/b.x", "b", "a/b0", "x/y/z", "a/\u00e4", "a/Z"]


def test_list_is_byte_ordered(store: ObjectStore) -> None:
    for k in TRICKY:
        store.put(k, k.encode())
    want = sorted(TRICKY, key=str.encode)
    got = [i.key for i in store.list("")]
    assert got == want
    assert [i.size for i in store.list("")] == [len(k.encode()) for k in want]
    assert [i.key for i in store.list("a/b")] == [k for k in want if k.startswith("a/b")]
    # start_after is exclusive and byte-ordered, also when it names a "directory"
    for sa in ["a/b", "a/b/c", "a-c", "a/", "", "zzz", "a/b/c/d"]:
        assert [i.key for i in store.list("", start_after=sa)] == [k for k in want if k.encode() > sa.encode()], sa
    assert list(store.list("nothing/")) == []


def test_list_pagination(store: ObjectStore) -> None:
    keys = [f"p/{i:03d}/part-{j}.parquet" for i in range(12) for j in range(3)] + [f"p/{i:03d}" for i in range(5)]
    for k in keys:
        store.put(k, b"x")
    assert [i.key for i in store.list("p/", page_size=4)] == sorted(keys)
    assert [i.key for i in store.list("p/", start_after="p/005/part-1.parquet", page_size=7)] == [
        k for k in sorted(keys) if k > "p/005/part-1.parquet"
    ]
    assert store.list_prefixes("p/", page_size=5) == [f"p/{i:03d}/" for i in range(12)]
    assert store.list_prefixes("p/000/") == []
    assert store.list_prefixes("") == ["p/"]


def test_delete_many(store: ObjectStore) -> None:
    keys = [f"d/{i}" for i in range(25)]
    for k in keys:
        store.put(k, b"1")
    assert store.delete_many(keys[:10] + ["d/missing"]) == 11
    assert [i.key for i in store.list("d/")] == sorted(keys[10:])
    assert store.delete_many(iter(keys)) == 25
    assert list(store.list("d/")) == []
    assert store.delete_many([]) == 0


def test_copy_inside_the_store_if_the_source_is_unchanged(store: ObjectStore) -> None:
    etag = store.put("c/src", b"payload")
    assert store.copy("c/src", "c/dst", if_match=etag) is True
    info = store.head("c/dst")
    assert store.get("c/dst") == b"payload" and info is not None and info.etag == etag
    store.put("c/src", b"changed")
    assert store.copy("c/src", "c/dst2", if_match=etag) is False  # the precondition failed: nothing written
    assert not store.exists("c/dst2") and store.get("c/dst") == b"payload"
    with pytest.raises(ObjectNotFound):
        store.copy("c/missing", "c/dst3", if_match=etag)
    assert not store.exists("c/dst3")
    store.delete_many(["c/src", "c/dst"])


# -------------------------------------------------------- conditional create
def test_create_if_absent(store: ObjectStore) -> None:
    store.create_if_absent("m/_COMMITTED", b"run-1")
    with pytest.raises(ObjectExists) as ei:
        store.create_if_absent("m/_COMMITTED", b"run-2")
    assert ei.value.key == "m/_COMMITTED"
    with pytest.raises(ObjectExists):  # same bytes, but this call did not create it
        store.create_if_absent("m/_COMMITTED", b"run-1")
    assert store.get("m/_COMMITTED") == b"run-1"
    store.delete("m/_COMMITTED")
    store.create_if_absent("m/_COMMITTED", b"run-3")
    assert store.get("m/_COMMITTED") == b"run-3"


def _race_create(store: ObjectStore, key: str, n: int) -> dict[int, str]:
    """`n` threads released together each try create_if_absent(key): thread -> "won" or "lost"."""
    barrier = threading.Barrier(n)
    results: dict[int, str] = {}

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            store.create_if_absent(key, f"run-{i}".encode())
            results[i] = "won"
        except ObjectExists:
            results[i] = "lost"

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_create_if_absent_race_has_one_winner(store: ObjectStore) -> None:
    for trial in range(3):
        key = f"race/{trial}/_COMMITTED"
        results = _race_create(store, key, 8)
        winners = [i for i, r in results.items() if r == "won"]
        assert len(results) == 8 and len(winners) == 1
        assert store.get(key) == f"run-{winners[0]}".encode()


def test_create_if_absent_on_a_prefix_key_is_not_object_exists(store: ObjectStore) -> None:
    store.put("dir/child", b"1")
    try:
        store.create_if_absent("dir", b"x")  # MinIO: fine; SeaweedFS: cannot store both
    except ObjectStoreError as exc:
        assert "prefix" in str(exc)
    else:
        assert store.get("dir") == b"x"


def test_create_if_absent_lost_reply_is_idempotent(store: ObjectStore, proxy: FaultProxy) -> None:
    flaky = _via(proxy, store, retry_budget=10)
    proxy.drop_put_replies = 1  # the server creates it, the client never hears back
    flaky.create_if_absent("lost/_COMMITTED", b"run-1")
    assert proxy.drop_put_replies == 0
    assert store.get("lost/_COMMITTED") == b"run-1"
    # a rival's marker stays a loss even when our reply was lost
    store.put("lost/other", b"rival")
    proxy.drop_put_replies = 1
    with pytest.raises(ObjectExists):
        flaky.create_if_absent("lost/other", b"run-1")
    assert store.get("lost/other") == b"rival"


def test_put_cut_after_headers_leaves_no_torn_object(store: ObjectStore, proxy: FaultProxy) -> None:
    # SeaweedFS 4.48 stores an EMPTY object for a PUT whose body never arrives
    # unless the request carries Content-MD5; ours always does.
    store.put("torn/existing", b"old content")
    once = _via(proxy, store, retry_budget=0)
    proxy.cut_puts = 1
    with pytest.raises(ObjectStoreError):
        once.put("torn/existing", b"new content!")
    assert store.get("torn/existing") == b"old content"
    proxy.cut_puts = 1
    with pytest.raises(ObjectStoreError):
        once.create_if_absent("torn/_COMMITTED", b"run-1")
    assert store.head("torn/_COMMITTED") is None
    # with retries, the same cut is invisible
    proxy.cut_puts = 1
    _via(proxy, store, retry_budget=10).create_if_absent("torn/_COMMITTED", b"run-1")
    assert store.get("torn/_COMMITTED") == b"run-1"


# ------------------------------------------------------------------ failures
def test_5xx_is_retried(store: ObjectStore, proxy: FaultProxy) -> None:
    store.put("r/k", b"v")
    flaky = _via(proxy, store, retry_budget=10, backoff_initial=0.01)
    proxy.fail_requests = 3
    assert flaky.get("r/k") == b"v"
    assert proxy.fail_requests == 0


def test_5xx_gives_up_within_budget(store: ObjectStore, proxy: FaultProxy) -> None:
    flaky = _via(proxy, store, retry_budget=1.0, backoff_initial=0.05, backoff_cap=0.2)
    proxy.fail_requests = 10_000
    t0 = time.monotonic()
    with pytest.raises(ObjectStoreError) as ei:
        flaky.get("r/k")
    assert time.monotonic() - t0 < 3
    msg = str(ei.value)
    assert "get s3://" in msg and "r/k" in msg and "503" in msg and "\n" not in msg
    assert store.cfg.secret_key not in msg and store.cfg.access_key not in msg


@pytest.mark.parametrize("field", ["secret_key", "access_key"])
def test_wrong_credentials_are_refused(store: ObjectStore, field: str) -> None:
    store.put("c/k", b"v")
    wrong = "WRONG" + ("x" * 20)
    bad = ObjectStore(replace(store.cfg, **{field: wrong}), retry_budget=1)
    t0 = time.monotonic()
    with pytest.raises(ObjectStoreError) as ei:
        bad.get("c/k")
    assert time.monotonic() - t0 < 1, "4xx must not be retried"
    msg = str(ei.value)
    assert "access denied" in msg and "c/k" in msg
    for secret in (store.cfg.secret_key, wrong):
        assert secret not in msg
    with pytest.raises(ObjectStoreError, match="access denied"):
        bad.put("c/k2", b"v")
    assert not store.exists("c/k2")


def test_unreachable_gives_up_within_budget(store: ObjectStore) -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    dead = ObjectStore(replace(store.cfg, endpoint=f"http://127.0.0.1:{port}"), retry_budget=1.0)
    t0 = time.monotonic()
    with pytest.raises(ObjectStoreError) as ei:
        dead.get("k")
    assert 0.3 < time.monotonic() - t0 < 3
    assert "attempts" in str(ei.value)


# ------------------------------------------------------------------- pyarrow
def test_arrow_parquet_round_trip(store: ObjectStore) -> None:
    table = pa.table({"key": ["a", "b", "c"], "ts": [1, 2, 3], "amount": [1.5, 2.5, None]})
    fs = store.arrow_fs()
    path = f"{store.bucket}/arrow/small.parquet"
    pq.write_table(table, path, filesystem=fs)
    assert pq.read_table(path, filesystem=fs).equals(table)
    assert store.head("arrow/small.parquet") is not None
    # the options dict survives pickling (as it does on its way to a Spark executor)
    fs2 = arrow_fs_from_options(pickle.loads(pickle.dumps(store.fs_options())))
    assert pq.read_table(path, filesystem=fs2).equals(table)
    pq.write_table(table, f"{store.bucket}/arrow/small2.parquet", filesystem=fs2)
    assert store.get("arrow/small2.parquet") == store.get("arrow/small.parquet")


def test_arrow_multipart_upload(store: ObjectStore) -> None:
    blobs = [os.urandom(1 << 20) for _ in range(24)]  # 24 MiB incompressible: several multipart parts
    table = pa.table({"i": list(range(len(blobs))), "blob": pa.array(blobs, pa.binary())})
    path = f"{store.bucket}/arrow/big.parquet"
    fs = arrow_fs_from_options(store.fs_options())
    pq.write_table(table, path, filesystem=fs, compression="none")
    info = store.head("arrow/big.parquet")
    assert info is not None and info.size > 24 << 20
    assert "-" in info.etag, f"expected a multipart ETag, got {info.etag}"
    back = pq.read_table(path, filesystem=store.arrow_fs())
    assert back.equals(table)
    wrong = arrow_fs_from_options({**store.fs_options(), "secret_key": "nope-nope-nope"})
    with pytest.raises(OSError):
        pq.read_table(path, filesystem=wrong)


def test_response_times_are_botocores_without_dateutil(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """S3's times (a listing's ISO 8601 LastModified, a GET's and a HEAD's HTTP date) are read
    without dateutil's general parser, ~0.1 ms each, and mean the instant botocore's own parser
    (`parse_timestamp`) reads: for the forms S3 sends and the others it accepts."""
    import dateutil.parser
    from botocore.utils import parse_timestamp

    from wire_dagster.objectstore import response_time

    for v in (
        "2026-11-28T22:51:00.000Z",
        "2026-11-28T22:51:00.123Z",
        "2026-11-28T22:51:00Z",
        "2026-11-28T22:51:00+01:00",
        "Sat, 28 Nov 2026 22:51:00 GMT",
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "2026-11-28 22:51:00Z",
        1_700_000_000,
        "1700000000.5",
    ):
        assert response_time(v).timestamp() == parse_timestamp(v).timestamp(), v

    store.put("times/a", b"x")
    calls = []
    parse = dateutil.parser.parse
    monkeypatch.setattr(dateutil.parser, "parse", lambda *a, **kw: calls.append(a) or parse(*a, **kw))
    (listed,) = store.list("times/")
    head = store.head("times/a")
    got = store.get_with_info("times/a")  # one GET: body, ETag, Last-Modified
    assert calls == []
    assert got is not None
    got_ms = got[2]
    assert head is not None and head.last_modified_ms == got_ms  # both from the HTTP date: whole seconds
    assert got_ms // 1000 == listed.last_modified_ms // 1000  # the listing's: its milliseconds too
    assert abs(listed.last_modified_ms - time.time() * 1000) < 60_000
