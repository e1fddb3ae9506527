"""Every TCP listening socket rankrun opens, opened one way: ``listen(host, port, protocol) -> (server, port)``.

Bound once, to exactly the address given (never all interfaces unless asked), with ``SO_REUSEADDR``
(a fixed endpoint must be re-bindable at once while the last job's sockets sit in TIME_WAIT) and a
backlog for thousands of agents connecting within a second. Port 0 lets the OS pick; on a name with
several addresses every socket is rebound on the lowest port picked (a worker gets one MASTER_PORT),
and when that port is taken on another of the addresses, the whole group is picked afresh
(``REBIND_ATTEMPTS`` times at most).
A bind that fails is a ``StoreError`` naming the address and the OS's reason, with the ``OSError``
on ``__cause__`` (its errno tells "someone else hosts it" from "not this machine's address").

Used by the workers' TCPStore (``workerstore.tcpstore``), the embedded store (``store.embedded.server``), the shared
rendezvous port (``rendezvous.listener``), the metrics endpoint (``events.metrics``), the network check's probe
endpoint (``health.probe``), the neighbour copy's keep endpoint (``checkpoint.peer``), a node's store relay
(``workerstore.relay``), the relays' host on a port of its own (``workerstore.relayhost``: tests and benchmarks; a
job's relays reach it on the shared port), and, through ``hold``, the single-node loop (``agent.loop``): a single-node
c10d endpoint kept taken for the job, so that a second job on it fails loudly (nothing is served behind it). The one
non-TCP listener, ``rankrun --stacks``'s local Unix socket, is ``rankrun.stacks.control``'s.

Accepting is this module's, not asyncio's (``_Acceptor``): asyncio's accept loop, out of file descriptors
(``EMFILE``/``ENFILE``), logs a traceback and schedules a retry for every one of up to ``backlog`` attempts per wake-up,
and spins a core (measured: 36 s of CPU in 40 s, 222 MB of stderr, 4,096 clients at a soft limit of 1,024). Here it
stops accepting, says so once in one line (the limit, the fix), backs off (50 ms doubling to 1 s) and resumes; the
clients wait in the listen queue meanwhile. Each wake-up drains the listen queue (``accept`` until it would block),
and a connection costs a transport and its protocol, without asyncio's Task per connection. ``SO_KEEPALIVE`` and
``TCP_NODELAY`` are set once, on the listening socket: Linux's accepted sockets inherit both (asyncio's transport sets
``TCP_NODELAY`` again; a ``Polled`` one makes no syscall for either).

``listen(..., polled=True)`` (the workers' store, 16,384 connections in a second at scale) goes further: its
connections are not asyncio transports but ``Polled`` ones, all in one epoll of the listener's own (``_Poller``) that
the loop watches as one reader. A wake-up reads every ready connection in one loop (no Handle, no callback per event),
and a transport sends at once and buffers only what the socket refuses. Why (``bench/store_storm.py``, 4,096 clients,
same run): with asyncio's transports the server spent 146-149 us of user CPU per rank against libuv's 17-30, its
system time equal; this path's figures are in ``workerstore/tcpstore.py``. Still one thread, the loop's (the store's
keyspace and waiters stay single-threaded); one more ``epoll_wait`` per wake-up is its price (not measurable in a
single client's ADD latency).
"""

from __future__ import annotations

import _socket
import asyncio
import contextlib
import errno
import logging
import resource
import select
import socket
from collections.abc import Callable
from typing import Any

from rankrun.errors import StoreError

logger = logging.getLogger(__name__)

# Thousands of agents (or every rank of a job) connect within a second of each other: a SYN past the listen queue is
# dropped and costs its client a 1 s retransmit. The kernel caps this at net.core.somaxconn, so ask for the most and get
# min(this, somaxconn) (fdlimit.listen_short says when somaxconn is below a job's world size).
BACKLOG = 65535
ACCEPT_BATCH = 4096  # accepted per loop turn at most: the rest of the queue next turn, other callbacks between
PAUSE_FIRST_S = 0.05  # out of file descriptors: accepting resumes after this, doubling ...
PAUSE_MAX_S = 1.0  # ... up to this: a freed descriptor is used within a second, and a paused listener costs nothing
REBIND_ATTEMPTS = 16  # the one rebind failed in 3 of 12 loaded test runs: 16 failures in a row do not happen


