"""The stacks exchange on the in-memory store: one report of every node's ranks, printed once by every node.

Each node's sampling is a function handed to the exchange (the seam the agent fills with the real sampler);
what is under test is the exchange: who asks, who answers, what every node prints, and the naming of nodes
that do not answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rankrun.ranks import NodeRanks
from rankrun.rendezvous.keys import Assignment, Keys, node_value
from rankrun.rendezvous.round import NodeInfo
from rankrun.stacks import exchange as exchange_module
from rankrun.stacks.dump import Dump, Frame, ThreadStack
from rankrun.stacks.exchange import Exchange
from rankrun.stacks.report import ProcState, RankSample
from rankrun.stacks.wire import Ask
from rankrun.store.memory import MemoryStore

BOUND = 30.0
NPROC = 2
WAIT = (Frame("/w/train.py", 9, "<module>"), Frame("/w/train.py", 4, "wait_for_peers"))
ODD = (Frame("/w/train.py", 9, "<module>"), Frame("/w/train.py", 7, "stuck_loading_data"))


class Node:
    """One agent's side: its exchange over the shared store, what it printed, how often it was sampled."""

    def __init__(self, store: MemoryStore, keys: Keys, index: int, nodes: int, odd: int) -> None:
        self.index, self.odd = index, odd
        self.printed: list[list[str]] = []
        self.sampled = 0
        self.asked_for: list[str] = []
        place = Assignment(0, index, nodes, NodeRanks(index * NPROC, nodes * NPROC, index * NPROC, nodes * NPROC),
                           "127.0.0.1", 29500, 0)
        self.exchange = Exchange(store, keys, f"n{index}", place, host=f"h{index}", run_id="job", sample=self._sample,
                                 show=lambda lines: self.printed.append(list(lines)))
        self.serving: asyncio.Task[None] | None = None

    async def _sample(self, why: str) -> list[RankSample]:
        self.sampled += 1
        self.asked_for.append(why)
        ranks = range(self.index * NPROC, (self.index + 1) * NPROC)
        return [RankSample(r, f"h{self.index}", Dump((ThreadStack(1, True, ODD if r == self.odd else WAIT),)),
                           ProcState("S", 0.0)) for r in ranks]


async def _job(nodes: int, odd: int, serving: Sequence[int] | None = None) -> tuple[MemoryStore, list[Node]]:
    store, keys = MemoryStore(), Keys.for_run("job")
    members = [Node(store, keys, i, nodes, odd) for i in range(nodes)]
    for m in members:
        await store.put(keys.node(f"n{m.index}"), node_value(NodeInfo(f"n{m.index}", 0, NPROC, "default",
                                                                      f"10.0.0.{m.index + 1}", f"h{m.index}")))
        await store.put(keys.assign(f"n{m.index}"), m.exchange.place.value())
    for m in members:
        if serving is None or m.index in serving:
            m.serving = asyncio.create_task(m.exchange.serve())
    async with asyncio.timeout(BOUND):
        for m in members:
            if m.serving is not None:
                await m.exchange.serving.wait()  # its watches are in place before anyone asks
    return store, members


async def _stop(members: list[Node]) -> None:
    for m in members:
        if m.serving is not None:
            m.serving.cancel()
    await asyncio.gather(*(m.serving for m in members if m.serving is not None), return_exceptions=True)


async def _printed_by_all(members: list[Node]) -> None:
    while not all(m.printed for m in members):
        await asyncio.sleep(0.01)  # printing is a callback the exchange calls; polled, bounded by the caller


def test_one_stall_is_one_report_of_every_rank_printed_once_by_every_node() -> None:
    async def scenario() -> None:
        _, members = await _job(3, odd=5)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(BOUND):
            report = await members[0].exchange.stall("12", since=loop.time())
            await _printed_by_all(members)
            later = await members[2].exchange.stall("13", since=loop.time() - 60)  # silent before the report came
        await _stop(members)
        assert later == report and all(m.asked_for == ["stall"] for m in members)  # the later stall asked nobody again
        lines = members[1].printed[0]
        assert lines[0] == "rankrun: job job stalled: no output for 12 s; 2 distinct stacks across 6 ranks on 3 nodes"
        odd = next(i for i, line in enumerate(lines) if line.startswith("  rank 5 on h2 (1 rank;"))
        assert odd < next(i for i, line in enumerate(lines) if line.startswith("  ranks 0-4 on h0, h1, h2 (5 ranks;"))
        assert all(m.printed == [lines] for m in members)  # every node, once
        assert report.cause == "no output for 12 s; rank 5 on h2 (the smallest group of stacks) at /w/train.py:7 in stuck_loading_data"
        assert report.blame == "n2"  # the node holding the outlier, by its id in the rendezvous (asked by n0)

    asyncio.run(scenario())


