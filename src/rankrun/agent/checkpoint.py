"""Kept progress (``rankrun.checkpoint``) on this node, from the job's start to its end: sequencing only.

``keeping`` makes the node's keeper (``rankrun.checkpoint.keeper``) before the first attempt and frees its memory at
the job's end; ``KeptProgress`` is its round-level feature (``agent.round``): each attempt's workers get
``RANKRUN_CHECKPOINT``, the keeper settles the step the attempt resumes from before they start and learns their pids
as they run, and what it saw becomes the job's events. With several nodes the step is every node's: each round's
nodes agree on it through the store before their workers start (``rendezvous.kept``), and a rank whose state another
node holds gets it from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankrun.agent.deps import AgentDeps
from rankrun.agent.race import first_of
from rankrun.agent.round import Feature, Round
from rankrun.checkpoint.keeper import Keeper, OnDisk, Told
from rankrun.checkpoint.plan import Plan, Source
from rankrun.checkpoint.wire import ENV
from rankrun.errors import StoreUnavailable
from rankrun.events.records import CheckpointKept, CheckpointRestored, CheckpointWritten
from rankrun.memroom import fits, read_here
from rankrun.proc.signals import StopStream
from rankrun.ranges import range_string
from rankrun.spec import LaunchSpec, Standalone
from rankrun.stacks.sampler import Target

if TYPE_CHECKING:
    from rankrun.checkpoint.disk import DiskWriter, Written
    from rankrun.checkpoint.peer import Sender
    from rankrun.rendezvous.member import Member


class Keeping:
    """The node's keeper and the value of ``RANKRUN_CHECKPOINT`` its workers get."""

    def __init__(self, keeper: Keeper, env: str) -> None:
        self.keeper, self.env = keeper, env


@contextlib.asynccontextmanager
async def keeping(spec: LaunchSpec, deps: AgentDeps, stops: StopStream) -> AsyncIterator[Keeping | None]:
    """The node's keeper for the job's length, with ``--checkpoint-dir``'s writer: at a stop by signal (a scheduler's
    preemption) the newest complete step is written within ``--shutdown-timeout``, while the workers stop."""
    folder = _folder(spec)
    keeper = Keeper(spec.worker.nproc, say=deps.console.say, told=_told(deps), room=_room,
                    disk=(lambda: _on_disk(folder)) if folder is not None else None)
    writer: DiskWriter | None = None
    flush: Flush | None = None
    if folder is not None:  # each launcher's manifests under a name of its own: two nodes may share a host name
        from rankrun.checkpoint.disk import DiskWriter  # noqa: PLC0415 - --checkpoint-dir only (json, shutil)

        writer = DiskWriter(folder, f"{deps.host}.{os.getpid()}", say=deps.console.say, on_written=_written(deps))
        keeper.on_step.append(writer.offer)
        flush = Flush(writer, stops, spec.restart.shutdown_timeout)
    env = await keeper.start()
    try:
        yield Keeping(keeper, env)
    finally:
        if flush is not None:
            await flush.finish()
        if writer is not None:
            await writer.close()
        await keeper.close()


class Flush:
    """``--checkpoint-dir`` at the first stop by signal: the step being written and the newest kept one, on disk within
    ``grace`` seconds from the signal (the workers' own stop runs meanwhile: they may keep one more step in it); at the
    job's end without one, the same."""

    def __init__(self, writer: DiskWriter, stops: StopStream, grace: float) -> None:
        self._writer, self._stops, self._grace = writer, stops, grace
        self.began = False
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> bool:
        await self._stops.arrived()
        self.began = True
        return await self._writer.flush(asyncio.get_running_loop().time() + self._grace, grace=self._grace)

    async def finish(self) -> None:
        """The job is over: a flush that began is waited for (bounded by its deadline); else the newest kept step is
        written now, within the same grace (a job that ended is resumed from its last step by the next one)."""
        if not self.began:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            await self._writer.flush(asyncio.get_running_loop().time() + self._grace, grace=self._grace)
            return
        await asyncio.gather(self._task, return_exceptions=True)


def _folder(spec: LaunchSpec) -> Path | None:
    """Where ``--checkpoint-dir``'s steps go: the run's folder, or the directory itself for one node on its own (a
    standalone job's run id is fresh at every launch, as torchrun's: the next job could never find its steps)."""
    if spec.checkpoint.dir is None:
        return None
    from rankrun.checkpoint.manifest import NO_RUN_ID, run_folder  # noqa: PLC0415 - --checkpoint-dir only

    return run_folder(spec.checkpoint.dir, NO_RUN_ID if isinstance(spec.rendezvous, Standalone) else spec.rendezvous.run_id)


