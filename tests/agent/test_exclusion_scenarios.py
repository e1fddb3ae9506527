"""Exclusion on several agents in one process, on one in-memory store, with fake spawners (issue 23).

The real rounds, session and coordinator, as in ``test_multinode_scenarios``; only the backend (a shared
``MemoryStore``) and the workers are fakes. A node blamed ``--max-node-failures`` times, or that reports itself
unhealthy, is excluded: it leaves with ``NodeExcluded`` (exit code 4), or, hosting the store, serves on without
workers; the job goes on without it (a spare in its place), or ends at once when it cannot; a launcher of that node
that comes back is refused at join, the job undisturbed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_multinode_scenarios import BOUND, Agent, Plan, _spec, shared

from fakes import Behaviour, FakeHandle, FakeTimers
from rankrun.agent.attempt import Outcome
from rankrun.agent.lines import ConsoleLines
from rankrun.agent.multinode import _left_out, run_multinode
from rankrun.errors import EXIT_UNHEALTHY, LauncherError, NodeExcluded, RankrunError, RendezvousClosed
from rankrun.events.records import NodeExcluded as ExcludedFact
from rankrun.events.records import RdzvRound, Record, Restart
from rankrun.logs.layout import RunLogs
from rankrun.proc.signals import StopStream
from rankrun.rendezvous.coordinator import Coordinator
from rankrun.rendezvous.keys import Assignment, Blocked, Excluded, Keys, RoundWord, node_from, node_value, place_from
from rankrun.rendezvous.member import Ended, Member
from rankrun.rendezvous.round import NodeInfo, Phase, Settings
from rankrun.rendezvous.session import Session, node_info, open_session, ttl
from rankrun.spec import LaunchSpec
from rankrun.store.api import EventKind
from rankrun.store.embedded.client import StoreClient
from rankrun.store.embedded.server import StoreServer
from rankrun.store.memory import MemoryStore

KEYS = Keys.for_run("fake")
# three nodes start round 1 together (MAX: at once); a round re-formed after an exclusion starts at once too
ELASTIC = ("--max-restarts", "3", "--rdzv-conf", "last_call_timeout=5")


def _fails(attempt: int, rank: int) -> Behaviour:
    """A black hole: its workers exit 1 at start, every attempt."""
    return Behaviour(exit_status=1, stderr=b'Traceback (most recent call last):\n  File "train.py", line 1, in <module>\n'
                                           b"RuntimeError: CUDA error: uncorrectable ECC error encountered\n")


def _waits(attempt: int, rank: int) -> Behaviour:
    """Runs until stopped (or until the scenario makes it exit)."""
    return Behaviour()


class Node(Agent):
    """An agent whose session, events and console lines the scenario can see."""

    def __init__(self, tmp_path: Path, store: MemoryStore, index: int, plan: Plan, *, host: bool = False,
                 done: Callable[[dict[str, str]], bool] | None = None) -> None:
        super().__init__(tmp_path, store, index, plan, host=host)
        started = self.spawner.after_spawn

        def spawned(handle: FakeHandle) -> None:
            if started is not None:
                started(handle)
            if done is not None and done(handle.env):  # its work done once the round is as the scenario wants
                handle.exit(0)

        self.spawner.after_spawn = spawned
        self.events: list[Record] = []
        self.session: Session | None = None
        self.joined = asyncio.Event()
        opened = shared(store, index, host=host)

        async def backend(spec, worker_store, say, stack, unhealthy=None):
            session, lead = await opened(spec, worker_store, say, stack, unhealthy)
            self.session = session
            self.joined.set()
            return session, lead

        self.deps.rendezvous = backend
        self.deps.events.node = f"127.0.0.{index + 1}"  # as run_agent names it: the node's address
        self.deps.events.add(self)

    def on_event(self, event: Record) -> None:
        self.events.append(event)

    async def run(self, spec: LaunchSpec) -> Outcome | RankrunError:  # type: ignore[override]
        self.deps.events.add(ConsoleLines(self.console.say, spec.restart.max_restarts))
        logs = RunLogs(spec.logs, spec.rendezvous.run_id)
        try:
            return await run_multinode(spec, self.deps, StopStream(), logs)
        except RankrunError as exc:  # NodeExcluded is no LauncherError: exit code 4, not 3
            return exc
        finally:
            logs.finish()

    def rounds(self) -> list[RdzvRound]:
        return [e for e in self.events if isinstance(e, RdzvRound)]

    def last(self) -> FakeHandle:
        return self.spawner.spawned[-1]


def _play(tmp_path: Path, spec: LaunchSpec, plans: list[Plan],
          during: Callable[[MemoryStore, list[Node]], Awaitable[None]] | None = None,
          done: Callable[[dict[str, str]], bool] | None = None):
    store = MemoryStore(FakeTimers())
    nodes = [Node(tmp_path, store, i, plan, host=i == 0, done=done) for i, plan in enumerate(plans)]

    async def main():
        runs = [asyncio.create_task(n.run(spec)) for n in nodes]
        if during is not None:
            await during(store, nodes)
        return await asyncio.gather(*runs)

    try:
        ends = asyncio.run(asyncio.wait_for(main(), BOUND))
    finally:
        errs = [n.close() for n in nodes]
    return ends, nodes, errs, store


async def _when(condition: Callable[[], bool]) -> None:
    """A condition of the fakes' state, checked as the loop turns (every agent here shares this one loop)."""
    while not condition():
        await asyncio.sleep(0)