def test_two_nodes_stalling_together_ask_once() -> None:
    async def scenario() -> None:
        _, members = await _job(2, odd=3)
        now = asyncio.get_running_loop().time()
        async with asyncio.timeout(BOUND):
            first, second = await asyncio.gather(members[0].exchange.stall("5", now), members[1].exchange.stall("5", now))
        await _stop(members)
        assert first == second and [m.sampled for m in members] == [1, 1]
        assert [len(m.printed) for m in members] == [1, 1]

    asyncio.run(scenario())


def test_a_node_that_does_not_answer_is_named_with_its_address_and_ranks(monkeypatch) -> None:
    monkeypatch.setattr(exchange_module, "ANSWER_BOUND", 0.2)  # waited out whole: its length is not the point

    async def scenario() -> None:
        _, members = await _job(3, odd=1, serving=[0, 1])  # node 2's agent is stuck: it never answers
        async with asyncio.timeout(BOUND):
            lines = await members[0].exchange.request()
        await _stop(members)
        assert lines[0] == "rankrun: job job stacks on request: 2 distinct stacks across 4 ranks on 2 nodes"
        assert lines[-1] == "  node 2 (10.0.0.3; ranks 4-5): no answer — its agent is stuck or gone"
        assert [m.printed for m in members] == [[], [], []]  # a request is the asker's alone
        assert [m.asked_for for m in members] == [["request"], ["request"], []]

    asyncio.run(scenario())


def test_a_stall_whose_asker_never_reports_is_asked_again(monkeypatch) -> None:
    monkeypatch.setattr(exchange_module, "REPORT_BOUND", 0.2)  # waited out whole: its length is not the point

    async def scenario() -> None:
        store, members = await _job(2, odd=3)
        keys = members[0].exchange.keys  # the ask of an agent that got stuck right after asking
        await store.put(keys.stacks_ask, Ask(0, "n-gone", "stall").value())
        async with asyncio.timeout(BOUND):
            report = await members[1].exchange.stall("9", asyncio.get_running_loop().time())
            await _printed_by_all(members)
        await _stop(members)
        assert "stalled" in report.lines[0] and [len(m.printed) for m in members] == [1, 1]

    asyncio.run(scenario())


def test_the_asker_stops_waiting_once_every_node_of_the_round_answered(monkeypatch) -> None:
    """Every node answers: the report comes then, not when ``ANSWER_BOUND`` runs out (made longer than this test's
    own bound here, so that waiting it out fails the test rather than slowing it)."""
    monkeypatch.setattr(exchange_module, "ANSWER_BOUND", 2 * BOUND)

    async def scenario() -> None:
        _, members = await _job(3, odd=1)
        async with asyncio.timeout(BOUND):
            lines = await members[0].exchange.request()
            report = await members[1].exchange.stall("4", asyncio.get_running_loop().time())
        await _stop(members)
        assert lines[0] == "rankrun: job job stacks on request: 2 distinct stacks across 6 ranks on 3 nodes"
        assert report.lines[0] == "rankrun: job job stalled: no output for 4 s; 2 distinct stacks across 6 ranks on 3 nodes"

    asyncio.run(scenario())


def test_a_stall_whose_node_did_not_answer_blames_nobody(monkeypatch) -> None:
    """The smallest group of what was seen need not be the job's: with node 2's stacks missing, rank 1 stands out
    among the ranks seen, yet its node is not blamed."""
    monkeypatch.setattr(exchange_module, "ANSWER_BOUND", 0.2)

    async def scenario() -> None:
        _, members = await _job(3, odd=1, serving=[0, 1])  # node 2's agent is stuck: it never answers
        async with asyncio.timeout(BOUND):
            report = await members[0].exchange.stall("7", asyncio.get_running_loop().time())
        await _stop(members)
        assert "rank 1 on h0 (the smallest group of stacks)" in report.cause and report.blame == ""

    asyncio.run(scenario())
