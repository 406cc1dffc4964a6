"""S3 object-store client: one code path for MinIO (production, docker/) and
SeaweedFS (the embedded default), reached only through the S3 API.

Guarantees, in one line each:

- Transient failures (connection refused/reset, timeouts, 5xx, 409
  ConditionalRequestConflict/OperationAborted, 429) are retried with capped
  exponential backoff inside a total time budget, then raise ObjectStoreError.
- Other 4xx are never retried: 403 -> ObjectStoreError("access denied"),
  a missing key on read -> ObjectNotFound.
- Error messages are one line naming the operation and the key; they never
  contain the access key or the secret key (`redact`: whole tokens, so a short
  key does not mangle the words around it).
- `list` yields keys in UTF-8 binary (S3) order on every server (SeaweedFS
  lists in path-component order, so the client sorts).
- Every PUT carries Content-MD5, so a PUT cut off mid-request never stores a
  truncated or empty object (SeaweedFS 4.48 stores an empty one without it).
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, quote_plus, urlsplit

import boto3
import botocore.exceptions as bexc
import botocore.session
from botocore.config import Config
from botocore.utils import parse_timestamp

from .errors import ObjectExists, ObjectNotFound, ObjectStoreError, WireInputError

if TYPE_CHECKING:
    import pyarrow.fs

T = TypeVar("T")

_ENV_ENDPOINT = "WIRE_S3_ENDPOINT"
_ENV_ACCESS = "WIRE_S3_ACCESS_KEY"
_ENV_SECRET = "WIRE_S3_SECRET_KEY"
_ENV_BUCKET = "WIRE_S3_BUCKET"
_ENV_REGION = "WIRE_S3_REGION"

#: 409 codes that mean "a concurrent request got in the way; try again".
_RETRYABLE_409 = frozenset({"ConditionalRequestConflict", "OperationAborted"})
#: Exceptions (botocore and below) that mean the request may not have reached
#: the server or its answer was lost.
_TRANSIENT_EXC: tuple[type[BaseException], ...] = (
    bexc.EndpointConnectionError,
    bexc.ConnectionClosedError,
    bexc.ConnectTimeoutError,
    bexc.ReadTimeoutError,
    bexc.HTTPClientError,
    bexc.ResponseStreamingError,
    bexc.IncompleteReadError,
    ConnectionError,  # builtin: refused, reset, aborted, broken pipe
    TimeoutError,
)
try:  # urllib3 errors can escape while a body is being streamed
    import urllib3.exceptions as _u3

    _TRANSIENT_EXC += (_u3.ProtocolError, _u3.ReadTimeoutError, _u3.IncompleteRead)
except ImportError:  # pragma: no cover
    pass


@dataclass(frozen=True)
class S3Config:
    """Where the object store is and how to sign; the secret never appears in repr."""

    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    bucket: str = "wire"
    region: str = "us-east-1"

    def __post_init__(self) -> None:
        parts = urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise WireInputError(f"{_ENV_ENDPOINT}: expected a URL like http://127.0.0.1:9000, got {self.endpoint!r}")
        if not self.bucket:
            raise WireInputError(f"{_ENV_BUCKET}: bucket name must not be empty")
        if not self.access_key or not self.secret_key:
            raise WireInputError(f"{_ENV_ACCESS}/{_ENV_SECRET}: both are required with an S3 endpoint")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> S3Config | None:
        """The config from WIRE_S3_*; None when WIRE_S3_ENDPOINT is unset or empty."""
        e = os.environ if env is None else env
        endpoint = e.get(_ENV_ENDPOINT, "").strip()
        if not endpoint:
            return None
        access = e.get(_ENV_ACCESS, "")
        secret = e.get(_ENV_SECRET, "")
        if not access or not secret:
            missing = _ENV_ACCESS if not access else _ENV_SECRET
            raise WireInputError(f"{missing}: required when {_ENV_ENDPOINT} is set")
        return cls(
            endpoint=endpoint.rstrip("/"),
            access_key=access,
            secret_key=secret,
            bucket=e.get(_ENV_BUCKET, "").strip() or "wire",
            region=e.get(_ENV_REGION, "").strip() or "us-east-1",
        )

    def export_env(self) -> dict[str, str]:
        """The WIRE_S3_* variables that make `from_env` in a child process return this config."""
        return {
            _ENV_ENDPOINT: self.endpoint,
            _ENV_ACCESS: self.access_key,
            _ENV_SECRET: self.secret_key,
            _ENV_BUCKET: self.bucket,
            _ENV_REGION: self.region,
        }

    @property
    def secure(self) -> bool:
        return urlsplit(self.endpoint).scheme == "https"

    @property
    def host_port(self) -> str:
        """`host:port` of the endpoint (the form pyarrow's endpoint_override wants)."""
        parts = urlsplit(self.endpoint)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.hostname}:{port}"


