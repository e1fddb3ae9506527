"""The goodput account at the job's end (``agent.goodput``): this node's line, and on several nodes the job's, from
every node's account shared through the (in-memory) store before each node reports to the coordinator."""

from __future__ import annotations

import asyncio
import json

import pytest

from rankrun.agent.goodput import GoodputShare, JobGoodput
from rankrun.agent.round import Round
from rankrun.events.goodput import from_value
from rankrun.events.records import CheckpointKept, JobEnd, JobStart, Record, Training, WorkersEnd, WorkersStart, stamp
from rankrun.ranks import NodeRanks
from rankrun.rendezvous.keys import Assignment, Keys, RoundWord
from rankrun.rendezvous.member import Member
from rankrun.rendezvous.round import NodeInfo, Phase
from rankrun.store.memory import MemoryStore

BOUND = 30.0


def _events(node: str, *pairs: tuple[float, Record]) -> JobGoodput:
    goodput = JobGoodput()
    for mono, fact in pairs:
        goodput.on_event(stamp(fact, 1_767_225_500.0 + mono, mono, "job", node))
    return goodput


def _trained(node: str, first: float, *, kept: bool = False, end: float = 110.0) -> JobGoodput:
    """A node whose one attempt started at 101 and trained from ``first`` to ``end``."""
    pairs: list[tuple[float, Record]] = [(100, JobStart(1, "2", 0, "c10d", "train.py")), (101, WorkersStart(0, "0", (7,))),
                                         (first, Training(0, first - 101))]
    if kept:
        pairs.append((105, CheckpointKept(5, "0", 10, 0.0, "kept", None)))
    pairs += [(end, WorkersEnd(0, "succeeded")), (end, JobEnd(0, "succeeded"))]
    return _events(node, *pairs)


def test_a_node_that_never_showed_a_sign_of_training_says_no_line():
    plain = _events("127.0.0.1", (100, JobStart(1, "1", 0, "c10d", "x")), (101, WorkersStart(0, "0", (7,))),
                    (110, WorkersEnd(0, "succeeded")), (110, JobEnd(0, "succeeded")))
    assert plain.line(plain.ledger.at(110)) is None
    refused = _events("127.0.0.1", (100, JobStart(1, "1", 0, "c10d", "x")), (100.1, JobEnd(2, "error")))
    assert refused.line(refused.ledger.at(100.1)) is None


def test_one_node_says_its_own_account():
    node = _trained("127.0.0.1", 103)
    assert node.line(node.ledger.at(110)) == ("goodput 70.0 % of 10.0 s — start-up 20.0 %, restarts 0 % (0), stalls 0 %, "
                                              "lost 0 %, waiting 10.0 %")


@pytest.mark.parametrize("nodes", [2, 3])
def test_the_host_says_the_jobs_account_from_every_nodes_naming_the_worst(nodes):
    async def scenario() -> str | None:
        store, keys = MemoryStore(), Keys.for_run("job")
        host = _trained("127.0.0.1", 102, kept=True)
        others = [_trained(f"127.0.0.{i + 1}", 102 + 2 * i, end=109.5) for i in range(1, nodes)]
        shares = []
        for i, goodput in enumerate([host, *others]):
            lease = await store.grant(30)
            member = Member(store, keys, NodeInfo(f"n{i}", i, 1, "default", f"127.0.0.{i + 1}", f"h{i}"), lease)
            shares.append(GoodputShare(goodput, member, lambda: 109.5, host=i == 0, bound=BOUND))
        word = Assignment(3, 0, nodes, NodeRanks(0, nodes, 0, nodes), "127.0.0.1", 29500, 0)
        for i, share in enumerate(shares):
            place = Assignment(3, i, nodes, NodeRanks(i, nodes, i, nodes), "127.0.0.1", 29500, 0)
            await share.after(Round(0, 0, place), None)  # type: ignore[arg-type]
        written = {e.key: json.loads(e.value) for e in (await store.range(keys.goodput(3)))[0]}
        assert sorted(written) == [keys.goodput_of(3, i) for i in range(1, nodes)]  # the host reads, it writes none
        assert all(from_value(v) is not None for v in written.values())
        assert [(v["node"], v["kept"]) for _, v in sorted(written.items())] == [(f"127.0.0.{i + 1}", False)
                                                                                for i in range(1, nodes)]
        assert [from_value(v) for _, v in sorted(written.items())] == [g.ledger.at(109.5) for g in others]
        await shares[0].ended(RoundWord(word.round, Phase.ENDED, stranded=True))
        assert not host.others  # a job stranded (too few nodes left) has no job's account to give
        await shares[0].ended(RoundWord(word.round, Phase.ENDED, ok=True))
        for share in shares[1:]:
            await share.ended(RoundWord(word.round, Phase.ENDED, ok=True))  # the others read nothing
        assert all(not g.others for g in others)
        return host.line(host.ledger.at(110))

    said = asyncio.run(asyncio.wait_for(scenario(), BOUND))
    worst = f"127.0.0.{nodes}"  # the last trained least: its first collective came latest
    assert said is not None and said.startswith("goodput ") and f"(the job, {nodes} nodes; the worst: {worst})" in said
    # the job's wall is the host's 10 s; the worst's parts, its missing half second as waiting
    first = 102 + 2 * (nodes - 1)
    assert said.split(" — ")[0].startswith(f"goodput {100 * (109.5 - first) / 10:.1f} % of 10.0 s")


