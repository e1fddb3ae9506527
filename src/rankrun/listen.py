"""Every TCP listening socket rankrun opens, opened one way: ``listen(host, port, protocol) -> (server, port)``.

Bound once, to exactly the address given (never all interfaces unless asked), with ``SO_REUSEADDR``
(a fixed endpoint must be re-bindable at once while the last job's sockets sit in TIME_WAIT) and a
backlog for thousands of agents connecting within a second. Port 0 lets the OS pick; on a name with
several addresses every socket is rebound on the first one's port (a worker gets one MASTER_PORT).
A bind that fails is a ``StoreError`` naming the address and the OS's reason, with the ``OSError``
on ``__cause__`` (its errno tells "someone else hosts it" from "not this machine's address").

Used by the workers' TCPStore (``workerstore.tcpstore``), the embedded store (``store.embedded.server``),
the shared rendezvous port (``rendezvous.listener``), and ``hold``: a single-node c10d endpoint kept
taken for the job, so that a second job on it fails loudly (nothing is served behind it). The one
non-TCP listener, ``rankrun --stacks``'s local Unix socket, is ``rankrun.stacks.control``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rankrun.errors import StoreError

BACKLOG = 4096  # thousands of agents connect within a second of each other


async def listen(host: str, port: int, protocol: Callable[[], asyncio.BaseProtocol]) -> tuple[asyncio.Server, int]:
    """Bind ``host:port`` and serve ``protocol`` on it; the server and its port."""
    loop = asyncio.get_running_loop()
    try:
        server = await loop.create_server(protocol, host, port, reuse_address=True, backlog=BACKLOG)
        ports = sorted({int(sock.getsockname()[1]) for sock in server.sockets})
        if len(ports) > 1:  # port 0 on a name with several addresses: one port for all of them
            server.close()
            await server.wait_closed()
            server = await loop.create_server(protocol, host, ports[0], reuse_address=True, backlog=BACKLOG)
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
