"""A node's store relay: serves its own workers' TCPStore connections and forwards them to the host's store over ONE
multiplexed, authenticated connection (``--store-relays``), so that no process holds more than ``nodes + local
ranks`` store connections, whatever the world size.

Each local client gets a virtual connection on the host (``workerstore.relayhost``: the store's own connection code),
so the host applies every request exactly as it would a socket's; the relay only cuts its clients' byte streams into
requests (``workerstore.mux.RequestCutter``) and follows their replies (``ReplyTracker``) for one purpose: identical
concurrent GETs of several local clients go upstream once, on a virtual connection of the relay's own, and the reply
is given to each; their WAITs on one key join one shared wait (``mux``: released as their WAITs would be, a queue push
releasing the oldest WAIT of all). 8 local ranks waiting for one id cost the host one shared wait and one GET.
This is safe because one ordered connection carries everything: a reply reaches the relay before any reply that
reflects a later state of the host, so a client that joins a request in flight could not have known of a newer
value; and a client is only joined when it owes no other reply (torch's client never pipelines a request behind
one that has a reply), so its replies stay in order. A client that sends anything but CANCEL_WAIT behind a pending
WAIT (never torch's) is no longer followed: its bytes pass through unchanged. A request sent behind a shared one
goes on the client's own connection, answered in the order the host handled them; a CANCEL_WAIT behind a shared WAIT
detaches the client (the relay answers it, or the host where the client has replies in flight), and the shared WAIT
upstream is canceled when its last waiter goes.

The host drops a virtual connection (a protocol error, ``reset()`` for a new attempt, close()): the relay closes that
client, as a store would. The multiplexed connection drops: every client is closed; the next client to connect makes
the relay reconnect (a store that went away would fail their connects; one that comes back is used again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from rankrun.errors import StoreError
from rankrun.listen import listen
from rankrun.workerstore import mux
from rankrun.workerstore.queries import MAGIC, STOP_WAITING, WAIT_CANCELED, Query

__all__ = ["StoreRelay", "StoreRelayStats"]

logger = logging.getLogger(__name__)

_VALIDATE = bytes([Query.VALIDATE]) + MAGIC.to_bytes(4, "little")  # what a helper connection says first, as every client does
_CONNECT_TIMEOUT_S = 10.0
_HIGH_WATER = 1 << 20  # bytes queued upstream before the clients' reads are paused


class StoreRelayStats:
    """What a store relay did: requests forwarded upstream for coalescing, and requests that joined one in flight."""

    __slots__ = ("clients", "coalesced", "shared")

    def __init__(self) -> None:
        self.clients = 0  # local connections accepted
        self.shared = 0  # GETs/WAITs sent upstream on the relay's own connections
        self.coalesced = 0  # GETs/WAITs answered by one of those, without a request of their own


class _Shared:
    """One GET, or one WAIT on one key, in flight upstream for several local clients (``waiters``, oldest first)."""

    __slots__ = ("cid", "code", "indices", "joined", "key", "pending", "waiters")

    def __init__(self, code: int, key: bytes, cid: int) -> None:
        self.code = code
        self.key = key
        self.cid = cid  # a WAIT: its shared wait's connection; a GET: the reader's
        self.waiters: list[_Local] = []
        self.joined = 0  # a WAIT: JOINs sent (the next waiter's index)
        self.indices: dict[_Local, int] = {}  # a WAIT: each waiter's index
        self.pending = b""  # a WAIT: an incomplete reply

class _Local(asyncio.Protocol):
    """One local worker's TCPStore connection."""

    def __init__(self, relay: StoreRelay) -> None:
        self._relay = relay
        self.transport: asyncio.Transport | None = None
        self.cid = 0
        self._buf = bytearray()
        self._cutter = mux.RequestCutter()
        self.tracker: mux.ReplyTracker | None = mux.ReplyTracker()  # None: no longer followed (bytes pass through)
        self._validated = False
        self.attached: _Shared | None = None
        self.opened = False  # its OPEN went upstream
        self.gone = False  # the host dropped it, or it disconnected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._relay._accepted(self)

    def connection_lost(self, exc: Exception | None) -> None:
        del exc
        self._relay._lost(self)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self.opened:
            self.process()
        if self._relay._paused and self.transport is not None:  # the host is not reading: stop reading too
            self.transport.pause_reading()
            self._relay._held.add(self)

    def process(self) -> None:  # noqa: PLR0912 - one walk over the requests, read straight through
        """Forward every complete request; coalesce a GET/WAIT where it is safe."""
        buf, relay = self._buf, self._relay
        pos, sent, end = 0, 0, len(buf)
        while pos < end and not self.gone:
            if self.tracker is None:  # not followed: everything passes
                pos = end
                break
            try:
                cut = self._cutter.cut(buf, pos, end)
            except mux.MuxError:  # an unknown code: the host closes it; pass it on
                self.tracker = None
                continue
            if cut is None:
                break
            code, nxt, count = cut
            tracker, shared = self.tracker, self.attached
            if shared is not None and shared.code == mux.WAIT and code in (mux.WAIT, mux.BARRIER):
                self.abort()  # a second WAIT while one is pending: the store closes such a connection
                return
            if shared is not None and shared.code == mux.WAIT and code == mux.CANCEL_WAIT:
                relay._detach(self)  # its timeout: the others keep waiting
                if not tracker.owed:  # nothing of its own in flight: answered here, in order
                    if sent < pos:
                        relay._send(mux.DATA, self.cid, bytes(buf[sent:pos]))
                    self.write(WAIT_CANCELED)
                    pos = sent = nxt
                    continue
            elif shared is None and code in (mux.GET, mux.WAIT) and self._validated and not tracker.owed and count <= 1:
                keys = mux.keys_of(buf, pos, nxt)
                if len(keys) == 1:
                    if sent < pos:
                        relay._send(mux.DATA, self.cid, bytes(buf[sent:pos]))
                    relay._coalesce(self, code, keys[0], bytes(buf[pos:nxt]))
                    pos = sent = nxt
                    continue
            # anything else goes on its own connection; behind a shared request it is answered in the order the host
            # handled it (one ordered connection carries both): as a socket of its own would be
            if tracker.waits and code != mux.CANCEL_WAIT:  # never torch's: stop following it
                self.tracker = None
            else:
                tracker.expect(mux.REPLIES[code], count)
                self._validated = self._validated or code == 0
            pos = nxt
        if sent < pos:
            relay._send(mux.DATA, self.cid, bytes(buf[sent:pos]))
        del buf[:pos]

    def replied(self, data: bytes) -> None:
        """Reply bytes from the host, for this client."""
        self.write(data)
        if self.tracker is not None:
            try:
                self.tracker.feed(data)
            except mux.MuxError:
                self.tracker = None

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def abort(self) -> None:
        self.gone = True
        if self.transport is not None:
            self.transport.abort()


