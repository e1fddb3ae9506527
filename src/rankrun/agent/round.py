"""One round of the job on this node, and the seam every round-level feature plugs into.

A round is what one attempt of this node's workers belongs to: on several nodes the coordinator's word places this
node in it (``agent.multinode``); on one node each attempt is a round without a store (``agent.loop``). Each
round-level feature is a small object (a ``Feature``); the features are listed once for each path
(``agent.features``), and a ``RoundWatch``, made for each round, calls their hooks in this order, as an
``AttemptWatch`` is told an attempt's facts:

- ``before``: go or skip, before the round's workers: the ``--health-check`` gate, the ``--network-check``'s verdict,
  the open-files line (said once);
- ``told``: the job's news, as events, outside a round too: what ended the round before (``node.lost``,
  ``failure``, ``restart``), each exclusion once (``node.excluded``), the new round (``rdzv.round``);
- ``serving``: a context around the round's attempt for its background work: the store relay (which names the
  workers' MASTER_ADDR), the stacks exchange and the job's straggler watch;
- ``after``: the round's workers are gone: ``rankrun.launch``'s values and this node's report to the coordinator;
- ``ended``: the job is over (several nodes): ``rankrun.launch``'s values of the other nodes.

The loops (``agent.multinode._rounds``, ``agent.loop._attempts``) sequence these hooks and name no feature.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rankrun.agent.facts import failure_from, failure_line
from rankrun.events.records import NodeExcluded, NodeLost, RdzvRound, Record, Restart
from rankrun.fdlimit import job_fits, listen_fits, relay_budget

if TYPE_CHECKING:
    from rankrun.agent.attempt import AttemptResult
    from rankrun.agent.gate import HealthGate
    from rankrun.agent.plan import Membership
    from rankrun.events.stream import EventStream
    from rankrun.rendezvous.keys import Assignment, RoundWord
    from rankrun.spec import LaunchSpec


@dataclass
class Round:
    """One round as this node's features see it."""

    attempt: int  # the attempt this node's workers run in it, if it goes
    restarts: int  # the job's restarts counted when it formed
    word: Assignment | None = None  # several nodes: the coordinator's word that placed this node (None: one node)
    master: tuple[str, int] | None = None  # where the workers reach the store: the word's, or the store relay's
    env: tuple[tuple[str, str], ...] = ()  # what this node adds to every worker's environment


class Feature:
    """A round-level feature: each hook does nothing unless the feature has work there."""

    async def before(self, round_: Round) -> bool:  # noqa: ARG002 - a hook, for features to override
        """Whether the round's workers may start (False: this node skips the round)."""
        return True

    def told(self, news: Sequence[Record]) -> None:
        """The job's news, as events (also between rounds, and at its end)."""

    def serving(self, round_: Round) -> contextlib.AbstractAsyncContextManager[None]:  # noqa: ARG002 - a hook
        """A context around the round's attempt, for its background work."""
        return _nothing()

    async def after(self, round_: Round, result: AttemptResult) -> None:
        """The round's workers are gone: ``result`` says how they ended."""

    async def ended(self, end: RoundWord) -> None:
        """The job ended (several nodes): ``end``, the coordinator's last word."""


@contextlib.asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


class RoundWatch:
    """One round's features (from ``Rounds.round``), their hooks called in the order the module docstring gives."""

    def __init__(self, features: Sequence[Feature], round_: Round) -> None:
        self._features, self.round = features, round_

    async def before(self) -> bool:
        """Each feature's go, in order; the first that skips ends the asking."""
        for feature in self._features:
            if not await feature.before(self.round):
                return False
        return True

    def told(self, news: Sequence[Record]) -> None:
        for feature in self._features:
            feature.told(news)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Round]:
        """Every feature's background work, for the round's attempt; the round (its ``master`` now set) inside."""
        async with contextlib.AsyncExitStack() as stack:
            for feature in self._features:
                await stack.enter_async_context(feature.serving(self.round))
            yield self.round

    async def after(self, result: AttemptResult) -> None:
        for feature in self._features:
            await feature.after(self.round, result)


