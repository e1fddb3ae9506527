"""``rankrun.listen``'s accept loop out of file descriptors, in-process: accepting stops, resumes after a pause that
doubles from 50 ms to 1 s while ``accept`` keeps failing (asyncio's own loop retries at once and spins a core), starts
again from 50 ms once a connection is accepted, and says so once. The listening socket is real (a client waits in its
queue, so it is readable); only its ``accept`` answers ``EMFILE`` as a process at its limit would, and the loop's
``call_later`` is recorded and fired by the test (a fake clock: no test waits seconds)."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from typing import Any

from rankrun import listen as listen_module

BOUND = 10


class OutOfDescriptors(socket.socket):
    """A listening socket whose accepts fail with EMFILE as ``fails`` says, one entry an accept (then they work)."""

    fails: tuple[bool, ...] = ()

    def _accept(self) -> tuple[int, Any]:
        fail, self.fails = self.fails[:1] == (True,), self.fails[1:]
        if fail:
            raise OSError(errno.EMFILE, "Too many open files")
        return super()._accept()  # type: ignore[misc]


def test_the_pause_doubles_up_to_a_second_and_starts_afresh_after_an_accept(monkeypatch, caplog):
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        paused: asyncio.Queue[tuple[float, Callable[[], None]]] = asyncio.Queue()

        def call_later(delay: float, callback: Callable[[], None], *args: object) -> None:
            paused.put_nowait((delay, lambda: callback(*args)))

        monkeypatch.setattr(loop, "call_later", call_later)
        sock = OutOfDescriptors(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.setblocking(False)
        served: list[asyncio.BaseTransport] = []
        each = asyncio.Queue[None]()

        class Served(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                served.append(transport)
                each.put_nowait(None)

        clients = [socket.create_connection(sock.getsockname()) for _ in range(2)]
        delays = []
        try:
            sock.fails = (True,) * 7 + (False, True)  # 7 failures; then one client is accepted, and the next fails
            acceptor = listen_module._Acceptor(loop, None, sock, Served)  # type: ignore[arg-type]
            acceptor.start()
            for _ in range(8):
                delay, resume = await paused.get()
                delays.append(delay)
                resume()
            for _ in clients:  # both accepted in the end
                await each.get()
            assert paused.empty()
        finally:
            loop.remove_reader(sock.fileno())
            for transport in served:
                transport.close()
            for client in clients:
                client.close()
            sock.close()
        return delays

    with caplog.at_level(logging.WARNING, logger=listen_module.logger.name):
        delays = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 0.05]
    [said] = [r.getMessage() for r in caplog.records]  # once, however many times it paused
    assert said.startswith("cannot accept connections on 127.0.0.1:") and "accepting paused" in said
