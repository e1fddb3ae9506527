"""etcd's v3 JSON gateway over HTTP/1.1 (asyncio, standard library), across several endpoints with failover.

Why our own client: no released Python etcd client fails over between endpoints (``etcd3gw`` and
``aetcd`` talk to one; ``etcd3`` no longer imports with current protobuf), the gRPC ones would
pull grpcio and protobuf into a launcher that must start in milliseconds, and etcd's gateway
(``POST /v3/...`` with JSON bodies, base64 keys) is stable from 3.4 to 3.6. What this module
knows of etcd is only the transport: one request, one JSON answer (or a stream of JSON lines for
a watch), its error codes, and which of them mean "ask another member".

Failover: a call goes to the endpoint that answered last; on a connection error, a timeout, or
an answer that says the member cannot serve now (no leader, leader changed, request timed out:
gRPC codes 14 and 4) it goes on to the next endpoint, and after a full turn it pauses (50 ms,
doubling to 1 s or a quarter of an attempt's bound: no event announces a member coming back) and
tries again until ``retry_for`` seconds have passed. Then ``StoreUnavailable`` names every
endpoint tried and why each failed. Every request carries ``Grpc-Metadata-hasleader: true``,
etcd's "require a leader" flag: a member cut off from the quorum refuses at once (and ends its
watches) instead of hanging.

Slow members: each attempt (connecting included) has ``REQUEST_TIMEOUT`` seconds, or less where
the call says so (``attempt_timeout``: a lease's keep-alive cannot wait longer than the lease
lasts). A member that lets an attempt run out, or whose attempt the caller cancelled after
``SLOW_AFTER`` seconds without an answer (a partitioned member sends no RST: only time tells),
*rests* for ``REST`` seconds: a turn tries it only after the others (``attempt_order``), and not
at all if one of them answered that it cannot serve yet (no leader: it is up, and the next turn
asks it again rather than wait on a silent member), so neither the next turn nor the next call
waits on it first. A turn in which every attempt ran out doubles the bound for the next one (up
to ``REQUEST_TIMEOUT``): when no member is faster, patience is what is left.

Authentication: with a user, each endpoint gets its own token (etcd's simple tokens are valid on
the member that issued them only), fetched on first use and again when the member says it is
invalid. TLS: an ``ssl.SSLContext`` built from ``ca_cert`` / ``ssl_cert`` / ``ssl_cert_key``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rankrun.errors import UsageError
from rankrun.spec import Endpoint
from rankrun.store.api import AuthenticationFailed, StoreUnavailable

if TYPE_CHECKING:
    import ssl  # imported only for https: the launcher keeps asyncio from loading it otherwise (rankrun.__main__)

CONNECT_TIMEOUT = 3.0  # seconds to open a connection (and finish TLS) to one member
REQUEST_TIMEOUT = 5.0  # seconds for one attempt (connection and answer) unless the call says less; etcd's own
#                        proposal timeout is about as long
REST = 5.0  # seconds a member that did not answer an attempt in time is left out while another can be tried
SLOW_AFTER = 0.25  # an attempt its caller cancels after this long without an answer counts as not answered
PAUSE = (0.05, 1.0)  # first and longest pause after every endpoint failed once
SAY_AFTER = 1.0  # an outage shorter than this (a leader election) is not worth a line
SAY_EVERY = 5.0  # seconds between two "etcd unavailable, retrying" lines
_RETRY_CODES = frozenset({4, 14})  # DEADLINE_EXCEEDED, UNAVAILABLE: another member may serve
_UNAUTHENTICATED = 16
_MAX_HEAD = 64 * 1024
T = TypeVar("T")


def tls_context(ca_cert: Path | None, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    """Verify the members against ``ca_cert`` (the system's CAs without it); present ``cert``/``key`` if given."""
    import ssl  # noqa: PLC0415 - see the TYPE_CHECKING import

    try:
        context = ssl.create_default_context(cafile=str(ca_cert) if ca_cert else None)
        if cert is not None:
            context.load_cert_chain(str(cert), str(key) if key else None)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError("--rdzv-conf ca_cert/ssl_cert/ssl_cert_key", str(ca_cert or cert),
                         f"cannot load it: {getattr(exc, 'strerror', None) or exc}") from None
    return context


class EtcdError(StoreUnavailable):
    """etcd answered with an error (not a transport failure)."""

    def __init__(self, endpoint: Endpoint, status: int, code: int, message: str) -> None:
        super().__init__(f"etcd at {endpoint}: {message} (HTTP {status}, code {code})")
        self.endpoint = endpoint
        self.status = status
        self.code = code
        self.message = message


class Transport(Exception):
    """One endpoint failed at the transport level: try the next."""


@dataclass(frozen=True)
class _Failed:
    """An attempt on one endpoint that failed in a way another endpoint may not: why, and how."""

    why: str
    slow: bool = False  # it ran out of time (or its caller's patience)
    up: bool = False  # the member answered, only not with a result (no leader yet): it will serve soon


class _Stale(Exception):
    """A kept-alive connection turned out closed before any answer: the same request again on a new one is safe."""


# --------------------------------------------------------------------------- one HTTP/1.1 connection


class Connection:
    def __init__(self, endpoint: Endpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.endpoint = endpoint
        self._reader = reader
        self._writer = writer
        self._pending = b""  # a streamed answer's bytes after the last complete message
        self._ended = False  # the chunked body's last chunk was read
        sockname = writer.get_extra_info("sockname")
        self.local_address = str(sockname[0]) if isinstance(sockname, tuple) else None

    @classmethod
    async def open(cls, endpoint: Endpoint, context: ssl.SSLContext | None) -> Connection:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                reader, writer = await asyncio.open_connection(
                    endpoint.host, endpoint.port, limit=_MAX_HEAD * 16,
                    ssl=context if endpoint.scheme == "https" else None,
                    server_hostname=endpoint.host if endpoint.scheme == "https" else None)
        except TimeoutError:
            raise Transport(f"no connection within {CONNECT_TIMEOUT:.0f} s") from None
        except OSError as exc:  # ssl.SSLError among them
            tls = getattr(exc, "verify_message", None) or getattr(exc, "reason", None)
            raise Transport(f"TLS: {tls}" if tls else _reason(exc)) from None
        sock = writer.get_extra_info("socket")
        if sock is not None:  # a member gone without a RST (power, partition): a watch notices in about 10 s
            with contextlib.suppress(OSError, AttributeError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 4)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 2)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
        return cls(endpoint, reader, writer)

    async def send(self, path: str, body: bytes, headers: dict[str, str]) -> None:
        self._pending, self._ended = b"", False  # a new answer (a kept-alive connection carries one after another)
        lines = [f"POST {path} HTTP/1.1", f"Host: {self.endpoint.host}:{self.endpoint.port}",
                 "Content-Type: application/json", f"Content-Length: {len(body)}",
                 *(f"{k}: {v}" for k, v in headers.items())]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await self._writer.drain()

    async def head(self) -> tuple[int, dict[str, str]]:
        try:
            raw = await self._reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise Transport("an HTTP header over 1 MiB") from None
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise Transport(f"not an HTTP answer: {lines[0][:80]!r}")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return int(parts[1]), headers

    async def body(self, headers: dict[str, str]) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while chunk := await self._chunk():
                parts.append(chunk)
            return b"".join(parts)
        if "content-length" in headers:
            return await self._reader.readexactly(int(headers["content-length"]))
        return await self._reader.read()  # closed-delimited

    async def _chunk(self) -> bytes:
        """The next chunk of a chunked body; b"" after the last one."""
        if self._ended:
            return b""
        size_line = await self._reader.readuntil(b"\r\n")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:  # the trailer: header lines up to an empty one (etcd sends Grpc-Trailer-* with every error)
            while await self._reader.readuntil(b"\r\n") != b"\r\n":
                pass
            self._ended = True
            return b""
        data = await self._reader.readexactly(size)
        await self._reader.readexactly(2)
        return data

    async def line(self) -> dict[str, Any] | None:
        """The next message of a streamed answer (a watch: one JSON object a line); None once the member ended it.

        The buffer lives on the connection: a chunk may carry more than one message, or part of one.
        """
        while True:
            line, newline, rest = self._pending.partition(b"\n")
            if newline:
                self._pending = rest
                if line.strip():
                    return _json(line)
                continue
            chunk = await self._chunk()
            if not chunk:
                tail, self._pending = self._pending.strip(), b""
                return _json(tail) if tail else None
            self._pending += chunk

    def close(self) -> None:
        self._writer.close()


def _json(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError:
        raise Transport(f"an answer that is not JSON: {data[:80]!r}") from None
    if not isinstance(obj, dict):
        raise Transport(f"an answer that is not a JSON object: {data[:80]!r}")
    return obj


def error_of(obj: dict[str, Any]) -> tuple[int, str] | None:
    """The gRPC code and message of an etcd error answer, or None."""
    err = obj.get("error")
    if isinstance(err, dict):  # a streamed error: {"error": {"grpc_code": .., "message": ..}}
        return int(err.get("grpc_code") or err.get("code") or 2), str(err.get("message", err))
    if err is not None or ("code" in obj and "message" in obj):
        return int(obj.get("code", 2)), str(obj.get("message") or err)
    return None


# --------------------------------------------------------------------------- the endpoints


def attempt_order(count: int, current: int, resting: Mapping[int, float], now: float) -> tuple[list[int], list[int]]:
    """The endpoints one turn tries: those awake, round the list from ``current`` (the one that answered last);
    then those resting (``resting``: endpoint → when its rest ends), the one whose rest ends first first."""
    rotation = [(current + step) % count for step in range(count)]
    awake = [i for i in rotation if resting.get(i, now) <= now]
    return awake, sorted((i for i in rotation if i not in awake), key=lambda i: resting[i])


def next_pause(pause: float, bound: float) -> float:
    """The pause after the next turn that failed: doubling, at most ``PAUSE[1]`` or a quarter of an attempt's bound."""
    return max(PAUSE[0], min(pause * 2, PAUSE[1], bound / 4))


class Gateway:
    def __init__(
        self,
        endpoints: tuple[Endpoint, ...],
        *,
        context: ssl.SSLContext | None = None,
        user: str | None = None,
        password: str | None = None,
        retry_for: float = 30.0,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.retry_for = retry_for
        self.local_address: str | None = None  # this side of the last connection: what other nodes reach us on
        self._context = context
        self._user = user
        self._password = password or ""
        self.say = say  # where "etcd unavailable, retrying" goes (None: quiet)
        self._current = 0
        self._resting: dict[int, float] = {}  # endpoint index → when its rest ends (it did not answer in time)
        self._idle: dict[Endpoint, list[Connection]] = {}
        self._tokens: dict[Endpoint, str] = {}
        self._closed = False
        self._said = 0.0

    @property
    def serving(self) -> Endpoint:
        """The endpoint that answered last (where the next call starts unless it rests)."""
        return self.endpoints[self._current]

    async def call(
        self, path: str, body: dict[str, Any], *, retry_for: float | None = None, attempt_timeout: float | None = None
    ) -> dict[str, Any]:
        """One unary request, on the first endpoint that can serve it (failing over as the module says).

        ``retry_for``: seconds to go on trying (the gateway's ``retry_for`` by default); ``attempt_timeout``:
        seconds one member has to answer before the next is tried (``REQUEST_TIMEOUT`` at most, and by default).
        """
        return await self._over_endpoints(lambda ep: self._call_on(ep, path, body), retry_for, attempt_timeout)

    async def open_stream(self, path: str, body: dict[str, Any]) -> tuple[Connection, dict[str, Any]]:
        """Start a streamed request; returns its connection (read on with ``line()``) and the first message."""
        return await self._over_endpoints(lambda ep: self._stream_on(ep, path, body))

    async def _over_endpoints(
        self, attempt: Callable[[Endpoint], Awaitable[T]], retry_for: float | None = None, attempt_timeout: float | None = None
    ) -> T:
        window = self.retry_for if retry_for is None else retry_for
        bound = REQUEST_TIMEOUT if attempt_timeout is None else max(0.001, min(attempt_timeout, REQUEST_TIMEOUT))
        loop = asyncio.get_running_loop()
        started = loop.time()
        pause = PAUSE[0]
        last: dict[int, str] = {}  # endpoint index → why it failed last (a resting one is not tried every turn)
        while True:
            failures: list[_Failed] = []
            awake, resting = attempt_order(len(self.endpoints), self._current, self._resting, loop.time())
            for index in awake + resting:
                if index in resting and any(f.up for f in failures):
                    break  # a member that is up waits for its leader: ask it again rather than wait on a silent one
                result = await self._attempt(index, attempt, bound)
                if not isinstance(result, _Failed):
                    return result
                failures.append(result)
                last[index] = result.why
            if self._closed:
                raise StoreUnavailable("the etcd client was closed")
            waited = loop.time() - started
            why = "; ".join(last[i] for i in sorted(last))
            if waited + pause > window:
                raise StoreUnavailable(f"etcd: no endpoint could serve after {waited:.1f} s: {why}")
            if self.say is not None and waited >= SAY_AFTER and loop.time() - self._said >= SAY_EVERY:
                self._said = loop.time()
                self.say(f"etcd unavailable for {waited:.0f} s ({why}); retrying for up to {window:.0f} s")
            if all(f.slow for f in failures):  # no member answered in time: none is faster, so wait longer on them
                bound = min(bound * 2, REQUEST_TIMEOUT)
            await asyncio.sleep(pause)  # every member refused: wait for one to come back (no event says when)
            pause = next_pause(pause, bound)

    async def _attempt(self, index: int, attempt: Callable[[Endpoint], Awaitable[T]], bound: float) -> T | _Failed:
        """One attempt on one endpoint, within ``bound`` seconds; what failed, if it is worth trying the next."""
        loop = asyncio.get_running_loop()
        endpoint = self.endpoints[index]
        begun = loop.time()
        try:
            async with asyncio.timeout(bound):
                result = await attempt(endpoint)
        except TimeoutError:
            self._resting[index] = loop.time() + REST
            return _Failed(f"{endpoint} (no answer within {bound:.2g} s)", slow=True)
        except asyncio.CancelledError:
            if loop.time() - begun >= SLOW_AFTER:  # its caller gave up waiting on this member: rest it all the same
                self._resting[index] = loop.time() + REST
            raise
        except Transport as exc:
            return _Failed(f"{endpoint} ({exc})")
        except EtcdError as exc:
            if exc.code not in _RETRY_CODES:
                raise
            return _Failed(f"{endpoint} ({exc.message})", up=True)
        self._current = index
        self._resting.pop(index, None)
        return result

    async def _connection(self, endpoint: Endpoint, *, pooled: bool) -> Connection:
        idle = self._idle.get(endpoint)
        if pooled and idle:
            return idle.pop()
        conn = await Connection.open(endpoint, self._context)
        self.local_address = conn.local_address or self.local_address
        return conn

    async def _headers(self, endpoint: Endpoint) -> dict[str, str]:
        headers = {"Grpc-Metadata-hasleader": "true"}
        if self._user is not None:
            if endpoint not in self._tokens:
                self._tokens[endpoint] = await self._authenticate(endpoint)
            headers["Authorization"] = self._tokens[endpoint]
        return headers

    async def _authenticate(self, endpoint: Endpoint) -> str:
        obj = await self._exchange(endpoint, "/v3/auth/authenticate", {"name": self._user, "password": self._password}, {})
        token = obj.get("token")
        if not token:
            raise AuthenticationFailed(f"etcd at {endpoint}: no token for user {self._user!r}")
        return str(token)

    async def _call_on(self, endpoint: Endpoint, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self._exchange(endpoint, path, body, await self._headers(endpoint))
        except EtcdError as exc:
            if exc.code != _UNAUTHENTICATED or self._user is None:
                raise
            self._tokens.pop(endpoint, None)  # expired or issued by another member: once more with a new one
            return await self._exchange(endpoint, path, body, await self._headers(endpoint))

    async def _exchange(self, endpoint: Endpoint, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        if self._idle.get(endpoint):
            with contextlib.suppress(_Stale):  # a kept-alive connection the member closed meanwhile: nothing was served
                return await self._exchange_on(endpoint, path, body, headers, pooled=True)
        return await self._exchange_on(endpoint, path, body, headers, pooled=False)

    async def _exchange_on(
        self, endpoint: Endpoint, path: str, body: dict[str, Any], headers: dict[str, str], *, pooled: bool
    ) -> dict[str, Any]:
        conn = await self._connection(endpoint, pooled=pooled)
        reusable, answered = False, False
        try:  # bounded by the caller (_over_endpoints): a timeout or a cancellation closes the connection
            await conn.send(path, json.dumps(body).encode(), headers)
            status, head = await conn.head()
            answered = True
            obj = _json(await conn.body(head))
            reusable = head.get("connection", "").lower() != "close"
        except (OSError, EOFError, asyncio.IncompleteReadError, ValueError) as exc:
            if pooled and not answered and isinstance(exc, ConnectionError | asyncio.IncompleteReadError):
                raise _Stale from None
            raise Transport(_reason(exc)) from None
        finally:
            if reusable and not self._closed:
                self._idle.setdefault(endpoint, []).append(conn)
            else:
                conn.close()
        return _checked(endpoint, status, obj)

    async def _stream_on(self, endpoint: Endpoint, path: str, body: dict[str, Any]) -> tuple[Connection, dict[str, Any]]:
        headers = await self._headers(endpoint)
        conn = await self._connection(endpoint, pooled=False)  # a stream keeps its connection to itself
        try:  # bounded by the caller (_over_endpoints) up to the first message
            await conn.send(path, json.dumps(body).encode(), headers)
            status, head = await conn.head()
            if status != 200:
                _checked(endpoint, status, _json(await conn.body(head)))
                raise Transport(f"HTTP {status}")
            first = await conn.line()
        except (OSError, EOFError, asyncio.IncompleteReadError, ValueError) as exc:
            conn.close()
            raise Transport(_reason(exc)) from None
        except BaseException:
            conn.close()
            raise
        if first is None:
            conn.close()
            raise Transport("the stream ended at once")
        error = error_of(first)
        if error is not None:
            conn.close()
            raise EtcdError(endpoint, status, *error)
        return conn, first

    async def close(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


def _checked(endpoint: Endpoint, status: int, obj: dict[str, Any]) -> dict[str, Any]:
    error = error_of(obj)
    if error is None and status == 200:
        return obj
    code, message = error if error is not None else (2, f"HTTP {status}")
    if code == 3 and ("authentication failed" in message or "user name is empty" in message):
        raise AuthenticationFailed(f"etcd at {endpoint}: {message}")
    if code == 7:  # PERMISSION_DENIED
        raise AuthenticationFailed(f"etcd at {endpoint}: {message}")
    if status in (502, 503) and error is None:
        code = 14
    raise EtcdError(endpoint, status, code, message)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.IncompleteReadError):
        return "the connection closed mid-answer"
    if isinstance(exc, OSError):  # asyncio words a refusal "Connect call failed (...)": say what the errno means
        return os.strerror(exc.errno) if exc.errno else exc.strerror or str(exc)
    return str(exc) or type(exc).__name__
