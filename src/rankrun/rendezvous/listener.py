"""One listening port for the rendezvous and the worker store, told apart by the client's first byte.

A torch TCPStore client always starts with ``0x00`` (VALIDATE); a rankrun agent starts with
``RKRN`` (``store.embedded.wire``); another node's store relay with ``rkrl`` (``workerstore.mux``).
Neither server speaks first, so the listener waits for the first bytes, then hands the connection
(and those bytes) to the right server. This is how
``MASTER_PORT`` can be the ``--master-port`` (static) or the endpoint's port (dynamic) for the
workers of every node, as under torchrun, while agents meet on the same port. The TCPStore side
cannot be authenticated (torch's protocol has no place for it): the port is bound to named
addresses only, never all interfaces: the endpoint's, and (``also``) the host's ``--local-addr``
where that differs, since the workers are told to reach their store there, as under torchrun.
Anything else is closed.
"""

from __future__ import annotations

import asyncio
import contextlib

from rankrun.listen import listen
from rankrun.store.embedded import wire
from rankrun.store.embedded.server import StoreServer
from rankrun.workerstore import mux
from rankrun.workerstore.relayhost import StoreRelayHost
from rankrun.workerstore.tcpstore import TCPStoreServer


class _Sniffer(asyncio.Protocol):
    def __init__(self, listener: SharedListener) -> None:
        self._listener = listener
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        transport, self._transport = self._transport, None
        if transport is None:
            return
        if data[:1] == b"\x00" and self._listener.worker_store is not None:
            self._listener.worker_store.adopt(transport, data)
        elif data[:1] == wire.MAGIC[:1]:
            self._listener.rendezvous.adopt(transport, data)
        elif data[:1] == mux.MAGIC[:1] and self._listener.store_relays is not None:
            self._listener.store_relays.adopt(transport, data)
        else:
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        del exc


class SharedListener:
    def __init__(self, rendezvous: StoreServer, worker_store: TCPStoreServer | None) -> None:
        self.rendezvous = rendezvous
        self.worker_store = worker_store
        self.store_relays: StoreRelayHost | None = None  # other nodes' store relays (--store-relays), for worker_store
        self._servers: list[asyncio.Server] = []
        self.address = ""

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` once (``StoreError`` with the OS's reason, and ``errno`` on ``__cause__``)."""
        # polled: every rank of a multi-node job reaches the workers' store through this port; its connections are
        # then Polled transports (``rankrun.listen``), the store's own accept path, whichever server adopts them
        server, bound = await listen(host, port, lambda: _Sniffer(self), polled=True)
        self._servers.append(server)
        self.address = str(server.sockets[0].getsockname()[0])
        return bound

    async def also(self, host: str, port: int) -> None:
        """Listen on ``host:port`` as well, for the same servers (``StoreError`` as ``start``): the host's
        ``--local-addr``, when it is not the endpoint's address, is where its workers are told to find their store."""
        server, _ = await listen(host, port, lambda: _Sniffer(self), polled=True)
        self._servers.append(server)

    async def close(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        for server in servers:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5.0)
