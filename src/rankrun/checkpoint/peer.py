"""The neighbour's copy: a keep endpoint on every launcher of a several-node job, which holds another node's kept
steps in memory files of its own (``PeerServer``), and the client calls that fill and read it (``put``, ``get``,
``held``). Launcher side: standard library only.

The wire (TCP, both sides with ``TCP_NODELAY``). The handshake is ``rankrun.handshake``'s with the magic ``RKCK``, and
the job's secret is required on both sides: what crosses is a model's weights, which must go to no one else and come
from no one else (the client checks the server's proof too). Without a secret there is no neighbour copy: the server
cannot be made and the client calls refuse (``NO_SECRET``). The proof authenticates; it does not encrypt: the bytes
cross the network in clear.

Then requests, each a 5-byte header (an operation byte, a 4-byte big-endian count ``n``) and ``n`` bytes of JSON (at
most ``MAX_REQUEST``); each answer is ``K n`` and ``n`` bytes of JSON, or ``X n`` and a message, after which the server
closes the connection. Sizes are in the JSON, so a copy may be larger than 4 GiB:

- ``P {"node", "rank", "step", "world", "bytes"}`` (put): the server judges its room (``room(bytes)``: ``None`` or why
  not), makes a fresh memory file (``memfd_create``) and reserves it (``posix_fallocate``), then answers ``K {}`` (go
  ahead: the client sends nothing before, so a refusal costs no bytes); the client sends the bytes (``sendfile`` from
  its memory file); the server answers ``K {}`` once it holds them all. Only then does the new copy become the newest
  for that ``(node, rank)``: the one it replaces is still held (a node's ranks are put one after another, so its last
  complete step stays whole here), and the one before that is dropped. A put cut off anywhere changes nothing.
- ``G {"node", "rank", "step"}`` (get): ``K {"step", "world", "bytes"}`` and the bytes (``sendfile``), or ``X`` when
  that step of that rank is not held here; for the server's own node id, the step its keeper holds (``own``).
- ``H {}`` (held): ``K {node: {rank: [step, world, bytes]}}``, the newest copy of each.

``Sender`` is the other side: a node's kept steps put to the next node's endpoint in the background.

Bounded: at most ``max_connections`` connections at once (more are closed at once); the handshake and each wait for a
request take at most ``timeout`` seconds; a transfer at most ``deadline(bytes)``: 30 s, or the time at 50 MB/s when
longer; one transfer at a time per connection (its requests are served in turn). A client that fails the proof is
logged once per address and closed, and holds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import mmap
import os
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rankrun.handshake import HandshakeError, Stranger, accept, no_delay, prove
from rankrun.listen import listen

logger = logging.getLogger(__name__)

MAGIC = b"RKCK"
MAX_CONNECTIONS = 16
TIMEOUT = 10.0  # seconds for the handshake, and for each wait for a request or an answer
FLOOR_S = 30.0  # a transfer's deadline: at least this ...
RATE = 50e6  # ... or its bytes at this rate (bytes/s), whichever is longer
MAX_REQUEST = 1024  # a request's JSON
MAX_ANSWER = 1 << 20  # an answer's JSON (``held``'s listing)
MAX_NODE = 256  # the characters of a node id
CHUNK = 1 << 20  # bytes received per read
NAME = "rankrun-peer"  # the memory files' names (memfd:NAME-<pid>-<rank>)
NO_SECRET = ("no job secret (RANKRUN_RDZV_SECRET): the neighbour copy carries the model's weights and is off; kept in "  # noqa: S105
             "this node's memory only")

_HEAD = struct.Struct(">cI")
Own = Callable[[int, int], Awaitable[tuple[int, int, int] | None]]  # (rank, step) -> a fresh fd, its world, its bytes
_T = TypeVar("_T")


class PeerError(Exception):
    """A call to a keep endpoint failed: it refused, was not there, did not prove the secret, or ran out of time (one
    line naming the endpoint and why)."""


class _Refused(Exception):
    """The server's answer to a request it does not serve (sent to the client, then the connection is closed)."""


def deadline(nbytes: int, floor: float = FLOOR_S, rate: float = RATE) -> float:
    """Seconds a transfer of ``nbytes`` may take: ``floor``, or ``nbytes`` at ``rate`` bytes/s when longer."""
    return max(floor, nbytes / rate)


