"""The rendezvous algorithm (coordinator + members) on the in-memory store: join, grow, shrink, spares, restarts, close."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket

import pytest

from counting import count_writes
from rankrun.cli import spec_from_args
from rankrun.errors import RendezvousClosed
from rankrun.rendezvous.coordinator import Coordinator
from rankrun.rendezvous.keys import Assignment, Keys, RoundWord, Spare
from rankrun.rendezvous.member import Ended, Member
from rankrun.rendezvous.round import NodeInfo, Phase, Settings
from rankrun.rendezvous.session import CONNECT_RETRY, _resolvable
from rankrun.store.api import StoreUnavailable
from rankrun.store.embedded.client import StoreClient
from rankrun.store.embedded.server import StoreServer
from rankrun.store.memory import MemoryStore

BOUND = 20.0
KEYS = Keys.for_run("job")


def _info(i: int, nproc: int = 2, *, host: bool = False, rank: int | None = None) -> NodeInfo:
    return NodeInfo(f"node{i}", 0, nproc, "default", f"127.0.0.{i + 1}", f"h{i}", rank, host)


async def _rig(settings: Settings):
    store = MemoryStore()
    resets: list[int] = []

    async def before_round() -> None:
        resets.append(1)

    coordinator = Coordinator(store, KEYS, settings, master=lambda: ("127.0.0.1", 29500), before_round=before_round,
                              why_gone=store.why_deleted)
    task = asyncio.create_task(coordinator.run())
    return store, coordinator, task, resets


def _run(body) -> None:
    asyncio.run(asyncio.wait_for(body(), BOUND))


def test_a_full_round_forms_at_once_with_the_host_first_and_ranks_by_join_order():
    async def body():
        store, _coordinator, task, resets = await _rig(Settings(2, 3, last_call_timeout=600.0, max_restarts=0))
        a = await Member.join(store, KEYS, _info(1, nproc=1), ttl=60)
        host = await Member.join(store, KEYS, _info(0, nproc=4, host=True), ttl=60)
        b = await Member.join(store, KEYS, _info(2, nproc=2), ttl=60)
        got = [await m.next_round(0) for m in (host, a, b)]  # MAX reached: no last-call wait
        assert all(isinstance(g, Assignment) for g in got)
        assert [(g.group_rank, g.ranks.base_rank, g.ranks.world_size) for g in got] == [(0, 0, 7), (1, 4, 7), (2, 5, 7)]
        assert {(g.round, g.master_addr, g.master_port, g.group_world_size) for g in got} == {(1, "127.0.0.1", 29500, 3)}
        assert resets == [1]  # the worker store was reset before the round
        for m in (host, a, b):
            await m.report(1, ok=True)
        ends = [await m.next_round(1) for m in (host, a, b)]
        assert all(isinstance(e, Ended) and e.word.ok for e in ends)
        with pytest.raises(RendezvousClosed):
            await Member.join(store, KEYS, _info(9), ttl=60)
        await asyncio.wait_for(task, BOUND)

    _run(body)


def test_min_then_last_call_then_a_late_joiner_regroups_the_running_round():
    async def body():
        store, _coordinator, task, _ = await _rig(Settings(1, 3, last_call_timeout=0.05, max_restarts=0))
        host = await Member.join(store, KEYS, _info(0, host=True), ttl=60)
        first = await host.next_round(0)  # MIN (1) reached, last call (50 ms) passed
        assert isinstance(first, Assignment) and first.group_world_size == 1
        changed = asyncio.create_task(host.round_changed(first.round))
        late = await Member.join(store, KEYS, _info(1), ttl=60)
        word = await changed
        assert (word.phase, word.reason) == (Phase.FORMING, "node node1 joined")
        again = [await m.next_round(first.round) for m in (host, late)]
        assert [(g.round, g.group_rank, g.group_world_size) for g in again] == [(2, 0, 2), (2, 1, 2)]
        assert again[0].restarts == 0  # a regroup is not a restart
        task.cancel()

    _run(body)


def test_a_lost_node_regroups_the_survivors_and_a_spare_takes_its_place():
    async def body():
        store, _coordinator, task, _ = await _rig(Settings(2, 2, last_call_timeout=600.0, max_restarts=0))
        host = await Member.join(store, KEYS, _info(0, host=True), ttl=60)
        a = await Member.join(store, KEYS, _info(1), ttl=60)
        spare = await Member.join(store, KEYS, _info(2), ttl=60)
        assert isinstance(await host.next_round(0), Assignment)
        assert await spare.next_round(0) == Spare(1)
        assert isinstance(await a.next_round(0), Assignment)
        changed = asyncio.create_task(host.round_changed(1))
        await a.leave()  # its lease goes: as when its agent dies and the lease expires
        assert (await changed).reason == "node node1 at 127.0.0.2 was lost: it left (revoked its lease)"
        second = [await m.next_round(1) for m in (host, spare)]
        assert [(g.round, g.group_rank) for g in second] == [(2, 0), (2, 1)]
        task.cancel()

    _run(body)


def test_one_restart_budget_for_the_whole_job_and_the_first_failure_named_everywhere():
    async def body():
        store, _coordinator, task, _ = await _rig(Settings(2, 2, last_call_timeout=600.0, max_restarts=1))
        host = await Member.join(store, KEYS, _info(0, host=True), ttl=60)
        a = await Member.join(store, KEYS, _info(1), ttl=60)
        assert isinstance(await host.next_round(0), Assignment)
        await a.next_round(0)
        await a.report(1, ok=False, summary="rank 3 on h1: exit code 1: ValueError: boom")
        again = [await m.next_round(1) for m in (host, a)]
        assert [(g.round, g.restarts) for g in again] == [(2, 1), (2, 1)]  # counted once, for both nodes
        await host.report(2, ok=False, summary="rank 0 on h0: exit code 2")
        await a.report(2, ok=False, summary="rank 3 on h1: again")
        ends = [await m.next_round(2) for m in (host, a)]
        assert all(isinstance(e, Ended) and not e.word.ok for e in ends)
        assert {e.word.cause for e in ends} == {"rank 0 on h0: exit code 2"}  # the first the store got
        await asyncio.wait_for(task, BOUND)

    _run(body)


def test_static_ranks_wait_for_every_node_rank():
    async def body():
        store, _coordinator, task, _ = await _rig(Settings(3, 3, 0.0, 0, static=True))
        nodes = [await Member.join(store, KEYS, _info(i, rank=r), ttl=60) for i, r in ((0, 2), (1, 0))]
        pending = asyncio.create_task(nodes[0].next_round(0))
        watch = await store.watch(KEYS.status, after=0)
        async for event in watch:  # the coordinator has seen both and published who is there
            if json.loads(event.value)["static_ranks"] == [0, 2]:
                break
        await watch.close()
        assert (await nodes[0].status()).joined == 2
        assert not pending.done()  # rank 1 is missing: no round
        nodes.append(await Member.join(store, KEYS, _info(2, rank=1), ttl=60))
        got = await pending
        assert isinstance(got, Assignment) and got.group_rank == 2  # node rank 2
        task.cancel()

    _run(body)


def test_an_elected_coordinator_takes_over_mid_job_leads_the_next_round_and_keeps_the_count():
    """On a shared store the coordinator is elected; its successor carries on from the round key."""

    async def body():
        store = MemoryStore()
        settings = Settings(2, 3, last_call_timeout=600.0, max_restarts=2)
        first = Coordinator(store, KEYS, settings, master=lambda: ("127.0.0.1", 1000), before_round=_nothing,
                            leader="node0")
        task = asyncio.create_task(first.run())
        members = [await Member.join(store, KEYS, _info(i, nproc=1), ttl=60) for i in range(3)]
        got = [await m.next_round(0) for m in members]
        assert [g.group_rank for g in got] == [0, 1, 2] and got[0].master_port == 1000
        task.cancel()  # node0, coordinator and group rank 0, is lost
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await members[0].lease.revoke()
        second = Coordinator(store, KEYS, settings, master=lambda: ("127.0.0.3", 2000), before_round=_nothing,
                             leader="node2")
        task = asyncio.create_task(second.run())
        word = await members[1].round_changed(1)
        assert (word.round, word.phase) == (1, Phase.FORMING)  # the successor stops the round it cannot vouch for
        again = [await m.next_round(1) for m in members[1:]]
        assert [(g.round, g.group_rank, g.master_addr, g.master_port) for g in again] == [
            (2, 1, "127.0.0.3", 2000), (2, 0, "127.0.0.3", 2000)]  # the new leader is group rank 0, with its store
        assert again[0].restarts == 0
        task.cancel()

    _run(body)


def test_a_successor_keeps_the_jobs_restart_count():
    """The budget is the job's: a coordinator elected mid-job carries the count on, it does not start from 0."""

    async def body():
        store = MemoryStore()
        settings = Settings(1, 2, last_call_timeout=600.0, max_restarts=3)
        await store.put(KEYS.round, RoundWord(4, Phase.RUNNING, restarts=2).value())
        successor = Coordinator(store, KEYS, settings, master=lambda: ("127.0.0.1", 1), before_round=_nothing, leader="node0")
        task = asyncio.create_task(successor.run())
        member = await Member.join(store, KEYS, _info(0, nproc=1), ttl=60)
        got = await member.next_round(4)
        assert (got.round, got.restarts) == (5, 2)
        task.cancel()

    _run(body)