class _Upstream(asyncio.Protocol):
    """The relay's multiplexed connection to the host: the handshake (``ready`` resolves, or fails), then frames."""

    def __init__(self, relay: StoreRelay) -> None:
        self._relay = relay
        self._buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self._state = "challenge"  # challenge → verdict → frames
        self._nonce = self._fresh = b""
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=_HIGH_WATER)
        message, self._nonce = mux.hello()
        transport.write(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.ready.done():
            self.ready.set_exception(EOFError("the host closed the connection during the handshake"))
            return
        self._relay._upstream_lost(self, exc)

    def pause_writing(self) -> None:
        self._relay._paused = True

    def resume_writing(self) -> None:
        self._relay._resume_clients()

    def _handshake(self) -> bool:
        """The handshake's next step with the bytes so far; whether it is over (MuxError: refused)."""
        buf, secret = self._buf, self._relay._secret
        if self._state == "challenge":
            if len(buf) < mux.CHALLENGE_LEN:
                return False
            proof, self._fresh = mux.answer(secret, bytes(buf[: mux.CHALLENGE_LEN]), self._nonce)
            del buf[: mux.CHALLENGE_LEN]
            assert self.transport is not None
            self.transport.write(proof)
            self._state = "verdict"
        if len(buf) < mux.VERDICT_LEN:
            return False
        mux.host_proven(secret, bytes(buf[: mux.VERDICT_LEN]), self._fresh, self._nonce)
        del buf[: mux.VERDICT_LEN]
        self._state = "frames"
        self.ready.set_result(None)
        return True

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if self._state != "frames":
            try:
                if not self._handshake():
                    return
            except mux.MuxError as exc:
                self.ready.set_exception(exc)
                if self.transport is not None:
                    self.transport.abort()
                return
        try:
            complete, pos = mux.frames(buf)
            for kind, cid, start, stop in complete:
                if kind == mux.DATA:
                    self._relay._from_host(cid, bytes(buf[start:stop]))
                elif kind == mux.CLOSE:
                    self._relay._closed_by_host(cid)
                else:
                    raise mux.MuxError(f"unexpected frame kind {kind} from the host")
        except mux.MuxError as exc:
            logger.warning("store relay: the host's connection broke the protocol (%s): closing it", exc)
            if self.transport is not None:
                self.transport.abort()
            return
        del buf[:pos]


class StoreRelay:
    """Listens for this node's workers on ``start``'s address and relays them to the store at ``upstream``.

    ``bind``: the address the upstream connection is made from (the node's own, as its rendezvous connection);
    ``secret``: the job's. All methods run on the event loop that runs the relay.
    """

    def __init__(self, upstream: tuple[str, int], secret: bytes | None, *, bind: str | None = None) -> None:
        self.upstream = upstream
        self._secret = secret
        self._bind = bind
        self._link: _Upstream | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._listener: asyncio.Server | None = None
        self._next = 0
        self._clients: dict[int, _Local] = {}
        self._gets: dict[bytes, _Shared] = {}  # GETs in flight, by key
        self._reading: deque[_Shared] = deque()  # the same, in the order their replies come
        self._reader = 0  # the connection GETs are shared on (0: none yet)
        self._reader_replies = mux.ReplyTracker(collect=True)
        self._waits: dict[bytes, _Shared] = {}  # shared waits still joinable, by key
        self._waiting: dict[int, _Shared] = {}  # shared waits whose connection is open, by its id
        self._out: list[bytes] = []
        self._flush_soon: asyncio.Handle | None = None
        self._paused = False
        self._held: set[_Local] = set()
        self._closed = False
        self.stats = StoreRelayStats()
        self.on_lost: Callable[[str], None] | None = None  # told (once per loss) when the host's connection drops
        self.port = 0

    async def start(self, host: str, port: int = 0) -> int:
        """Connect to the host (the handshake), then listen on ``host:port``; the bound port. StoreError: the host
        cannot be reached or refused this relay, or the port cannot be bound."""
        await self._connect()
        self._listener, self.port = await listen(host, port, lambda: _Local(self))
        return self.port

    async def close(self) -> None:
        """Close the listener, every client and the host's connection. Idempotent."""
        self._closed = True
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for client in list(self._clients.values()):
            client.abort()
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, StoreError):
                await self._connecting
        link, self._link = self._link, None
        self._flush()
        if link is not None and link.transport is not None:
            link.transport.close()
        if listener is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(listener.wait_closed(), 5.0)

    # -- the host's connection

    async def _connect(self) -> None:
        host, port = self.upstream
        where = f"{host}:{port}"
        loop = asyncio.get_running_loop()
        link: _Upstream | None = None
        try:
            async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                _, link = await loop.create_connection(lambda: _Upstream(self), host, port,
                                                       local_addr=(self._bind, 0) if self._bind else None)
                await link.ready
        except mux.MuxError as exc:
            raise StoreError(f"store relay: {where}: {exc}") from None
        except (OSError, EOFError, TimeoutError) as exc:
            if link is not None and link.transport is not None:
                link.transport.abort()
            raise StoreError(f"store relay: cannot reach the job's store at {where}: {exc or 'timed out'}") from exc
        self._link = link

    def _upstream_lost(self, link: _Upstream, exc: Exception | None) -> None:
        if link is not self._link:
            return
        self._link = None
        self._out.clear()
        if not self._closed and self.on_lost is not None:
            self.on_lost(f"the store relay's connection to {self.upstream[0]}:{self.upstream[1]} was lost"
                         + (f": {exc}" if exc else ""))
        for client in list(self._clients.values()):  # as a store that went away: every client's connection ends
            client.abort()
        self._gets.clear()
        self._reading.clear()
        self._reader = 0
        self._reader_replies = mux.ReplyTracker(collect=True)
        self._waits.clear()
        self._waiting.clear()
        self._resume_clients()

    def _reconnect(self) -> None:
        """A client came while the host's connection was down: connect again, then open the clients that waited."""
        if self._connecting is not None or self._closed:
            return

        async def again() -> None:
            try:
                await self._connect()
            except StoreError as exc:
                logger.warning("%s", exc)
                for client in list(self._clients.values()):
                    client.abort()
                return
            finally:
                self._connecting = None
            for client in list(self._clients.values()):
                self._open(client)

        self._connecting = asyncio.get_running_loop().create_task(again())

    # -- frames

    def _send(self, kind: int, cid: int, payload: bytes = b"") -> None:
        if self._link is None:
            return
        self._out.append(mux.frame(kind, cid, payload))
        if self._flush_soon is None:
            self._flush_soon = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = None
        out, self._out = self._out, []
        link = self._link
        if out and link is not None and link.transport is not None and not link.transport.is_closing():
            link.transport.write(b"".join(out))

    def _resume_clients(self) -> None:
        self._paused = False
        held, self._held = self._held, set()
        for client in held:
            if client.transport is not None and not client.gone:
                client.transport.resume_reading()

    def _new_id(self) -> int:
        self._next += 1
        if self._next > 0xFFFFFFFF:  # ids are never reused within a connection's life; 4 billion clients: reconnect
            raise StoreError("store relay: out of connection ids")
        return self._next

    # -- local clients

    def _accepted(self, client: _Local) -> None:
        if self._closed:
            client.abort()
            return
        client.cid = self._new_id()
        self._clients[client.cid] = client
        self.stats.clients += 1
        if self._link is None:
            self._reconnect()
        else:
            self._open(client)

    def _open(self, client: _Local) -> None:
        if client.opened or client.gone:
            return
        client.opened = True
        self._send(mux.OPEN, client.cid)
        client.process()

    def _lost(self, client: _Local) -> None:
        if self._clients.pop(client.cid, None) is None:
            return
        self._held.discard(client)
        if client.attached is not None:
            self._detach(client)
        if not client.gone and client.opened:
            self._send(mux.CLOSE, client.cid)
        client.gone = True

    def _closed_by_host(self, cid: int) -> None:
        client = self._clients.get(cid)
        if client is not None:
            client.abort()  # its connection_lost forgets it
            return
        self._shared_closed(cid)

    def _from_host(self, cid: int, data: bytes) -> None:
        client = self._clients.get(cid)
        if client is not None:
            client.replied(data)
            return
        self._shared_replied(cid, data)

    # -- coalescing

    def _coalesce(self, client: _Local, code: int, key: bytes, request: bytes) -> None:
        """``client``'s GET or one-key WAIT: joins the same one in flight, or goes upstream as the first of its kind."""
        table = self._gets if code == mux.GET else self._waits
        shared = table.get(key)
        if shared is not None:
            self.stats.coalesced += 1
        elif code == mux.GET:  # all GETs share one connection of the relay's: they never block, replies come in order
            if self._reader == 0:
                self._reader = self._new_id()
                self._send(mux.OPEN, self._reader)
                self._send(mux.DATA, self._reader, _VALIDATE)
            shared = table[key] = _Shared(code, key, self._reader)
            self._reading.append(shared)
            self._reader_replies.expect("s")
            self._send(mux.DATA, self._reader, request)
            self.stats.shared += 1
        else:  # a WAIT: a shared wait (mux), one JOIN per waiter
            shared = table[key] = _Shared(code, key, self._new_id())
            self._waiting[shared.cid] = shared
            self._send(mux.SHARED, shared.cid, key)
            self.stats.shared += 1
        if code == mux.WAIT:
            shared.indices[client] = shared.joined
            shared.joined += 1
            self._send(mux.JOIN, shared.cid)
        shared.waiters.append(client)
        client.attached = shared

    def _detach(self, client: _Local) -> None:
        """A waiter canceled its WAIT or went: the others keep waiting (LEAVE, its index); the last one's going ends
        the shared wait (CLOSE: the host forgets it). A GET's reply is only given to those still there."""
        shared, client.attached = client.attached, None
        if shared is None:
            return
        with contextlib.suppress(ValueError):
            shared.waiters.remove(client)
        if shared.code != mux.WAIT:
            return
        index = shared.indices.pop(client)
        if shared.waiters:
            self._send(mux.LEAVE, shared.cid, mux.INDEX.pack(index))
        else:
            self._end_wait(shared, tell=True)

    def _end_wait(self, shared: _Shared, *, tell: bool) -> None:
        if self._waits.get(shared.key) is shared:
            del self._waits[shared.key]
        if self._waiting.pop(shared.cid, None) is not None and tell:
            self._send(mux.CLOSE, shared.cid)

    def _shared_replied(self, cid: int, data: bytes) -> bool:
        """Bytes for one of the relay's own connections (whether it was one)."""
        if cid == self._reader and cid:
            try:
                _, replies = self._reader_replies.feed(data)
            except mux.MuxError as exc:
                logger.warning("store relay: %s on the relay's reader connection", exc)
                return True
            for reply in replies:
                read = self._reading.popleft()
                if self._gets.get(read.key) is read:
                    del self._gets[read.key]
                waiters, read.waiters = read.waiters, []
                for waiter in waiters:
                    waiter.attached = None
                    waiter.write(reply)
            return True
        shared = self._waiting.get(cid)
        if shared is None:  # a shared wait ended here (its CLOSE is on its way): its late replies are nobody's
            return False
        data, size = shared.pending + data, mux.RELEASE.size
        whole = len(data) - len(data) % size
        shared.pending = data[whole:]
        for at in range(0, whole, size):
            kind, number = mux.RELEASE.unpack_from(data, at)
            if kind == mux.ALL_RELEASED:  # the key got a value: every waiter the host knew of (its JOIN arrived)
                released = [w for w in shared.waiters if shared.indices[w] < number]
                if self._waits.get(shared.key) is shared:  # later waiters start a shared wait of their own
                    del self._waits[shared.key]
            else:  # a queue push released that one
                released = [w for w in shared.waiters if shared.indices[w] == number]
            for waiter in released:
                shared.waiters.remove(waiter)
                del shared.indices[waiter]
                waiter.attached = None
                waiter.write(STOP_WAITING)
            if not shared.waiters:
                self._end_wait(shared, tell=True)
                break
        return True

    def _shared_closed(self, cid: int) -> bool:
        """The host dropped one of the relay's own connections (``reset()``, close()): the clients it was answering
        are dropped too, as theirs were; whether it was one."""
        if cid == self._reader and cid:
            self._reader = 0
            self._reader_replies = mux.ReplyTracker(collect=True)
            reading, self._reading = self._reading, deque()
            self._gets.clear()
            for read in reading:
                for waiter in read.waiters:
                    waiter.attached = None
                    waiter.abort()
            return True
        shared = self._waiting.get(cid)
        if shared is None:
            return False
        self._end_wait(shared, tell=False)
        for waiter in shared.waiters:
            waiter.attached = None
            waiter.abort()
        return True