def _waits_then_ok_from(attempt_ok: int) -> Plan:
    return lambda attempt, rank: Behaviour(exit_status=0) if attempt >= attempt_ok else Behaviour()


def _without_one(env: dict[str, str]) -> bool:
    """A healthy node's work is done in the first round of two nodes (whatever its attempt: a node still stopping its
    workers may skip a round that failed at once)."""
    return env["WORLD_SIZE"] == "2"


def test_a_black_hole_is_excluded_after_k_failures_and_the_others_finish_without_it(tmp_path):
    spec = _spec(tmp_path, "2:3", *ELASTIC)
    ends, nodes, errs, store = _play(tmp_path, spec, [_waits, _waits, _fails], done=_without_one)
    host, other, hole = ends
    assert isinstance(host, Outcome) and isinstance(other, Outcome), errs
    assert (host.exit_code, other.exit_code) == (0, 0)
    assert host.restarts == other.restarts == 2  # the two failures' restarts, and no more
    assert isinstance(hole, NodeExcluded) and hole.exit_code == EXIT_UNHEALTHY == 4
    assert re.fullmatch(r"this node \(\S+, 127\.0\.0\.3\) is excluded from job fake: blamed for 2 failures of the job "
                        r"\(--max-node-failures 2\); the last: rank 2 on 127\.0\.0\.3 exited 1: RuntimeError: CUDA error: "
                        r"uncorrectable ECC error encountered; drain it or reschedule elsewhere", str(hole)), str(hole)
    assert len(nodes[2].spawner.spawned) == 2  # it ran no worker after its exclusion
    for node in nodes[:2]:
        assert node.last().env["WORLD_SIZE"] == "2" and node.last().env["TORCHELASTIC_RESTART_COUNT"] == "2"
        # the restarts it was told: the last leaves 1 of 3, also on a node that skipped a round that failed at once
        assert [e.restarts_left for e in node.events if isinstance(e, Restart)][-1] == 1
        (told,) = [e for e in node.events if isinstance(e, ExcludedFact)]  # every node says who, and why
        assert told.nodes[0].endswith(" at 127.0.0.3") and told.reason.startswith("blamed for 2 failures of the job")
    assert "is excluded from the job: blamed for 2 failures" in errs[0]
    (entry,) = store.scan(KEYS.blocklist)[0]
    assert entry.key.endswith("@127.0.0.3") and Blocked.parse(entry.value).reason.startswith("blamed for 2 failures")