def _on_disk(folder: Path) -> OnDisk | None:
    from rankrun.checkpoint.manifest import newest_complete  # noqa: PLC0415 - --checkpoint-dir only

    step = newest_complete(folder)
    return (step.step, step.world, step.files) if step is not None else None


def _written(deps: AgentDeps) -> Written:
    def written(step: int, where: str, nbytes: int, seconds: float, state: str) -> None:
        deps.events.emit(CheckpointWritten(step, "disk", where, nbytes, seconds, "complete" if state == "complete"
                                           else "abandoned"))

    return written


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


@contextlib.asynccontextmanager
async def across_nodes(keeping: Keeping, spec: LaunchSpec, deps: AgentDeps, stops: StopStream, *, member: Member,
                       address: str) -> AsyncIterator[KeptAcrossNodes]:
    """Kept progress on several nodes for the session's length: with the job's secret, this node's keep endpoint on
    its address (``checkpoint.peer``: it holds the ring's previous node's copies and serves any node a step it holds)
    and its sender to the next node; without one, no neighbour's copy, said once."""
    from rankrun.checkpoint import peer  # noqa: PLC0415 - several nodes only

    keeper, node = keeping.keeper, member.info.id
    keeper.node = node
    if not spec.secret:
        deps.console.say(f"checkpoint: {peer.NO_SECRET}")
        yield KeptAcrossNodes(keeping, deps, stops, member)
        return
    secret = spec.secret
    server = peer.PeerServer(address, secret, room=_room, node=node, own=keeper.copy_of)
    port = await server.start()
    sender = peer.Sender(secret, node, say=deps.console.say, sent=_sent(deps))

    async def remote(source: Source, rank: int, step: int) -> int:
        if source.peer is None:
            raise OSError(f"node {source.node} serves no copies")
        try:
            return await peer.get(*source.peer, secret, node=source.node, rank=rank, step=step)
        except peer.PeerError as exc:
            raise OSError(str(exc)) from None

    keeper.neighbours, keeper.remote = server, remote
    keeper.on_step.append(sender.offer)
    try:
        yield KeptAcrossNodes(keeping, deps, stops, member, peer=(address, port), sender=sender)
    finally:
        keeper.on_step.remove(sender.offer)
        keeper.neighbours = keeper.remote = None
        await sender.close()
        await server.close()


def _sent(deps: AgentDeps) -> Written:
    def sent(step: int, where: str, nbytes: int, seconds: float, state: str) -> None:
        deps.events.emit(CheckpointWritten(step, "neighbour", where, nbytes, seconds,
                                           "complete" if state == "complete" else "abandoned"))

    return sent


class KeptAcrossNodes(Feature):
    """Each round's part of kept progress on several nodes: the step agreed by every node of the round before its
    workers start (a round that moves on meanwhile, or a stop, leaves the attempt with nothing to resume: it is
    stopped at once anyway), and the next node of the round's ring as the neighbour that holds this node's copies."""

    def __init__(self, keeping: Keeping, deps: AgentDeps, stops: StopStream, member: Member, *,
                 peer: tuple[str, int] | None = None, sender: Sender | None = None) -> None:
        self._keeping, self._deps, self._stops, self._member = keeping, deps, stops, member
        self._peer, self._sender = peer, sender

    @contextlib.asynccontextmanager
    async def serving(self, round_: Round) -> AsyncIterator[None]:
        keeper, member, word = self._keeping.keeper, self._member, round_.word
        assert word is not None
        round_.env = (*round_.env, (ENV, self._keeping.env))
        from rankrun.rendezvous.kept import agree, successor  # noqa: PLC0415 - one node never loads the rendezvous

        agreed: Plan | str = ""
        try:
            index, result = await first_of(
                agree(member.store, member.keys, word.round, word.group_rank, word.group_world_size,
                      mine=keeper.holdings(self._peer), lease=member.lease.id, peer=self._peer),
                member.round_changed(word.round), self._stops.arrived())
            if index == 0:
                agreed = result
                if self._sender is not None:
                    self._sender.to = await successor(member.store, member.keys, word.round, word.group_rank,
                                                      word.group_world_size)
        except StoreUnavailable:
            pass  # the round's own watches say the store is gone; the attempt is stopped
        keeper.attempt_starts(round_.attempt, word.ranks.world_size, agreed)
        self._deps.on_demand.on_running = lambda targets: running(keeper, targets)
        try:
            yield
        finally:
            self._deps.on_demand.on_running = None
            keeper.attempt_ended()


__all__ = ["Keeping", "KeptAcrossNodes", "KeptProgress", "across_nodes", "keeping", "record", "running"]