# -- requests, checked (pure)


def _field(obj: dict[str, Any], name: str, least: int) -> int:
    value = obj.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise _Refused(f"a request whose {name!r} is {value!r} (an integer of at least {least})")
    return value


def _node(obj: dict[str, Any]) -> str:
    node = obj.get("node")
    if not isinstance(node, str) or not node or len(node) > MAX_NODE:
        raise _Refused(f"a request whose 'node' is {node!r} (a node id of 1 to {MAX_NODE} characters)")
    return node


def put_request(obj: dict[str, Any]) -> tuple[str, int, int, int, int]:
    """A put's ``(node, rank, step, world, bytes)``; ``_Refused`` naming the field that is not one."""
    return (_node(obj), _field(obj, "rank", 0), _field(obj, "step", 0), _field(obj, "world", 1),
            _field(obj, "bytes", 0))


def get_request(obj: dict[str, Any]) -> tuple[str, int, int]:
    """A get's ``(node, rank, step)``; ``_Refused`` naming the field that is not one."""
    return _node(obj), _field(obj, "rank", 0), _field(obj, "step", 0)


def _encode(op: bytes, obj: dict[str, Any]) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return _HEAD.pack(op, len(body)) + body


# -- memory files, both sides


def _memfd(rank: int) -> int:
    return os.memfd_create(f"{NAME}-{os.getpid()}-{rank}", os.MFD_CLOEXEC)


async def _reserve(fd: int, nbytes: int) -> None:
    """The pages exist before a byte arrives (a tmpfs or cgroup limit is met here, not in the middle of a transfer)."""
    if nbytes:
        await asyncio.to_thread(os.posix_fallocate, fd, 0, nbytes)


async def _receive(reader: asyncio.StreamReader, fd: int, nbytes: int) -> None:
    """Exactly ``nbytes`` from ``reader`` into ``fd`` from its start."""
    done = 0
    while done < nbytes:
        chunk = await reader.read(min(nbytes - done, CHUNK))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", nbytes - done)
        view = memoryview(chunk)
        while view:
            written = os.pwrite(fd, view, done)
            done += written
            view = view[written:]


async def _send(writer: asyncio.StreamWriter, fd: int, nbytes: int) -> None:
    """The first ``nbytes`` of ``fd`` to ``writer``'s socket, by ``sendfile``: no copy through Python."""
    if not nbytes:
        return
    with open(fd, "rb", buffering=0, closefd=False) as file:
        sent = await asyncio.get_running_loop().sendfile(writer.transport, file, 0, nbytes)
    if sent != nbytes:
        raise EOFError(f"sent {sent} of {nbytes} bytes: the memory file is shorter")


class _Into(asyncio.BufferedProtocol):
    """A put's bytes straight from the socket into a mapping of the memory file (``recv_into``: the kernel's one copy,
    none through a stream's buffer), in place of the connection's stream protocol until the last byte; then the stream
    protocol is back. Flow control and the connection's end still reach the stream protocol."""

    def __init__(self, transport: asyncio.Transport, view: memoryview, stream: asyncio.BaseProtocol) -> None:
        self._transport, self._view, self._stream = transport, view, stream
        self._done = 0
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def get_buffer(self, sizehint: int) -> memoryview:  # noqa: ARG002 - the rest of the copy, whatever the hint
        return self._view[self._done:]

    def buffer_updated(self, nbytes: int) -> None:
        self._done += nbytes
        if self._done == len(self._view):
            self._transport.set_protocol(self._stream)
            self._end(None)

    def eof_received(self) -> bool:
        self._end(asyncio.IncompleteReadError(b"", len(self._view) - self._done))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or asyncio.IncompleteReadError(b"", len(self._view) - self._done))
        self._stream.connection_lost(exc)

    def pause_writing(self) -> None:
        self._stream.pause_writing()

    def resume_writing(self) -> None:
        self._stream.resume_writing()

    def detach(self) -> None:
        """Done with, whatever happened: the mapping can be closed."""
        self._view = memoryview(b"")
        self.finished.cancel()

    def _end(self, exc: BaseException | None) -> None:
        self._view = memoryview(b"")  # the mapping can be closed
        if not self.finished.done():
            if exc is None:
                self.finished.set_result(None)
            else:
                self.finished.set_exception(exc)


