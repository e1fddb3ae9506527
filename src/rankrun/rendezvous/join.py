"""The rendezvous algorithm over a ``Store``: one coordinator decides, every node reads only its own part.

Keys under ``/rankrun/<run id>/`` (all small; none is rewritten by more than one writer)::

    nodes/<node>            a node's description, written once when it joins, bound to its lease
    round                   the coordinator's word on the current round: number, phase, restarts, why
    assign/<node>           this node's place in a round: group rank, first rank, sizes, MASTER_ADDR/PORT
    result/<round>/<node>   how a node's workers ended in a round (and its failure, in a few lines)
    status                  who has joined so far, for the "3/4 nodes joined" line of waiting nodes
    closed                  the job is over: late joiners are turned away

A join costs a node a fixed handful of operations (grant, put, range, two watches) and a few
hundred bytes, whatever the number of nodes: nobody reads or rewrites a list of everyone. The
coordinator (the agent hosting the store, or node rank 0 in static mode) learns of joins, leaves
(a lease expiring deletes the node key) and results through watches, asks the pure
``rendezvous.round.next_step`` what to do, and writes each member its assignment. Waiting is
always on a watch or a deadline, never a polling loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from rankrun.rendezvous.round import (
    Finish,
    NodeInfo,
    NodeRanks,
    NodeSlots,
    Phase,
    Regroup,
    Restart,
    Result,
    Settings,
    Start,
    View,
    Wait,
    assign_node_ranks,
    next_step,
)
from rankrun.store.api import Entry, Event, EventKind, Lease, Store, StoreUnavailable, exact
from rankrun.store.embedded.liveness import seconds

logger = logging.getLogger(__name__)

STATUS_EVERY = 1.0  # seconds between two writes of the status key
PUTS_IN_FLIGHT = 64  # a round's assignments written this many at a time


@dataclass(frozen=True)
class Keys:
    root: str

    @classmethod
    def for_run(cls, run_id: str, prefix: str = "/rankrun") -> Keys:
        return cls(f"{prefix.rstrip('/')}/{run_id}/")

    @property
    def coordinator(self) -> str:
        """Who coordinates (a shared store: elected, bound to the winner's lease)."""
        return self.root + "coordinator"

    @property
    def job(self) -> str:
        """The job lease's id (a shared store: every key but the node keys lives on it)."""
        return self.root + "job"

    @property
    def nodes(self) -> str:
        return self.root + "nodes/"

    @property
    def round(self) -> str:
        return self.root + "round"

    @property
    def status(self) -> str:
        return self.root + "status"

    @property
    def closed(self) -> str:
        return self.root + "closed"

    @property
    def results(self) -> str:
        return self.root + "result/"

    def node(self, node_id: str) -> str:
        return self.nodes + node_id

    def assign(self, node_id: str) -> str:
        return self.root + "assign/" + node_id

    def result(self, round_: int, node_id: str) -> str:
        return f"{self.results}{round_}/{node_id}"


def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _load(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def node_from(value: bytes, joined: int, node_id: str) -> NodeInfo:
    d = _load(value)
    return NodeInfo(node_id, joined, int(d.get("nproc", 1)), str(d.get("role", "default")), str(d.get("addr", "")),
                    str(d.get("host", "")), d.get("static_rank"), bool(d.get("is_host", False)))


def node_value(info: NodeInfo) -> bytes:
    d = asdict(info)
    del d["id"], d["joined"]
    return _dump(d)


@dataclass(frozen=True)
class Assignment:
    round: int
    group_rank: int
    group_world_size: int
    ranks: NodeRanks
    master_addr: str
    master_port: int
    restarts: int


@dataclass(frozen=True)
class RoundWord:
    """The ``round`` key: what the coordinator says about the job now."""

    round: int
    phase: str  # "running", "stopping" (re-forming), "ended"
    restarts: int = 0
    reason: str = ""
    ok: bool = False  # for "ended"
    cause: str = ""  # for a failed end: the job's first failure, in a few lines
    stranded: bool = False  # for a failed end: too few nodes were left (not the workers' failure)

    @classmethod
    def parse(cls, value: bytes) -> RoundWord:
        d = _load(value)
        return cls(int(d.get("round", 0)), str(d.get("phase", "")), int(d.get("restarts", 0)), str(d.get("reason", "")),
                   bool(d.get("ok", False)), str(d.get("cause", "")), bool(d.get("stranded", False)))


# --------------------------------------------------------------------------- the coordinator


class Coordinator:
    """Runs on the agent that hosts the store; decides every round of the job."""

    def __init__(
        self,
        store: Store,
        keys: Keys,
        settings: Settings,
        *,
        master: Callable[[], tuple[str, int]],
        before_round: Callable[[], Awaitable[None]],
        now: Callable[[], float] | None = None,
        leader: str | None = None,
        lease: int = 0,
        fence: Callable[[str, bytes], Awaitable[bool]] | None = None,
        why_gone: Callable[[str], str] | None = None,
    ) -> None:
        self._store = store
        self._keys = keys
        self._settings = settings
        self._leader = leader  # this coordinator's own node: group rank 0, with the worker store
        self._lease = lease  # what the keys it writes are bound to (0: none; a shared store: the job lease)
        # an elected coordinator writes only while it still holds the election (False: it does not)
        self._fence = fence
        self._master = master  # the worker store's address and port (hosted by group rank 0)
        self._before_round = before_round  # e.g. a fresh worker-store keyspace
        self._now = now or (lambda: asyncio.get_running_loop().time())
        self._why_gone = why_gone or (lambda _key: "")  # the store's word on why a node key went (its lease's end)
        self._nodes: dict[str, NodeInfo] = {}
        self._gone: dict[str, tuple[str, str]] = {}  # node id → (name, why it went), for the reasons given
        self._alone_since: float | None = None
        self._phase = Phase.FORMING
        self._round = 0
        self._members: tuple[str, ...] = ()
        self._restarts = 0
        self._min_since: float | None = None
        self._results: dict[str, Result] = {}
        self._spares: set[str] = set()  # told they wait as spares in the current round
        self._arrived: list[str] = []  # nodes that joined since the last decision
        self._events: asyncio.Queue[Event | StoreUnavailable] = asyncio.Queue()
        self._status_dirty = True
        self._status_due = 0.0

    async def run(self) -> None:
        if await self._take_over():
            return
        entries, revision = await self._store.range(self._keys.nodes)
        for entry in entries:
            node_id = entry.key[len(self._keys.nodes) :]
            self._nodes[node_id] = node_from(entry.value, entry.create_revision, node_id)
        watches = [await self._store.watch(self._keys.nodes, revision), await self._store.watch(self._keys.results, revision)]
        feeders = [asyncio.create_task(_feed(w, self._events)) for w in watches]
        try:
            await self._decide_forever()
        finally:
            for task in feeders:
                task.cancel()
            for watch in watches:
                with contextlib.suppress(StoreUnavailable):
                    await watch.close()

    async def _take_over(self) -> bool:
        """A coordinator elected mid-job (the last one was lost) carries on from the round key; True if it ended."""
        entry = await self._store.get(self._keys.round)
        if entry is None:
            return False
        word = RoundWord.parse(entry.value)
        closed = await self._store.get(self._keys.closed)
        if word.phase != "ended" and closed is not None:  # the last coordinator died between the two writes: finish it
            ok = bool(_load(closed.value).get("ok"))
            word = RoundWord(word.round, "ended", word.restarts, "the job had ended", ok)
            await self._put(self._keys.round, _dump(asdict(word)))
        if word.phase == "ended":
            self._phase = Phase.ENDED
            return True
        self._round, self._restarts = word.round, word.restarts
        reason = "the coordinator changed; re-forming"
        await self._put(self._keys.round, _dump(asdict(RoundWord(self._round, "stopping", self._restarts, reason))))
        self._min_since = self._now() - self._settings.last_call_timeout  # re-form at once, as after a regroup
        logger.info("rendezvous: took over as coordinator at round %d", self._round)
        return False

    async def _put(self, key: str, value: bytes) -> None:
        if self._fence is None:
            await self._store.put(key, value, lease=self._lease)
        elif not await self._fence(key, value):
            raise NotCoordinator("this node no longer holds the coordinator key (its lease ended): another node coordinates")

    async def _put_all(self, writes: list[tuple[str, bytes]]) -> None:
        """Many independent writes, up to ``PUTS_IN_FLIGHT`` at a time: a networked store (etcd) commits
        concurrent writes together, where one after another would each wait for their own commit."""
        for at in range(0, len(writes), PUTS_IN_FLIGHT):
            await asyncio.gather(*(self._put(key, value) for key, value in writes[at : at + PUTS_IN_FLIGHT]))

    async def _decide_forever(self) -> None:
        while True:
            self._note_min()
            step = next_step(self._view(), self._settings, self._now())
            if isinstance(step, Start):
                await self._start(step)
                continue
            if isinstance(step, Regroup | Restart):
                await self._reform(step)
                continue
            if isinstance(step, Finish):
                await self._finish(step)
                return
            await self._tell_spares()
            await self._publish_status()
            await self._next_events(step)

    def _view(self) -> View:
        return View(tuple(self._nodes.values()), self._phase, self._round, self._members, self._restarts, self._min_since,
                    self._results, self._leader, self._gone, self._alone_since)

    def _note_min(self) -> None:
        enough = len(self._nodes) >= self._settings.min_nodes
        if self._phase is Phase.FORMING and enough and self._min_since is None:
            self._min_since = self._now()
        elif not enough:
            self._min_since = None
        mine = [n for n in self._nodes.values() if n.id == self._leader or n.is_host]
        alone = self._phase is Phase.FORMING and self._round > 0 and len(self._nodes) == 1 and bool(mine)
        if alone and self._alone_since is None:
            self._alone_since = self._now()
        elif not alone:
            self._alone_since = None

    async def _next_events(self, step: Wait) -> None:
        """Wait for something to change (or the step's deadline), then take every event already there."""
        until = step.until
        if self._status_dirty and self._phase is not Phase.ENDED:  # a status write held back by the rate limit
            until = self._status_due if until is None else min(until, self._status_due)
        timeout = None if until is None else max(0.0, until - self._now())
        try:
            first = await asyncio.wait_for(self._events.get(), timeout)
        except TimeoutError:
            return
        self._apply(first)
        while not self._events.empty():
            self._apply(self._events.get_nowait())

    def _apply(self, event: Event | StoreUnavailable) -> None:
        if isinstance(event, StoreUnavailable):  # a watch ended: deciding on without it would go deaf
            raise event
        if event.key.startswith(self._keys.nodes):
            node_id = event.key[len(self._keys.nodes) :]
            if event.kind is EventKind.PUT:
                self._nodes[node_id] = node_from(event.value, event.revision, node_id)
                self._arrived.append(node_id)
            elif (info := self._nodes.pop(node_id, None)) is not None:
                self._gone[node_id] = (f"{node_id} at {info.addr}" if info.addr else node_id, self._why_gone(event.key))
            self._status_dirty = True
            return
        round_text, _, node_id = event.key[len(self._keys.results) :].partition("/")
        if event.kind is EventKind.PUT and round_text == str(self._round) and node_id in self._members:
            d = _load(event.value)
            self._results[node_id] = Result(bool(d.get("ok")), event.revision, str(d.get("summary", "")))

    async def _start(self, step: Start) -> None:
        await self._before_round()
        self._round += 1
        self._members = step.placement.members
        self._results = {}
        self._phase = Phase.RUNNING
        infos = [self._nodes[m] for m in self._members]
        ranks = assign_node_ranks([NodeSlots(n.role, n.nproc) for n in infos])
        addr, port = self._master()
        writes = [(self._keys.assign(info.id), _dump({
            "round": self._round, "group_rank": group_rank, "group_world_size": len(infos), "ranks": asdict(mine),
            "master_addr": addr, "master_port": port, "restarts": self._restarts}))
            for group_rank, (info, mine) in enumerate(zip(infos, ranks, strict=True))]
        self._spares = set(step.placement.spares)
        spare = _dump({"round": self._round, "spare": True})
        writes += [(self._keys.assign(node_id), spare) for node_id in step.placement.spares]
        await self._put_all(writes)
        await self._put(self._keys.round, _dump(asdict(RoundWord(self._round, "running", self._restarts))))
        logger.info("rendezvous round %d: %d nodes, %d spares", self._round, len(self._members), len(step.placement.spares))

    async def _reform(self, step: Regroup | Restart) -> None:
        if isinstance(step, Restart):
            self._restarts += 1
        await self._put(self._keys.round, _dump(asdict(RoundWord(self._round, "stopping", self._restarts, step.reason))))
        self._phase = Phase.FORMING
        # a regroup or restart re-forms at once when enough nodes are there (last_call is for the first round)
        self._min_since = self._now() - self._settings.last_call_timeout

    async def _finish(self, step: Finish) -> None:
        failures = sorted((r.revision, r.summary) for r in self._results.values() if not r.ok)
        cause = failures[0][1] if failures else ""
        word = RoundWord(self._round, "ended", self._restarts, step.reason, step.ok, cause, step.stranded)
        await self._put(self._keys.closed, _dump({"ok": step.ok}))  # first: once nodes read the end, they leave at once
        await self._put(self._keys.round, _dump(asdict(word)))
        self._phase = Phase.ENDED

    async def _tell_spares(self) -> None:
        """A node that joined a full, running round learns at once that it waits as a spare."""
        arrived, self._arrived = self._arrived, []
        if self._phase is not Phase.RUNNING:
            return
        members = set(self._members)
        for node_id in arrived:
            if node_id in self._nodes and node_id not in members and node_id not in self._spares:
                self._spares.add(node_id)
                await self._put(self._keys.assign(node_id), _dump({"round": self._round, "spare": True}))

    async def _publish_status(self) -> None:
        """Who has joined, for waiting nodes' progress lines: at most once a second (they print every 5 s)."""
        now = self._now()
        if not self._status_dirty or self._phase is Phase.ENDED or now < self._status_due:
            return
        self._status_dirty, self._status_due = False, now + STATUS_EVERY
        first = list(itertools.islice(self._nodes.values(), 4))  # events arrive in revision order: join order
        static = sorted(n.static_rank for n in self._nodes.values() if n.static_rank is not None) if self._settings.static else []
        status = {"joined": len(self._nodes), "names": [n.addr or n.host for n in first], "static_ranks": static}
        await self._put(self._keys.status, _dump(status))


# --------------------------------------------------------------------------- a node


@dataclass(frozen=True)
class Spare:
    round: int


@dataclass(frozen=True)
class Ended:
    word: RoundWord


class Member:
    """One node's side: join once, then read its own assignment and the round key, round after round."""

    def __init__(self, store: Store, keys: Keys, info: NodeInfo, lease: Lease, job: Lease | None = None) -> None:
        self.store = store
        self.keys = keys
        self.info = info
        self.lease = lease
        self.job = job  # a shared store: the job lease, which this node helps keep alive and writes results on

    @classmethod
    async def join(cls, store: Store, keys: Keys, info: NodeInfo, ttl: float, job: Lease | None = None) -> Member:
        """Register (a lease-bound node key); ``RendezvousClosed`` if the job is already over."""
        if await store.get(keys.closed) is not None:
            raise RendezvousClosed("the job has already finished")
        lease = await store.grant(ttl)
        await store.put(keys.node(info.id), node_value(info), lease=lease.id)
        return cls(store, keys, info, lease, job)

    async def next_round(self, after: int) -> Assignment | Spare | Ended:
        """The first word after round ``after``: an assignment, a place as a spare, or the end of the job."""
        key, round_key = self.keys.assign(self.info.id), self.keys.round
        entries, revision = await self.store.range(key)  # a prefix: "assign/n1" also finds "assign/n10", so match exactly
        round_entries, _ = await self.store.range(round_key)
        latest_assign, latest_round = _value(entries, key), _value(round_entries, round_key)
        found = self._read(latest_assign, latest_round, after)
        if found is not None:
            return found
        watch_assign, watch_round = await self.store.watch(key, revision), await self.store.watch(round_key, revision)
        try:
            merged: asyncio.Queue[Event | StoreUnavailable] = asyncio.Queue()
            feeders = [asyncio.create_task(_feed(w, merged)) for w in (watch_assign, watch_round)]
            try:
                while True:
                    event = await merged.get()
                    if isinstance(event, StoreUnavailable):
                        raise event
                    if event.kind is EventKind.PUT:
                        if event.key == key:
                            latest_assign = event.value
                        elif event.key == round_key:
                            latest_round = event.value
                    found = self._read(latest_assign, latest_round, after)
                    if found is not None:
                        return found
            finally:
                for task in feeders:
                    task.cancel()
        finally:
            for watch in (watch_assign, watch_round):
                with contextlib.suppress(StoreUnavailable):
                    await watch.close()

    def _read(self, assign: bytes | None, round_value: bytes | None, after: int) -> Assignment | Spare | Ended | None:
        word = RoundWord.parse(round_value) if round_value else None
        if word is not None and word.phase == "ended":
            return Ended(word)
        if assign is None or word is None or word.phase != "running":
            return None
        d = _load(assign)
        round_ = int(d.get("round", 0))
        if round_ <= after or round_ != word.round:
            return None
        if d.get("spare"):
            return Spare(round_)
        ranks = d["ranks"]
        return Assignment(round_, int(d["group_rank"]), int(d["group_world_size"]),
                          NodeRanks(int(ranks["base_rank"]), int(ranks["world_size"]), int(ranks["base_role_rank"]),
                                    int(ranks["role_world_size"])),
                          str(d["master_addr"]), int(d["master_port"]), int(d.get("restarts", 0)))

    async def round_changed(self, round_: int) -> RoundWord:
        """Wait until the round key says round ``round_`` is over (re-forming, or the job ended)."""
        entries, revision = await self.store.range(self.keys.round)
        current = _value(entries, self.keys.round)
        if current is not None:
            word = RoundWord.parse(current)
            if word.round != round_ or word.phase != "running":
                return word
        watch = await self.store.watch(self.keys.round, revision)
        try:
            async for event in watch:
                if event.kind is not EventKind.PUT or event.key != self.keys.round:
                    continue
                word = RoundWord.parse(event.value)
                if word.round != round_ or word.phase != "running":
                    return word
        finally:
            with contextlib.suppress(StoreUnavailable):
                await watch.close()
        raise StoreUnavailable("the round watch ended")

    async def report(self, round_: int, ok: bool, summary: str = "") -> None:
        await self.store.put(self.keys.result(round_, self.info.id), _dump({"ok": ok, "summary": summary}),
                             lease=self.job.id if self.job is not None else 0)

    async def status(self) -> dict[str, Any]:
        entry = await self.store.get(self.keys.status)
        return _load(entry.value) if entry is not None else {}

    async def keep_alive(self, interval: float, max_attempts: int) -> None:
        """Refresh the lease every ``interval`` s until it is lost.

        Each keep-alive gets ``interval`` s to be answered (a silent network must not hold it for TCP's
        15 minutes); one that fails or is not answered in time is a miss. After ``max_attempts`` misses in
        a row the lease is given up on this side, whatever TCP believes: the store has expired it too.
        """
        loop = asyncio.get_running_loop()
        misses, started, first_miss = 0, loop.time(), 0.0
        while True:
            with contextlib.suppress(TimeoutError):  # a keep-alive every interval, or the lease's end
                async with asyncio.timeout_at(started + interval):
                    await self.lease.lost.wait()
                    return
            started = loop.time()
            try:
                async with asyncio.timeout(interval):
                    await self.lease.keep_alive()
                misses = 0
            except (StoreUnavailable, TimeoutError) as exc:
                misses += 1
                first_miss = started if misses == 1 else first_miss
                if misses >= max_attempts or self.lease.lost.is_set():
                    why = f"no answer within {interval:g} s" if isinstance(exc, TimeoutError) else str(exc)
                    over = seconds(loop.time() - first_miss)
                    self.lease.set_lost(f"{misses} keep-alives in a row failed over {over} s ({why})")
                    return
                continue
            if self.job is not None:  # every node keeps the job's keys alive (a shared store); its failures are not ours
                with contextlib.suppress(StoreUnavailable, TimeoutError):
                    async with asyncio.timeout(interval):
                        await self.job.keep_alive()

    async def leave(self) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.lease.revoke()


class NotCoordinator(StoreUnavailable):
    """An elected coordinator found, on a write, that the election has moved on without it."""


class RendezvousClosed(StoreUnavailable):
    """The job this node wants to join has already finished."""


def _value(entries: list[Entry], key: str) -> bytes | None:
    entry = exact(entries, key)
    return entry.value if entry is not None else None


async def _feed(watch: Any, queue: asyncio.Queue[Event | StoreUnavailable]) -> None:
    """A watch's events into a queue several watches share; its end (``StoreUnavailable``) too, for the reader to raise."""
    try:
        async for event in watch:
            queue.put_nowait(event)
    except StoreUnavailable as exc:
        queue.put_nowait(exc)
