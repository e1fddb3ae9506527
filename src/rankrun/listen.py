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
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable

from rankrun.errors import StoreError

BACKLOG = 4096  # thousands of agents connect within a second of each other
REBIND_ATTEMPTS = 16  # the one rebind failed in 3 of 12 loaded test runs: 16 failures in a row do not happen


async def listen(host: str, port: int, protocol: Callable[[], asyncio.BaseProtocol]) -> tuple[asyncio.Server, int]:
    """Bind ``host:port`` and serve ``protocol`` on it; the server and its port."""
    loop = asyncio.get_running_loop()
    try:
        for attempt in range(1, REBIND_ATTEMPTS + 1):
            server = await loop.create_server(protocol, host, port, reuse_address=True, backlog=BACKLOG)
            ports = sorted({int(sock.getsockname()[1]) for sock in server.sockets})
            if len(ports) == 1:
                break
            # Port 0 on a name with several addresses: the OS picked a port per address, each known free on its
            # own address only. Another socket may hold the lowest on another one (a listener or a connection on
            # 127.0.0.1 forbids it on 0.0.0.0), or take it between the close and the bind: then pick afresh.
            server.close()
            await server.wait_closed()
            try:
                server = await loop.create_server(protocol, host, ports[0], reuse_address=True, backlog=BACKLOG)
                break
            except OSError as exc:  # asyncio closed what it had bound of the group
                if exc.errno != errno.EADDRINUSE or attempt == REBIND_ATTEMPTS:
                    raise
    except OSError as exc:
        raise StoreError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return server, int(server.sockets[0].getsockname()[1])


class _Closed(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


async def hold(host: str, port: int) -> asyncio.Server:
    """Keep ``host:port`` taken (connections are closed at once); ``close()`` the server to let it go."""
    server, _ = await listen(host, port, _Closed)
    return server