async def _receive_mapped(writer: asyncio.StreamWriter, fd: int, nbytes: int, go: bytes) -> None:
    """Send ``go`` (the client's go-ahead: it sends nothing before), then exactly ``nbytes`` into ``fd`` (reserved)."""
    transport = writer.transport
    if not nbytes or not isinstance(transport, asyncio.Transport):
        writer.write(go)
        return
    with mmap.mmap(fd, nbytes) as mapped:
        view = memoryview(mapped)
        stream = transport.get_protocol()
        into = _Into(transport, view, stream)
        transport.set_protocol(into)  # before the go-ahead: no byte of the copy reaches the stream's buffer
        try:
            writer.write(go)
            await into.finished
        finally:
            into.detach()
            if transport.get_protocol() is into:
                transport.set_protocol(stream)
            view.release()


# -- the endpoint


@dataclass(frozen=True)
class Copy:
    """One rank's copy held here: its memory file (this server's; closed when replaced) and what it is."""

    fd: int
    step: int
    world: int
    length: int


class PeerServer:
    """The keep endpoint of one launcher: ``await start()`` binds ``host`` (port 0) and returns the port; ``close()``
    ends every connection and frees every copy held.

    ``room(bytes)`` judges each put before anything is reserved: ``None`` when it fits, else why not (sent to the
    client). ``on_change()`` is called after a copy is added, replaced or dropped (the keeper republishes ``held``).
    """

    def __init__(self, host: str, secret: bytes | None, *, room: Callable[[int], str | None],
                 on_change: Callable[[], None] | None = None, timeout: float = TIMEOUT,
                 max_connections: int = MAX_CONNECTIONS, floor: float = FLOOR_S, node: str = "",
                 own: Own | None = None) -> None:
        if not secret:
            raise PeerError(f"checkpoint peer: {NO_SECRET}")
        self.host = host
        self.secret = secret
        self.room = room
        self.on_change = on_change
        self.timeout = timeout
        self.max_connections = max_connections
        self.floor = floor
        self.node, self.own = node, own  # this launcher's node id, and its own ranks' kept steps for a get
        self._held: dict[tuple[str, int], Copy] = {}
        self._before: dict[tuple[str, int], Copy] = {}  # the copy each newest one replaced: see _keep
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._rejected: set[str] = set()

    @property
    def connections(self) -> int:
        """The connections open now."""
        return len(self._tasks)

    async def start(self) -> int:
        def protocol() -> asyncio.StreamReaderProtocol:
            # a larger buffer than asyncio's 64 KiB: fewer pauses of the socket's reading while a copy streams in
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=CHUNK), self._accepted)

        self._server, port = await listen(self.host, 0, protocol)
        return port

    # -- what is held (the keeper publishes it)

    def held(self) -> dict[str, dict[int, tuple[int, int, int]]]:
        """node → rank → (step, world, bytes) of every copy held here."""
        out: dict[str, dict[int, tuple[int, int, int]]] = {}
        for (node, rank), copy in sorted(self._held.items()):
            out.setdefault(node, {})[rank] = (copy.step, copy.world, copy.length)
        return out

    def fd_of(self, node: str, rank: int) -> tuple[int, int] | None:
        """The memory file holding ``node``'s ``rank`` and its length, or None. The descriptor stays this server's: it
        is closed when a newer copy replaces it, by ``drop`` and by ``close`` (``os.dup`` it to keep it longer)."""
        copy = self._held.get((node, rank))
        return None if copy is None else (copy.fd, copy.length)

    def drop(self, node: str, rank: int | None = None) -> None:
        """Free the copy of ``node``'s ``rank`` (every rank of ``node`` with None)."""
        gone = [key for key in self._held if key[0] == node and (rank is None or key[1] == rank)]
        for key in gone:
            os.close(self._held.pop(key).fd)
            if (before := self._before.pop(key, None)) is not None:
                os.close(before.fd)
        if gone:
            self._changed()

    def _keep(self, node: str, rank: int, copy: Copy) -> None:
        """The newest copy of ``node``'s ``rank``, and the one it replaced: a node's ranks are put one after another,
        so while a step is on its way some of them hold the new step and some the one before; with the one before
        still held for every rank, the node's last complete step is always whole here."""
        old = self._before.pop((node, rank), None)
        if old is not None:
            os.close(old.fd)  # only now: the new copy is complete
        replaced = self._held.get((node, rank))
        self._held[(node, rank)] = copy
        if replaced is not None:
            if replaced.step == copy.step:
                os.close(replaced.fd)
            else:
                self._before[(node, rank)] = replaced
        self._changed()

    def steps(self) -> dict[str, dict[int, list[tuple[int, int]]]]:
        """node → rank → the (step, world) pairs held here, the newest first (the one before it too)."""
        out: dict[str, dict[int, list[tuple[int, int]]]] = {}
        for held in (self._held, self._before):
            for (node, rank), copy in sorted(held.items()):
                out.setdefault(node, {}).setdefault(rank, []).append((copy.step, copy.world))
        return out

    def find(self, rank: int, step: int) -> Copy | None:
        """A copy of ``rank`` at ``step`` held here for any node (a rank's state of a step is one, whoever sent it)."""
        return next((c for held in (self._held, self._before) for (_, r), c in held.items()
                     if r == rank and c.step == step), None)

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # -- connections

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._tasks) >= self.max_connections or self._server is None:
            writer.transport.abort()  # full (or closing): a flood costs one accept each, nothing held
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
                known = await self._handshake(reader, writer, host)
            if known:
                await self._requests(reader, writer)
        except _Refused as exc:
            message = str(exc).encode()
            writer.write(_HEAD.pack(b"X", len(message)) + message)
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(1.0):
                    await writer.drain()
            writer.close()  # a FIN after the message, not a reset that could overtake it
        except (TimeoutError, OSError, EOFError, ValueError) as exc:  # a silent, slow, gone or garbled client
            logger.debug("checkpoint peer: closed the connection from %s: %r", host, exc)
        finally:
            writer.transport.abort()

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> bool:
        try:
            return await accept(reader, writer, MAGIC, self.secret, "authentication failed: this job's neighbour copy "
                                "needs its secret")
        except Stranger:
            if host not in self._rejected:
                self._rejected.add(host)
                logger.warning("checkpoint peer: rejected a connection from %s that does not know this job's secret", host)
            return False

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            async with asyncio.timeout(self.timeout):
                try:
                    head = await reader.readexactly(_HEAD.size)
                except asyncio.IncompleteReadError:
                    return  # the client is done
                op, n = _HEAD.unpack(head)
                if n > MAX_REQUEST:
                    raise _Refused(f"a request of {n} bytes (limit {MAX_REQUEST})")
                body = json.loads(await reader.readexactly(n)) if n else {}
            if not isinstance(body, dict):
                raise _Refused("a request that is not a JSON object")
            if op == b"P":
                await self._put(writer, body)
            elif op == b"G":
                await self._get(writer, body)
            elif op == b"H":
                listing = {node: {str(rank): list(held) for rank, held in ranks.items()}
                           for node, ranks in self.held().items()}
                writer.write(_encode(b"K", listing))
            else:
                raise _Refused(f"an unknown request {op!r}")
            async with asyncio.timeout(self.timeout):  # a client that reads no answers holds nothing for long
                await writer.drain()

    async def _put(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        node, rank, step, world, nbytes = put_request(body)
        why = self.room(nbytes)
        if why is not None:
            raise _Refused(f"no room for a copy of {nbytes} bytes (node {node} rank {rank} step {step}): {why}")
        try:
            fd = _memfd(rank)
        except OSError as exc:
            raise _Refused(f"cannot make a memory file: {exc.strerror or exc}") from None
        try:
            try:
                await _reserve(fd, nbytes)
            except OSError as exc:
                raise _Refused(f"cannot reserve {nbytes} bytes: {exc.strerror or exc}") from None
            async with asyncio.timeout(deadline(nbytes, self.floor)):
                await _receive_mapped(writer, fd, nbytes, _encode(b"K", {}))  # go ahead, then the bytes
        except BaseException:
            os.close(fd)  # a put cut off anywhere: the copy held before stays
            raise
        self._keep(node, rank, Copy(fd=fd, step=step, world=world, length=nbytes))
        writer.write(_encode(b"K", {}))

    async def _get(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        node, rank, step = get_request(body)
        if node == self.node and self.own is not None:  # this launcher's own ranks' kept step
            mine = await self.own(rank, step)
            if mine is None:
                raise _Refused(f"rank {rank}'s step {step} is not kept on node {node}")
            copy = Copy(fd=mine[0], step=step, world=mine[1], length=mine[2])  # a descriptor of its own: closed below
        else:
            held = self._held.get((node, rank))
            if held is None:
                raise _Refused(f"no copy of node {node} rank {rank} is held here")
            if held.step != step:
                held = self._before.get((node, rank))
                if held is None or held.step != step:
                    raise _Refused(f"the copy of node {node} rank {rank} held here is of step "
                                   f"{self._held[(node, rank)].step}, not {step}")
            copy = Copy(fd=os.dup(held.fd), step=held.step, world=held.world, length=held.length)  # readable if
            # a newer put replaces it meanwhile
        try:
            writer.write(_encode(b"K", {"step": copy.step, "world": copy.world, "bytes": copy.length}))
            async with asyncio.timeout(deadline(copy.length, self.floor)):
                await writer.drain()
                await _send(writer, copy.fd, copy.length)
        finally:
            os.close(copy.fd)

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
        held, self._held, before, self._before = self._held, {}, self._before, {}
        for copy in (*held.values(), *before.values()):
            os.close(copy.fd)


# -- the client calls


async def put(addr: str, port: int, secret: bytes | None, *, node: str, rank: int, step: int, world: int, fd: int,
              length: int) -> None:
    """Copy the first ``length`` bytes of the memory file ``fd`` to the keep endpoint ``addr:port`` as ``node``'s
    ``rank`` at ``step`` of a world of ``world``; returns once the endpoint holds all of it. ``PeerError`` otherwise."""
    where = f"{addr}:{port}"
    if os.fstat(fd).st_size < length:
        raise PeerError(f"checkpoint peer {where}: a copy of {length} bytes from a memory file of "
                        f"{os.fstat(fd).st_size}")

    async def body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_encode(b"P", {"node": node, "rank": rank, "step": step, "world": world, "bytes": length}))
        async with asyncio.timeout(TIMEOUT):
            await _answer(reader)  # go ahead (room judged, memory reserved)
        async with asyncio.timeout(deadline(length) + TIMEOUT):
            await _send(writer, fd, length)
            await _answer(reader)  # complete

    await _call(addr, port, secret, body)


async def get(addr: str, port: int, secret: bytes | None, *, node: str, rank: int, step: int) -> int:
    """A fresh memory file (close-on-exec, this caller's to close) holding the copy of ``node``'s ``rank`` at ``step``
    that the keep endpoint ``addr:port`` holds; its size is the copy's. ``PeerError`` otherwise."""

    async def body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> int:
        writer.write(_encode(b"G", {"node": node, "rank": rank, "step": step}))
        async with asyncio.timeout(TIMEOUT):
            answer = await _answer(reader)
        nbytes = answer.get("bytes")
        if not isinstance(nbytes, int) or nbytes < 0 or answer.get("step") != step:
            raise ValueError(f"an answer of {nbytes!r} bytes of step {answer.get('step')!r} to a get of step {step}")
        fd = _memfd(rank)
        try:
            await _reserve(fd, nbytes)
            async with asyncio.timeout(deadline(nbytes) + TIMEOUT):
                await _receive(reader, fd, nbytes)
        except BaseException:
            os.close(fd)
            raise
        return fd

    return await _call(addr, port, secret, body)


async def held(addr: str, port: int, secret: bytes | None) -> dict[str, dict[int, tuple[int, int, int]]]:
    """What the keep endpoint ``addr:port`` holds: node → rank → (step, world, bytes). ``PeerError`` otherwise."""

    async def body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> dict[str, Any]:
        writer.write(_encode(b"H", {}))
        async with asyncio.timeout(TIMEOUT):
            return await _answer(reader)

    listing = await _call(addr, port, secret, body)
    try:
        return {str(node): {int(rank): (int(s), int(w), int(b)) for rank, (s, w, b) in ranks.items()}
                for node, ranks in listing.items()}
    except (TypeError, ValueError, AttributeError):
        raise PeerError(f"checkpoint peer {addr}:{port}: a listing that is not one") from None


async def _answer(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The server's answer: ``K``'s JSON object; ``_Refused`` with the server's message for ``X``."""
    op, n = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if op == b"X":
        raise _Refused((await reader.readexactly(min(n, MAX_REQUEST))).decode(errors="replace"))
    if op != b"K" or n > MAX_ANSWER:
        raise ValueError(f"an answer {op!r} of {n} bytes")
    obj = json.loads(await reader.readexactly(n))
    if not isinstance(obj, dict):
        raise ValueError("an answer that is not a JSON object")
    return obj


async def _call(addr: str, port: int, secret: bytes | None,
                body: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[_T]]) -> _T:
    """Connect, prove, run ``body``; every way it fails is one ``PeerError`` line naming the endpoint."""
    where = f"{addr}:{port}"
    if not secret:
        raise PeerError(f"checkpoint peer {where}: {NO_SECRET}")
    try:
        async with asyncio.timeout(TIMEOUT):
            reader, writer = await asyncio.open_connection(addr, port, limit=CHUNK)
        try:
            no_delay(writer)
            async with asyncio.timeout(TIMEOUT):
                await prove(reader, writer, MAGIC, secret)
            return await body(reader, writer)
        finally:
            writer.transport.abort()
    except _Refused as exc:
        raise PeerError(f"checkpoint peer {where}: refused: {exc}") from None
    except HandshakeError as exc:
        raise PeerError(f"checkpoint peer {where}: {exc}") from None
    except TimeoutError:
        raise PeerError(f"checkpoint peer {where}: no answer in time") from None
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise PeerError(f"checkpoint peer {where}: the endpoint closed the connection ({exc})") from None
    except OSError as exc:
        raise PeerError(f"checkpoint peer {where}: {exc.strerror or exc}") from None
    except (ValueError, EOFError) as exc:
        raise PeerError(f"checkpoint peer {where}: not a rankrun keep endpoint ({exc})") from None


Sent = Callable[[int, str, int, float, str], None]  # (step, the neighbour's address, bytes, seconds, complete|abandoned)


class Sender:
    """This node's kept steps put to its neighbour's keep endpoint (``to``), in the background: a step at a time, its
    ranks one after another; a step offered while one is on its way waits, and only the newest waiting one is sent.
    Failures are said once per neighbour (one line; the next step tries again). Called from the loop's thread."""

    def __init__(self, secret: bytes, node: str, *, say: Callable[[str], None], sent: Sent | None = None) -> None:
        self._secret, self._node, self._say, self._sent = secret, node, say, sent
        self.to: tuple[str, int] | None = None  # the neighbour's keep endpoint, for this round
        self._pending: tuple[int, int, dict[int, tuple[int, int]]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._failed: set[tuple[str, int]] = set()

    def offer(self, step: int, world: int, files: dict[int, tuple[int, int]]) -> None:
        """A step's copies (rank → (fd, length): fds this sender owns and closes)."""
        if self._pending is not None:
            _close(self._pending[2])
        self._pending = (step, world, files)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="rankrun-checkpoint-neighbour")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending is not None:
            (step, world, files), self._pending = self._pending, None
            to, started = self.to, loop.time()
            try:
                if to is None:
                    continue
                for rank, (fd, length) in sorted(files.items()):
                    await put(*to, self._secret, node=self._node, rank=rank, step=step, world=world, fd=fd,
                              length=length)
                self._report(step, to, files, loop.time() - started, "complete")
            except PeerError as exc:
                self._report(step, to, files, loop.time() - started, "abandoned")
                if to is not None and to not in self._failed:
                    self._failed.add(to)
                    self._say(f"checkpoint: the neighbour's copy of step {step} was not made: {exc}")
            finally:
                _close(files)

    def _report(self, step: int, to: tuple[str, int] | None, files: dict[int, tuple[int, int]], seconds: float,
                state: str) -> None:
        if self._sent is not None and to is not None:
            self._sent(step, f"{to[0]}:{to[1]}", sum(length for _, length in files.values()), seconds, state)

    async def close(self) -> None:
        if self._pending is not None:
            _close(self._pending[2])
            self._pending = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def _close(files: dict[int, tuple[int, int]]) -> None:
    for fd, _ in files.values():
        with contextlib.suppress(OSError):
            os.close(fd)
