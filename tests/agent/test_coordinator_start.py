"""The coordinator's start reads the store (the nodes, then the unhealthy reports) before it watches: a node that
joins between the two reads (on etcd a round trip apart) must still be seen, else the round waits for it forever."""

from __future__ import annotations

import asyncio

import pytest

from fakes import FakeTimers
from rankrun.errors import NotCoordinator
from rankrun.rendezvous.coordinator import Coordinator, Writes
from rankrun.rendezvous.keys import Assignment, Keys, node_value, place_from
from rankrun.rendezvous.round import NodeInfo, Settings
from rankrun.store.api import Event, EventKind
from rankrun.store.memory import MemoryStore

KEYS = Keys.for_run("fake")
BOUND = 30.0


class JoinBetweenReads(MemoryStore):
    """The in-memory store, where a third node joins just as the coordinator reads the unhealthy reports."""

    def __init__(self) -> None:
        super().__init__(FakeTimers())
        self.lease = 0

    async def range(self, prefix: str):  # type: ignore[no-untyped-def]
        if prefix == KEYS.unhealthy and self.lease:
            lease, self.lease = self.lease, 0
            await self.put(KEYS.node("n2"), node_value(NodeInfo("n2", 0, 1, "default", "127.0.0.4", "h2")), lease=lease)
        return await super().range(prefix)


def test_a_node_joining_between_the_coordinators_first_reads_is_in_the_first_round():
    async def main() -> dict[str, int]:
        store = JoinBetweenReads()
        lease = await store.grant(60)
        for i in range(2):
            await store.put(KEYS.node(f"n{i}"), node_value(NodeInfo(f"n{i}", 0, 1, "default", f"127.0.0.{i + 2}", f"h{i}",
                                                                   is_host=i == 0)), lease=lease.id)
        store.lease = lease.id

        async def fresh_keyspace() -> None:
            return None

        coordinator = Coordinator(store, KEYS, Settings(2, 3, 0.1, 0), master=lambda: ("127.0.0.1", 29500),
                                  before_round=fresh_keyspace)
        running = asyncio.create_task(coordinator.run())
        try:
            while True:  # the first round: with all three (MAX) it starts at once
                entries, _ = await store.range(KEYS.assigns)
                places = {e.key[len(KEYS.assigns):]: place_from(e.value) for e in entries}
                if len(places) == 3:
                    return {n: p.group_world_size for n, p in places.items() if isinstance(p, Assignment)}
                await asyncio.sleep(0.01)
        finally:
            running.cancel()

    sizes = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert sizes == {"n0": 3, "n1": 3, "n2": 3}


class Watched(asyncio.Queue):  # type: ignore[type-arg]
    """The coordinator's queue of watch events, saying when the coordinator waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()

    async def get(self):  # type: ignore[no-untyped-def]
        self.waiting.set()
        return await super().get()


def test_a_coordinator_cancelled_as_an_event_arrives_ends():
    # the session cancels the coordinator as the nodes leave: an event may land in the same turn of the loop. Python
    # 3.11's asyncio.wait_for then returned the event and dropped the cancellation: the coordinator waited on, for
    # ever, and its launcher never exited (two nodes that both got SIGINT)
    async def main() -> BaseException | None:
        store = MemoryStore(FakeTimers())
        lease = await store.grant(60)
        for i in range(2):
            await store.put(KEYS.node(f"n{i}"), node_value(NodeInfo(f"n{i}", 0, 1, "default", f"127.0.0.{i + 2}", f"h{i}",
                                                                   is_host=i == 0)), lease=lease.id)

        async def fresh_keyspace() -> None:
            return None

        # MIN 2 of MAX 3 with a long last call: it waits with a deadline (asyncio.wait_for with a timeout, before)
        coordinator = Coordinator(store, KEYS, Settings(2, 3, 600.0, 0), master=lambda: ("127.0.0.1", 29500),
                                  before_round=fresh_keyspace)
        queue = coordinator._events = Watched()
        running = asyncio.create_task(coordinator.run())
        await queue.waiting.wait()
        queue.put_nowait(Event(EventKind.PUT, KEYS.results + "7/n0", b"", 99))  # an old round's result: changes nothing
        running.cancel()
        done, _ = await asyncio.wait([running], timeout=5.0)
        if not done:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
            return None
        return running.exception() if not running.cancelled() else asyncio.CancelledError()

    ended = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert isinstance(ended, asyncio.CancelledError), f"the coordinator did not end when cancelled: {ended!r}"


def test_the_coordinators_writes_wait_pending_for_a_flush_and_a_fenced_one_refused_is_not_coordinating():
    async def main() -> None:
        store = MemoryStore(FakeTimers())
        writes = Writes(store, None)
        writes.pending.append(("/a", b"1"))
        assert await store.get("/a") is None
        await writes.flush()
        entry = await store.get("/a")
        assert entry is not None and entry.value == b"1" and writes.pending == []
        asked: list[str] = []

        async def fence(key: str, value: bytes) -> bool:
            asked.append(key)
            return key != "/deposed" and await store.put(key, value) > 0

        fenced = Writes(store, fence)
        await fenced.put_all([("/b", b"2"), ("/c", b"3")])
        assert asked == ["/b", "/c"]
        with pytest.raises(NotCoordinator):
            await fenced.put("/deposed", b"x")
        assert await store.get("/deposed") is None

    asyncio.run(asyncio.wait_for(main(), BOUND))
