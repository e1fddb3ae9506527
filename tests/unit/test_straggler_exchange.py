"""The straggler watch of several nodes over the rendezvous's keys (``rankrun.rendezvous.stragglers``) on the
in-memory store: a node's clock offset to the host recovered through the store with an injected skew, the host
judging the job from every node's windows, and every node reading the verdict."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from fakes import FakeTimers
from rankrun.rendezvous import stragglers
from rankrun.rendezvous.keys import Keys
from rankrun.store.api import Store
from rankrun.store.memory import MemoryStore
from rankrun.straggler import summary
from rankrun.straggler.summary import NodeWindow
from rankrun.straggler.verdict import RankWindow

KEYS = Keys.for_run("job")
BOUND = 30


async def _skewed_offset(store: MemoryStore, node_side: Store, skew: float) -> float:
    """The host answers on ``store``'s own side with its clock ``skew`` ahead; the node asks through ``node_side``."""
    async def put(key: str, value: bytes) -> None:
        await store.put(key, value)

    host = asyncio.create_task(stragglers.answer_clocks(store, KEYS, 1, lambda: time.time() + skew, put))
    try:
        found = await stragglers.offset(node_side, KEYS, 1, "n1", time.time)
    finally:
        host.cancel()
        await asyncio.gather(host, return_exceptions=True)
    assert found is not None
    return found.offset


@pytest.mark.parametrize("skew", [0.050, -0.050])
def test_a_nodes_offset_to_the_host_is_recovered_through_the_store_within_2_ms(skew):
    async def main() -> float:
        store = MemoryStore(FakeTimers())
        return await _skewed_offset(store, store, skew)

    assert abs(asyncio.run(asyncio.wait_for(main(), BOUND)) - skew) <= 0.002


def test_no_answer_from_the_host_is_no_offset(monkeypatch):
    monkeypatch.setattr(stragglers, "ASK_BOUND", 0.1)
    assert asyncio.run(stragglers.offset(MemoryStore(FakeTimers()), KEYS, 1, "n1", time.time)) is None


def _window(node: str, ranks: tuple[int, ...], slow: int | None, number: int) -> NodeWindow:
    rng = random.Random(number)
    arrivals, t = {}, 1_796_000_000.0 + 100 * number
    for seq in range(1 + 40 * (number - 1), 1 + 40 * number):
        arrivals[("0", seq)] = {r: t + 0.05 + (0.25 if r == slow else 0.0) + rng.uniform(-0.002, 0.002) for r in ranks}
        t += 0.3
    where = f"node-{node[1]}/127.0.0.{2 + int(node[1])}"
    return NodeWindow(node, number, tuple(RankWindow(r, where, cpu=1.0, state="R") for r in ranks),
                      summary.pick(arrivals), 40, 12.0)


def test_the_host_judges_once_every_node_sent_a_window_and_every_node_reads_the_verdict():
    async def main() -> list[list[int]]:
        store = MemoryStore(FakeTimers())

        async def put(key: str, value: bytes) -> None:
            await store.put(key, value)

        told: list[list[int]] = []
        owners: list[dict[int, str]] = []

        async def tell(found, owner) -> None:
            told.append([s.rank for s in found])
            owners.append(dict(owner))

        host = asyncio.create_task(stragglers.judge_job(store, KEYS, 1, 2, put, 12.0, tell=tell))
        read: list[list[int]] = []

        async def reader() -> None:
            async for found in stragglers.verdicts(store, KEYS, 1):
                read.append([s.rank for s in found])
                if len(read) == 1:
                    return

        reading = asyncio.create_task(reader())
        await asyncio.sleep(0)
        await stragglers.publish(store, KEYS, 1, _window("n0", (0, 1), None, 1))
        await asyncio.sleep(0.05)
        assert told == []  # n1 has not sent its window yet
        await stragglers.publish(store, KEYS, 1, _window("n1", (2, 3), 3, 1))
        await asyncio.wait_for(reading, BOUND)
        host.cancel()
        await asyncio.gather(host, return_exceptions=True)
        assert told == read
        assert owners == [{0: "n0", 1: "n0", 2: "n1", 3: "n1"}]
        return read

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == [[3]]


