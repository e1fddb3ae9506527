"""``rankrun.listen`` on a name with several addresses: port 0 gives them one port, whatever other sockets hold.

The wildcard ("") resolves to ``::`` and ``0.0.0.0``, so port 0 first gets a port per address; rebinding the
group onto one of them can meet another socket holding it on the other address (a listener on the
loopback forbids it on the wildcard). The tests force that collision, on real sockets, by taking the port
on the other address's loopback between the pick and the rebind, as another process could.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

import pytest

from rankrun.errors import StoreError
from rankrun.listen import REBIND_ATTEMPTS, listen

WILDCARD = ""
LOOPBACK = {socket.AF_INET: "127.0.0.1", socket.AF_INET6: "::1"}

pytestmark = pytest.mark.skipif(
    len({info[0] for info in socket.getaddrinfo(None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)}) < 2,
    reason="the wildcard has one address here (no IPv6): nothing to share a port between",
)


def _occupy(family: socket.AddressFamily, port: int) -> socket.socket:
    """Another process's listener on ``port`` of ``family``'s loopback."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio binds ::, so that 0.0.0.0 is apart
        sock.bind((LOOPBACK[family], port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


class _TakesTheSharedPort:
    """The loop's ``create_server``, with another socket taking the group's port after each of the first
    ``times`` port-0 picks: on the address that did not get it, so that the rebind onto it fails."""

    def __init__(self, loop: asyncio.AbstractEventLoop, times: int) -> None:
        self.create = loop.create_server
        self.times = times
        self.ports: list[int] = []  # the port each call asked for
        self.occupants: list[socket.socket] = []
        self.picks: list[asyncio.Server] = []

    async def __call__(self, protocol: Any, host: str, port: int, **kwargs: Any) -> asyncio.Server:
        self.ports.append(port)
        if port != 0 or len(self.occupants) == self.times:
            return await self.create(protocol, host, port, **kwargs)
        for _ in range(100):
            server = await self.create(protocol, host, 0, **kwargs)
            families = {int(sock.getsockname()[1]): sock.family for sock in server.sockets}
            if len(families) > 1:  # else the OS picked one port for both: nothing to collide with
                shared = min(families)  # the one listen rebinds the group onto
                other = next(family for port, family in families.items() if port != shared)
                try:
                    self.occupants.append(_occupy(other, shared))
                    self.picks.append(server)
                    return server
                except OSError as exc:  # a socket of someone else's has it there already: not this test's collision
                    if exc.errno != errno.EADDRINUSE:
                        server.close()
                        raise
            server.close()  # pick again
            await server.wait_closed()
        pytest.fail("no port-0 pick on :: and 0.0.0.0 this test could make collide, in 100")


def test_a_port_taken_on_another_address_before_the_rebind_is_picked_afresh(monkeypatch):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        hook = _TakesTheSharedPort(loop, times=2)
        monkeypatch.setattr(loop, "create_server", hook)
        try:
            server, port = await listen(WILDCARD, 0, asyncio.Protocol)
            try:
                taken = [o.getsockname()[1] for o in hook.occupants]
                assert hook.ports[:4] == [0, taken[0], 0, taken[1]]  # two picks collided, each was given up
                assert len(server.sockets) == 2
                assert {sock.getsockname()[1] for sock in server.sockets} == {port}
                assert port not in taken
            finally:
                server.close()
                await server.wait_closed()
        finally:
            for occupant in hook.occupants:
                occupant.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_picking_afresh_is_bounded_and_leaves_nothing_bound(monkeypatch):
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        hook = _TakesTheSharedPort(loop, times=REBIND_ATTEMPTS + 1)
        monkeypatch.setattr(loop, "create_server", hook)
        try:
            with pytest.raises(StoreError, match=r"^cannot listen on :0: .*address already in use") as failed:
                await listen(WILDCARD, 0, asyncio.Protocol)
            assert isinstance(failed.value.__cause__, OSError)
            assert failed.value.__cause__.errno == errno.EADDRINUSE
            assert len(hook.occupants) == REBIND_ATTEMPTS  # as many picks as attempts, not one more
            assert all(not pick.is_serving() and not pick.sockets for pick in hook.picks)  # each pick closed
        finally:
            for occupant in hook.occupants:
                occupant.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