async def _nothing() -> None:
    return None


def test_a_member_reads_only_its_own_assignment_when_another_id_extends_its_own():
    """Ranges and watches are by prefix: "assign/node1" also matches "assign/node10"."""

    async def body():
        store = MemoryStore()
        node1 = await Member.join(store, KEYS, _info(1), ttl=60)
        other = {"round": 1, "group_rank": 7, "group_world_size": 8, "master_addr": "127.0.0.9", "master_port": 9,
                 "ranks": {"base_rank": 14, "world_size": 16, "base_role_rank": 14, "role_world_size": 16}}
        await store.put(KEYS.assign("node10"), json.dumps(other).encode())
        await store.put(KEYS.round, json.dumps({"round": 1, "phase": "running"}).encode())
        waiting = asyncio.create_task(node1.next_round(0))
        await store.put(KEYS.assign("node11"), json.dumps(other).encode())  # seen by node1's watch: not its own
        await asyncio.sleep(0)
        assert not waiting.done()
        mine = other | {"group_rank": 0, "ranks": other["ranks"] | {"base_rank": 0}}
        await store.put(KEYS.assign("node1"), json.dumps(mine).encode())
        got = await waiting
        assert isinstance(got, Assignment) and (got.group_rank, got.ranks.base_rank) == (0, 0)

    _run(body)