def test_a_straggler_that_keeps_up_again_is_a_verdict_of_nobody_written_and_told():
    """A verdict naming nobody after one that named somebody is written, so every node says "keeps up again" and
    emits its ``recovered`` event, and the host's ``tell`` hears it (its streaks start afresh); a balanced window after
    that writes nothing more."""
    async def main() -> tuple[list[list[int]], list[list[int]]]:
        store = MemoryStore(FakeTimers())

        async def put(key: str, value: bytes) -> None:
            await store.put(key, value)

        told: list[list[int]] = []

        async def tell(found, owner) -> None:
            del owner
            told.append([s.rank for s in found])

        host = asyncio.create_task(stragglers.judge_job(store, KEYS, 1, 2, put, 12.0, tell=tell))
        reading = aiter(stragglers.verdicts(store, KEYS, 1))
        read = []
        await asyncio.sleep(0)  # the host watches the windows' keys (the in-memory store answers at once)
        for number, slow in ((1, 3), (2, None), (3, None)):
            await stragglers.publish(store, KEYS, 1, _window("n0", (0, 1), None, number))
            await stragglers.publish(store, KEYS, 1, _window("n1", (2, 3), slow, number))
            if number < 3:
                read.append([s.rank for s in await asyncio.wait_for(anext(reading), 10)])
        with pytest.raises(TimeoutError):  # nobody before, nobody now: nothing written
            await asyncio.wait_for(anext(reading), 0.2)
        host.cancel()
        await asyncio.gather(host, return_exceptions=True)
        return read, told

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == ([[3], []], [[3], []])


def test_a_node_that_sends_nothing_does_not_hold_the_verdict_back():
    async def main() -> list[int]:
        store = MemoryStore(FakeTimers())

        async def put(key: str, value: bytes) -> None:
            await store.put(key, value)

        # n0 alone sends (its two ranks, one slow); n1's agent is busy: the host judges after LATE windows of 0.2 s
        host = asyncio.create_task(stragglers.judge_job(store, KEYS, 1, 2, put, 0.2))
        await stragglers.publish(store, KEYS, 1, _window("n0", (0, 1), 1, 1))
        async for found in stragglers.verdicts(store, KEYS, 1):
            host.cancel()
            await asyncio.gather(host, return_exceptions=True)
            return [s.rank for s in found]
        return []

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == [1]


@pytest.mark.parametrize("skew", [0.050, -0.050])
def test_over_the_embedded_store_on_loopback_the_skew_is_recovered_within_2_ms(skew):
    """The node's questions go through a real client over TCP to the embedded store's server; the host answers from
    the store's own side (its agent runs beside the server, as on the host node)."""
    from rankrun.store.embedded.client import StoreClient  # noqa: PLC0415
    from rankrun.store.embedded.server import StoreServer  # noqa: PLC0415

    async def main() -> float:
        store = MemoryStore(FakeTimers())
        server = StoreServer(store, secret=b"secret")
        port = await server.start("127.0.0.1", 0)
        client = await StoreClient.connect("127.0.0.1", port, b"secret")
        try:
            return await _skewed_offset(store, client, skew)
        finally:
            await client.close()
            await server.close()

    assert abs(asyncio.run(asyncio.wait_for(main(), BOUND)) - skew) <= 0.002


def test_the_hosts_windows_are_judged_on_what_each_node_sent_and_nobody_is_written_only_after_somebody():
    """``Windows`` (pure): a malformed window passed over, the nodes that sent one counted until a verdict starts them
    afresh, a verdict of nobody worth writing only after one that named somebody, and each rank's node id."""
    prefix = KEYS.straggler_windows(1)
    windows = stragglers.Windows(prefix)
    windows.take(prefix + "n9", b"not a window")
    assert windows.fresh == set()
    for number, slow, written in ((1, None, None), (2, 3, [3]), (3, None, []), (4, None, None)):
        windows.take(prefix + "n0", summary.encode(_window("n0", (0, 1), None, number)))
        windows.take(prefix + "n1", summary.encode(_window("n1", (2, 3), slow, number)))
        assert windows.fresh == {"n0", "n1"}
        found = windows.judge()
        assert (None if found is None else [s.rank for s in found]) == written
        assert windows.fresh == set()
    assert windows.owners() == {0: "n0", 1: "n0", 2: "n1", 3: "n1"}
