"""A seeded, HTTP-aware fault injector between S3 clients and the S3 server, on loopback only.

`FaultProxy(endpoint)` listens on 127.0.0.1 and forwards each HTTP request of a
connection to the server (also on loopback) and the server's answer back, one request
at a time, so that it can fail a request as a flaky network or a struggling server
would. Per request it can:

- ``lost``: forward, let the server act, then drop its answer and close the connection;
- ``slowdown``: answer 503 SlowDown without forwarding;
- ``reset_before`` / ``reset_after``: reset the connection (RST) before forwarding, or
  after the server acted instead of answering;
- ``error_after``: for a write (PUT, POST, DELETE), forward it, then answer 500
  InternalError instead of the server's answer;
- ``latency``: wait up to `Faults.max_latency` seconds, then forward.

Random faults: `FaultProxy(endpoint, faults=Faults(...), seed=...)` faults each request
with the probability `Faults.total`, drawn from a `random.Random(seed)`, and the faults take
the kinds in turn, in proportion to their probabilities (so a short run meets every kind).
The sequence of fates is the seed's; which request gets which depends on the clients'
interleaving (one client sending one request at a time gets the same fates). It is bounded: after
`max_faults` injected faults (or `max_requests` requests) every request is forwarded
untouched, so retries end. `stats` counts requests and faults by kind.

Outages: `outage(seconds)` answers every request 503 for a while (from now or from the
next request); `lose_then_outage(suffix, seconds)` loses the answer of the next PUT to a
key ending in `suffix` (after the server acted), then starts an outage.

Scripted faults (tests/test_objectstore.py), taken before random ones: the next
`fail_requests` requests are answered `fail_status` (503 SlowDown) unforwarded; the
next `drop_put_replies` PUTs lose their answer; the next `cut_puts` PUTs reach the
server as headers only, then the connection is dropped.
"""

from __future__ import annotations

import ipaddress
import random
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, fields
from typing import BinaryIO
from xml.sax.saxutils import escape

KINDS = ("lost", "slowdown", "reset_before", "reset_after", "error_after", "latency")
WRITES = frozenset({"PUT", "POST", "DELETE"})
_MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class Faults:
    """Per-request probabilities of each fault kind (their sum at most 1)."""

    lost: float = 0.0
    slowdown: float = 0.0
    reset_before: float = 0.0
    reset_after: float = 0.0
    error_after: float = 0.0  # writes only: a read drawn for a fault gets another kind
    latency: float = 0.0
    max_latency: float = 0.3  # seconds

    def __post_init__(self) -> None:
        probs = [getattr(self, k) for k in KINDS]
        if any(p < 0 for p in probs) or sum(probs) > 1:
            raise ValueError(f"fault probabilities must be >= 0 and sum to at most 1: {self}")

    @property
    def total(self) -> float:
        return sum(getattr(self, k) for k in KINDS)

    @classmethod
    def mixed(cls, rate: float, max_latency: float = 0.3) -> Faults:
        """`rate` of all requests faulted, evenly over the kinds."""
        return cls(**{k: rate / len(KINDS) for k in KINDS}, max_latency=max_latency)

    def __str__(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name):.3g}" for f in fields(self) if getattr(self, f.name))


@dataclass
class _Message:
    head: bytes  # start line and headers as they go on the wire (CRLF CRLF included)
    start: str  # the start line
    headers: dict[str, str]  # lower-case names
    body: bytes  # raw, as framed on the wire (chunked framing kept)
    keep_alive: bool


def _xml_error(status: int, reason: str, code: str, message: str) -> bytes:
    body = f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>".encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


_REASONS = {500: "Internal Server Error", 503: "Service Unavailable"}