def test_a_node_given_a_place_is_no_spare_even_if_the_job_ended_before_it_read_the_place():
    """A loaded node may read its first word only after another node's failure ended the job: it was given a place in
    that round, so it failed with the job (it was once told it had waited as a spare, and exited 0)."""

    async def body():
        store = MemoryStore()
        placed = await Member.join(store, KEYS, _info(1), ttl=60)
        spare = await Member.join(store, KEYS, _info(2), ttl=60)
        waiting = await Member.join(store, KEYS, _info(3), ttl=60)  # not even told it is a spare yet
        place = {"round": 1, "group_rank": 0, "group_world_size": 2, "master_addr": "127.0.0.2", "master_port": 9,
                 "ranks": {"base_rank": 0, "world_size": 4, "base_role_rank": 0, "role_world_size": 4}}
        await store.put(KEYS.assign("node1"), json.dumps(place).encode())
        await store.put(KEYS.round, RoundWord(1, Phase.ENDED, reason="rank 3 failed", cause="rank 3 failed").value())
        await store.put(KEYS.assign("node2"), Spare(1).value())
        ends = [await placed.next_round(0), await spare.next_round(0), await waiting.next_round(0)]
        assert [(type(e), e.placed) for e in ends if isinstance(e, Ended)] == [(Ended, True), (Ended, False), (Ended, False)]

    _run(body)


def test_a_coordinator_whose_watches_end_says_so_instead_of_going_deaf():
    async def body():
        store, _coordinator, task, _ = await _rig(Settings(2, 2, last_call_timeout=600.0, max_restarts=0))
        await Member.join(store, KEYS, _info(0), ttl=60)
        await store.close()  # its watches end with StoreUnavailable
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(task, BOUND)

    _run(body)


def test_a_successor_finishes_a_job_whose_coordinator_died_between_closed_and_the_end():
    async def body():
        store = MemoryStore()
        await store.put(KEYS.round, json.dumps({"round": 3, "phase": "running", "restarts": 1}).encode())
        await store.put(KEYS.closed, json.dumps({"ok": True}).encode())
        member = Member(store, KEYS, _info(1), await store.grant(60))
        successor = Coordinator(store, KEYS, Settings(1, 2, 600.0, 2), master=lambda: ("127.0.0.1", 1),
                                before_round=_nothing, leader="node1")
        await asyncio.wait_for(successor.run(), BOUND)  # returns: the job is over
        end = await member.next_round(3)
        assert isinstance(end, Ended) and end.word.ok and end.word.round == 3

    _run(body)


