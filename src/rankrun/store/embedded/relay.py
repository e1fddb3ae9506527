"""A relay of the embedded store: one process holds k agents' connections and forwards them over one connection.

One process cannot hold a connection per node past its RLIMIT_NOFILE (20,000 here: 32,768 nodes cannot each connect
to the host). A relay accepts its agents' connections (the same protocol, authenticated here with the job's secret,
and watched for silence here, pinged as the host pings them), and forwards their frames over ONE connection to the
host, itself authenticated with the secret and marked a relay in its hello (``store.embedded.server``). On the host
each relayed agent is a virtual connection of its own (``server._Virtual``): its own leases and watches, so a lost
agent loses exactly its own. Frames travel in batches both ways (``{"b": [{"c": agent, ...frame}, ...]}``): one write
and one read per turn of either loop, however many agents spoke, so the host reads and writes per relay, not per node.

What is lost when:

- an agent's connection to its relay ends (it closed, its host died, it fell silent past its window): the relay says
  ``bye`` for it and the host revokes its leases, exactly as if it had been connected directly;
- the relay's connection to the host ends (the relay died, its network went): the host ends every one of its agents'
  virtual connections (their leases go at once, their node keys with them), and the relay closes every agent's
  connection: each agent sees its rendezvous connection lost, as when the host goes, and rejoins or exits as it would.

Deployment: the host decides who relays (``store.embedded.routing``): past what it can hold, the first agents to
arrive are asked to (``rendezvous.session`` starts one on the agent's own address) and the later ones are sent to them;
no process then holds more than about twice sqrt(nodes) connections. A relay whose node is lost takes its agents'
places with it: they exit as when the host goes, and the others re-form. The bench and the contract tests also start
relays themselves, as processes of their own.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from rankrun.store.embedded import wire
from rankrun.store.embedded.client import StoreClient
from rankrun.store.embedded.liveness import Liveness
from rankrun.store.embedded.server import StoreServer, _Connection
from rankrun.store.memory import MemoryStore

logger = logging.getLogger(__name__)


class _Forwarded(_Connection):
    """An agent's connection to the relay: its handshake and its silence are the relay's business (the inherited
    server side), its requests the host's (forwarded with the relay's id for it)."""

    def __init__(self, relay: Relay, cid: int) -> None:
        super().__init__(relay.server)
        self._relay = relay
        self.cid = cid

    def _request(self, msg: dict[str, Any]) -> None:
        if "pong" in msg:
            return  # an answer to the relay's own ping
        self._relay.forward(self.cid, msg)

    def _end(self, why: str) -> None:
        ready = self._state == "ready"  # it was known upstream
        super()._end(why)
        self._relay.gone(self.cid, why if ready else None)

    def deliver(self, obj: dict[str, Any]) -> None:
        """A frame from the host for this agent (a reply, a watch event, a lease's end)."""
        self._send(obj)


class _RelayServer(StoreServer):
    def __init__(self, relay: Relay, secret: bytes | None) -> None:
        super().__init__(MemoryStore(), secret)  # never read or written: every request is forwarded
        self._relay = relay

    def new_connection(self) -> _Connection:
        return self._relay.accepted()


class Relay:
    """Forwards the agents that connect to ``start``'s address to the host, over one connection (see the module)."""

    def __init__(self, secret: bytes | None, liveness: Liveness | None = None) -> None:
        self.server = _RelayServer(self, secret)
        self._secret = secret
        self._liveness = liveness
        self._upstream: StoreClient | None = None
        self._agents: dict[int, _Forwarded] = {}
        self._batch: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self.lost = asyncio.Event()  # set once the connection to the host is gone (the relay is then of no use)
        self._empty = asyncio.Event()  # set while no agent is connected
        self._empty.set()
        self.why = ""

    async def start(self, host: str, port: int, upstream: tuple[str, int], local_addr: str | None = None, *,
                    token: int | None = None) -> int:
        """Serve agents on ``host:port`` (0: the OS picks), and connect to the host at ``upstream``, telling it that
        address (a host that routes agents sends them there: ``store.embedded.routing``; ``token``: the host's word
        that asked this node to relay); the port. Not reaching the
        host is ``StoreUnavailable`` or ``AuthenticationFailed``, as an agent would get them, and serves nobody."""
        bound = await self.server.start(host, port)  # first: the host may send agents here as soon as it knows
        try:
            self._upstream = await StoreClient.connect(upstream[0], upstream[1], self._secret, local_addr,
                                                       self._liveness, relay=self._from_host, at=f"{host}:{bound}", token=token)
        except BaseException:
            await self.server.close()
            raise
        self._upstream.when_lost = self._lost
        return bound

    @property
    def agents(self) -> int:
        """Agents connected through this relay now."""
        return len(self._agents)

    def accepted(self) -> _Forwarded:
        agent = _Forwarded(self, next(self._ids))
        self._agents[agent.cid] = agent
        self._empty.clear()
        return agent

    async def empty(self) -> None:
        """Until no agent is connected through this relay (they left, or were lost)."""
        await self._empty.wait()

    def forward(self, cid: int, msg: dict[str, Any]) -> None:
        """An agent's frame for the host: in this turn's batch."""
        if not self._batch:
            asyncio.get_running_loop().call_soon(self._flush)
        msg["c"] = cid
        self._batch.append(msg)

    def gone(self, cid: int, why: str | None) -> None:
        """An agent's connection ended; ``why`` is told to the host if it knew the agent (its leases go there)."""
        self._agents.pop(cid, None)
        if not self._agents:
            self._empty.set()
        if why is not None and not self.lost.is_set():
            self.forward(cid, {"bye": why})

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        if self._upstream is not None:
            for at in range(0, len(batch), wire.BATCH):
                self._upstream.send({"b": batch[at : at + wire.BATCH]})

    def _from_host(self, batch: list[Any]) -> None:
        for item in batch:
            if not isinstance(item, dict):
                continue
            agent = self._agents.get(item.pop("c", 0))
            if agent is not None:
                agent.deliver(item)

    def _lost(self, why: str) -> None:
        """The host is out of reach: every agent's connection is closed, as the host's loss would close it."""
        if self.lost.is_set():
            return
        self.why = why
        self.lost.set()
        logger.warning("rendezvous relay: %s; closing its %d agents' connections", why, len(self._agents))
        for agent in list(self._agents.values()):
            agent.abort()

    async def close(self) -> None:
        self.why = self.why or "the relay was closed"
        self.lost.set()  # its own doing: nothing to warn about
        await self.server.close()
        if self._upstream is not None:
            await self._upstream.close()
        await self.server.store.close()