def test_a_value_that_is_no_account_is_left_out_and_with_none_left_the_host_says_its_own():
    async def scenario(values: list[bytes]) -> str | None:
        store, keys = MemoryStore(), Keys.for_run("job")
        host = _trained("127.0.0.1", 102)
        member = Member(store, keys, NodeInfo("n0", 0, 1, "default", "127.0.0.1", "h0"), await store.grant(30))
        for i, value in enumerate(values, start=1):
            await store.put(keys.goodput_of(1, i), value)
        await GoodputShare(host, member, lambda: 110.0, host=True, bound=BOUND).ended(RoundWord(1, Phase.ENDED, ok=True))
        return host.line(host.ledger.at(110))

    bad = [b"not json", json.dumps({"node": "127.0.0.9", "wall_s": "ten"}).encode(),
           json.dumps({"node": "127.0.0.8", "wall_s": float("nan"), "productive_s": 1.0, "waiting_s": 0.0,
                       "startup_s": 0.0, "restart_s": 0.0, "stall_s": 0.0, "lost_s": 0.0}).encode()]
    own = asyncio.run(asyncio.wait_for(scenario(bad), BOUND))
    assert own is not None and "(the job" not in own
    good = json.dumps({"node": "127.0.0.2", "kept": False, "wall_s": 10.0, "productive_s": 1.0, "waiting_s": 9.0,
                       "startup_s": 0.0, "restart_s": 0.0, "stall_s": 0.0, "lost_s": 0.0}).encode()
    job = asyncio.run(asyncio.wait_for(scenario([*bad, good]), BOUND))
    assert job is not None and job.startswith("goodput 10.0 % of 10.0 s (the job, 2 nodes; the worst: 127.0.0.2)")


def test_a_node_keeps_one_account_in_the_store_its_last_rounds():
    async def scenario() -> list[str]:
        store, keys = MemoryStore(), Keys.for_run("job")
        node = _trained("127.0.0.2", 102)
        member = Member(store, keys, NodeInfo("n1", 1, 1, "default", "127.0.0.2", "h1"), await store.grant(30))
        share = GoodputShare(node, member, lambda: 109.0, host=False, bound=BOUND)
        for number in (1, 2, 4):
            await share.after(Round(number - 1, 0, Assignment(number, 1, 2, NodeRanks(1, 2, 1, 2), "127.0.0.1", 29500, 0)),
                              None)  # type: ignore[arg-type]
        return [e.key for e in (await store.range(keys.root + "goodput/"))[0]]

    assert asyncio.run(asyncio.wait_for(scenario(), BOUND)) == [Keys.for_run("job").goodput_of(4, 1)]


def test_the_jobs_line_says_nothing_was_kept_only_when_no_node_kept_a_step():
    def lost(node: str, kept: bool) -> JobGoodput:
        pairs: list[tuple[float, Record]] = [(100, JobStart(1, "2", 0, "c10d", "t.py")), (101, WorkersStart(0, "0", (7,))),
                                             (102, Training(0, 1.0))]
        if kept:
            pairs.append((104, CheckpointKept(5, "0", 10, 0.0, "kept", None)))
        pairs += [(106, WorkersEnd(0, "failed")), (110, JobEnd(1, "failed"))]
        return _events(node, *pairs)

    host = lost("127.0.0.1", kept=False)
    other = lost("127.0.0.2", kept=True)
    host.others = [("127.0.0.2", other.ledger.at(110), True)]
    said = host.line(host.ledger.at(110))
    assert said is not None and "nothing was kept" not in said and "(the job, 2 nodes; the worst: 127.0.0.1)" in said
    host.others = [("127.0.0.2", lost("127.0.0.2", kept=False).ledger.at(110), False)]
    said = host.line(host.ledger.at(110))
    assert said is not None and said.endswith("; nothing was kept (rankrun.checkpoint): each failed attempt lost all its "
                                              "training")
    alone = lost("127.0.0.1", kept=False)
    assert (alone.line(alone.ledger.at(110)) or "").startswith("goodput 0 % of 10.0 s — start-up 10.0 %, "
                                                               "restarts 40.0 % (0), stalls 0 %, lost 40.0 %")


def test_the_worst_named_is_the_node_whose_parts_the_jobs_account_takes_not_one_that_only_waited():
    host = _trained("127.0.0.1", 105)
    host.others = [("127.0.0.7", _events("127.0.0.7", (100, JobStart(1, "2", 0, "c10d", "t.py")),
                                         (100.5, JobEnd(0, "succeeded"))).ledger.at(100.5), False),
                   ("127.0.0.2", _trained("127.0.0.2", 103).ledger.at(110), False)]
    said = host.line(host.ledger.at(110))
    assert said is not None and said.startswith("goodput 50.0 % of 10.0 s (the job, 3 nodes; the worst: 127.0.0.1)")
