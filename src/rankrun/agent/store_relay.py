"""This node's store relay (``--store-relays``, ``workerstore.relay``): started for the first round that wants it, on
this node's own address, kept for the session, and named to the workers as MASTER_ADDR/MASTER_PORT.

The node hosting the workers' store never relays (its workers connect to the store directly), nor does a node whose
session says its backend does not let them (``Session.relayable``: on etcd the store is a coordinator's own, on a port
of its own that only speaks torch's protocol). A relay that cannot
be started is said, and the node's workers connect to the host directly (what they would do without relays).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from rankrun.agent.round import Feature, Round
from rankrun.errors import StoreError
from rankrun.fdlimit import nofile, relays_wanted
from rankrun.rendezvous.keys import Assignment
from rankrun.spec import LaunchSpec
from rankrun.workerstore.relay import StoreRelay


def wanted(spec: LaunchSpec, word: Assignment, *, relayable: bool) -> bool:
    """Whether this job's nodes relay in ``word``'s round (``fdlimit.relays_wanted`` on this node's limits);
    ``relayable``: whether the session's backend lets them (``Session.relayable``: not on etcd)."""
    if not relayable:
        return False
    soft, hard = nofile()
    return relays_wanted(spec.store.relays, world_size=word.ranks.world_size, nodes=word.group_world_size,
                         local_workers=spec.worker.nproc, soft=soft, hard=hard)


class NodeStoreRelay(Feature):
    """``master(word)``: where this node's workers reach the store in ``word``'s round (as a round-level feature: the
    round's ``master``, while it is served); ``close()`` at the end."""

    def __init__(self, spec: LaunchSpec, say: Callable[[str], None], *, hosting: bool, relayable: bool,
                 address: str) -> None:
        self._spec = spec
        self._say = say
        self._hosting, self._relayable = hosting, relayable
        self._address = address
        self._relay: StoreRelay | None = None
        self._said_etcd = False

    @contextlib.asynccontextmanager
    async def serving(self, round_: Round) -> AsyncIterator[None]:
        if round_.word is not None:
            round_.master = await self.master(round_.word)
        yield

    async def master(self, word: Assignment) -> tuple[str, int]:
        upstream = (word.master_addr, word.master_port)
        if not self._relayable and self._spec.store.relays and not self._said_etcd:
            self._said_etcd = True
            self._say("--store-relays: not with the etcd rendezvous (the store is a node's own, reached on a port that "
                      "speaks only torch's protocol); this node's workers connect to it directly")
        if self._hosting or not wanted(self._spec, word, relayable=self._relayable):
            return upstream
        relay = self._relay
        if relay is not None and relay.upstream == upstream:
            return self._address, relay.port
        await self.close()
        relay = StoreRelay(upstream, self._spec.secret, bind=self._address)
        try:
            port = await relay.start(self._address, 0)
        except StoreError as exc:
            await relay.close()
            self._say(f"{exc}; this node's workers connect to the job's store directly")
            return upstream
        relay.on_lost = self._say
        self._relay = relay
        self._say(f"store relay: this node's workers reach the job's store at {upstream[0]}:{upstream[1]} through "
                  f"{self._address}:{port} (their MASTER_ADDR and MASTER_PORT)")
        return self._address, port

    async def close(self) -> None:
        relay, self._relay = self._relay, None
        if relay is not None:
            await relay.close()