class FaultProxy:
    """A proxy in front of the S3 server at `endpoint` (see the module docstring)."""

    def __init__(
        self,
        endpoint: str,
        faults: Faults | None = None,
        seed: int = 0,
        max_faults: int | None = None,
        max_requests: int | None = None,
    ) -> None:
        host, port = endpoint.removeprefix("http://").rstrip("/").rsplit(":", 1)
        addr = str(socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)[0][4][0])
        if not ipaddress.ip_address(addr).is_loopback:
            raise ValueError(f"FaultProxy forwards to loopback only, not {endpoint}")
        self.upstream = (addr, int(port))
        self.faults = faults or Faults()
        self.seed = seed
        self.max_faults = max_faults
        self.max_requests = max_requests
        self.rng = random.Random(seed)
        # "requests", "writes", "arrow requests" (pyarrow's), each fault kind injected, "outage" answers
        self.stats: Counter[str] = Counter()
        # Scripted faults, taken before the random ones.
        self.drop_put_replies = 0  # swallow the answer of the next N PUTs (after the server acted)
        self.cut_puts = 0  # forward only the headers of the next N PUTs, then drop the connection
        self.fail_requests = 0  # answer the next N requests without forwarding them:
        self.fail_status, self.fail_code, self.fail_message = 503, "SlowDown", "injected"
        self._outage_until = 0.0  # time.monotonic() until which every request is answered 503
        self._credit: Counter[str] = Counter()  # each kind's turn (see _fate)
        self._trigger: tuple[str, float, bool] | None = None  # a pending outage: (key suffix, seconds, lose)
        self.lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def injected(self) -> int:
        return sum(self.stats[k] for k in KINDS)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting and cut every open connection (their threads then end)."""
        self.listener.close()
        with self.lock:
            conns = list(self._open)
        for s in conns:
            _hard_close(s)

    def __repr__(self) -> str:
        return f"FaultProxy({self.endpoint} -> {self.upstream[0]}:{self.upstream[1]}, seed={self.seed}, {self.faults})"

    # ------------------------------------------------------------------ fates
    def outage(self, seconds: float, from_next_request: bool = False) -> None:
        """For `seconds` from now (or from the next request), answer every request 503 SlowDown
        without forwarding it."""
        with self.lock:
            if from_next_request:
                self._trigger = ("", seconds, False)
            else:
                self._outage_until = time.monotonic() + seconds

    def lose_then_outage(self, suffix: str, seconds: float) -> None:
        """The next PUT to a key ending in `suffix` reaches the server, its answer is lost, and an
        outage of `seconds` begins (a commit marker written, then S3 down)."""
        with self.lock:
            self._trigger = (suffix, seconds, True)

    def _fate(self, method: str, path: str, agent: str) -> tuple[str | None, float]:
        """The fault for this request (None: forward it untouched) and the latency to add."""
        with self.lock:
            self.stats["requests"] += 1
            if method in WRITES:
                self.stats["writes"] += 1
            if "aws-sdk-cpp" in agent:  # pyarrow's S3 filesystem (the Spark executors' reads)
                self.stats["arrow requests"] += 1
            if time.monotonic() < self._outage_until:
                self.stats["outage"] += 1
                return "slowdown", 0.0
            if self._trigger is not None:
                suffix, seconds, lose = self._trigger
                if not lose:
                    self._outage_until = time.monotonic() + seconds
                    self._trigger = None
                    self.stats["outage"] += 1
                    return "slowdown", 0.0
                if method == "PUT" and path.split("?", 1)[0].endswith(suffix):
                    self._outage_until = time.monotonic() + seconds
                    self._trigger = None
                    self.stats["lost before an outage"] += 1
                    return "lost", 0.0
            if self.fail_requests > 0:
                self.fail_requests -= 1
                return "fail", 0.0
            if method == "PUT" and self.cut_puts > 0:
                self.cut_puts -= 1
                return "cut", 0.0
            if method == "PUT" and self.drop_put_replies > 0:
                self.drop_put_replies -= 1
                return "lost", 0.0
            if (self.max_faults is not None and self.injected >= self.max_faults) or (
                self.max_requests is not None and self.stats["requests"] > self.max_requests
            ):
                return None, 0.0
            x = self.rng.random()
            delay = self.rng.uniform(0, self.faults.max_latency)  # drawn for every request: one sequence per seed
            total = self.faults.total
            if x >= total:
                return None, 0.0
            # Which kind: smooth weighted round robin over the kinds' shares, so every kind comes
            # round in proportion, even in a short run (a write-only kind waits for the next write).
            for k in KINDS:
                self._credit[k] += getattr(self.faults, k) / total
            kinds = [k for k in KINDS if getattr(self.faults, k) and (k != "error_after" or method in WRITES)]
            kind = max(kinds, key=lambda k: self._credit[k])
            self._credit[kind] -= 1
            self.stats[kind] += 1
            return kind, delay if kind == "latency" else 0.0

    # ------------------------------------------------------------ connections
    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _track(self, s: socket.socket) -> socket.socket:
        with self.lock:
            self._open.add(s)
        return s

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        upstream: socket.socket | None = None
        up_in: BinaryIO | None = None
        c_in = client.makefile("rb")
        reset = False
        try:
            while True:
                req = _read_message(c_in, client, request=True)
                if req is None:
                    return
                method, path = (req.start.split(" ") + ["", ""])[:2]
                method = method.upper()
                fate, delay = self._fate(method, path, req.headers.get("user-agent", ""))
                if fate == "fail":
                    status = self.fail_status
                    client.sendall(_xml_error(status, _REASONS.get(status, "Error"), self.fail_code, self.fail_message))
                    return
                if fate == "slowdown":
                    client.sendall(_xml_error(503, _REASONS[503], "SlowDown", "injected: reduce your request rate"))
                    return
                if fate == "reset_before":
                    reset = True
                    return
                if delay:
                    time.sleep(delay)
                if upstream is None:
                    upstream = self._track(socket.create_connection(self.upstream, timeout=120))
                    up_in = upstream.makefile("rb")
                assert up_in is not None
                if fate == "cut":
                    upstream.sendall(req.head)
                    time.sleep(0.5)  # the server has the headers, never the body
                    return
                upstream.sendall(req.head + req.body)
                resp = _read_message(up_in, None, request=False, method=method)
                if resp is None:
                    return
                if fate == "lost":
                    return
                if fate == "reset_after":
                    reset = True
                    return
                if fate == "error_after":
                    client.sendall(_xml_error(500, _REASONS[500], "InternalError", "injected after the write"))
                    return
                client.sendall(resp.head + resp.body)
                if not (req.keep_alive and resp.keep_alive):
                    return
        except (OSError, ValueError):
            pass
        finally:
            for f in (c_in, up_in):  # the sockets close (and reset) only once their files are closed too
                if f is not None:
                    f.close()
            if reset:
                _reset(client)
            for s in (client, upstream):
                if s is not None:
                    _hard_close(s)
                    with self.lock:
                        self._open.discard(s)


def _read_message(rf: BinaryIO, client: socket.socket | None, *, request: bool, method: str = "") -> _Message | None:
    """One HTTP/1.1 message from `rf` (None at a clean end of the connection). A request's
    `Expect: 100-continue` is answered here (on `client`) and not forwarded; a response's 1xx
    interim answers are skipped."""
    while True:
        lines: list[bytes] = []
        size = 0
        while True:
            line = rf.readline(_MAX_HEAD)
            if not line:
                if lines:
                    raise ValueError("connection closed inside a message head")
                return None
            if not lines and line in (b"\r\n", b"\n"):
                continue  # stray CRLF between messages
            lines.append(line)
            size += len(line)
            if size > _MAX_HEAD:
                raise ValueError("message head too large")
            if line in (b"\r\n", b"\n"):
                break
        start = lines[0].decode("latin-1").strip()
        headers: dict[str, str] = {}
        kept = [lines[0]]
        for line in lines[1:-1]:
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip()
            if request and name == "expect" and value.lower() == "100-continue":
                assert client is not None
                client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                continue
            headers[name] = value
            kept.append(line)
        kept.append(b"\r\n")
        version = start.rsplit(" ", 1)[-1] if request else start.split(" ", 1)[0]
        status = 0 if request else int(start.split(" ")[1])
        if not request and 100 <= status < 200:
            continue
        conn = headers.get("connection", "").lower()
        keep_alive = ("keep-alive" in conn) if version == "HTTP/1.0" else ("close" not in conn)
        if not request and (method == "HEAD" or status in (204, 304)):
            body = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = _read_chunked(rf)
        elif "content-length" in headers:
            n = int(headers["content-length"])
            body = rf.read(n)
            if len(body) < n:
                raise ValueError("connection closed inside a message body")
        elif request:
            body = b""
        else:
            body = rf.read()  # delimited by the end of the connection
            keep_alive = False
        return _Message(b"".join(kept), start, headers, body, keep_alive)


def _read_chunked(rf: BinaryIO) -> bytes:
    out = []
    while True:
        line = rf.readline(_MAX_HEAD)
        if not line:
            raise ValueError("connection closed inside a chunked body")
        out.append(line)
        n = int(line.split(b";", 1)[0].strip(), 16)
        if n == 0:
            while True:  # trailers, then the empty line
                t = rf.readline(_MAX_HEAD)
                if not t:
                    raise ValueError("connection closed inside chunked trailers")
                out.append(t)
                if t in (b"\r\n", b"\n"):
                    return b"".join(out)
        data = rf.read(n + 2)
        if len(data) < n + 2:
            raise ValueError("connection closed inside a chunk")
        out.append(data)


def _reset(s: socket.socket) -> None:
    """Close with an RST instead of a FIN (SO_LINGER 0)."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    except OSError:
        pass


def _hard_close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()
