"""The straggler watch of several nodes, one round on this node (``--straggler-window``): this node's windows go to
the host on the host's clock (``rendezvous.stragglers``); the host (the coordinator's node) also answers the clock
questions and judges the whole job; every node reads the verdicts and says what changed (``agent.stragglers.watch.Said``).
Loaded only by a job of several nodes with the watch on (its records are JSON)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping

from rankrun.agent.stragglers.watch import Said
from rankrun.rendezvous import stragglers
from rankrun.rendezvous.keys import Keys
from rankrun.store.api import Store, StoreUnavailable
from rankrun.straggler import verdict
from rankrun.straggler.clock import Offset
from rankrun.straggler.summary import NodeWindow, pick
from rankrun.straggler.verdict import Arrivals, RankWindow, Straggler

RECLOCK = 10  # windows between two estimates of the host's clock
STREAK = 3  # windows in a row a rank is named before its node is blamed (--straggler-action exclude)

Blame = Callable[[str, str], Awaitable[None]]  # node id, why (the coordinator's ``straggler``)


class JobStragglers:
    """Several nodes, one round: this node's windows go to the host on its clock; the host (``host``) answers the
    clock questions and judges the job; every node says the verdicts (``said``). ``run`` until cancelled (the round's
    end); a store that fails is the round's business (its own watches say so)."""

    def __init__(self, store: Store, keys: Keys, round_: int, node: str, nodes: int, window: float,  # noqa: PLR0917
                 said: Said, *, where: str, host: bool, lease: int = 0, now: Callable[[], float] = time.time,
                 blame: Blame | None = None) -> None:
        """``where``: this node as lines name it (hostname/address). ``blame`` (the host, ``--straggler-action
        exclude``): a node whose rank was named ``STREAK`` windows in a row is blamed for it, once a streak."""
        self.where, self._blame = where, blame
        self._streaks: dict[int, int] = {}
        self._store, self._keys, self._round, self._node, self._nodes = store, keys, round_, node, nodes
        self._window, self._said, self._host, self._lease, self._now = window, said, host, lease, now
        self._offset: Offset | None = None
        self._number = 0

    async def run(self) -> None:
        tasks = [self._verdicts()]
        if self._host:
            tasks += [stragglers.answer_clocks(self._store, self._keys, self._round, self._now, self._put),
                      stragglers.judge_job(self._store, self._keys, self._round, self._nodes, self._put, self._window,
                                           tell=self._judged)]
        with contextlib.suppress(StoreUnavailable):
            await asyncio.gather(*tasks)

    async def _judged(self, found: list[Straggler], owners: Mapping[int, str]) -> None:
        """The host's verdict: a rank named ``STREAK`` windows in a row gets its node blamed (then counts again)."""
        self._streaks, due = verdict.blamed(self._streaks, found, STREAK)
        if self._blame is None:
            return
        for s in due:
            node = owners.get(s.rank)
            if node is not None:
                await self._blame(node, f"rank {s.rank} on {s.where} held the others back for {STREAK} windows in a "
                                        f"row ({verdict.figures(s)})")

    async def _put(self, key: str, value: bytes) -> None:
        await self._store.put(key, value, lease=self._lease)

    async def _verdicts(self) -> None:
        async for found in stragglers.verdicts(self._store, self._keys, self._round):
            self._said.update(found)

    async def judge(self, ranks: list[RankWindow], arrivals: Arrivals, length: float) -> None:
        """A window of this node's, sent to the host: a sample of its collectives, on the host's clock."""
        if self._number % RECLOCK == 0:
            with contextlib.suppress(StoreUnavailable):
                self._offset = await stragglers.offset(self._store, self._keys, self._round, self._node, self._now,
                                                       lease=self._lease) or self._offset
        self._number += 1
        shift = self._offset.offset if self._offset is not None else 0.0
        sent = {key: {rank: t + shift for rank, t in when.items()} for key, when in pick(arrivals).items()}
        with contextlib.suppress(StoreUnavailable):
            await stragglers.publish(self._store, self._keys, self._round,
                                     NodeWindow(self._node, self._number, tuple(ranks), sent, len(arrivals), length),
                                     lease=self._lease)