async def listen(host: str, port: int, protocol: Callable[[], asyncio.BaseProtocol], *,
                 polled: bool = False) -> tuple[asyncio.Server, int]:
    """Bind ``host:port`` and serve ``protocol`` on it; the server and its port.

    ``polled``: serve the connections with ``Polled`` transports in the listener's own epoll (see the module's
    docstring); they are not attached to the server (``wait_closed`` does not wait for them: close them yourself).
    """
    loop = asyncio.get_running_loop()
    try:
        for attempt in range(1, REBIND_ATTEMPTS + 1):
            server = await loop.create_server(protocol, host, port, reuse_address=True, backlog=BACKLOG,
                                              start_serving=False)
            ports = sorted({int(sock.getsockname()[1]) for sock in server.sockets})
            if len(ports) == 1:
                break
            # Port 0 on a name with several addresses: the OS picked a port per address, each known free on its
            # own address only. Another socket may hold the lowest on another one (a listener or a connection on
            # 127.0.0.1 forbids it on 0.0.0.0), or take it between the close and the bind: then pick afresh.
            server.close()
            await server.wait_closed()
            try:
                server = await loop.create_server(protocol, host, ports[0], reuse_address=True, backlog=BACKLOG,
                                                  start_serving=False)
                break
            except OSError as exc:  # asyncio closed what it had bound of the group
                if exc.errno != errno.EADDRINUSE or attempt == REBIND_ATTEMPTS:
                    raise
        await _serve(loop, server, protocol, polled)
    except OSError as exc:
        raise StoreError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return server, int(server.sockets[0].getsockname()[1])


async def _serve(loop: asyncio.AbstractEventLoop, server: asyncio.Server, protocol: Callable[[], asyncio.BaseProtocol],
                 polled: bool) -> None:
    """Start accepting on ``server``'s sockets with ``_Acceptor``; asyncio's own accept loop where its raw sockets are
    out of reach (``Server._sockets``, private: the public ``sockets`` are wrappers that cannot ``accept``)."""
    raw: list[socket.socket] | None = getattr(server, "_sockets", None)
    for sock in server.sockets:  # inherited by every accepted socket (Linux): set once here, not per connection
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)  # idle NAT paths, dead peers found
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # tiny latency-bound replies
    if not isinstance(raw, list) or not all(isinstance(sock, socket.socket) for sock in raw):
        await server.start_serving()
        return
    poller = _Poller(loop) if polled and hasattr(select, "epoll") else None
    for sock in raw:
        sock.listen(BACKLOG)
        _Acceptor(loop, server, sock, protocol, poller).start()


_MakeTransport = Callable[..., asyncio.Transport]