def test_a_spare_takes_the_excluded_nodes_place(tmp_path):
    spec = _spec(tmp_path, "2", "--max-restarts", "3", "--max-node-failures", "1")

    async def hole_fails_once_the_spare_waits(store: MemoryStore, nodes: list[Node]) -> None:
        del store
        for node in nodes[:2]:
            await node.running.wait()
        spare_waits = asyncio.Event()
        say = nodes[2].console.say

        def heard(line: str) -> None:
            say(line)
            if "this node waits as a spare" in line:
                spare_waits.set()

        nodes[2].console.say = heard  # type: ignore[method-assign]
        spare_task.append(asyncio.create_task(nodes[2].run(spec)))
        await spare_waits.wait()
        nodes[1].last().exit(1)  # the black hole's worker dies: K = 1

    spare_task: list[asyncio.Task] = []
    store = MemoryStore(FakeTimers())
    host, hole, spare = (Node(tmp_path, store, 0, _waits_then_ok_from(1), host=True), Node(tmp_path, store, 1, _waits),
                         Node(tmp_path, store, 2, _waits_then_ok_from(0)))

    async def main():
        runs = [asyncio.create_task(n.run(spec)) for n in (host, hole)]
        await hole_fails_once_the_spare_waits(store, [host, hole, spare])
        return await asyncio.gather(*runs, *spare_task)

    try:
        ends = asyncio.run(asyncio.wait_for(main(), BOUND))
    finally:
        for node in (host, hole, spare):
            node.close()
    assert isinstance(ends[0], Outcome) and ends[0].exit_code == 0
    assert isinstance(ends[1], NodeExcluded)
    assert isinstance(ends[2], Outcome) and ends[2].exit_code == 0
    (started,) = spare.spawner.spawned
    assert (started.env["GROUP_RANK"], started.env["WORLD_SIZE"], started.env["TORCHELASTIC_RESTART_COUNT"]) == ("1", "2", "1")


def test_excluding_below_min_ends_every_node_at_once_naming_it(tmp_path):
    spec = _spec(tmp_path, "2", "--max-restarts", "3")  # join_timeout: its default, 600 s; the bound is 30 s
    ends, nodes, errs, _ = _play(tmp_path, spec, [_waits, _fails])
    host, hole = ends
    assert isinstance(hole, NodeExcluded), errs
    assert isinstance(host, LauncherError) and not isinstance(host, NodeExcluded)  # exit 3 on the others
    assert re.search(r"the job ended: node \S+ at 127\.0\.0\.2 was excluded \(blamed for 2 failures of the job "
                     r"\(--max-node-failures 2\); the last: .*\): 1 node\(s\) left, min 2 needed$", str(host)), str(host)
    assert len(nodes[1].spawner.spawned) == 2


def test_the_store_host_excluded_keeps_serving_without_workers_and_the_others_run_the_job(tmp_path):
    spec = _spec(tmp_path, "2:3", *ELASTIC)
    ends, nodes, errs, _ = _play(tmp_path, spec, [_fails, _waits, _waits], done=_without_one)
    assert [e.exit_code for e in ends] == [0, 0, 0], errs  # the host leaves with the job's exit code
    assert len(nodes[0].spawner.spawned) == 2  # no worker after its exclusion
    last = [n.last().env for n in nodes[1:]]
    assert sorted((e["GROUP_RANK"], e["RANK"]) for e in last) == [("0", "0"), ("1", "1")]  # group rank 0 moved on
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["WORLD_SIZE"]) for e in last} == {("127.0.0.1", "29500", "2")}
    assert re.search(r"this node \(host0, 127\.0\.0\.1\) is excluded from job fake since .* UTC: blamed for 2 failures "
                     r".*; it keeps serving the rendezvous and the workers' store, without workers, until the job ends",
                     errs[0]), errs[0]
    assert "the job ended (succeeded); this node served it without workers: excluded: blamed for 2 failures" in errs[0]


