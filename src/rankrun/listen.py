"""Every TCP listening socket rankrun opens, opened one way: ``listen(host, port, protocol) -> (server, port)``.

Bound once, to exactly the address given (never all interfaces unless asked), with ``SO_REUSEADDR``
(a fixed endpoint must be re-bindable at once while the last job's sockets sit in TIME_WAIT) and a
backlog for thousands of agents connecting within a second. Port 0 lets the OS pick; on a name with
several addresses every socket is rebound on the lowest port picked (a worker gets one MASTER_PORT),
and when that port is taken on another of the addresses, the whole group is picked afresh
(``REBIND_ATTEMPTS`` times at most).
A bind that fails is a ``StoreError`` naming the address and the OS's reason, with the ``OSError``
on ``__cause__`` (its errno tells "someone else hosts it" from "not this machine's address").

Used by the workers' TCPStore (``workerstore.tcpstore``), the embedded store (``store.embedded.server``),
the shared rendezvous port (``rendezvous.listener``), the metrics endpoint (``events.metrics``), and ``hold``: a
single-node c10d endpoint kept taken for the job, so that a second job on it fails loudly (nothing is served
behind it). The one non-TCP listener, ``rankrun --stacks``'s local Unix socket, is ``rankrun.stacks.control``'s.

Accepting is this module's, not asyncio's (``_Acceptor``): asyncio's accept loop, out of file descriptors
(``EMFILE``/``ENFILE``), logs a traceback and schedules a retry for every one of up to ``backlog`` attempts per wake-up,
and spins a core (measured: 36 s of CPU in 40 s, 222 MB of stderr, 4,096 clients at a soft limit of 1,024). Here it
stops accepting, says so once in one line (the limit, the fix), backs off (50 ms doubling to 1 s) and resumes; the
clients wait in the listen queue meanwhile. Each wake-up drains the listen queue (``accept`` until it would block),
and a connection costs a transport and its protocol, without asyncio's Task per connection.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
from collections.abc import Callable

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


async def listen(host: str, port: int, protocol: Callable[[], asyncio.BaseProtocol]) -> tuple[asyncio.Server, int]:
    """Bind ``host:port`` and serve ``protocol`` on it; the server and its port."""
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
        await _serve(loop, server, protocol)
    except OSError as exc:
        raise StoreError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return server, int(server.sockets[0].getsockname()[1])


async def _serve(loop: asyncio.AbstractEventLoop, server: asyncio.Server, protocol: Callable[[], asyncio.BaseProtocol]) -> None:
    """Start accepting on ``server``'s sockets with ``_Acceptor``; asyncio's own accept loop where its raw sockets are
    out of reach (``Server._sockets``, private: the public ``sockets`` are wrappers that cannot ``accept``)."""
    raw: list[socket.socket] | None = getattr(server, "_sockets", None)
    if not isinstance(raw, list) or not all(isinstance(sock, socket.socket) for sock in raw):
        await server.start_serving()
        return
    for sock in raw:
        sock.listen(BACKLOG)
        _Acceptor(loop, server, sock, protocol).start()


_MakeTransport = Callable[..., asyncio.Transport]


class _Acceptor:
    """Accepts the connections of one listening socket of ``server`` (created with ``start_serving=False``).

    ``server.close()`` still ends it: asyncio's ``_stop_serving`` removes the reader and closes the socket (a pending
    resume then finds it closed), and every transport is attached to ``server``, so ``wait_closed`` means what it did.
    """

    __slots__ = ("_factory", "_loop", "_make", "_pause", "_said", "_server", "_sock")

    def __init__(self, loop: asyncio.AbstractEventLoop, server: asyncio.Server, sock: socket.socket,
                 factory: Callable[[], asyncio.BaseProtocol]) -> None:
        self._loop = loop
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
        accept = self._sock.accept
        for _ in range(ACCEPT_BATCH):  # the whole listen queue, in bounded turns (other callbacks run between)
            try:
                conn, addr = accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # drained (or the one that was there gave up)
            except OSError as exc:  # out of descriptors (or anything else the kernel keeps answering): never spin
                self._paused(exc)
                return
            self._pause = PAUSE_FIRST_S
            self._serve(conn, addr)

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
        if make is None:
            self._loop.create_task(self._adopt(conn))
            return
        try:
            protocol = self._factory()
        except Exception as exc:  # a protocol factory that failed: this connection only
            logger.debug("closing accepted connection from %s: %r", addr, exc)
            conn.close()
            return
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
