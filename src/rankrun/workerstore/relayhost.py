"""The host's side of the store relays: one multiplexed connection per relay, each of its virtual connections served
by the workers' store exactly as a socket of its own would be.

A relay's connection reaches the host on the shared port (``rendezvous.listener`` hands it over by its first byte,
``adopt``) or on a listener of its own (``start``: tests, ``bench/relay_storm.py``). After the handshake
(``workerstore.mux``: the job's secret, as the rendezvous's) every OPEN frame makes a
:class:`~rankrun.workerstore.tcpstore.TCPStoreServer` connection (the very class a socket gets) whose transport is a
:class:`_Virtual`: its ``write`` frames the replies onto the relay's connection, its ``close``/``abort`` send CLOSE.
So every op, blocking wait, CANCEL_WAIT, barrier and ``reset()`` keeps its semantics: ``reset()`` aborts the virtual
connections with the others (the relay then closes its clients: the stale-key restart bug cannot come back through a
relay), and a relay that goes takes its virtual connections with it (their waits are forgotten, as a client's that
disconnects). Replies of one loop turn go out in one write per relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from rankrun.listen import listen
from rankrun.workerstore import mux
from rankrun.workerstore.keyspace import KeyWaiter
from rankrun.workerstore.queries import MAX_KEY_LEN
from rankrun.workerstore.tcpstore import TCPStoreServer, _Connection

__all__ = ["StoreRelayHost"]

logger = logging.getLogger(__name__)


class _Virtual(asyncio.Transport):
    """One relayed client, as the store's connection sees it: a transport whose bytes travel in frames."""

    def __init__(self, link: _Link, cid: int) -> None:
        super().__init__()
        self._link = link
        self._cid = cid
        self._closing = False
        self.protocol: _Connection | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing:
            self._link.send(mux.DATA, self._cid, bytes(data))

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._drop(tell=True)

    def abort(self) -> None:
        self._drop(tell=True)

    def pause_reading(self) -> None:
        """Never called: a virtual transport reports no write pressure (the relay's connection carries it)."""

    def resume_reading(self) -> None:
        """See ``pause_reading``."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return (*self._link.peer, self._cid)
        return default

    def _drop(self, *, tell: bool) -> None:
        """The connection is gone: tell the relay (unless the relay told us), and the store's connection, once."""
        if self._closing:
            return
        self._closing = True
        self._link.forget(self._cid)
        if tell:
            self._link.send(mux.CLOSE, self._cid)
        protocol = self.protocol
        if protocol is not None:  # asyncio's transports call connection_lost on the next turn too
            asyncio.get_running_loop().call_soon(protocol.connection_lost, None)


