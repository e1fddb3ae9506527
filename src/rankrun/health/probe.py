"""The network check's measurements: a probe endpoint every agent serves on its own address, and ``measure``, which
times one link to another agent's endpoint (round trip, and throughput both ways) as an ``outliers.Link``.

The wire (TCP, both sides with ``TCP_NODELAY``). The handshake is ``rankrun.handshake``'s (the embedded store's
shape, ``store.embedded.wire``), with its own magic and small frames (a 2-byte big-endian length, then at most 1 KiB
of JSON; byte strings as hex)::

    client → server   RKPB {"hello": 1, "nonce": <16 random bytes>}
    server → client   {"version": 1, "challenge": <16 random bytes>, "auth": true|false}
    client → server   {"proof": client_proof(secret, challenge, nonce)}          ("" without a secret)
    server → client   {"ok": true, "proof": server_proof(secret, challenge, nonce)}
                      or {"ok": false, "error": "..."} and the connection is closed

(the proofs are ``rankrun.proof``'s: the secret is never sent, and the client checks the server's proof too, so an
endpoint that does not know the secret cannot answer for another node). Without a secret, as the rendezvous, no proof
is asked. Then requests, each a 5-byte header (an operation byte, a 4-byte big-endian count ``n``):

- ``E n`` and ``n`` bytes (``n`` at most 1 KiB): echoed back, header and bytes: one round trip;
- ``W n``: the server answers ``K n`` (go ahead), the client sends ``n`` bytes, which the server reads and drops, then
  acknowledges with ``K n`` (forward throughput: from the go-ahead to the acknowledgement);
- ``R n``: the server answers ``K n`` and sends ``n`` bytes (backward throughput: from the request to the last byte);
- anything else, or ``n`` over ``max_bytes`` (16 MiB): refused with ``X len`` and a message instead of ``K``, and the
  connection closed.

What a stranger can make the endpoint hold is bounded: at most ``max_connections`` connections at once (more are
closed at once), each for ``timeout`` seconds at most from its accept, whatever it sends or not; only a client that
passed the handshake measures, and only ``max_active`` at once (the others wait, within their timeout: two transfers
at once would also halve each other's throughput); bytes are read and sent in chunks of 256 KiB, never ``n`` at once.
A client that fails the proof is logged once per address; a silent, slow or garbled one is closed without a word.

``measure`` raises ``ProbeError`` (one line naming the endpoint and why) when the endpoint refuses, is not there, does
not prove the secret, or does not finish within ``timeout``; the caller counts that as no answer (``NO_ANSWER``, the
ring's unreachable pair, or None for a re-probe: ``outliers.confirm``). What a measure costs: one connection, the
handshake (two round trips), ``pings`` round trips of 32 bytes, and ``size`` bytes each way (4 MiB by default, in
``PARTS`` transfers, the fastest counting): on
loopback a few milliseconds in all; on a 10 Gb/s link about 7 ms of transfer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import statistics
import struct
import time

from rankrun.handshake import MAX_FRAME, HandshakeError, Stranger, accept, no_delay, prove
from rankrun.health.outliers import Link
from rankrun.listen import listen

logger = logging.getLogger(__name__)

MAGIC = b"RKPB"
MAX_ECHO = 1024
MAX_BYTES = 16 << 20  # the most one throughput request may ask for
MAX_CONNECTIONS = 32
MAX_ACTIVE = 2
TIMEOUT = 10.0  # seconds one connection may stay, from its accept
CHUNK = 256 << 10
PARTS = 4  # a measure's bytes each way go in this many transfers, the fastest counting (``measure``)
PING = 32  # the bytes of one round trip's message
NO_ANSWER = Link(rtt=math.inf, forward=0.0, backward=0.0)  # the ring's pair with a node that did not answer

_HEAD = struct.Struct(">cI")
_BLOCK = memoryview(bytes(CHUNK))


class ProbeError(Exception):
    """A probe got no measurement: the endpoint refused, was not there, did not prove the secret, or ran out of time."""


class _Refused(Exception):
    """The server's answer to a request it does not serve (sent to the client, then the connection is closed)."""


# -- the endpoint


