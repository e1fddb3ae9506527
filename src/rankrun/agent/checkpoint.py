"""Kept progress (``rankrun.checkpoint``) on this node, from the job's start to its end: sequencing only.

``keeping`` makes the node's keeper (``rankrun.checkpoint.keeper``) before the first attempt and frees its memory at
the job's end; ``KeptProgress`` is its round-level feature (``agent.round``): each attempt's workers get
``RANKRUN_CHECKPOINT``, the keeper settles the step the attempt resumes from before they start and learns their pids
as they run, and what it saw becomes the job's events. With several nodes the step is every node's: each round's
nodes agree on it through the store before their workers start (``rendezvous.kept``), and a rank whose state another
node holds gets it from there.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from rankrun.agent.deps import AgentDeps
from rankrun.agent.race import first_of
from rankrun.agent.round import Feature, Round
from rankrun.checkpoint.keeper import Keeper, Told
from rankrun.checkpoint.plan import Plan
from rankrun.checkpoint.wire import ENV
from rankrun.errors import StoreUnavailable
from rankrun.events.records import CheckpointKept, CheckpointRestored
from rankrun.memroom import fits, read_here
from rankrun.proc.signals import StopStream
from rankrun.ranges import range_string
from rankrun.spec import LaunchSpec
from rankrun.stacks.sampler import Target

if TYPE_CHECKING:
    from rankrun.rendezvous.member import Member


class Keeping:
    """The node's keeper and the value of ``RANKRUN_CHECKPOINT`` its workers get."""

    def __init__(self, keeper: Keeper, env: str) -> None:
        self.keeper, self.env = keeper, env


@contextlib.asynccontextmanager
async def keeping(spec: LaunchSpec, deps: AgentDeps) -> AsyncIterator[Keeping | None]:
    """The node's keeper for the job's length."""
    keeper = Keeper(spec.worker.nproc, say=deps.console.say, told=_told(deps), room=_room)
    env = await keeper.start()
    try:
        yield Keeping(keeper, env)
    finally:
        await keeper.close()


def _room(growth: int) -> str | None:
    """Whether the node has room for ``growth`` more bytes of kept memory (``memroom``, as the health check judges)."""
    return fits(read_here(), growth)


def _told(deps: AgentDeps) -> Told:
    """What the keeper saw, as the job's events (``checkpoint.kept``, ``checkpoint.restored``)."""

    def told(what: str, facts: dict[str, Any]) -> None:
        deps.events.emit(record(what, facts))

    return told


def record(what: str, facts: dict[str, Any]) -> CheckpointKept | CheckpointRestored:
    """The event of one thing the keeper saw (pure)."""
    if what == "restored":
        return CheckpointRestored(int(facts["attempt"]), int(facts["step"]), facts["source"],
                                  range_string(facts["ranks"]), int(facts["bytes"]), float(facts["seconds"]))
    if what == "refused":
        return CheckpointKept(max(0, int(facts["step"])), range_string([facts["rank"]]), int(facts["bytes"]), 0.0,
                              "refused", str(facts["why"]))
    return CheckpointKept(int(facts["step"]), range_string(facts["ranks"]), int(facts["bytes"]),
                          float(facts["seconds"]), "kept", None)


class KeptProgress(Feature):
    """Each attempt's part of kept progress (one node: every attempt is a round)."""

    def __init__(self, keeping: Keeping, deps: AgentDeps, world: int) -> None:
        self._keeping, self._deps, self._world = keeping, deps, world

    @contextlib.asynccontextmanager
    async def serving(self, round_: Round) -> AsyncIterator[None]:
        keeper = self._keeping.keeper
        round_.env = (*round_.env, (ENV, self._keeping.env))
        keeper.attempt_starts(round_.attempt, self._world)
        self._deps.on_demand.on_running = self._running
        try:
            yield
        finally:
            self._deps.on_demand.on_running = None
            keeper.attempt_ended()

    def _running(self, targets: list[Target]) -> None:
        running(self._keeping.keeper, targets)


def running(keeper: Keeper, targets: list[Target]) -> None:
    """The attempt's workers, as they started, to the keeper: pid -> (rank, local rank)."""
    if targets:
        ranks = sorted(t.rank for t in targets)
        keeper.workers({t.pid: (t.rank, ranks.index(t.rank)) for t in targets})


class KeptAcrossNodes(Feature):
    """Each round's part of kept progress on several nodes: the step agreed by every node of the round before its
    workers start (a round that moves on meanwhile, or a stop, leaves the attempt with nothing to resume: it is
    stopped at once anyway)."""

    def __init__(self, keeping: Keeping, deps: AgentDeps, stops: StopStream, member: Member) -> None:
        self._keeping, self._deps, self._stops, self._member = keeping, deps, stops, member
        keeping.keeper.node = member.info.id

    @contextlib.asynccontextmanager
    async def serving(self, round_: Round) -> AsyncIterator[None]:
        keeper, member, word = self._keeping.keeper, self._member, round_.word
        assert word is not None
        round_.env = (*round_.env, (ENV, self._keeping.env))
        from rankrun.rendezvous.kept import agree  # noqa: PLC0415 - one node never loads the rendezvous

        agreed: Plan | str = ""
        try:
            index, result = await first_of(
                agree(member.store, member.keys, word.round, word.group_rank, word.group_world_size,
                      mine=keeper.holdings(), lease=member.lease.id),
                member.round_changed(word.round), self._stops.arrived())
            if index == 0:
                agreed = result
        except StoreUnavailable:
            pass  # the round's own watches say the store is gone; the attempt is stopped
        keeper.attempt_starts(round_.attempt, word.ranks.world_size, agreed)
        self._deps.on_demand.on_running = lambda targets: running(keeper, targets)
        try:
            yield
        finally:
            self._deps.on_demand.on_running = None
            keeper.attempt_ended()


__all__ = ["Keeping", "KeptProgress", "keeping"]
