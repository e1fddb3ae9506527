"""A silent peer on the embedded store's connection is given up within the liveness window, on both sides.

The network between client and server is a small proxy in the test that forwards bytes until it is
told to go silent, and from then on swallows them (as a pulled cable or a dropping switch port
does: no RST, no FIN). The store's lease timers run on a fake clock that never moves, so what
ends the leases here is the connection's own silence detection, nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import re

import pytest

from fakes import FakeTimers
from rankrun.rendezvous.keys import Keys
from rankrun.rendezvous.member import Member
from rankrun.rendezvous.round import NodeInfo
from rankrun.store.api import LeaseHandle, StoreUnavailable
from rankrun.store.embedded.client import StoreClient
from rankrun.store.embedded.liveness import Liveness
from rankrun.store.embedded.server import StoreServer
from rankrun.store.memory import MemoryStore

BOUND = 20.0
FAST = Liveness(0.1, 0.4)


class SilentableNetwork:
    """A TCP proxy to ``upstream``: forwards both ways until ``go_silent()``, then swallows everything."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.silent = False
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        self._writers += [writer, up_writer]
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if not self.silent:
                writer.write(data)

    def go_silent(self) -> None:
        self.silent = True

    async def close(self) -> None:
        for writer in self._writers:
            writer.close()
        if self._server is not None:
            self._server.close()


def _run(body) -> None:
    async def main() -> None:
        store = MemoryStore(FakeTimers())  # lease timers that never fire: only silence detection can end a lease
        server = StoreServer(store)
        port = await server.start("127.0.0.1", 0)
        network = SilentableNetwork(port)
        try:
            await body(store, await network.start(), network)
        finally:
            await network.close()
            await server.close()
            await store.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_a_silent_host_is_given_up_by_the_client_within_the_window():
    async def body(store, port, network):
        client = await StoreClient.connect("127.0.0.1", port, liveness=FAST)
        lease = await client.grant(3600.0)
        _, revision = await client.range("/job/")
        watch = await client.watch("/job/", after=revision)
        network.go_silent()
        call = asyncio.create_task(client.get("/job/x"))  # a request that will never be answered
        await asyncio.wait_for(lease.lost.wait(), 5.0)
        assert "stopped answering (no reply for" in lease.why and "the network or the host is down" in lease.why
        with pytest.raises(StoreUnavailable, match="stopped answering"):
            await asyncio.wait_for(call, 5.0)
        with pytest.raises(StoreUnavailable, match="stopped answering"):
            await asyncio.wait_for(anext(watch.__aiter__()), 5.0)

    _run(body)


def test_a_silent_client_is_given_up_by_the_server_and_its_leased_keys_go():
    async def body(store, port, network):
        client = await StoreClient.connect("127.0.0.1", port, liveness=FAST)
        lease = await client.grant(3600.0)
        await client.put("/job/nodes/a", b"a", lease=lease.id)
        _, revision = store.scan("/job/")
        gone = asyncio.Event()
        store.subscribe("/job/nodes/", revision, lambda event: gone.set())
        network.go_silent()
        await asyncio.wait_for(gone.wait(), 5.0)
        assert store.read("/job/nodes/a") is None
        assert store.why_deleted("/job/nodes/a").startswith("its lease expired after 0.4 s of silence")
        await client.close()

    _run(body)


def test_pings_keep_an_idle_healthy_connection_alive():
    async def body(store, port, network):
        client = await StoreClient.connect("127.0.0.1", port, liveness=FAST)
        lease = await client.grant(3600.0)
        await asyncio.sleep(5 * FAST.window)  # idle for five windows: the point of the test is the passing time
        assert not lease.lost.is_set()
        assert await client.get("/job/none") is None
        await client.close()

    _run(body)


def test_a_server_that_never_answers_the_hello_fails_the_connect_within_the_window():
    async def main() -> None:
        held: list[asyncio.StreamWriter] = []

        async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)  # accept, read, never answer
            with contextlib.suppress(ConnectionError):
                while await reader.read(4096):
                    pass

        server = await asyncio.start_server(mute, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(StoreUnavailable, match=rf"127\.0\.0\.1:{port}: no answer within 0\.4 s"):
                await StoreClient.connect("127.0.0.1", port, liveness=FAST)
        finally:
            for writer in held:
                writer.close()
            server.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))


class _MuteLease(LeaseHandle):
    """A lease whose keep-alives are never answered (the request went into a silent network)."""

    def __init__(self) -> None:
        super().__init__(7, 3.0)
        self.sent = 0

    async def keep_alive(self) -> None:
        self.sent += 1
        await asyncio.Event().wait()

    async def revoke(self) -> None:
        self.set_lost("revoked")


def test_unanswered_keep_alives_lose_the_lease_after_max_attempts_each_bounded_by_the_interval():
    async def main() -> None:
        lease = _MuteLease()
        member = Member(MemoryStore(), Keys.for_run("j"), NodeInfo("n", 0, 1, "default", "", ""), lease)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(member.keep_alive(0.05, 3), 5.0)
        assert lease.lost.is_set()
        assert lease.sent == 3
        assert re.fullmatch(r"3 keep-alives in a row failed over [\d.]+ s \(no answer within 0\.05 s\)", lease.why), lease.why
        assert loop.time() - started < 1.0  # not TCP's 15 minutes: (1 + 3) intervals, and some scheduling

    asyncio.run(asyncio.wait_for(main(), BOUND))