def test_a_blocklisted_node_coming_back_is_refused_at_once_and_the_job_is_undisturbed(tmp_path):
    spec = _spec(tmp_path, "2:3", *ELASTIC)
    store = MemoryStore(FakeTimers())
    nodes = [Node(tmp_path, store, 0, _waits, host=True), Node(tmp_path, store, 1, _waits), Node(tmp_path, store, 2, _fails)]
    again = Node(tmp_path, store, 2, _fails)  # the same host and address: a scheduler started it again
    refused: list[object] = []
    took: list[float] = []

    async def main():
        runs = [asyncio.create_task(n.run(spec)) for n in nodes]
        assert isinstance(await runs[2], NodeExcluded)
        await _when(lambda: all(n.spawner.spawned and _without_one(n.last().env) for n in nodes[:2]))
        before = [(len(n.rounds()), len(n.spawner.spawned)) for n in nodes[:2]]
        loop = asyncio.get_running_loop()
        start = loop.time()
        refused.append(await again.run(spec))
        took.append(loop.time() - start)
        # one that raced past the join's check (its node key written): told on its assign key, never counted
        racer = NodeInfo("racer", 0, 1, "default", "127.0.0.3", nodes[2].session.member.info.host)
        lease = await store.grant(60)
        _, revision = await store.range(KEYS.assign("racer"))
        watch = await store.watch(KEYS.assign("racer"), revision)
        await store.put(KEYS.node("racer"), node_value(racer), lease=lease.id)
        async for event in watch:
            if event.kind is EventKind.PUT and event.key == KEYS.assign("racer"):
                told = place_from(event.value)
                break
        await watch.close()
        await lease.revoke()
        assert isinstance(told, Excluded) and told.reason.startswith("blamed for 2 failures")
        assert [(len(n.rounds()), len(n.spawner.spawned)) for n in nodes[:2]] == before  # no regroup, no restart
        for node in nodes[:2]:
            node.last().exit(0)
        return await asyncio.gather(*runs)

    try:
        ends = asyncio.run(asyncio.wait_for(main(), BOUND))
    finally:
        for node in (*nodes, again):
            node.close()
    assert [e.exit_code for e in ends[:2]] == [0, 0]
    (no,) = refused
    assert isinstance(no, NodeExcluded) and no.exit_code == 4
    assert re.fullmatch(r"this node \(\S+, 127\.0\.0\.3\) was excluded from job fake at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: "
                        r"blamed for 2 failures of the job .*; drain it or reschedule elsewhere", str(no)), str(no)
    assert took[0] < 5.0
    assert again.spawner.spawned == [] and not again.rounds()


def test_a_node_that_reports_itself_unhealthy_is_excluded_at_once_without_a_restart(tmp_path):
    spec = _spec(tmp_path, "2:3", *ELASTIC)

    async def sick(store: MemoryStore, nodes: list[Node]) -> None:
        del store
        for node in nodes:
            await node.running.wait()
        assert nodes[2].session is not None
        await nodes[2].session.member.report_unhealthy("GPU 3: uncorrectable ECC error (nvidia-smi: recovery action reset)")

    ends, nodes, errs, _ = _play(tmp_path, spec, [_waits, _waits, _waits], during=sick, done=_without_one)
    host, other, out = ends
    assert (host.exit_code, other.exit_code) == (0, 0), errs
    assert isinstance(out, NodeExcluded)
    assert str(out).endswith("is excluded from job fake: unhealthy: GPU 3: uncorrectable ECC error (nvidia-smi: recovery "
                             "action reset); drain it or reschedule elsewhere")
    for node in nodes[:2]:
        assert node.last().env["WORLD_SIZE"] == "2"
        assert node.last().env["TORCHELASTIC_RESTART_COUNT"] == "0"  # a regroup: no restart spent
    assert len(nodes[2].spawner.spawned) == 1


async def _decided(store: MemoryStore, key: str) -> None:
    """Until the coordinator has written ``key`` (a node's assign key: its decision about that node)."""
    entries, revision = await store.range(key)
    if any(e.key == key for e in entries):
        return
    watch = await store.watch(key, revision)
    try:
        async for event in watch:
            if event.kind is EventKind.PUT and event.key == key:
                return
    finally:
        await watch.close()


def test_a_node_whose_check_fails_before_it_joins_is_never_counted_in_a_round(tmp_path):
    """Issue 34: the sick node's join must say it is unhealthy. It joins first, and its next write reaches the store
    only once the coordinator has decided about it (a slow link): told only after joining, it completed MAX (1:2) and
    the healthy node's first round counted it, its workers seeing WORLD_SIZE 2."""
    healthy = _spec(tmp_path, "1:2", "--rdzv-conf", "last_call_timeout=0.2")
    ill = _spec(tmp_path, "1:2", "--rdzv-conf", "last_call_timeout=0.2", "--health-check", "echo 'GPU 3: ECC error'; exit 1")
    store = MemoryStore(FakeTimers())
    host, sick = Node(tmp_path, store, 0, _ok, host=True), Node(tmp_path, store, 1, _ok)
    joins = sick.deps.rendezvous
    assert joins is not None

    async def slow_link(spec, worker_store, say, stack, unhealthy=None):
        opened = await joins(spec, worker_store, say, stack, unhealthy)
        assert sick.session is not None
        await _decided(store, KEYS.assign(sick.session.member.info.id))
        return opened

    sick.deps.rendezvous = slow_link

    async def main():
        first = asyncio.create_task(sick.run(ill))
        await sick.joined.wait()  # its node key is in the store before the coordinator's first read
        return await asyncio.gather(host.run(healthy), first)

    try:
        ends = asyncio.run(asyncio.wait_for(main(), BOUND))
    finally:
        errs = [n.close() for n in (host, sick)]
    done, out = ends
    assert isinstance(done, Outcome) and done.exit_code == 0, errs
    assert [h.env["WORLD_SIZE"] for h in host.spawner.spawned] == ["1"]  # never a round with the sick node
    assert [(r.nodes, r.world_size) for r in host.rounds()] == [(1, 1)]
    assert isinstance(out, NodeExcluded) and out.exit_code == 4
    assert str(out).endswith("is excluded from job fake: unhealthy: health check: GPU 3: ECC error; drain it or "
                             "reschedule elsewhere"), str(out)
    assert sick.spawner.spawned == []
    (told,) = [e for e in host.events if isinstance(e, ExcludedFact)]
    assert told.nodes[0].endswith(" at 127.0.0.2") and told.reason == "unhealthy: health check: GPU 3: ECC error"


