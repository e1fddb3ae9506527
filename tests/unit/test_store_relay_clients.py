"""A node's store relay (``workerstore.relay``) in-process, over loopback: a worker that disconnects from the relay
is closed on the host at once (its virtual connection there), not kept open until the attempt ends: a job's
workers that come and go must not pile up connections on the host. (Every request through a relay: ``tests/integration/test_relay_protocol.py``.)"""

from __future__ import annotations

import asyncio

from rankrun.workerstore.relay import StoreRelay
from rankrun.workerstore.relayhost import StoreRelayHost
from rankrun.workerstore.tcpstore import TCPStoreServer
from tcpwire import get, ping, validate

HOST = "127.0.0.1"
SECRET = b"the job's secret"
BOUND = 30.0


async def _client(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(validate() + ping(b"\x2a\x00\x00\x00"))
    assert await reader.readexactly(4) == b"\x2a\x00\x00\x00"  # the host answered: it holds this client's connection
    return reader, writer


def test_a_worker_that_disconnects_from_its_relay_is_closed_on_the_host():
    async def main() -> None:
        server = TCPStoreServer()
        await server.start(HOST, 0)
        host = StoreRelayHost(server, SECRET)
        relay = StoreRelay((HOST, await host.start(HOST, 0)), SECRET, bind=HOST)
        port = await relay.start(HOST, 0)
        try:
            open_before = len(server._connections)
            clients = [await _client(port) for _ in range(3)]
            assert len(server._connections) == open_before + 3
            for _, gone in clients[:2]:
                gone.close()
                await gone.wait_closed()
            while len(server._connections) > open_before + 1:  # the relay's CLOSE, a turn or two later
                await asyncio.sleep(0.01)
            reader, writer = clients[2]
            writer.write(get(b"/k") + ping(b"\x2b\x00\x00\x00"))  # the host serves the one left as before
            assert await reader.readexactly(8) == b"\x00" * 8  # (an empty value)
            assert await reader.readexactly(4) == b"\x2b\x00\x00\x00"
            writer.close()
            await writer.wait_closed()
        finally:
            await relay.close()
            await host.close()
            await server.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))
