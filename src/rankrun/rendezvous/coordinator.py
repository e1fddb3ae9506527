"""The coordinator: one per job, it decides every round; the members only read their own part.

It runs on the agent that hosts the embedded store (or node rank 0 in static mode), or on the
agent elected on a shared store (``rendezvous.election``). It learns of joins, leaves (a lease
expiring deletes the node key) and results through watches, asks the pure
``rendezvous.round.next_step`` what to do, and writes each member its assignment (``rendezvous.keys``).
Waiting is always on a watch or a deadline, never a polling loop.

It also holds the job's account of its nodes (``rendezvous.account``, pure): how many failures each was blamed for
(``round.blamed``), which are excluded and why, and writes what the account decides. An excluded node is left out of
every later decision (``View.nodes`` holds only the eligible ones), told on its ``assign/`` key (``Excluded``), and put
on the job's blocklist (``blocklist/<host>@<addr>``), which a launcher of that node reads when it comes back
(``Member.join``) and which the account also checks as node keys appear (one that raced past the check is told the
same way, and never counted).

With ``--network-check`` (``Settings.network_check``) it also judges each round of 3 nodes or more before the workers
start (``rendezvous.netcheck``, in a task of the round's, cancelled when the round ends): a node whose links are
outliers gets an ``unhealthy/`` key from it, which its own watch turns into that node's exclusion, as a node's own word.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from rankrun.errors import NotCoordinator
from rankrun.health.outliers import network_line
from rankrun.rendezvous import netcheck
from rankrun.rendezvous.account import Account, Reported, Warned
from rankrun.rendezvous.keys import (
    Assignment,
    Blocked,
    Excluded,
    Keys,
    RoundWord,
    Spare,
    Status,
    closed_ok,
    closed_value,
    node_from,
    result_from,
    unhealthy_from,
    unhealthy_value,
    verdict_value,
)
from rankrun.rendezvous.round import (
    Exclude,
    Exclusion,
    Finish,
    NodeInfo,
    NodeSlots,
    Phase,
    Placement,
    Regroup,
    Restart,
    Result,
    Settings,
    Start,
    View,
    Wait,
    assign_node_ranks,
    first_failure,
    next_step,
)
from rankrun.store.api import Event, EventKind, Events, Store, StoreUnavailable, next_event, watching

logger = logging.getLogger(__name__)

STATUS_EVERY = 1.0  # seconds between two writes of the status key
PUTS_IN_FLIGHT = 64  # a round's assignments written this many at a time


@dataclass
class RoundState:
    """The round the coordinator decides on: its number, phase and restarts, its members, spares and results, and what
    ended the last round (told with the next)."""

    number: int = 0
    phase: Phase = Phase.FORMING
    restarts: int = 0
    members: tuple[str, ...] = ()
    # the same, as a set: a result's check (every node's, as a round ends) and a newcomer's; ``in`` the tuple
    # scanned every member for each, 5 s of the host's CPU as 32,768 nodes reported
    member_set: frozenset[str] = frozenset()
    spares: set[str] = field(default_factory=set)  # told they wait as spares
    results: dict[str, Result] = field(default_factory=dict)
    # what ended the last round (why, its first failure's root cause, the nodes lost): told with the next round
    news: tuple[str, dict[str, object] | None, tuple[str, ...]] = ("", None, ())

    def start(self, placement: Placement) -> None:
        """The next round starts on ``placement``: running, its results yet to come."""
        self.number += 1
        self.members = placement.members
        self.member_set = frozenset(placement.members)
        self.spares = set(placement.spares)
        self.results = {}
        self.phase = Phase.RUNNING


class Writes:
    """How the coordinator writes. An elected coordinator (a shared store) writes only while it still holds the
    election (``fence``; False: it does not), each key bound to the job lease; without one, a key is written as it is,
    bound to no lease. Writes decided while applying events (a blocklisted arrival) wait in ``pending`` for the next
    decision (``flush``)."""

    def __init__(self, store: Store, fence: Callable[[str, bytes], Awaitable[bool]] | None) -> None:
        self._store = store
        self._fence = fence
        # a store in this process (the hosting agent's in-memory one), unfenced: a write never suspends, so a round's
        # writes need no concurrency
        self._in_memory = store.in_process and fence is None
        self.pending: list[tuple[str, bytes]] = []

    async def put(self, key: str, value: bytes) -> None:
        if self._fence is None:
            await self._store.put(key, value)
        elif not await self._fence(key, value):
            raise NotCoordinator("this node no longer holds the coordinator key (its lease ended): another node coordinates")

    async def put_all(self, writes: list[tuple[str, bytes]]) -> None:
        """Many independent writes, up to ``PUTS_IN_FLIGHT`` at a time: a networked store (etcd) commits
        concurrent writes together, where one after another would each wait for their own commit. The in-memory
        store: one after another, all in this turn of the loop (no task each; the embedded server then sends each
        node its assignment and the round key, written right after, in one write)."""
        if self._in_memory:
            for key, value in writes:
                await self.put(key, value)
            return
        for at in range(0, len(writes), PUTS_IN_FLIGHT):
            await asyncio.gather(*(self.put(key, value) for key, value in writes[at : at + PUTS_IN_FLIGHT]))

    async def flush(self) -> None:
        """The pending writes, made."""
        if self.pending:
            writes, self.pending = self.pending, []
            await self.put_all(writes)


class Coordinator:
    """Decides every round of the job. Runs on the agent that hosts the embedded store (node rank 0 in static mode), or
    on the agent elected on a shared store (``rendezvous.election``)."""

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
        fence: Callable[[str, bytes], Awaitable[bool]] | None = None,
        why_gone: Callable[[str], str] | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self._store = store
        self._keys = keys
        self._settings = settings
        self._leader = leader  # this coordinator's own node: group rank 0, with the worker store
        self._writes = Writes(store, fence)  # through the fence, if any; many at once where that gains
        self._master = master  # the worker store's address and port (hosted by group rank 0)
        self._before_round = before_round  # e.g. a fresh worker-store keyspace
        self._now = now or (lambda: asyncio.get_running_loop().time())
        self._why_gone = why_gone or (lambda _key: "")  # the store's word on why a node key went (its lease's end)
        self._say = say or (lambda line: logger.info("%s", line))  # this node's console
        self._check: asyncio.Task[None] | None = None  # the running round's --network-check (rendezvous.netcheck)
        self._judged = False  # that check has its verdict and is writing it
        self._nodes: dict[str, NodeInfo] = {}
        self._gone: dict[str, tuple[str, str]] = {}  # node id → (name, why it went), for the reasons given
        self._alone_since: float | None = None
        self._round = RoundState()  # the round decided on: its number, phase, members, spares and results
        self._min_since: float | None = None
        self._arrived: list[str] = []  # nodes that joined since the last decision
        self._events: Events = asyncio.Queue()
        self._status_dirty = True
        self._began: float | None = None
        self._status_due = 0.0
        self._account = Account(keys.run_id, settings)  # blame, exclusions, the blocklist, the unhealthy nodes

    async def run(self) -> None:
        if await self._take_over():
            return
        self._began = self._now()  # join_timeout's start, for a first round that cannot form
        blocked, _ = await self._store.range(self._keys.blocklist)
        self._account.blocklisted((e.key[len(self._keys.blocklist) :], Blocked.parse(e.value)) for e in blocked)
        entries, revision = await self._store.range(self._keys.nodes)
        for entry in entries:
            self._node_joined(entry.key[len(self._keys.nodes) :], entry.value, entry.create_revision)
        # the watches start after the first read: a node that joins between the two reads (etcd: a round trip) is in
        # neither read, and a watch from the second read's revision would miss it for good (the round then waits for
        # it forever); what the second read saw comes again as events, which are idempotent
        sick, _ = await self._store.range(self._keys.unhealthy)
        for entry in sick:
            self._account.said_unhealthy(entry.key[len(self._keys.unhealthy) :], unhealthy_from(entry.value))
        try:
            async with watching(self._store, (self._keys.nodes, self._keys.results, self._keys.unhealthy), revision,
                                self._events):
                await self._decide_forever()
        finally:
            await self._stop_check()

    async def _take_over(self) -> bool:
        """A coordinator elected mid-job (the last one was lost) carries on from the round key; True if it ended."""
        entry = await self._store.get(self._keys.round)
        if entry is None:
            return False
        word = RoundWord.parse(entry.value)
        closed = await self._store.get(self._keys.closed)
        if word.phase is not Phase.ENDED and closed is not None:  # the last coordinator died between the two writes: finish it
            ok = closed_ok(closed.value)
            word = RoundWord(word.round, Phase.ENDED, word.restarts, "the job had ended", ok)
            await self._writes.put(self._keys.round, word.value())
        if word.phase is Phase.ENDED:
            self._round.phase = Phase.ENDED
            return True
        self._round.number, self._round.restarts = word.round, word.restarts
        word = RoundWord(self._round.number, Phase.FORMING, self._round.restarts, "the coordinator changed; re-forming")
        await self._writes.put(self._keys.round, word.value())
        self._min_since = self._now() - self._settings.last_call_timeout  # re-form at once, as after a regroup
        logger.info("rendezvous: took over as coordinator at round %d", self._round.number)
        return False

    async def _decide_forever(self) -> None:
        while True:
            await self._writes.flush()
            self._note_min()
            step = next_step(self._view(), self._settings, self._now())
            if isinstance(step, Exclude):
                await self._exclude(step.excluded)
                continue
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

    def _eligible(self) -> Mapping[str, NodeInfo]:
        return self._account.eligible(self._nodes)

    def _view(self) -> View:
        current = self._round
        return View(self._eligible().values(), current.phase, current.number, current.members, current.restarts,
                    self._min_since, current.results, self._leader, self._gone, self._alone_since, self._account.blame,
                    self._account.unhealthy, self._began)

    def _note_min(self) -> None:
        nodes = self._eligible()
        enough = len(nodes) >= self._settings.min_nodes
        if self._round.phase is Phase.FORMING and enough and self._min_since is None:
            # last_call is for the first round: a later one (a regroup, a restart, a coordinator taking over) re-forms
            # at once when enough nodes are there, also when they were too few for a while (its nodes were not all
            # back yet, or had not joined the new coordinator's view yet)
            self._min_since = self._now() - (self._settings.last_call_timeout if self._round.number > 0 else 0.0)
        elif not enough:
            self._min_since = None
        only = next(iter(nodes.values())) if len(nodes) == 1 else None  # O(1) but with exclusions: this runs every decision
        alone = (self._round.phase is Phase.FORMING and self._round.number > 0 and only is not None
                 and (only.id == self._leader or only.is_host))
        if alone and self._alone_since is None:
            self._alone_since = self._now()
        elif not alone:
            self._alone_since = None

    async def _next_events(self, step: Wait) -> None:
        """Wait for something to change (or the step's deadline), then take every event already there."""
        until = step.until
        if self._status_dirty and self._round.phase is not Phase.ENDED:  # a status write held back by the rate limit
            until = self._status_due if until is None else min(until, self._status_due)
        timeout = None if until is None else max(0.0, until - self._now())
        try:
            # not asyncio.wait_for: on Python 3.11 an event that lands as the session cancels this task is returned and
            # the cancellation dropped, so the coordinator waited on for ever and its launcher never exited
            async with asyncio.timeout(timeout):
                first = await next_event(self._events, deletes=True)
        except TimeoutError:
            return
        self._apply(first)
        while not self._events.empty():  # a watch's end raised here too: deciding on without it would go deaf
            self._apply(await next_event(self._events, deletes=True))  # there already: no suspension

    def _apply(self, event: Event) -> None:
        if event.key.startswith(self._keys.unhealthy):
            if event.kind is EventKind.PUT:
                self._account.said_unhealthy(event.key[len(self._keys.unhealthy) :], unhealthy_from(event.value))
            return
        if event.key.startswith(self._keys.nodes):
            node_id = event.key[len(self._keys.nodes) :]
            if event.kind is EventKind.PUT:
                self._node_joined(node_id, event.value, event.revision)
                self._arrived.append(node_id)
            elif (info := self._nodes.pop(node_id, None)) is not None:
                self._gone[node_id] = (info.name, self._why_gone(event.key))
            self._status_dirty = True
            return
        round_text, _, node_id = event.key[len(self._keys.results) :].partition("/")
        if event.kind is EventKind.PUT and round_text == str(self._round.number) and node_id in self._round.member_set:
            self._round.results[node_id] = result_from(event.value, event.revision)

    def _node_joined(self, node_id: str, value: bytes, revision: int) -> None:
        info = self._nodes[node_id] = node_from(value, revision, node_id)
        blocked = self._account.joined(info)
        if blocked is not None:  # it raced past Member.join's check: told, not counted
            self._writes.pending.append((self._keys.assign(node_id), Excluded(blocked.reason, blocked.at).value()))
            logger.info("rendezvous: %s at %s is on the job's blocklist: refused", node_id, info.addr)

    async def _exclude(self, excluded: tuple[Exclusion, ...]) -> None:
        """Leave these nodes out for good: each is told on its assign key and put on the blocklist (before the round
        key moves on, so that an excluded node reads its exclusion, not a round it is no longer in)."""
        at = time.time()
        writes: list[tuple[str, bytes]] = []
        for exclusion in excluded:
            info = self._nodes.get(exclusion.node)
            record = self._account.exclude(exclusion, info, at)
            writes.append((self._keys.assign(exclusion.node), Excluded(exclusion.reason, at).value()))
            if info is not None and record is not None:
                writes.append((self._keys.blocked(info.host, info.addr), record.value()))
                logger.info("rendezvous: excluded %s at %s: %s", exclusion.node, info.addr, exclusion.reason)
        await self._writes.put_all(writes)
        self._status_dirty = True

    async def _start(self, step: Start) -> None:
        await self._before_round()
        self._round.start(step.placement)
        infos = [self._nodes[m] for m in self._round.members]
        ranks = assign_node_ranks([NodeSlots(n.role, n.nproc) for n in infos])
        addr, port = self._master()
        writes = [(self._keys.assign(info.id), Assignment(self._round.number, group_rank, len(infos), mine, addr,
                                                          port, self._round.restarts).value())
                  for group_rank, (info, mine) in enumerate(zip(infos, ranks, strict=True))]
        spare = Spare(self._round.number).value()
        writes += [(self._keys.assign(node_id), spare) for node_id in step.placement.spares]
        await self._writes.put_all(writes)
        reason, failure, lost = self._round.news
        word = RoundWord(self._round.number, Phase.RUNNING, self._round.restarts, reason, failure=failure, lost=lost,
                         excluded=tuple(self._account.exclusions))
        await self._writes.put(self._keys.round, word.value())
        logger.info("rendezvous round %d: %d nodes, %d spares", self._round.number, len(self._round.members),
                    len(step.placement.spares))
        await self._stop_check()
        if self._settings.network_check and len(infos) >= netcheck.MIN_NODES:
            self._judged = False
            self._check = asyncio.create_task(self._network_check(self._round.number, infos))

    async def _network_check(self, round_: int, infos: list[NodeInfo]) -> None:
        """Judge round ``round_``'s network check; the nodes found unhealthy get their ``unhealthy/`` key (this
        coordinator's watch then re-forms the round without them), then every member reads the verdict."""
        started = self._now()
        try:
            found = await netcheck.judge(self._store, self._keys, round_, len(infos), self._writes.put,
                                         reach_=netcheck.reach(self._settings.health_timeout))
            self._judged = True  # the writes that follow are not cancelled: the regroup they cause must not stop them
            lines = {g: network_line(g, infos[g].addr or infos[g].id, why) for g, why in sorted(found.items())}
            for g, line in lines.items():
                self._say(line)
                await self._writes.put(self._keys.unhealthy_node(infos[g].id), unhealthy_value(line))
            await self._writes.put(self._keys.netcheck_verdict(round_), verdict_value(lines))
            self._say(f"rendezvous round {round_}: network check of {len(infos)} nodes in {self._now() - started:.2f} s: "
                      + (f"{len(lines)} unhealthy, re-forming without them" if lines else "nobody unhealthy"))
        except (StoreUnavailable, NotCoordinator) as exc:  # the members' wait is bounded: they go on without a verdict
            logger.warning("rendezvous round %d: the network check got no verdict: %s", round_, exc)

    async def _stop_check(self) -> None:
        """The last round's network check, if still running, is over: its round is."""
        check, self._check = self._check, None
        if check is not None and not check.done():
            if not self._judged:
                check.cancel()
            await asyncio.gather(check, return_exceptions=True)

    async def _reform(self, step: Regroup | Restart) -> None:
        await self._stop_check()
        if isinstance(step, Restart):
            self._round.restarts += 1
            self._account.blamed(step.blamed)
        await self._exclude(step.excluded)
        self._round.news = (step.reason, _root(first_failure(self._round.results.values())), step.lost)
        word = RoundWord(self._round.number, Phase.FORMING, self._round.restarts, step.reason,
                         failure=self._round.news[1], lost=step.lost, excluded=tuple(self._account.exclusions))
        await self._writes.put(self._keys.round, word.value())
        self._round.phase = Phase.FORMING
        # a regroup or restart re-forms at once when enough nodes are there (last_call is for the first round)
        self._min_since = self._now() - self._settings.last_call_timeout

    async def straggler(self, node_id: str, why: str) -> None:
        """``--straggler-action exclude``: ``node_id`` held a rank the others waited for, window after window; the
        account blames it (``Account.straggler``, for a member of the running round): this node's console says so, or
        at its ``--max-node-failures``-th, where the job can go on without it, its ``unhealthy/`` key is written (as
        the network check does), so the round re-forms without it."""
        if node_id not in self._round.member_set:
            return
        info = self._nodes.get(node_id)
        verdict = self._account.straggler(node_id, info.name if info is not None else node_id, why,
                                          members=len(self._round.members), spares=bool(self._round.spares))
        if isinstance(verdict, Warned):
            self._say(verdict.line)
        elif isinstance(verdict, Reported):
            with contextlib.suppress(StoreUnavailable, NotCoordinator):
                await self._writes.put(self._keys.unhealthy_node(node_id), unhealthy_value(verdict.reason))

    async def _finish(self, step: Finish) -> None:
        await self._stop_check()
        self._account.blamed(step.blamed)
        await self._exclude(step.excluded)
        # picked once: the cause's words and its root are one failure's
        first = first_failure(self._round.results.values())
        cause = first.summary if first is not None else ""
        failure, lost = _root(first), step.lost
        if self._round.phase is Phase.FORMING:  # ended before the next round: what ended the last one is still news
            failure, lost = failure or self._round.news[1], lost or self._round.news[2]
        word = RoundWord(self._round.number, Phase.ENDED, self._round.restarts, step.reason, step.ok, cause,
                         step.stranded, failure, lost, tuple(self._account.exclusions))
        await self._writes.put(self._keys.closed, closed_value(step.ok))  # first: once nodes read the end, they leave at once
        await self._writes.put(self._keys.round, word.value())
        self._round.phase = Phase.ENDED

    async def _tell_spares(self) -> None:
        """A node that joined a full, running round learns at once that it waits as a spare."""
        arrived, self._arrived = self._arrived, []
        if self._round.phase is not Phase.RUNNING:
            return
        for node_id in arrived:
            if node_id in self._nodes and node_id not in self._round.member_set and node_id not in self._round.spares \
                    and node_id not in self._account.excluded:
                self._round.spares.add(node_id)
                await self._writes.put(self._keys.assign(node_id), Spare(self._round.number).value())

    async def _publish_status(self) -> None:
        """Who has joined, for waiting nodes' progress lines: at most once a second (they print every 5 s)."""
        now = self._now()
        if not self._status_dirty or self._round.phase is Phase.ENDED or now < self._status_due:
            return
        self._status_dirty, self._status_due = False, now + STATUS_EVERY
        nodes = self._eligible()
        first = list(itertools.islice(nodes.values(), 4))  # events arrive in revision order: join order
        static = sorted(n.static_rank for n in nodes.values() if n.static_rank is not None) if self._settings.static else []
        status = Status(len(nodes), tuple(n.addr or n.host for n in first), tuple(static))
        await self._writes.put(self._keys.status, status.value())


def _root(first: Result | None) -> dict[str, object] | None:
    """The root cause of a round's first failure, where its node said it (the round key's ``failure``)."""
    return dict(first.root) if first is not None and first.root is not None else None