def _ok(attempt: int, rank: int) -> Behaviour:
    return Behaviour(exit_status=0)


@pytest.mark.parametrize(("unhealthy", "stands"), [(None, True), ("health check: exit 1", False)], ids=["healthy", "sick"])
def test_a_node_whose_check_failed_does_not_stand_for_election(tmp_path, unhealthy, stands):
    """On a shared store (etcd) a node whose check failed before it joined must not coordinate the job while a healthy
    node can (it would host the workers' store, without workers, and leave with the job's exit code, never 4): its
    join says why, and the session runs no campaign for it."""
    spec = _spec(tmp_path, "1:2")
    store = MemoryStore(FakeTimers())
    stood = asyncio.Event()

    async def backend(spec, worker_store, say, stack, unhealthy=None):
        member = await Member.join(store, KEYS, node_info(spec, "127.0.0.2", is_host=False, unhealthy=unhealthy), ttl(spec))

        async def campaign(session: Session) -> None:
            stood.set()

        return Session(member, "127.0.0.2", store, "the shared store ended its lease"), campaign

    async def main() -> NodeInfo:
        async with open_session(spec, SimpleNamespace(), print, backend=backend, unhealthy=unhealthy) as session:
            await asyncio.sleep(0)  # a campaign, if started, took its first step (tasks run in the order created)
            entries, _ = await store.range(KEYS.nodes)
            return node_from(entries[0].value, 1, session.member.info.id)

    joined = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert stood.is_set() is stands
    assert joined.unhealthy == unhealthy  # in the join itself


def test_a_sick_node_that_no_coordinator_excludes_leaves_as_unhealthy_at_join_timeout(tmp_path):
    """Nobody coordinates (on etcd it does not stand itself): at join_timeout it leaves with exit 4 and its check's
    line, not as a rendezvous that timed out (exit 3, "worth retrying")."""
    spec = _spec(tmp_path, "2", "--rdzv-conf", "join_timeout=0.3", "--health-check", "echo 'NIC down'; exit 1")
    sick = Node(tmp_path, MemoryStore(FakeTimers()), 1, _ok)
    try:
        out = asyncio.run(asyncio.wait_for(sick.run(spec), BOUND))
    finally:
        sick.close()
    assert isinstance(out, NodeExcluded) and out.exit_code == 4, out
    assert str(out) == "this node (host1) is unhealthy: health check: NIC down; it runs no workers in job fake: drain it " \
                       "or reschedule the job elsewhere"


def test_nobody_is_excluded_with_max_node_failures_0(tmp_path):
    spec = _spec(tmp_path, "2", "--max-restarts", "2", "--max-node-failures", "0")
    ends, nodes, _, store = _play(tmp_path, spec, [_waits, _fails])
    assert [e.exit_code for e in ends] == [1, 1]  # the budget spent, as before
    assert len(nodes[1].spawner.spawned) == 3
    assert store.scan(KEYS.blocklist)[0] == []



