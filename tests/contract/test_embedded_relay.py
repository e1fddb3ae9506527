"""The embedded store through relays (``store.embedded.relay``): what is lost when an agent or a relay goes, and who
is refused; then real processes: a relay in a process of its own, agents joining a round through it, the relay
SIGKILLed. (Every store operation through a relay: ``test_store_contract.py``'s "relayed" implementation.)"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rankrun.rendezvous.coordinator import Coordinator
from rankrun.rendezvous.keys import Assignment, Keys
from rankrun.rendezvous.member import Member
from rankrun.rendezvous.round import NodeInfo, Settings
from rankrun.store.api import AuthenticationFailed, EventKind, StoreUnavailable
from rankrun.store.embedded.client import StoreClient
from rankrun.store.embedded.relay import Relay
from rankrun.store.embedded.server import StoreServer
from rankrun.store.memory import MemoryStore

SECRET = b"relay-secret"
BOUND = 30.0
SRC = Path(__file__).resolve().parents[2] / "src"


async def _host() -> tuple[MemoryStore, StoreServer, int]:
    memory = MemoryStore()
    server = StoreServer(memory, SECRET)
    return memory, server, await server.start("127.0.0.1", 0)


def test_a_lost_agent_loses_exactly_its_own_leases():
    async def main() -> None:
        memory, server, port = await _host()
        relay = Relay(SECRET)
        relay_port = await relay.start("127.0.0.1", 0, ("127.0.0.1", port))
        a, b = [await StoreClient.connect("127.0.0.1", relay_port, SECRET) for _ in range(2)]
        for name, client in (("a", a), ("b", b)):
            lease = await client.grant(60)
            await client.put(f"/n/{name}", name.encode(), lease=lease.id)
        _, revision = memory.scan("/n/")
        watch = await memory.watch("/n/", revision)
        await a.close()
        event = await anext(aiter(watch))
        assert (event.kind, event.key) == (EventKind.DELETE, "/n/a")
        assert "closed" in memory.why_deleted("/n/a")
        assert memory.read("/n/b") is not None and relay.agents == 1
        assert (await b.get("/n/b")) is not None  # the other agent is served as before
        await watch.close()
        await b.close()
        await relay.close()
        await server.close()
        await memory.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_a_lost_relay_loses_its_agents_connections_and_their_leases():
    async def main() -> None:
        memory, server, port = await _host()
        relay = Relay(SECRET)
        relay_port = await relay.start("127.0.0.1", 0, ("127.0.0.1", port))
        agents = [await StoreClient.connect("127.0.0.1", relay_port, SECRET) for _ in range(3)]
        leases = [await c.grant(60) for c in agents]
        for i, (client, lease) in enumerate(zip(agents, leases, strict=True)):
            await client.put(f"/n/{i}", b"x", lease=lease.id)
        assert len(memory.scan("/n/")[0]) == 3
        for connection in list(server.connections):  # the host's side of the relay's one connection breaks
            connection.abort()
        await asyncio.gather(*(lease.lost.wait() for lease in leases))
        await relay.lost.wait()
        assert memory.scan("/n/")[0] == []
        assert all("relay" in memory.why_deleted(f"/n/{i}") for i in range(3))
        with pytest.raises(StoreUnavailable):
            await agents[0].get("/n/0")
        await relay.close()
        await server.close()
        await memory.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_the_relay_refuses_an_agent_without_the_secret_and_the_host_a_relay_without_it():
    async def main() -> None:
        memory, server, port = await _host()
        relay = Relay(SECRET)
        relay_port = await relay.start("127.0.0.1", 0, ("127.0.0.1", port))
        with pytest.raises(AuthenticationFailed):
            await StoreClient.connect("127.0.0.1", relay_port, b"not-the-secret")
        with pytest.raises(AuthenticationFailed):
            await Relay(b"not-the-secret").start("127.0.0.1", 0, ("127.0.0.1", port))
        await relay.close()
        await server.close()
        await memory.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))


RELAY_PROCESS = textwrap.dedent("""
    import asyncio, sys
    from rankrun.store.embedded.relay import Relay

    async def main():
        relay = Relay(sys.argv[2].encode())
        port = await relay.start("127.0.0.1", 0, ("127.0.0.1", int(sys.argv[1])))
        print(port, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
""")


def test_agents_join_a_round_through_a_relay_process_and_lose_their_places_when_it_is_killed():
    """3 agents (Member.join + next_round, as real agents) through a relay in its own process, one directly; the
    coordinator on the host places all 4; the relay is SIGKILLed: the 3 relayed agents' node keys go, the direct one's
    stays, and the relayed agents' leases are lost."""

    async def main() -> None:
        memory, server, port = await _host()
        keys = Keys.for_run("relayed")

        async def nothing() -> None:
            return None

        coordinator = Coordinator(memory, keys, Settings(4, 4, 60.0, 0), master=lambda: ("127.0.0.1", port),
                                  before_round=nothing)
        coordinating = asyncio.create_task(coordinator.run())
        relay = subprocess.Popen([sys.executable, "-c", RELAY_PROCESS, str(port), SECRET.decode()],
                                 stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(SRC)})
        try:
            assert relay.stdout is not None
            relay_port = int(await asyncio.to_thread(relay.stdout.readline))
            clients = [await StoreClient.connect("127.0.0.1", p, SECRET) for p in (relay_port,) * 3 + (port,)]
            members = await asyncio.gather(*(
                Member.join(c, keys, NodeInfo(f"node-{i}", 0, 1, "default", "127.0.0.1", "h"), ttl=60)
                for i, c in enumerate(clients)))
            places = await asyncio.gather(*(m.next_round(0) for m in members))
            assert sorted(p.group_rank for p in places if isinstance(p, Assignment)) == [0, 1, 2, 3]
            _, revision = memory.scan(keys.nodes)
            watch = await memory.watch(keys.nodes, revision)
            relay.send_signal(signal.SIGKILL)
            gone = set()
            async for event in watch:
                if event.kind is EventKind.DELETE:
                    gone.add(event.key[len(keys.nodes):])
                if len(gone) == 3:
                    break
            await watch.close()
            assert gone == {"node-0", "node-1", "node-2"}
            assert memory.read(keys.node("node-3")) is not None
            await asyncio.gather(*(m.lease.lost.wait() for m in members[:3]))
            assert not members[3].lease.lost.is_set()
            for client in clients:
                await client.close()
        finally:
            relay.kill()
            relay.wait(timeout=30)
            if relay.stdout is not None:
                relay.stdout.close()
            coordinating.cancel()
            await asyncio.gather(coordinating, return_exceptions=True)
            await server.close()
            await memory.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))
