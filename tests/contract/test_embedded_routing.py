"""The host's routing of agents to relays (``store.embedded.routing``) over real sockets: who is asked to relay, who
is sent to a relay and served there, who is told to retry, and what changes when a relay or an asked agent goes.
(Real launchers doing the same: ``tests/integration/test_rdzv_relays.py``.)"""

from __future__ import annotations

import asyncio

import pytest

from rankrun.store.api import AuthenticationFailed, RendezvousHeld, StoreUnavailable
from rankrun.store.embedded import wire
from rankrun.store.embedded.client import StoreClient
from rankrun.store.embedded.relay import Relay
from rankrun.store.embedded.routing import Redirect, Routing, Serve, Wait, relays_for
from rankrun.store.embedded.server import StoreServer
from rankrun.store.memory import MemoryStore

SECRET = b"routing-secret"


async def _host(wanted: int) -> tuple[MemoryStore, StoreServer, int]:
    memory = MemoryStore()
    server = StoreServer(memory, SECRET, routing=Routing(wanted))
    return memory, server, await server.start("127.0.0.1", 0)


async def _until(check: object, what: str) -> None:
    async with asyncio.timeout(10):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.01)  # the host's view changes on its own loop: no event a test can await


def test_the_first_agents_are_asked_to_relay_the_rest_wait_for_one_then_go_there():
    async def main() -> None:
        memory, server, port = await _host(wanted=1)
        asked = await StoreClient.connect("127.0.0.1", port, SECRET, relays=True)
        assert asked.serve is not None and asked.via is None
        early = asyncio.create_task(StoreClient.connect("127.0.0.1", port, SECRET, relays=True))
        await _until(lambda: len(server.connections) == 2, "the host holds its answer")
        assert not early.done()  # no relay yet: it waits, it is not told to come back
        relay = Relay(SECRET)
        relay_port = await relay.start("127.0.0.1", 0, ("127.0.0.1", port), token=asked.serve)
        at = f"127.0.0.1:{relay_port}"
        sent = [await asyncio.wait_for(early, 10), await StoreClient.connect("127.0.0.1", port, SECRET, relays=True)]
        assert [client.via for client in sent] == [at, at] and not any(client.serve for client in sent)
        assert f"through the relay at {at}" in sent[0].endpoint
        await sent[0].put("/k", b"v")  # served through the relay
        assert memory.read("/k") is not None and relay.agents == 2
        plain = await StoreClient.connect("127.0.0.1", port, SECRET)  # no offer to relay: served directly
        assert plain.via is None and plain.serve is None
        for client in (*sent, plain, asked):
            await client.close()
        await relay.close()
        await server.close()
        await memory.close()

    asyncio.run(main())


def test_another_jobs_agent_is_refused_by_the_host_not_sent_to_a_relay():
    """Once every relay is asked the host answers an agent from its hello (``Routing.early``), before any proof; an agent
    of another job (issue 34) must still reach the proof, where the host refuses it: a relay serves whoever it is sent."""
    async def main() -> None:
        memory = MemoryStore()
        server = StoreServer(memory, SECRET, routing=Routing(1), job="job-a")
        port = await server.start("127.0.0.1", 0)
        asked = await StoreClient.connect("127.0.0.1", port, SECRET, relays=True, job="job-a")
        relay = Relay(SECRET)
        relay_port = await relay.start("127.0.0.1", 0, ("127.0.0.1", port), token=asked.serve)
        ours = await StoreClient.connect("127.0.0.1", port, SECRET, relays=True, job="job-a")
        assert ours.via == f"127.0.0.1:{relay_port}"  # sent on from its hello
        with pytest.raises(RendezvousHeld, match="held by job job-a, not this node's job job-b"):
            await StoreClient.connect("127.0.0.1", port, SECRET, relays=True, job="job-b")
        assert relay.agents == 1
        for client in (ours, asked):
            await client.close()
        await relay.close()
        await server.close()
        await memory.close()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_an_agent_waiting_for_a_relay_that_is_lost_is_told_to_retry_and_the_next_is_asked():
    async def main() -> None:
        memory, server, port = await _host(wanted=1)
        asked = await StoreClient.connect("127.0.0.1", port, SECRET, relays=True)
        early = asyncio.create_task(StoreClient.connect("127.0.0.1", port, SECRET, relays=True))
        await _until(lambda: len(server.connections) == 2, "the host holds its answer")
        await asked.close()  # before its relay was up
        with pytest.raises(StoreUnavailable, match="lost before it was ready"):
            await asyncio.wait_for(early, 10)
        again = await StoreClient.connect("127.0.0.1", port, SECRET, relays=True)
        assert again.serve is not None and again.serve != asked.serve  # asked in its place
        await again.close()
        await server.close()
        await memory.close()

    asyncio.run(main())


def test_relays_are_taken_in_turn_and_a_lost_one_leaves_the_turn():
    async def main() -> None:
        memory, server, port = await _host(wanted=2)
        asked = [await StoreClient.connect("127.0.0.1", port, SECRET, relays=True) for _ in range(2)]
        relays = [Relay(SECRET) for _ in range(2)]
        at = [f"127.0.0.1:{await relay.start('127.0.0.1', 0, ('127.0.0.1', port), token=client.serve)}"
              for relay, client in zip(relays, asked, strict=True)]
        sent = [await StoreClient.connect("127.0.0.1", port, SECRET, relays=True) for _ in range(4)]
        assert [client.via for client in sent] == [at[0], at[1], at[0], at[1]]
        await relays[0].close()
        await _until(lambda: server.routing is not None and server.routing.relays == [at[1]], "the host saw it go")
        later = await StoreClient.connect("127.0.0.1", port, SECRET, relays=True)
        assert later.serve is not None  # a relay is wanted again: the next to arrive is asked
        for client in (*sent, later, *asked):
            await client.close()
        await relays[1].close()
        await server.close()
        await memory.close()

    asyncio.run(main())