def test_a_coordinator_taking_over_keeps_the_blocklist_it_finds_in_the_store():
    """On etcd a coordinator elected mid-job starts its blame counts from zero, but the exclusions are the store's:
    a node on the blocklist that joins is told it is excluded, and the round forms without it."""
    async def main() -> tuple[object, object]:
        store = MemoryStore(FakeTimers())
        await store.put(KEYS.blocked("h9", "127.0.0.9"), Blocked("fake", "blamed for 2 failures of the job", 1.7e9).value())

        async def fresh_keyspace() -> None:
            return None

        coordinator = Coordinator(store, KEYS, Settings(1, 3, 0.1, 3, max_node_failures=2),
                                  master=lambda: ("127.0.0.1", 29500), before_round=fresh_keyspace)
        running = asyncio.create_task(coordinator.run())
        _, revision = await store.range(KEYS.assigns)
        watch = await store.watch(KEYS.assigns, revision)
        lease = await store.grant(60)
        await store.put(KEYS.node("back"), node_value(NodeInfo("back", 0, 1, "default", "127.0.0.9", "h9")), lease=lease.id)
        await store.put(KEYS.node("fine"), node_value(NodeInfo("fine", 0, 1, "default", "127.0.0.2", "h2")), lease=lease.id)
        told: dict[str, object] = {}
        async for event in watch:
            told[event.key[len(KEYS.assigns):]] = place_from(event.value)
            if len(told) == 2:
                break
        await watch.close()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return told["back"], told["fine"]

    back, fine = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert back == Excluded("blamed for 2 failures of the job", 1.7e9)
    assert isinstance(fine, Assignment) and fine.group_world_size == 1  # the round formed without it


def test_a_job_that_ends_on_a_nodes_exclusion_before_it_reads_its_own_key_still_excludes_it():
    """The end word names the excluded node: that node leaves as excluded (exit 4), the others as the job ended; a
    store host named there serves to the end and takes the job's exit code (``_excluded``)."""
    why = "blamed for 2 failures of the job (--max-node-failures 2)"
    end = Ended(RoundWord(2, Phase.ENDED, reason="a static job (--nnodes 2) cannot go on without it", stranded=True,
                          excluded=(("vm-1-aa at 127.0.0.2", why),)))

    def session(node_id: str, addr: str, *, hosts: bool = False) -> Session:
        info = NodeInfo(node_id, 0, 1, "default", addr, "vm-1")
        return SimpleNamespace(member=SimpleNamespace(info=info), coordinator=object() if hosts else None)  # type: ignore[return-value]

    out = _left_out(end, session("vm-1-aa", "127.0.0.2"), None)
    assert isinstance(out, Excluded) and out.reason == why
    assert _left_out(end, session("vm-1-bb", "127.0.0.1"), None) is None  # another node: the job ended
    assert _left_out(end, session("vm-1-aa", "127.0.0.2", hosts=True), None) is None
    assert _left_out(Excluded("told", 1.0), session("vm-1-bb", "127.0.0.1"), None) == Excluded("told", 1.0)
    sick = _left_out(end, session("vm-1-bb", "127.0.0.1"), "exit 1")
    assert sick is not None and sick.reason == "unhealthy: health check: exit 1"


@pytest.mark.parametrize("served", [False, True], ids=["memory", "embedded"])
def test_a_node_refused_at_join_gives_back_the_lease_it_asked_for_with_its_reads(served):
    """Where the store pipelines them (the embedded client) the join's lease comes in the round trip of its reads; a
    node refused (excluded, or the job over) revokes it: nothing of it stays on the host."""
    async def main() -> None:
        memory = MemoryStore(FakeTimers())
        await memory.put(KEYS.blocked("h9", "127.0.0.9"), Blocked("fake", "blamed for 2 failures of the job", 1.7e9).value())
        server = StoreServer(memory, b"s") if served else None
        store = await StoreClient.connect("127.0.0.1", await server.start("127.0.0.1", 0), b"s") if server else memory
        try:
            with pytest.raises(NodeExcluded, match="blamed for 2 failures"):
                await Member.join(store, KEYS, NodeInfo("back", 0, 1, "default", "127.0.0.9", "h9"), ttl=60)
            assert memory._leases == {}
            await memory.put(KEYS.closed, b"done")
            with pytest.raises(RendezvousClosed):
                await Member.join(store, KEYS, NodeInfo("late", 0, 1, "default", "127.0.0.2", "h2"), ttl=60)
            assert memory._leases == {}
        finally:
            if server is not None:
                await store.close()
                await server.close()
            await memory.close()

    asyncio.run(asyncio.wait_for(main(), BOUND))
