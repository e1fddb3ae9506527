"""``rankrun.listen``'s own accept loop, on real sockets: connections served through the selector loop's transport
constructor, through the public fallback (``connect_accepted_socket``, as on a loop without the private one) and by the
listener's own epoll (``polled``: flow control, EOF, a failing protocol, the epoll gone with the last connection), and
``close()``/``wait_closed()`` as asyncio's. Out of descriptors: ``test_tcpstore_fd_limit.py``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from pathlib import Path

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


@pytest.mark.parametrize(("private", "polled"), [(True, False), (False, False), (True, True)],
                         ids=["transport-constructor", "connect_accepted_socket", "polled"])
def test_every_connection_is_served_and_the_server_closes(monkeypatch: pytest.MonkeyPatch, private: bool,
                                                          polled: bool) -> None:
    if not private:
        made = listen_module._Acceptor.__init__

        def without(self: listen_module._Acceptor, *args: object) -> None:
            made(self, *args)  # type: ignore[arg-type]
            self._make = None  # as on a loop without _make_socket_transport (uvloop)

        monkeypatch.setattr(listen_module._Acceptor, "__init__", without)

    async def scenario() -> None:
        server, port = await listen("127.0.0.1", 0, Echo, polled=polled)
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


BIG = 4 * 1024 * 1024  # far past the socket buffers: the transport must queue, pause the protocol and resume it


class Buffered(asyncio.BufferedProtocol):
    """Echoes each line back, and on b"big\\n" writes BIG bytes; records what the transport told it."""

    def __init__(self, log: list[str], changed: asyncio.Event) -> None:
        self.log = log
        self.changed = changed
        self.buf = bytearray(64)

    def say(self, what: str) -> None:
        self.log.append(what)
        self.changed.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        assert transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)  # from the listener
        assert transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        self.say("made")

    def get_buffer(self, sizehint: int) -> memoryview:  # noqa: ARG002 - asyncio's signature
        return memoryview(self.buf)

    def buffer_updated(self, nbytes: int) -> None:
        data = bytes(self.buf[:nbytes])
        if data == b"boom\n":
            raise RuntimeError("boom")
        self.transport.write(b"b" * BIG if data == b"big\n" else data)

    def pause_writing(self) -> None:
        self.say("pause")

    def resume_writing(self) -> None:
        self.say("resume")

    def eof_received(self) -> bool | None:
        self.say("eof")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.say(f"lost {type(exc).__name__ if exc else None}")


async def _until(changed: asyncio.Event, predicate: Callable[[], bool]) -> None:
    """Wait (10 s at most) until ``predicate`` holds, woken by each thing a protocol says."""
    while True:
        changed.clear()
        if predicate():
            return
        await asyncio.wait_for(changed.wait(), 10)


def _epolls() -> int:
    """This process's epoll descriptors: the loop's own, plus a polled listener's while it has connections."""
    found = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            found += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[eventpoll]"
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_polled_connections_flow_control_eof_and_a_failing_protocol() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, object]] = []
        loop.set_exception_handler(lambda _loop, context: errors.append(context))
        logs: list[list[str]] = []
        changed = asyncio.Event()

        def factory() -> Buffered:
            logs.append([])
            return Buffered(logs[-1], changed)

        alone = _epolls()
        server, port = await listen("127.0.0.1", 0, factory, polled=True)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert _epolls() == alone + 1  # the listener's epoll, made with its first connection
        writer.write(b"big\n")
        await writer.drain()
        await _until(changed, lambda: "pause" in logs[0])  # nobody reads yet: the socket fills, the transport queues
        assert await reader.readexactly(BIG) == b"b" * BIG
        writer.write(b"hi\n")
        assert await reader.readexactly(3) == b"hi\n"
        assert logs[0] == ["made", "pause", "resume"]

        other_reader, other = await asyncio.open_connection("127.0.0.1", port)
        other.write(b"boom\n")
        assert await other_reader.read() == b""  # the failing protocol's connection is closed ...
        assert [e["message"] for e in errors] == ["protocol failed on received data"]  # ... and the loop hears why
        assert isinstance(errors[0]["exception"], RuntimeError)

        writer.write_eof()
        assert await reader.read() == b""  # closed after the peer's EOF
        await _until(changed, lambda: len(logs[0]) == 5 and len(logs[1]) == 2)
        assert logs[0][3:] == ["eof", "lost None"]
        assert logs[1] == ["made", "lost RuntimeError"]
        assert _epolls() == alone  # gone with the last connection
        writer.close()
        other.close()
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())