@dataclass(frozen=True, slots=True)
class ObjInfo:
    """One object's listing entry; etag without quotes, time in epoch ms."""

    key: str
    size: int
    etag: str
    last_modified_ms: int


def _etag(raw: str | None) -> str:
    return (raw or "").strip('"')


def _ms(dt: Any) -> int:
    return int(dt.timestamp() * 1000) if dt is not None else 0


def _status(exc: bexc.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _code(exc: bexc.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or "")


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, bexc.ClientError):
        status = _status(exc)
        return status >= 500 or status == 429 or (status == 409 and _code(exc) in _RETRYABLE_409)
    return isinstance(exc, _TRANSIENT_EXC)


def _md5(data: bytes) -> str:
    """Content-MD5 for a PUT: the server verifies the body, so a request cut off
    after its headers cannot store an empty object (SeaweedFS 4.48 does without it)."""
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def _one_line(text: str) -> str:
    return " ".join(text.split())


#: Characters a key is made of (AWS and MinIO keys: letters and digits; generated secrets such as
#: `secrets.token_urlsafe`: also "-" and "_"). A secret found inside a longer run of these is part of
#: another word ("b" in "bucket") and stays; anywhere else it is replaced. "/", "+", "=", "%",
#: quotes and spaces end a run, so a key before "/20260101/us-east-1/s3" (a SigV4 credential) or
#: after "=" is still replaced.
_KEY_CHARS = "A-Za-z0-9_-"


def _escaped(secret: str) -> set[str]:
    """The forms a secret takes in text: as is, and URL-encoded (in a path, a query, a form; either hex case)."""
    forms = {secret}
    for quoted in (quote(secret, safe=""), quote(secret, safe="/"), quote_plus(secret)):
        forms.add(quoted)
        forms.add(re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quoted))
    return forms


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every whole-token occurrence of each secret (as is or URL-encoded) replaced by "***".

    An occurrence counts where it is not part of a longer run of key characters (`_KEY_CHARS`): the
    neighbour before it is not one, or is the end of a URL escape ("%2F"), and the neighbour after it is
    not one. So a one-letter secret "b" hides "b" in "s3://b/k" and "secret=b", not the b of "bucket".
    The one helper every redaction of credentials goes through.
    """
    forms = sorted({f for s in secrets if s for f in _escaped(s)}, key=len, reverse=True)
    if not forms:
        return text
    alts = []
    for f in forms:
        before = rf"(?:(?<![{_KEY_CHARS}])|(?<=%[0-9A-Fa-f]{{2}}))" if re.match(rf"[{_KEY_CHARS}]", f) else ""
        after = rf"(?![{_KEY_CHARS}])" if re.search(rf"[{_KEY_CHARS}]$", f) else ""
        alts.append(before + re.escape(f) + after)
    return re.sub("|".join(alts), "***", text)


_SESSION: boto3.Session | None = None
_SESSION_LOCK = threading.Lock()


def s3_client(**kwargs: Any):
    """An S3 client of the process's one boto3 session: a session parses S3's service model once
    and keeps it, where a new session per store parsed it again (~50 ms a store; a `wire tick` and
    its run make several). Credentials are given per client, never taken from the session. The
    lock: a session is not thread-safe (its clients are). Its clients read times with
    `response_time` (botocore's response parser default)."""
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            core = botocore.session.get_session()
            core.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=response_time)
            _SESSION = boto3.Session(botocore_session=core)
        return _SESSION.client("s3", **kwargs)