def test_a_master_name_that_does_not_resolve_yet_is_looked_up_again_less_and_less_often():
    """A name a scheduler has not published yet (a Kubernetes Service) is waited for with backoff, not a lookup every
    50 ms for up to ``join_timeout``; the resolver is a fake here, the wait is real (0.75 s in all)."""
    spec = spec_from_args(["--nnodes", "2", "--node-rank", "1", "--master-addr", "master-0", "--master-port", "29500",
                           "--no-python", "true"], {"PATH": "/usr/bin:/bin", "RANKRUN_RDZV_SECRET": "s"})
    said: list[str] = []

    async def body():
        loop = asyncio.get_running_loop()
        looked: list[float] = []

        async def getaddrinfo(host, port, **kwargs):
            looked.append(loop.time())
            if len(looked) < 5:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

        loop.getaddrinfo = getaddrinfo  # type: ignore[method-assign]
        await _resolvable(spec, "master-0", 29500, said.append, loop.time() + spec.rendezvous.conf.join_timeout)
        return [b - a for a, b in itertools.pairwise(looked)]

    gaps = asyncio.run(asyncio.wait_for(body(), BOUND))
    first = CONNECT_RETRY[0]
    assert len(gaps) == 4 and all(gap >= 0.9 * first * 2**i for i, gap in enumerate(gaps)), gaps  # 0.05, 0.1, 0.2, 0.4 s
    assert said == ["rendezvous master-0:29500: waiting for master-0 to resolve: Name or service not known"]


def test_a_node_waiting_for_the_end_hears_every_word_before_it_with_the_exclusions_made_meanwhile():
    """An excluded node that serves the job without workers tells each later exclusion as it is made (``heard``)."""
    async def body():
        store = MemoryStore()
        first = RoundWord(2, Phase.RUNNING, 1, excluded=(("node0 at 127.0.0.1", "blamed for 2 failures"),))
        await store.put(KEYS.round, first.value())
        member = Member(store, KEYS, _info(0), await store.grant(60))
        heard: list[RoundWord] = []
        waiting = asyncio.create_task(member.wait_for_end(heard.append))
        later = RoundWord(3, Phase.RUNNING, 2, excluded=(*first.excluded, ("node2 at 127.0.0.3", "unhealthy: x")))
        while not heard:  # the current word first, before the watch (bounded by BOUND below)
            await asyncio.sleep(0)
        await store.put(KEYS.round, later.value())
        end = RoundWord(3, Phase.ENDED, 2, ok=True, excluded=later.excluded)
        await store.put(KEYS.round, end.value())
        assert await asyncio.wait_for(waiting, BOUND) == end
        assert heard == [first, later]

    _run(body)


def test_over_the_embedded_store_a_join_and_a_round_make_their_requests_together():
    """On the embedded client (``store.api.pipelines``) a join is two writes (its two reads with its grant, then its
    put) and a round whose assignment comes later three (its two ranges, its two watches, their two closes); one
    request after another they would be four and five."""
    async def body():
        memory = MemoryStore()
        server = StoreServer(memory, b"s")
        client = await StoreClient.connect("127.0.0.1", await server.start("127.0.0.1", 0), b"s")
        writes = count_writes(client)
        coordinator = Coordinator(memory, KEYS, Settings(1, 1, last_call_timeout=600.0, max_restarts=0),
                                  master=lambda: ("127.0.0.1", 29500), before_round=_nothing, why_gone=memory.why_deleted)
        task = None
        try:
            member = await Member.join(client, KEYS, _info(1), ttl=60)
            assert len(writes) == 2 and writes[0].count(b'"op":') == 3
            writes.clear()
            waiting = asyncio.ensure_future(member.next_round(0))
            while not client.watches:  # both watches asked for: the round may form
                await asyncio.sleep(0)
            task = asyncio.create_task(coordinator.run())
            assert isinstance(await waiting, Assignment)
            assert len(writes) == 3 and [w.count(b'"op":') for w in writes] == [2, 2, 2]
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await client.close()
            await server.close()
            await memory.close()

    _run(body)


async def _nothing() -> None:
    return None