@dataclass
class Rounds:
    """The job's round-level features on this node, listed once, and what outlives a round: the health gate's
    verdict on this node and the exclusions it has heard of."""

    features: Sequence[Feature]
    news: NewsEvents
    gate: HealthGate | None = None

    def round(self, round_: Round) -> RoundWatch:
        return RoundWatch(self.features, round_)

    def told(self, news: Sequence[Record]) -> None:
        """News outside a round (between rounds, at the job's end): every feature hears it."""
        for feature in self.features:
            feature.told(news)

    async def ended(self, end: RoundWord) -> None:
        for feature in self.features:
            await feature.ended(end)

    @property
    def sick(self) -> str | None:
        """Why this node's ``--health-check`` failed, once it has (it then runs no workers)."""
        return self.gate.sick if self.gate is not None else None

    @property
    def heard(self) -> dict[str, str]:
        return self.news.heard


class NewsEvents(Feature):
    """The job's news as events on this node's stream, each exclusion once (``heard``: node → why)."""

    def __init__(self, events: EventStream) -> None:
        self._events = events
        self.heard: dict[str, str] = {}

    def told(self, news: Sequence[Record]) -> None:
        for record in news:
            if isinstance(record, NodeExcluded):
                name = record.nodes[0]
                if name in self.heard:
                    continue
                self.heard[name] = record.reason
            self._events.emit(record)


class OpenFiles(Feature):
    """The host of the workers' store (and, embedded, of the rendezvous) says once, before its first workers start,
    if this process cannot hold the job's connections. ``nodes``: the nodes' connections it holds (None: the round's
    nodes, when it hosts the embedded store; 0: one node, or etcd, which holds them); ``relaying``: whether the other
    nodes relay in a round (``agent.store_relay.wanted``): the host then holds one connection per node."""

    def __init__(self, say: Callable[[str], None], spec: LaunchSpec, *, nodes: int | None,
                 relaying: Callable[[Assignment], bool] | None = None) -> None:
        self._say, self._spec, self._nodes, self._relaying = say, spec, nodes, relaying
        self._said = False

    async def before(self, round_: Round) -> bool:
        if not self._said:
            self._said = True
            for line in self.lines(round_.word):
                self._say(line)
        return True

    def lines(self, word: Assignment | None) -> list[str]:
        spec, local = self._spec, self._spec.worker.nproc
        world = word.ranks.world_size if word is not None else local
        nodes = self._nodes if self._nodes is not None else word.group_world_size if word is not None else 0
        if word is not None and self._relaying is not None and self._relaying(word):  # a connection per node, and its own
            return relay_budget(world_size=world, nodes=nodes, local_workers=local, asked=spec.store.relays is True)
        shorts = (job_fits(world_size=world, nodes=nodes, local_workers=local), listen_fits(world_size=world))
        return [short for short in shorts if short is not None]


def news(placed: Assignment | None, word: Assignment, restarts: int, latest: RoundWord | None) -> RoundWord | None:
    """What to tell of how this node's last round ended (pure): ``latest``, the word that came with ``word``, whose
    news is what ended the round before it, when that round was the one this node ran (``placed``), or when a
    restart was counted since ``restarts``: a node still stopping its workers may skip a round that failed at once,
    and its restart (and that failure) must not go untold. None when this node ran no round yet, or only regroups
    came between."""
    if placed is None:
        return None
    return latest if word.round == placed.round + 1 or word.restarts > restarts else None


def ended_news(word: RoundWord | None, attempt: int, restarts_left: int | None = None) -> tuple[Record, ...]:
    """What ended this node's round ``attempt``, as the coordinator says it to every node (``word``; None: nothing
    this node ran): the nodes lost, the job's first failure (its root cause), and the restart (``restarts_left``:
    when one was counted). Pure."""
    if word is None:
        return ()
    told: list[Record] = []
    if word.lost:
        told.append(NodeLost(word.lost, word.reason))
    fact = failure_from(word.failure, attempt) if word.failure is not None else None
    if fact is not None:
        told.append(fact)
    if restarts_left is not None:  # the root cause says more than the coordinator's "node N reported a failure"
        told.append(Restart(attempt + 1, failure_line(fact) if fact is not None else word.reason, restarts_left))
    return tuple(told)


def exclusions(word: RoundWord | None) -> tuple[Record, ...]:
    """A ``node.excluded`` for each exclusion ``word`` lists (``NewsEvents`` tells each once). Pure."""
    return tuple(NodeExcluded((name,), why) for name, why in word.excluded) if word is not None else ()


def formed(number: int, place: Assignment | Membership, seconds: float) -> RdzvRound:
    """``rdzv.round``: round ``number`` formed with this node at ``place``, ``seconds`` after it set out for it."""
    return RdzvRound(number, place.group_world_size, place.ranks.world_size, place.group_rank, seconds)
