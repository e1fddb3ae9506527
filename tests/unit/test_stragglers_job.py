"""The straggler watch of several nodes as each node's agent runs it (``rankrun.agent.stragglers.job``), in-process on
the in-memory store: two nodes whose wall clocks disagree by 50 ms send their windows to the host on the host's
clock, the host judges the job, every node says what changed, and the host blames a node that stays slow."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from fakes import FakeTimers
from rankrun.agent.stragglers.job import STREAK, JobStragglers
from rankrun.agent.stragglers.watch import Said
from rankrun.events.records import Record
from rankrun.events.stream import EventStream
from rankrun.rendezvous import stragglers
from rankrun.rendezvous.keys import Keys
from rankrun.store.memory import MemoryStore
from rankrun.straggler.verdict import Arrivals, RankWindow

KEYS = Keys.for_run("job")
BOUND = 10  # each scenario takes well under a second: a mutant that hangs one fails it soon
WINDOW = 12.0
NODES = {"n0": (0, 1), "n1": (2, 3)}


def _where(node: str) -> str:
    return f"node-{node[1]}/127.0.0.{2 + int(node[1])}"


def _arrivals(ranks: tuple[int, ...], slow: int | None, number: int, behind: float) -> Arrivals:
    """40 collectives of window ``number`` as a node's clock, ``behind`` seconds behind the true time, reads them:
    every rank within 2 ms of the others, ``slow`` 250 ms after them."""
    rng = random.Random(number)
    out, t = {}, time.time() + 100 * number
    for seq in range(1 + 40 * (number - 1), 1 + 40 * number):
        out[("0", seq)] = {r: t - behind + (0.25 if r == slow else 0.0) + rng.uniform(-0.002, 0.002) for r in ranks}
        t += 0.3
    return out


class Job:
    """The host (n0, on the true clock) and n1 (``behind`` seconds behind it), each its agent's ``JobStragglers``."""

    def __init__(self, behind: float, store: MemoryStore | None = None, leases: dict[str, int] | None = None) -> None:
        self.store = store or MemoryStore(FakeTimers())
        self.behind = behind
        self.blames: list[tuple[str, str]] = []
        self.lines: list[str] = []
        self.events: list[Record] = []
        clocks = {"n0": time.time, "n1": lambda: time.time() - behind}
        self.nodes = {node: JobStragglers(self.store, KEYS, 1, node, 2, WINDOW,
                                          Said(self.lines.append, EventStream("run", node, [self])), where=_where(node),
                                          host=node == "n0", now=clocks[node], blame=self._blame,
                                          lease=(leases or {}).get(node, 0))
                      for node in NODES}
        self.tasks = [asyncio.create_task(job.run()) for job in self.nodes.values()]

    def on_event(self, event: Record) -> None:
        self.events.append(event)

    async def _blame(self, node: str, why: str) -> None:
        self.blames.append((node, why))

    async def window(self, number: int, slow: int | None) -> None:
        """Window ``number`` of both nodes, sent to the host (each on its own clock)."""
        for node, ranks in NODES.items():
            behind = self.behind if node == "n1" else 0.0
            await self.nodes[node].judge([RankWindow(r, _where(node), cpu=1.0, state="R") for r in ranks],
                                         _arrivals(ranks, slow, number, behind), WINDOW)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.store.close()


@pytest.mark.parametrize("behind", [0.050, -0.050])
def test_clocks_50_ms_apart_name_the_slow_rank_and_nobody_else(behind):
    """n1's arrivals go out on the host's clock: a rank of n0 250 ms late is the one straggler. On n1's own clock, or
    shifted the wrong way, n1's ranks would look 100 ms early or late: n0's healthy rank named too, or n1's."""
    async def main() -> list[int]:
        job = Job(behind)
        try:
            await job.window(1, slow=1)
            async for found in stragglers.verdicts(job.store, KEYS, 1):
                return [s.rank for s in found]
            return []
        finally:
            await job.close()

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == [1]


def test_a_rank_slow_for_three_windows_in_a_row_gets_its_node_blamed_once():
    async def main() -> list[tuple[str, str]]:
        job = Job(0.020)
        try:
            reading = aiter(stragglers.verdicts(job.store, KEYS, 1))
            for number in range(1, STREAK + 1):
                await job.window(number, slow=1)
                assert [s.rank for s in await anext(reading)] == [1]
            while not job.blames:  # the host blames once it wrote the verdict: a turn or two later
                await asyncio.sleep(0.01)
            return job.blames
        finally:
            await job.close()

    blames = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert [node for node, _ in blames] == ["n0"]
    assert blames[0][1].startswith("rank 1 on node-0/127.0.0.2 held the others back for 3 windows in a row (late on")


def test_a_straggler_that_keeps_up_again_is_said_on_every_node():
    async def main() -> Job:
        job = Job(0.020)
        try:
            reading = aiter(stragglers.verdicts(job.store, KEYS, 1))
            for number, slow in ((1, 1), (2, None)):
                await job.window(number, slow)
                await anext(reading)
            while len(job.lines) < 4:  # each node says the verdict once it read it: a turn or two later
                await asyncio.sleep(0.01)
            return job
        finally:
            await job.close()

    job = asyncio.run(asyncio.wait_for(main(), BOUND))
    again = "rankrun: straggler: rank 1 on node-0/127.0.0.2 keeps up again: the others no longer wait for it"
    assert [line == again for line in job.lines].count(True) == 2 and len(job.lines) == 4
    assert sorted((e.node, e.verdict) for e in job.events) == [  # type: ignore[attr-defined]
        ("n0", "named"), ("n0", "recovered"), ("n1", "named"), ("n1", "recovered")]


def test_each_nodes_keys_go_with_its_lease():
    """A node that is lost (its lease revoked) takes its questions and windows with it; the host's answers and verdict
    go with the host's."""
    async def main() -> None:
        store = MemoryStore(FakeTimers())
        leases = {node: await store.grant(60) for node in NODES}
        job = Job(0.020, store, {node: lease.id for node, lease in leases.items()})
        try:
            reading = aiter(stragglers.verdicts(store, KEYS, 1))
            await job.window(1, slow=1)
            await anext(reading)
            mine = [KEYS.straggler_ask(1, "n1"), KEYS.straggler_window(1, "n1")]
            hosts = [KEYS.straggler_time(1, "n1"), KEYS.straggler_window(1, "n0"), KEYS.straggler_verdict(1)]
            assert all(store.read(key) is not None for key in mine + hosts)
            await leases["n1"].revoke()
            assert [store.read(key) is None for key in mine + hosts] == [True, True, False, False, False]
            await leases["n0"].revoke()
            assert all(store.read(key) is None for key in hosts)
        finally:
            await job.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))