class _SharedWait(_Connection):
    """A relay's shared wait (``mux``): one key that several of the relay's clients WAIT on, one JOIN each.

    Released as their WAITs would be, with one keyspace registration at a time: a value for the key releases every
    waiter joined so far (``ALL``, with how many), a queue push the oldest waiter of all, ours or another's (``ONE``,
    with its index), after which the next of ours waits at its own place (its arrival number, taken at its JOIN). A
    waiter that leaves (CANCEL_WAIT, or gone) is forgotten where it stood. Dropped (reset(), close(), the relay's
    link gone): every registration goes."""

    __slots__ = ("_joined", "_key", "_queue", "_waiter")

    def __init__(self, server: TCPStoreServer, key: bytes) -> None:
        super().__init__(server)
        self._key = key
        self._joined = 0  # JOINs so far: the next one's index
        self._queue: list[tuple[int, int]] = []  # (index, arrival number) of the waiters not yet released, oldest first
        self._waiter: KeyWaiter | None = None  # the keyspace's registration, for _queue[0]

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def abort(self) -> None:
        self._cancel()
        super().abort()

    def join(self) -> None:
        """One more waiter: released at once if the key is there (a value: all; a queued value: this one)."""
        index, self._joined = self._joined, self._joined + 1
        keyspace = self._keyspace
        self._queue.append((index, keyspace.stamp()))
        if self._waiter is not None:  # behind the first: registered when it is its turn, at its place
            return
        if self._key in keyspace.values:
            self._all()
        elif keyspace.exists(self._key):  # a non-empty queue: a WAIT on it returns at once
            self._one()
        else:
            self._register()

    def leave(self, index: int) -> None:
        for at, (queued, _) in enumerate(self._queue):
            if queued == index:
                del self._queue[at]
                if at == 0:  # it was the one registered: the next takes its own place
                    self._cancel()
                    self._register()
                return

    def _register(self) -> None:
        if not self._queue or self._closed:
            return
        self._waiter = KeyWaiter(self._ready, {self._key}, self._queue[0][1])
        self._keyspace.enqueue(self._key, self._waiter)

    def _ready(self) -> None:
        """The keyspace released our registration: a value was set (every waiter goes) or a push came (the oldest)."""
        self._waiter = None
        if self._closed:
            return
        if self._key in self._keyspace.values:
            self._all()
        else:
            self._one()
            self._register()

    def _all(self) -> None:
        self._queue.clear()
        self._reply(mux.ALL_RELEASED, self._joined)

    def _one(self) -> None:
        index, _ = self._queue.pop(0)
        self._reply(mux.ONE_RELEASED, index)

    def _reply(self, kind: int, number: int) -> None:
        if self._transport is not None:
            self._transport.write(mux.RELEASE.pack(kind, number))

    def _cancel(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._keyspace.cancel(waiter)


class _Link(asyncio.Protocol):
    """One relay's multiplexed connection: the handshake, then frames."""

    def __init__(self, host: StoreRelayHost) -> None:
        self._host = host
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._state = "hello"  # hello → proof → ready
        self._nonce = self._fresh = b""
        self._clients: dict[int, _Virtual] = {}
        self._out: list[bytes] = []
        self._flush_soon: asyncio.Handle | None = None
        self.peer: tuple[Any, ...] = ("?",)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = tuple(peer) if isinstance(peer, tuple) else (str(peer),)
        self._host.links.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        del exc
        self._host.links.discard(self)
        self._transport = None
        for client in list(self._clients.values()):  # the relay is gone: so are its clients, and their waits
            client._drop(tell=False)
        self._clients.clear()

    def pause_writing(self) -> None:
        """The relay does not read its replies: stop reading its requests until it does."""
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        try:
            self._take()
        except mux.MuxError as exc:
            logger.warning("store relay %s: %s: closing its connection", self.peer[0], exc)
            self.close()

    def close(self) -> None:
        self._flush()
        if self._transport is not None:
            self._transport.close()

    # -- bytes in

    def _take(self) -> None:  # noqa: PLR0912 - the handshake's two steps, then the frames: read straight through
        buf = self._buf
        if self._state == "hello":
            if len(buf) < mux.HELLO_LEN:
                return
            self._nonce = mux.read_hello(bytes(buf[: mux.HELLO_LEN]))
            del buf[: mux.HELLO_LEN]
            message, self._fresh = mux.challenge(self._host.secret)
            self._write(message)
            self._state = "proof"
        if self._state == "proof":
            if len(buf) < mux.PROOF_LEN:
                return
            reply, admitted = mux.verdict(self._host.secret, bytes(buf[: mux.PROOF_LEN]), self._fresh, self._nonce)
            del buf[: mux.PROOF_LEN]
            self._write(reply)
            if not admitted:
                self._host.refused(self.peer)
                self.close()
                return
            self._state = "ready"
        complete, pos = mux.frames(buf)
        for kind, cid, start, stop in complete:
            if kind == mux.DATA:
                self._deliver(cid, memoryview(buf)[start:stop])
            elif kind in (mux.OPEN, mux.SHARED):
                self._open(cid, bytes(buf[start:stop]) if kind == mux.SHARED else None)
            elif kind in (mux.JOIN, mux.LEAVE):
                self._count(cid, None if kind == mux.JOIN else mux.INDEX.unpack_from(buf, start)[0])
            elif kind == mux.CLOSE:
                client = self._clients.get(cid)
                if client is not None:
                    client._drop(tell=False)
            else:
                raise mux.MuxError(f"unknown frame kind {kind}")
            if self._transport is None or self._transport.is_closing():
                return
        del buf[:pos]

    def _count(self, cid: int, leaving: int | None) -> None:
        virtual = self._clients.get(cid)
        if virtual is None:  # dropped here already
            return
        connection = virtual.protocol
        if not isinstance(connection, _SharedWait):
            raise mux.MuxError(f"a JOIN or LEAVE for {cid}, not a shared wait")
        if leaving is None:
            connection.join()
        else:
            connection.leave(leaving)

    def _open(self, cid: int, shared: bytes | None) -> None:
        if cid in self._clients:
            raise mux.MuxError(f"virtual connection {cid} opened twice")
        if shared is not None and len(shared) > MAX_KEY_LEN:
            raise mux.MuxError(f"a shared wait on a key of {len(shared)} bytes")
        virtual = _Virtual(self, cid)
        connection = _SharedWait(self._host.server, shared) if shared is not None else _Connection(self._host.server)
        virtual.protocol = connection
        self._clients[cid] = virtual
        connection.connection_made(virtual)  # a closed server aborts it at once (CLOSE goes back)

    def _deliver(self, cid: int, data: memoryview) -> None:
        """A client's request bytes, fed to its store connection as a socket's reads would be."""
        virtual = self._clients.get(cid)
        if virtual is None:  # the host already dropped it (the relay's CLOSE for it is on its way): ignore
            data.release()
            return
        connection = virtual.protocol
        assert connection is not None
        try:
            connection.feed(data)
        finally:
            data.release()

    # -- bytes out

    def forget(self, cid: int) -> None:
        self._clients.pop(cid, None)

    def send(self, kind: int, cid: int, payload: bytes = b"") -> None:
        """Queue a frame; everything queued in one loop turn goes out in one write."""
        if self._transport is None or self._state != "ready":
            return
        self._out.append(mux.frame(kind, cid, payload))
        if self._flush_soon is None:
            self._flush_soon = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = None
        out, self._out = self._out, []
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out))

    def _write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)


class StoreRelayHost:
    """Accepts store relays' multiplexed connections for ``server`` (the job's workers' store), checking ``secret``."""

    def __init__(self, server: TCPStoreServer, secret: bytes | None) -> None:
        self.server = server
        self.secret = secret
        self.links: set[_Link] = set()
        self._listener: asyncio.Server | None = None
        self._refused: set[str] = set()

    def adopt(self, transport: asyncio.Transport, data: bytes) -> None:
        """Serve a relay's connection another listener accepted, starting with ``data`` (its first bytes)."""
        link = _Link(self)
        transport.set_protocol(link)
        link.connection_made(transport)
        if data:
            link.data_received(data)

    async def start(self, host: str, port: int) -> int:
        """Listen for relays on a port of their own (tests, benchmarks); the bound port."""
        self._listener, bound = await listen(host, port, lambda: _Link(self))
        return bound

    def refused(self, peer: tuple[Any, ...]) -> None:
        """Said once per address: a relay that does not know the job's secret."""
        if peer[0] not in self._refused:
            self._refused.add(str(peer[0]))
            logger.warning("store relay: refused %s: it does not know this job's secret", peer[0])

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for link in list(self.links):
            link.close()
        if listener is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(listener.wait_closed(), 5.0)
