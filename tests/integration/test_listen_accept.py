"""``rankrun.listen``'s own accept loop, on real sockets: connections served through the selector loop's transport
constructor and through the public fallback (``connect_accepted_socket``, as on a loop without the private one), and
``close()``/``wait_closed()`` as asyncio's. Out of descriptors: ``test_tcpstore_fd_limit.py``."""

from __future__ import annotations

import asyncio

import pytest

from rankrun import listen as listen_module
from rankrun.listen import listen

pytestmark = pytest.mark.timeout(60)

CLIENTS = 300  # more than one accept per wake-up: the queue is drained in a turn


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


@pytest.mark.parametrize("private", [True, False], ids=["transport-constructor", "connect_accepted_socket"])
def test_every_connection_is_served_and_the_server_closes(monkeypatch: pytest.MonkeyPatch, private: bool) -> None:
    if not private:
        made = listen_module._Acceptor.__init__

        def without(self: listen_module._Acceptor, *args: object) -> None:
            made(self, *args)  # type: ignore[arg-type]
            self._make = None  # as on a loop without _make_socket_transport (uvloop)

        monkeypatch.setattr(listen_module._Acceptor, "__init__", without)

    async def scenario() -> None:
        server, port = await listen("127.0.0.1", 0, Echo)
        opened = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", port) for _ in range(CLIENTS)))
        for n, (_, writer) in enumerate(opened):
            writer.write(b"%d\n" % n)
        replies = await asyncio.gather(*(reader.readline() for reader, _ in opened))
        assert replies == [b"%d\n" % n for n in range(CLIENTS)]
        server.close()  # (3.12+: wait_closed waits for the connections too: they are attached to the server)
        closing = asyncio.ensure_future(server.wait_closed())
        for _, writer in opened:
            writer.close()
        await asyncio.gather(*(writer.wait_closed() for _, writer in opened))
        await asyncio.wait_for(closing, 10)
        assert not server.sockets

    asyncio.run(scenario())
