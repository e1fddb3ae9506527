"""Kept progress (``rankrun.checkpoint``) on this node, from the job's start to its end: sequencing only.

``keeping`` makes the node's keeper (``rankrun.checkpoint.keeper``) before the first attempt and frees its memory at
the job's end; ``KeptProgress`` is its round-level feature (``agent.round``): each attempt's workers get
``RANKRUN_CHECKPOINT``, the keeper settles the step the attempt resumes from before they start and learns their pids
as they run, and what it saw becomes the job's events. One node only, for now: a job of several nodes needs the step
every node kept, which the rendezvous will carry.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from rankrun.agent.deps import AgentDeps
from rankrun.agent.round import Feature, Round
from rankrun.checkpoint.keeper import Keeper
from rankrun.checkpoint.wire import ENV
from rankrun.memroom import fits, read_here
from rankrun.spec import LaunchSpec
from rankrun.stacks.sampler import Target


class Keeping:
    """The node's keeper and the value of ``RANKRUN_CHECKPOINT`` its workers get."""

    def __init__(self, keeper: Keeper, env: str) -> None:
        self.keeper, self.env = keeper, env


@contextlib.asynccontextmanager
async def keeping(spec: LaunchSpec, deps: AgentDeps) -> AsyncIterator[Keeping | None]:
    """The node's keeper for the job's length (``None`` for a job of several nodes)."""
    if spec.multi_node:
        yield None
        return
    keeper = Keeper(spec.worker.nproc, say=deps.console.say, told=_told(deps), room=_room)
    env = await keeper.start()
    try:
        yield Keeping(keeper, env)
    finally:
        await keeper.close()


def _room(growth: int) -> str | None:
    """Whether the node has room for ``growth`` more bytes of kept memory (``memroom``, as the health check judges)."""
    return fits(read_here(), growth)


def _told(deps: AgentDeps) -> Any:
    def told(what: str, facts: dict[str, Any]) -> None:
        del what, facts  # the events come with the records of checkpoint.kept and checkpoint.restored

    del deps
    return told


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
        if targets:
            ranks = sorted(t.rank for t in targets)
            self._keeping.keeper.workers({t.pid: (t.rank, ranks.index(t.rank)) for t in targets})


__all__ = ["Keeping", "KeptProgress", "keeping"]