class _Acceptor:
    """Accepts the connections of one listening socket of ``server`` (created with ``start_serving=False``).

    ``server.close()`` still ends it: asyncio's ``_stop_serving`` removes the reader and closes the socket (a pending
    resume then finds it closed), and every transport is attached to ``server``, so ``wait_closed`` means what it did.
    """

    __slots__ = ("_factory", "_loop", "_make", "_pause", "_poller", "_said", "_server", "_sock")

    def __init__(self, loop: asyncio.AbstractEventLoop, server: asyncio.Server, sock: socket.socket,
                 factory: Callable[[], asyncio.BaseProtocol], poller: _Poller | None = None) -> None:
        self._loop = loop
        self._poller = poller
        self._server = server
        self._sock = sock
        self._factory = factory
        self._pause = PAUSE_FIRST_S
        self._said = False
        # A selector loop's own constructor of a socket transport (private, but unchanged since 3.4): the transport
        # schedules connection_made itself, so a connection costs no Task and no coroutine. Another loop (uvloop) has
        # none: then the public connect_accepted_socket, a Task each (see _serve).
        self._make: _MakeTransport | None = getattr(loop, "_make_socket_transport", None)

    def start(self) -> None:
        if self._sock.fileno() >= 0:  # -1: the server was closed while accepting was paused
            self._loop.add_reader(self._sock.fileno(), self._ready)

    def _ready(self) -> None:
        # socket.accept() in its two steps, the second with the family and type known once: accept() reads both back
        # from the listening socket and converts them to enums on every call (two enum lookups per connection)
        accept: Callable[[], tuple[int, Any]] = self._sock._accept  # type: ignore[attr-defined]  # (private, since 3.0)
        family, kind, proto = int(self._sock.family), int(self._sock.type), self._sock.proto
        # A polled connection's socket is the C type itself: socket.socket's Python subclass is one more object per
        # connection for the garbage collector to walk (the C one is not tracked), with a Python-level close
        wrap: Callable[..., socket.socket] = socket.socket if self._poller is None else _socket.socket  # type: ignore[assignment]
        for _ in range(ACCEPT_BATCH):  # the whole listen queue, in bounded turns (other callbacks run between)
            try:
                fd, addr = accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # drained (or the one that was there gave up)
            except OSError as exc:  # out of descriptors (or anything else the kernel keeps answering): never spin
                self._paused(exc)
                return
            self._pause = PAUSE_FIRST_S
            self._serve(wrap(family, kind, proto, fileno=fd), addr)

    def _paused(self, exc: OSError) -> None:
        """Stop accepting for a while (the socket stays readable: a reader would be called again at once), say so once."""
        self._loop.remove_reader(self._sock.fileno())
        self._loop.call_later(self._pause, self.start)
        self._pause = min(2 * self._pause, PAUSE_MAX_S)
        if not self._said:
            self._said = True
            logger.warning("%s", paused_line(self._sock.getsockname(), exc))

    def _serve(self, conn: socket.socket, addr: object) -> None:
        conn.setblocking(False)
        make = self._make
        if self._poller is None and make is None:
            self._loop.create_task(self._adopt(conn))
            return
        try:
            protocol = self._factory()
        except Exception as exc:  # a protocol factory that failed: this connection only
            logger.debug("closing accepted connection from %s: %r", addr, exc)
            conn.close()
            return
        if self._poller is not None:
            self._poller.serve(conn, protocol, addr)
            return
        assert make is not None
        try:
            make(conn, protocol, extra={"peername": addr}, server=self._server)
        except TypeError:  # its signature changed after all: the public path from now on (a fresh protocol)
            self._make = None
            self._loop.create_task(self._adopt(conn))

    async def _adopt(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except Exception as exc:  # one connection lost, said at debug level as asyncio would
            logger.debug("closing accepted connection: %r", exc)
            conn.close()


_IN = select.EPOLLIN if hasattr(select, "EPOLLIN") else 1
_OUT = select.EPOLLOUT if hasattr(select, "EPOLLOUT") else 4
_GONE = (select.EPOLLERR | select.EPOLLHUP) if hasattr(select, "EPOLLERR") else 24
WRITE_HIGH = 64 * 1024  # unsent bytes past which the protocol is told to pause writing (asyncio's default) ...
WRITE_LOW = 16 * 1024  # ... and below which it may resume
READ_SIZE = 64 * 1024  # a plain (not buffered) protocol's reads


class _Poller:
    """The connections of a ``polled`` listener, in one epoll of its own that the loop watches as a single reader.

    Created with the first connection and closed with the last (no descriptor, no reader while none is open).
    A wake-up handles every ready connection: ``ready`` (read, then hand the bytes to the protocol) or ``writable``.
    """

    __slots__ = ("_conns", "_epoll", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._epoll: Any = None  # select.epoll (typed Any: absent from typeshed off Linux)
        self._conns: dict[int, Polled] = {}

    def serve(self, sock: socket.socket, protocol: asyncio.BaseProtocol, peer: object) -> None:
        epoll = self._epoll
        if epoll is None:
            epoll = self._epoll = select.epoll()
            self._loop.add_reader(epoll.fileno(), self._ready)
        transport = Polled(self, sock, protocol, peer)
        try:
            epoll.register(transport.fd, _IN)
        except OSError as exc:  # out of epoll watches (fs.epoll.max_user_watches) or memory: this connection only
            logger.warning("closing accepted connection from %s: cannot watch it: %s", peer, exc.strerror or exc)
            sock.close()
            self.forget(transport)
            return
        self._conns[transport.fd] = transport
        # No read right after accept, although clients speak first: measured, 0 of 16,384 first requests were in by
        # then (the queue is drained as the handshakes complete), so it was one failed recv per connection
        try:
            protocol.connection_made(transport)
        except Exception as exc:  # a protocol that fails loses its connection, not the listener
            transport.fail(exc, "connection_made() failed")

    def modify(self, transport: Polled, mask: int) -> None:
        transport.mask = mask
        with contextlib.suppress(OSError):
            self._epoll.modify(transport.fd, mask)

    def forget(self, transport: Polled) -> None:
        """``transport`` is closed: closing its socket takes it out of the epoll (it is never duplicated)."""
        if self._conns.get(transport.fd) is transport:
            del self._conns[transport.fd]
        if not self._conns and self._epoll is not None:
            self._loop.remove_reader(self._epoll.fileno())
            self._epoll.close()
            self._epoll = None

    def _ready(self) -> None:
        epoll = self._epoll
        if epoll is None:
            return
        conns = self._conns
        for fd, events in epoll.poll(0):  # at most FD_SETSIZE - 1 a wake-up; level-triggered: the rest next turn
            transport = conns.get(fd)
            if transport is None:  # closed earlier in this batch
                continue
            if events & _OUT:
                transport.writable()
                if not events & (_IN | _GONE):
                    continue
            if transport.mask & _IN:
                transport.ready()  # data, an EOF, or an error: recv says which
            elif events & _GONE and not transport.is_closing():  # not reading (paused) and the peer is gone
                transport.lost(ConnectionResetError("connection lost while reading was paused"))


class Polled(asyncio.Transport):
    """The transport of a connection of a ``polled`` listener: a socket in its ``_Poller``'s epoll.

    As asyncio's socket transport for a protocol: ``connection_made`` first, then ``buffer_updated`` (a
    ``BufferedProtocol``) or ``data_received``, ``eof_received``, flow control (``pause_writing`` past 64 KiB unsent,
    ``resume_writing`` below 16 KiB), ``connection_lost`` once, on the loop's next turn. ``get_extra_info``: "peername",
    "sockname" and "socket" (the socket itself). No ``write_eof``: the workers' store never half-closes.
    """

    __slots__ = ("_buffered", "_closing", "_done", "_out", "_paused", "_peer", "_poller", "_protocol", "_reading",
                 "_sock", "fd", "mask")

    def __init__(self, poller: _Poller, sock: socket.socket, protocol: asyncio.BaseProtocol, peer: object) -> None:
        # No BaseTransport.__init__: its extra-info dict would be one more object per connection for the garbage
        # collector to walk (get_extra_info is answered from the slots)
        self._peer = peer
        self._poller = poller
        self._sock = sock
        self.fd = sock.fileno()
        self.mask = _IN
        self._protocol = protocol
        self._buffered = isinstance(protocol, asyncio.BufferedProtocol)
        self._out: bytes | bytearray = b""  # unsent bytes (bytes while empty, a bytearray once something waits)
        self._reading = True
        self._paused = False  # the protocol was told to pause writing
        self._closing = False
        self._done = False  # connection_lost scheduled

    # -- events, from the poller

    def ready(self) -> None:
        protocol = self._protocol
        try:
            if self._buffered:
                n = self._sock.recv_into(protocol.get_buffer(-1))  # type: ignore[attr-defined]
                data = None
            else:
                data = self._sock.recv(READ_SIZE)
                n = len(data)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.lost(exc)
            return
        except Exception as exc:  # get_buffer failed
            self.fail(exc, "protocol.get_buffer() failed")
            return
        try:
            if not n:
                if protocol.eof_received():  # type: ignore[attr-defined]
                    self.pause_reading()  # half-closed by the peer: nothing more to read, replies may still go
                elif self._out:
                    self.close()
                else:  # every client's end: connection_lost now, from the poller (no callback scheduled per connection)
                    self._closing = True
                    self._reading = False
                    self._finish(None, now=True)
            elif data is None:
                protocol.buffer_updated(n)  # type: ignore[attr-defined]
            else:
                protocol.data_received(data)  # type: ignore[attr-defined]
        except Exception as exc:  # as asyncio's transport: the connection is lost, the loop says why
            self.fail(exc, "protocol failed on received data")

    def writable(self) -> None:
        try:
            sent = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.lost(exc)
            return
        out = self._out
        assert isinstance(out, bytearray)
        del out[:sent]
        if self._paused and len(out) <= WRITE_LOW:
            self._paused = False
            self._protocol.resume_writing()
        if not self._out and not self._done:
            self._out = b""
            self._poller.modify(self, self._wanted())
            if self._closing:
                self._finish(None)

    # -- asyncio.Transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._done or not data:
            return
        if not self._out:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self.lost(exc)
                return
            if sent == len(data):
                return
            self._out = bytearray(memoryview(data)[sent:])
            self._poller.modify(self, self._wanted())
        else:
            self._out += data
        if not self._paused and len(self._out) > WRITE_HIGH:
            self._paused = True
            self._protocol.pause_writing()

    def close(self) -> None:
        """Stop reading; close once every queued byte is sent."""
        if self._closing:
            return
        self._closing = True
        self._reading = False
        if self._out:
            self._poller.modify(self, self._wanted())
        else:
            self._finish(None)

    def abort(self) -> None:
        self.lost(None)

    def is_closing(self) -> bool:
        return self._closing

    def pause_reading(self) -> None:
        if self._reading and not self._closing:
            self._reading = False
            self._poller.modify(self, self._wanted())

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self._poller.modify(self, self._wanted())

    def is_reading(self) -> bool:
        return self._reading

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self._peer
        if name == "socket":
            return self._sock
        if name == "sockname":
            with contextlib.suppress(OSError):
                return self._sock.getsockname()
        return default

    def get_write_buffer_size(self) -> int:
        return len(self._out)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol
        self._buffered = isinstance(protocol, asyncio.BufferedProtocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def can_write_eof(self) -> bool:
        return False

    # -- the end

    def lost(self, exc: Exception | None) -> None:
        """Closed now, unsent bytes dropped (``abort``, or the socket failed)."""
        self._closing = True
        self._reading = False
        self._out = b""
        self._finish(exc)

    def fail(self, exc: Exception, message: str) -> None:
        """A protocol callback raised: as asyncio's transport, the loop's exception handler hears of it, then the
        connection is lost."""
        self._poller._loop.call_exception_handler({"message": message, "exception": exc, "transport": self,
                                                   "protocol": self._protocol})
        self.lost(exc)

    def _wanted(self) -> int:
        return (_IN if self._reading else 0) | (_OUT if self._out else 0)

    def _finish(self, exc: Exception | None, *, now: bool = False) -> None:
        """Closed: the protocol hears of it on the loop's next turn (as from asyncio's transport: never inside a call of
        its own), or ``now`` where the poller, not the protocol, is running."""
        if self._done:
            return
        self._done = True
        self.mask = 0  # a later event of this batch finds nothing to read
        self._poller.forget(self)
        self._sock.close()
        if now:
            self._protocol.connection_lost(exc)
        else:
            self._poller._loop.call_soon(self._protocol.connection_lost, exc)


def paused_line(address: object, exc: OSError) -> str:
    """The one line a listener says when it stops accepting for want of descriptors (or another refusal)."""
    where = ":".join(map(str, address[:2])) if isinstance(address, tuple) else str(address)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if exc.errno == errno.ENFILE:
        why = "the system's open-files table is full (fs.file-max)"
    elif exc.errno == errno.EMFILE:
        why = f"this process has its {soft} open files (RLIMIT_NOFILE; hard limit {hard})"
    else:
        why = exc.strerror or str(exc)
    return (f"cannot accept connections on {where}: {why}; accepting paused, resumed as connections close (new "
            f"clients wait in the listen queue); raise the limit before rankrun (`ulimit -n`, or the hard limit: "
            f"limits.conf nofile, systemd LimitNOFILE=)")


class _Closed(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


async def hold(host: str, port: int) -> asyncio.Server:
    """Keep ``host:port`` taken (connections are closed at once); ``close()`` the server to let it go."""
    server, _ = await listen(host, port, _Closed)
    return server