class ProbeServer:
    """The probe endpoint of one agent: ``await start()`` binds ``host`` (port 0) and returns the port; ``close()``
    ends every connection. ``secret`` None: any client may measure (as the rendezvous without a secret)."""

    def __init__(self, host: str, secret: bytes | None, *, timeout: float = TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS, max_active: int = MAX_ACTIVE,
                 max_bytes: int = MAX_BYTES) -> None:
        self.host = host
        self.secret = secret
        self.timeout = timeout
        self.max_connections = max_connections
        self.max_bytes = max_bytes
        self._active = asyncio.Semaphore(max_active)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._rejected: set[str] = set()

    @property
    def connections(self) -> int:
        """The connections open now."""
        return len(self._tasks)

    async def start(self) -> int:
        def protocol() -> asyncio.StreamReaderProtocol:
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(), self._accepted)

        self._server, port = await listen(self.host, 0, protocol)
        return port

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._tasks) >= self.max_connections or self._server is None:
            writer.transport.abort()  # full (or closing): a stranger's flood costs one accept each, nothing held
            return
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else "?"
        no_delay(writer)
        try:
            async with asyncio.timeout(self.timeout):
                if await self._handshake(reader, writer, host):
                    async with self._active:
                        await self._requests(reader, writer)
        except _Refused as exc:
            message = str(exc).encode()
            writer.write(_HEAD.pack(b"X", len(message)) + message)
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await writer.drain()
            writer.close()  # a FIN after the message, not a reset that could overtake it
        except (TimeoutError, OSError, EOFError, ValueError) as exc:  # a silent, slow, gone or garbled client
            logger.debug("network probe: closed the connection from %s: %r", host, exc)
        finally:
            writer.transport.abort()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> bool:
        try:
            return await accept(reader, writer, MAGIC, self.secret, "authentication failed: this job's probe needs its secret")
        except Stranger:
            if host not in self._rejected:
                self._rejected.add(host)
                logger.warning("network probe: rejected a connection from %s that does not know this job's secret", host)
            return False

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readexactly(_HEAD.size)
            except asyncio.IncompleteReadError:
                return  # the client is done
            op, n = _HEAD.unpack(head)
            if op == b"E":
                if n > MAX_ECHO:
                    raise _Refused(f"an echo of {n} bytes (limit {MAX_ECHO})")
                writer.write(head + await reader.readexactly(n))
            elif op in (b"W", b"R"):
                if n > self.max_bytes:
                    raise _Refused(f"a transfer of {n} bytes (limit {self.max_bytes})")
                writer.write(_HEAD.pack(b"K", n))  # go ahead (the client sends nothing before: a refusal reaches it)
                if op == b"W":
                    await _drop(reader, n)
                    writer.write(_HEAD.pack(b"K", n))
                else:
                    await _send(writer, n)
            else:
                raise _Refused(f"an unknown request {op!r}")
            await writer.drain()

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()


async def _drop(reader: asyncio.StreamReader, n: int) -> None:
    """Read ``n`` bytes and keep none."""
    left = n
    while left:
        chunk = await reader.read(min(left, CHUNK))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", left)
        left -= len(chunk)


async def _send(writer: asyncio.StreamWriter, n: int) -> None:
    left = n
    while left:
        count = min(left, CHUNK)
        writer.write(_BLOCK[:count])
        await writer.drain()
        left -= count


# -- the prober


async def measure(host: str, port: int, secret: bytes | None, *, pings: int = 10, size: int = 4 << 20,
                  timeout: float = TIMEOUT) -> Link:
    """One link, measured from here to the probe endpoint ``host:port``: the median round trip of ``pings`` small
    messages (seconds), and the throughput of ``size`` bytes sent (``forward``) and received (``backward``), bytes/s:
    the fastest of ``PARTS`` transfers of ``size / PARTS`` bytes each way.
    Raises ``ProbeError`` when it gets no measurement within ``timeout`` seconds (all of it)."""
    where = f"{host}:{port}"
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                no_delay(writer)
                await _prove(reader, writer, secret, where)
                rtt = await _round_trips(reader, writer, pings, where)
                # the fastest of PARTS transfers each way counts: on a busy host a transfer of a few milliseconds loses
                # a scheduler's time slice now and then (a third of its rate, seen in CI with CPU hogs beside it),
                # and the first one pays TCP's slow start; neither is the link's rate, and neither makes a link faster
                part = max(size // PARTS, 1)
                forward = max([await _forward(reader, writer, part, where) for _ in range(PARTS)])
                backward = max([await _backward(reader, writer, part, where) for _ in range(PARTS)])
            finally:
                writer.transport.abort()
    except TimeoutError:
        raise ProbeError(f"network probe {where}: no measurement within {timeout:g} s") from None
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise ProbeError(f"network probe {where}: the endpoint closed the connection ({exc})") from None
    except OSError as exc:
        raise ProbeError(f"network probe {where}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ProbeError(f"network probe {where}: not a rankrun probe endpoint ({exc})") from None
    return Link(rtt=rtt, forward=forward, backward=backward)


async def _prove(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, secret: bytes | None, where: str) -> None:
    try:
        await prove(reader, writer, MAGIC, secret)
    except HandshakeError as exc:
        raise ProbeError(f"network probe {where}: {exc}") from None


async def _reply(reader: asyncio.StreamReader, where: str) -> int:
    op, n = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if op == b"X":
        message = (await reader.readexactly(min(n, MAX_FRAME))).decode(errors="replace")
        raise ProbeError(f"network probe {where}: refused: {message}")
    if op != b"K":
        raise ProbeError(f"network probe {where}: an answer {op!r} to a transfer")
    return int(n)


async def _round_trips(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pings: int, where: str) -> float:
    message = _HEAD.pack(b"E", PING) + os.urandom(PING)
    times = []
    for _ in range(max(pings, 1)):
        start = time.perf_counter()
        writer.write(message)
        echo = await reader.readexactly(len(message))
        times.append(time.perf_counter() - start)
        if echo != message:
            raise ProbeError(f"network probe {where}: a round trip came back altered")
    return statistics.median(times)


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int, where: str) -> float:
    writer.write(_HEAD.pack(b"W", size))
    if await _reply(reader, where) != size:
        raise ProbeError(f"network probe {where}: a transfer accepted short")
    start = time.perf_counter()
    await _send(writer, size)
    if await _reply(reader, where) != size:
        raise ProbeError(f"network probe {where}: a transfer acknowledged short")
    return size / max(time.perf_counter() - start, 1e-9)


async def _backward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, size: int, where: str) -> float:
    start = time.perf_counter()
    writer.write(_HEAD.pack(b"R", size))
    if await _reply(reader, where) != size:
        raise ProbeError(f"network probe {where}: a transfer announced short")
    await _drop(reader, size)
    return size / max(time.perf_counter() - start, 1e-9)