def test_once_every_relay_is_asked_the_hello_is_redirected_and_the_relay_asks_for_the_proof():
    async def main() -> None:
        memory, server, port = await _host(wanted=0)
        relay = Relay(SECRET)
        relay_port = await relay.start("127.0.0.1", 0, ("127.0.0.1", port))
        assert server.routing is not None and server.routing.relays == [f"127.0.0.1:{relay_port}"]
        hello = {"hello": wire.VERSION, "nonce": wire.b64(b"n" * 16), "relays": True}
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # a peer without the secret, on the wire
        writer.write(wire.MAGIC + wire.frame(hello))
        said = await asyncio.wait_for(reader.read(), 10)  # all it is told, until the host closes: no challenge
        assert f"127.0.0.1:{relay_port}".encode() in said and b"challenge" not in said
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", relay_port)  # where it was sent: the proof is asked
        writer.write(wire.MAGIC + wire.frame(hello) + wire.frame({"proof": "not-a-proof"}))
        said = await asyncio.wait_for(reader.read(), 10)
        assert b"challenge" in said and b"authentication failed" in said
        writer.close()
        with pytest.raises(AuthenticationFailed, match=f"through the relay at 127.0.0.1:{relay_port}"):
            await StoreClient.connect("127.0.0.1", port, b"another job's secret", relays=True)
        assert (await memory.range(""))[0] == []  # nothing reached the store
        await relay.close()
        await server.close()
        await memory.close()

    asyncio.run(main())


def test_a_peer_without_the_secret_is_never_asked_to_relay():
    async def main() -> None:
        memory, server, port = await _host(wanted=1)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        hello = {"hello": wire.VERSION, "nonce": wire.b64(b"n" * 16), "relays": True}
        writer.write(wire.MAGIC + wire.frame(hello) + wire.frame({"proof": "not-a-proof"}))
        said = await asyncio.wait_for(reader.read(), 10)
        assert b"authentication failed" in said and b"serve" not in said
        writer.close()
        asked = await StoreClient.connect("127.0.0.1", port, SECRET, relays=True)
        assert asked.serve is not None  # the relay's place was still free
        await asked.close()
        await server.close()
        await memory.close()

    asyncio.run(main())


def test_the_routing_rule():
    routing: Routing[str] = Routing(1)
    assert routing.route("a") == Serve(1)
    assert routing.route("b") == Wait()
    assert routing.ready("relay", 1, "10.0.0.2:4000") == ["b"]  # it waited: sent there now
    assert routing.route("c") == Redirect("10.0.0.2:4000")
    assert routing.ended("relay") == []
    assert routing.route("d") == Serve(2)  # the relay went: another is asked
    assert routing.route("e") == Wait()
    assert routing.ended("e") == []  # a waiting agent that went waits no more
    assert routing.route("f") == Wait()
    assert routing.early("f2") == Wait()  # every relay asked: answered from the hello, as after the proof
    assert Routing[str](1).early("h") is None  # one to ask: the proof first
    assert routing.ended("d") == ["f", "f2"]  # its relay's agent went before it was ready: told to retry
    assert routing.ready("own", None, "10.0.0.3:4000") == []  # a relay nobody asked for joins the turn
    assert routing.route("g") == Redirect("10.0.0.3:4000") and routing.relays == ["10.0.0.3:4000"]
    assert [relays_for(n, 2) for n in (1, 2, 4, 5, 7)] == [0, 1, 1, 2, 2]
    assert [relays_for(n, 1) for n in (2, 3, 4, 5)] == [1, 1, 2, 2]
    assert relays_for(16_384, 0) == 0 and relays_for(16_384, 128) == 127


def test_three_relays_are_taken_in_order_and_what_ends_later_leaves_no_trace():
    routing: Routing[str] = Routing(3)
    tokens = [routing.route(agent) for agent in ("a", "b", "c")]
    assert tokens == [Serve(1), Serve(2), Serve(3)]
    assert routing.route("w") == Wait()  # for relay 1, not up yet
    for token, relay in zip((1, 2, 3), ("r1", "r2", "r3"), strict=True):
        assert routing.ready(relay, token, f"{relay}:1") == (["w"] if token == 1 else [])
    assert "w" not in routing._of  # sent on: the routing holds nothing of it (thousands of agents pass through)
    assert [routing.route(f"x{i}") for i in range(4)] == [Redirect("r2:1"), Redirect("r3:1"), Redirect("r1:1"),
                                                          Redirect("r2:1")]
    assert routing.ended("w") == []  # sent on long ago: nothing of it is left to undo
    assert routing.ended("r2") == [] and routing.relays == ["r1:1", "r3:1"]
    assert "b" not in routing._of and "r2" not in routing._of  # the slot went whole
    assert routing.ended("b") == []  # its relay already went: its slot with it
    assert routing.route("y") == Serve(4)