def response_time(value: Any) -> datetime:
    """A time in an S3 response, as botocore's own parser reads it (`parse_timestamp`), but read
    by the standard library where it is ISO 8601 (every listed object's LastModified:
    `datetime.fromisoformat`) or an HTTP date in GMT (a GET's or HEAD's Last-Modified header:
    `email.utils.parsedate_to_datetime`): botocore gives each to dateutil's general parser, ~0.1
    ms, 40 % of a listing's CPU in this process."""
    if isinstance(value, str):
        try:
            if "T" in value and value[:4].isdigit():
                return datetime.fromisoformat(value)
            if value.endswith(" GMT"):
                return parsedate_to_datetime(value)
        except (TypeError, ValueError):
            pass
    return parse_timestamp(value)


class ObjectStore:
    """A bucket in an S3-compatible store; every call is retried within a time budget, then fails typed."""

    def __init__(
        self,
        cfg: S3Config,
        *,
        retry_budget: float = 20.0,
        backoff_initial: float = 0.1,
        backoff_cap: float = 2.0,
        connect_timeout: float = 2.0,
        read_timeout: float = 30.0,
        max_pool_connections: int = 32,
    ) -> None:
        self._cfg = cfg
        self.retry_budget = retry_budget
        self.backoff_initial = backoff_initial
        self.backoff_cap = backoff_cap
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._client = s3_client(
            endpoint_url=cfg.endpoint,
            aws_access_key_id=cfg.access_key,
            aws_secret_access_key=cfg.secret_key,
            region_name=cfg.region,
            config=Config(
                signature_version="s3v4",
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1, "mode": "standard"},  # no retries inside boto
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                max_pool_connections=max_pool_connections,
                # Plain MD5/CRC only where the API requires it: portable across S3 servers.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    # ------------------------------------------------------------------ basics
    @property
    def cfg(self) -> S3Config:
        return self._cfg

    @property
    def bucket(self) -> str:
        return self._cfg.bucket

    def __repr__(self) -> str:
        return f"ObjectStore(endpoint={self._cfg.endpoint!r}, bucket={self._cfg.bucket!r})"

    def _scrub(self, text: str) -> str:
        return _one_line(redact(text, (self._cfg.secret_key, self._cfg.access_key)))

    def _fail(self, op: str, key: str, exc: BaseException, attempts: int = 1, elapsed: float = 0.0) -> ObjectStoreError:
        """The typed error for a final failure of `op` on `key` (one line, no credentials)."""
        where = f"{op} s3://{self.bucket}/{key}" if key else f"{op} s3://{self.bucket}"
        if isinstance(exc, bexc.ClientError):
            status, code = _status(exc), _code(exc)
            msg = exc.response.get("Error", {}).get("Message") or ""
            if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                text = f"{where}: access denied ({code or status}); check WIRE_S3_ACCESS_KEY/WIRE_S3_SECRET_KEY"
            elif code == "NoSuchBucket":
                text = f"{where}: bucket {self.bucket!r} does not exist"
            else:
                text = f"{where}: HTTP {status} {code}: {msg}"
        else:
            text = f"{where}: {type(exc).__name__}: {exc}"
        if attempts > 1:
            text += f" (gave up after {attempts} attempts in {elapsed:.1f}s)"
        return ObjectStoreError(self._scrub(text))

    def _call(self, op: str, key: str, fn: Callable[[], T], *, on_transient: Callable[[], None] | None = None) -> T:
        """Run `fn`, retrying transient failures with capped exponential backoff within the budget."""
        start = time.monotonic()
        deadline = start + self.retry_budget
        delay = self.backoff_initial
        attempts = 0
        while True:
            attempts += 1
            try:
                return fn()
            except Exception as exc:
                if not _is_transient(exc):
                    raise
                if on_transient is not None:
                    on_transient()
                now = time.monotonic()
                sleep = delay * random.uniform(0.5, 1.0)
                if now + sleep > deadline:
                    raise self._fail(op, key, exc, attempts, now - start) from exc
                time.sleep(sleep)
                delay = min(delay * 2, self.backoff_cap)

    def _run(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """`_call`, with any remaining botocore error turned into ObjectStoreError."""
        try:
            return self._call(op, key, fn)
        except bexc.ClientError as exc:
            raise self._fail(op, key, exc) from exc
        except bexc.BotoCoreError as exc:
            raise self._fail(op, key, exc) from exc

    # ---------------------------------------------------------------- buckets
    def ping(self) -> None:
        """One authenticated ListBuckets with no retries; raises ObjectStoreError if it fails."""
        try:
            self._client.list_buckets()
        except (bexc.ClientError, bexc.BotoCoreError, *_TRANSIENT_EXC) as exc:
            raise self._fail("ping", "", exc) from exc

    def ensure_bucket(self) -> None:
        """The bucket exists afterwards (created if missing; idempotent and race-safe)."""

        def go() -> None:
            try:
                self._client.head_bucket(Bucket=self.bucket)
                return
            except bexc.ClientError as exc:
                if _status(exc) != 404:
                    raise
            kwargs: dict[str, Any] = {"Bucket": self.bucket}
            if self._cfg.region != "us-east-1":
                kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self._cfg.region}
            try:
                self._client.create_bucket(**kwargs)
            except bexc.ClientError as exc:
                if _code(exc) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

        self._run("create bucket", "", go)

    # ----------------------------------------------------------------- reads
    def get(self, key: str) -> bytes:
        """The object's bytes; ObjectNotFound if the key does not exist."""

        def go() -> bytes:
            resp = self._client.get_object(Bucket=self.bucket, Key=key)
            with resp["Body"] as body:
                return body.read()

        return self._read("get", key, go)

    def get_with_info(self, key: str) -> tuple[bytes, str, int] | None:
        """The object's bytes, ETag and write time (epoch ms) from one GET, so the three belong
        together (a HEAD then a GET could see two versions); None if there is no such object."""

        def go() -> tuple[bytes, str, int]:
            r = self._client.get_object(Bucket=self.bucket, Key=key)
            return r["Body"].read(), _etag(r.get("ETag")), _ms(r.get("LastModified"))

        try:
            return self._read("get", key, go, missing=key)
        except ObjectNotFound:
            return None

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Up to `length` bytes from offset `start` (fewer at the end, b"" past it); ObjectNotFound if missing."""
        if start < 0 or length < 0:
            raise ValueError("start and length must be >= 0")
        if length == 0:
            return b""

        def go() -> bytes:
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")
            except bexc.ClientError as exc:
                if _status(exc) == 416:
                    return b""
                raise
            with resp["Body"] as body:
                return body.read()

        return self._read("get", key, go)

    def _read(self, op: str, key: str, fn: Callable[[], T], missing: str | None = None) -> T:
        """`fn` through `_call`; a 404 (not of the bucket) is ObjectNotFound(`missing`, default `key`)."""
        try:
            return self._call(op, key, fn)
        except bexc.ClientError as exc:
            if _status(exc) == 404 and _code(exc) != "NoSuchBucket":
                raise ObjectNotFound(missing or key) from None
            raise self._fail(op, key, exc) from exc
        except bexc.BotoCoreError as exc:
            raise self._fail(op, key, exc) from exc

    def head(self, key: str) -> ObjInfo | None:
        """The object's metadata, or None if the key does not exist."""

        def go() -> ObjInfo | None:
            try:
                r = self._client.head_object(Bucket=self.bucket, Key=key)
            except bexc.ClientError as exc:
                if _status(exc) == 404 and _code(exc) != "NoSuchBucket":
                    return None
                raise
            return ObjInfo(key, int(r.get("ContentLength", 0)), _etag(r.get("ETag")), _ms(r.get("LastModified")))

        return self._run("head", key, go)

    def exists(self, key: str) -> bool:
        """True iff an object is stored under exactly this key."""
        return self.head(key) is not None

    def _pages(self, op: str, prefix: str, page_size: int, delimiter: str | None) -> Iterator[dict[str, Any]]:
        """Every ListObjectsV2 page under `prefix`, each page retried on its own."""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": page_size}
            if delimiter:
                kwargs["Delimiter"] = delimiter
            if token:
                kwargs["ContinuationToken"] = token
            page = self._run(op, prefix, lambda kw=kwargs: self._client.list_objects_v2(**kw))
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def _any_under(self, prefix: str) -> bool:
        page = self._run(
            "list", prefix, lambda: self._client.list_objects_v2(Bucket=self.bucket, Prefix=prefix, MaxKeys=1)
        )
        return bool(page.get("Contents") or page.get("CommonPrefixes"))

    def list(self, prefix: str, start_after: str | None = None, *, page_size: int = 1000) -> Iterator[ObjInfo]:
        """Every object under `prefix` with key > `start_after`, in UTF-8 binary key order, on any server.

        SeaweedFS lists in path-component order and its StartAfter skips a
        whole "directory" named by it, so this reads the full listing of the
        prefix (paginated) and sorts and filters client-side: memory is
        proportional to the number of keys under the prefix, not their size.
        """
        items: list[ObjInfo] = []
        for page in self._pages("list", prefix, page_size, None):
            for o in page.get("Contents", ()):
                key = o["Key"]
                if start_after is not None and key <= start_after:
                    continue
                items.append(ObjInfo(key, int(o.get("Size", 0)), _etag(o.get("ETag")), _ms(o.get("LastModified"))))
        items.sort(key=lambda i: i.key)  # code-point order == UTF-8 byte order
        yield from items

    def list_from(self, prefix: str, start_after: str | None = None, limit: int | None = None) -> list[ObjInfo]:
        """The objects under `prefix` after `start_after` in byte order, StartAfter applied by the
        server (so a long listing is not re-read from its start) and again here, sorted here
        (DESIGN §3: never rely on the server's order). With `limit`, stops after the page that
        holds `limit` objects (one request when few are there). For keys that are files: a
        SeaweedFS StartAfter naming a "directory" skips all of it (`list` reads whole instead)."""
        out: list[ObjInfo] = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": 1000}
            if token:
                kw["ContinuationToken"] = token
            elif start_after:
                kw["StartAfter"] = start_after
            page = self._run("list", prefix, lambda kw=kw: self._client.list_objects_v2(**kw))
            for o in page.get("Contents", ()):
                if start_after is None or o["Key"] > start_after:
                    out.append(
                        ObjInfo(o["Key"], int(o.get("Size", 0)), _etag(o.get("ETag")), _ms(o.get("LastModified")))
                    )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token or (limit is not None and len(out) >= limit):
                break
        out.sort(key=lambda i: i.key)
        return out

    def list_level(self, prefix: str) -> tuple[list[str], list[str]]:
        """One level below `prefix` (Delimiter "/"): the keys of the objects directly in it and the
        common prefixes (each ending in "/"), both sorted."""
        keys: set[str] = set()
        found: set[str] = set()
        for page in self._pages("list prefixes", prefix, 1000, "/"):
            keys.update(o["Key"] for o in page.get("Contents", ()))
            found.update(p["Prefix"] for p in page.get("CommonPrefixes", ()))
        return sorted(keys), sorted(found)

    def list_prefixes(self, prefix: str, *, page_size: int = 1000) -> list[str]:
        """The distinct common prefixes one level below `prefix` (Delimiter "/"), sorted, each ending in "/"."""
        found: set[str] = set()
        for page in self._pages("list prefixes", prefix, page_size, "/"):
            for p in page.get("CommonPrefixes", ()):
                found.add(p["Prefix"])
        return sorted(found)

    # ---------------------------------------------------------------- writes
    def put(self, key: str, data: bytes) -> str:
        """Store `data` under `key` (overwriting); returns the ETag without quotes."""
        md5 = _md5(data)
        r = self._run(
            "put", key, lambda: self._client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentMD5=md5)
        )
        return _etag(r.get("ETag"))

    def copy(self, src: str, dst: str, if_match: str) -> bool:
        """Copy object `src` to `dst` (overwriting) inside the store, if `src`'s ETag is still
        `if_match` (CopySourceIfMatch); False, and nothing written, if it is not. ObjectNotFound
        if `src` does not exist. The bytes never leave the server."""
        source = {"Bucket": self.bucket, "Key": src}

        def go() -> bool:
            try:
                self._client.copy_object(
                    Bucket=self.bucket, Key=dst, CopySource=source, CopySourceIfMatch=f'"{if_match}"'
                )
            except bexc.ClientError as exc:
                if _status(exc) == 412 or _code(exc) == "PreconditionFailed":
                    return False
                raise
            return True

        return self._read("copy", dst, go, missing=src)

    def create_if_absent(self, key: str, data: bytes) -> None:
        """Create `key` only if no object exists there (If-None-Match: *): exactly one concurrent creator wins.

        Losers get ObjectExists. If an attempt failed transiently and a retry
        then finds the key taken, the first attempt may have been the one that
        succeeded: the stored bytes are compared and, if equal to ours, the
        call succeeds (idempotent).
        """
        uncertain = False
        md5 = _md5(data)

        def mark() -> None:
            nonlocal uncertain
            uncertain = True

        deadline = time.monotonic() + self.retry_budget
        while True:
            try:
                self._call(
                    "create",
                    key,
                    lambda: self._client.put_object(
                        Bucket=self.bucket, Key=key, Body=data, ContentMD5=md5, IfNoneMatch="*"
                    ),
                    on_transient=mark,
                )
                return
            except bexc.ClientError as exc:
                if _status(exc) != 412 and _code(exc) != "PreconditionFailed":
                    raise self._fail("create", key, exc) from exc
            except bexc.BotoCoreError as exc:
                raise self._fail("create", key, exc) from exc
            # 412: something is there (or SeaweedFS: the key is a "directory").
            try:
                existing = self.get(key)
            except ObjectNotFound:
                if self._any_under(key + "/"):
                    raise ObjectStoreError(
                        f"create s3://{self.bucket}/{key}: the key is also a prefix of other objects "
                        "and this server cannot store both"
                    ) from None
                if time.monotonic() > deadline:
                    raise ObjectStoreError(
                        f"create s3://{self.bucket}/{key}: precondition failed but no object is there"
                    ) from None
                continue  # deleted in between: try again
            if uncertain and existing == data:
                return
            raise ObjectExists(key)

    def delete(self, key: str) -> None:
        """The key holds no object afterwards (idempotent: a missing key is not an error)."""

        def go() -> None:
            try:
                self._client.delete_object(Bucket=self.bucket, Key=key)
            except bexc.ClientError as exc:
                if _status(exc) != 404 or _code(exc) == "NoSuchBucket":
                    raise

        self._run("delete", key, go)

    def delete_many(self, keys: Iterable[str]) -> int:
        """Delete every key (batches of 1000, missing keys ignored); returns how many keys were requested."""
        batch: list[str] = []
        total = 0

        def flush() -> None:
            objs = [{"Key": k} for k in batch]
            r = self._run(
                "delete",
                batch[0],
                lambda: self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": objs, "Quiet": True}),
            )
            errors = [e for e in r.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
            if errors:
                e = errors[0]
                raise ObjectStoreError(
                    self._scrub(
                        f"delete s3://{self.bucket}/{e.get('Key')}: {e.get('Code')}: {e.get('Message')}"
                        f" ({len(errors)} of {len(batch)} keys failed)"
                    )
                )

        for k in keys:
            batch.append(k)
            if len(batch) == 1000:
                flush()
                total += len(batch)
                batch = []
        if batch:
            flush()
            total += len(batch)
        return total

    # ---------------------------------------------------------------- pyarrow
    def fs_options(self) -> dict[str, Any]:
        """A picklable dict (it holds the secret: never log it) that `arrow_fs_from_options` turns into an
        S3FileSystem."""
        return {
            "access_key": self._cfg.access_key,
            "secret_key": self._cfg.secret_key,
            "region": self._cfg.region,
            "endpoint_override": self._cfg.host_port,
            "scheme": "https" if self._cfg.secure else "http",
            "connect_timeout": self.connect_timeout,
            "request_timeout": self.read_timeout,
            "retry_max_attempts": 5,
        }

    def arrow_fs(self) -> pyarrow.fs.S3FileSystem:
        """A pyarrow S3FileSystem on the same endpoint and credentials (paths are "bucket/key")."""
        return arrow_fs_from_options(self.fs_options())


def arrow_fs_from_options(options: dict[str, Any]) -> pyarrow.fs.S3FileSystem:
    """The S3FileSystem described by `ObjectStore.fs_options()` (works in any process, e.g. Spark executors)."""
    import pyarrow.fs as pafs

    opts = dict(options)
    attempts = int(opts.pop("retry_max_attempts", 3))
    return pafs.S3FileSystem(
        **opts,
        allow_bucket_creation=False,
        allow_bucket_deletion=False,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts),
    )
