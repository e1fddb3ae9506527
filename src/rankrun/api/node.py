"""One node's part in a several-node ``rankrun.launch`` job: what the agent's rounds (``agent.multinode``) do for the
API, beside running the workers.

After each round whose workers ended by themselves, before the node reports how: its values
(``rankrun.api.values``) or its failures (``rankrun.api.failures``) into the store, the keys of its previous report
deleted first (a job that restarts often must not pile up values it will never read). When the job ends: the other
nodes' values or failures of the last round, into the caller's results directory, before the node leaves. A node
that did not run the last round (it waited as a spare, or a new coordinator's placement left it out) returns
nothing rather than what its own earlier round left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from rankrun.api import failures, values
from rankrun.errors import LauncherError
from rankrun.rendezvous.keys import Assignment, RoundWord
from rankrun.rendezvous.member import Member
from rankrun.report.failure import Ending, WorkerResult, root_cause
from rankrun.store.api import StoreUnavailable


class ApiNode:
    """This node's side of the exchange, for the length of the job (it remembers what it last published)."""

    def __init__(self, member: Member, results: Path, *, nproc: int, host: str, address: str, spill_dir: Path | None,
                 run_id: str, close_timeout: float) -> None:
        self.member = member
        self.results = results
        self.nproc = nproc
        self.host = host  # as the node's own WorkerError names it
        self.address = address  # host/address: two nodes may share a name
        self.spill_dir = spill_dir  # <log_dir>/<run>/values when the user gave a log_dir
        self.run_id = run_id
        self.close_timeout = close_timeout
        self._published: list[str] = []

    def _mine(self, placed: Assignment) -> range:
        return range(placed.ranks.base_rank, placed.ranks.base_rank + self.nproc)

    async def report(self, placed: Assignment, failed: bool, results: list[WorkerResult]) -> None:
        """This node's values, or (``failed``) its failures, for the other nodes (before it reports how its workers
        ended): ``results`` are how each of its workers ended."""
        store, keys = self.member.store, self.member.keys
        for key in self._published:
            with contextlib.suppress(StoreUnavailable):
                await store.delete(key)
        lease = self.member.job.id if self.member.job is not None else 0
        if not failed:
            self._published = await values.publish(store, keys, placed.round, self._mine(placed), results=self.results,
                                                   spill_dir=self.spill_dir, host=self.address, lease=lease)
            return
        root = root_cause(results)
        ended = [(r.rank, r.status) for r in results if r.ending is Ending.FAILED]
        value = failures.node_failures(self.member.info.id, self.host, root.rank if root else None, ended, self.results)
        self._published = await failures.publish(store, keys, placed.round, placed.group_rank, value, lease=lease)

    async def job_ended(self, end: RoundWord, placed: Assignment | None, say: Callable[[str], None]) -> None:
        """The other nodes' values (the job succeeded) or failures of the last round, before leaving. Values that
        cannot be read fail the launch; failures that cannot be read are said (the job failed either way, and the
        report names its first failure)."""
        if end.stranded:
            return
        if placed is None or placed.round != end.round:  # not in the last round: nothing of an earlier one
            values.forget_the_others(self.results, range(0))
            return
        store, keys = self.member.store, self.member.keys
        try:
            async with asyncio.timeout(self.close_timeout):
                if end.ok:
                    await values.collect(store, keys, placed.round, placed.ranks.world_size, self._mine(placed),
                                         results=self.results)
                else:
                    await failures.collect(store, keys, placed.round, placed.group_world_size, self._mine(placed),
                                           results=self.results)
        except (TimeoutError, StoreUnavailable, OSError, ValueError) as exc:
            why = f"no answer within {self.close_timeout:g} s (close_timeout)" if isinstance(exc, TimeoutError) else str(exc)
            if not end.ok:
                say(f"rendezvous {self.run_id}: the other nodes' failures could not be read: {why}")
                return
            raise LauncherError(f"rendezvous {self.run_id}: the job succeeded, but the other nodes' values could not be "
                                f"read: {why}") from None


__all__ = ["ApiNode"]
