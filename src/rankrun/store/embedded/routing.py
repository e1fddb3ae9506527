"""Which agents the host serves itself, and which it sends to a relay: the launcher's rendezvous relays.

Past what one process can hold (its open-files limit), the host of a large job stops taking every agent's connection
itself. An agent says in its hello that it can relay (``"relays": true``: the launcher's agents do). The host answers
such an agent with one of these:

- ``Serve(token)``: this agent stays connected as usual and also becomes a relay (``store.embedded.relay``) on its own
  address, whose connection to the host names the token: the first ``wanted`` agents to arrive are asked, so the relays
  start before the crowd arrives. Only once the handshake has proved that both sides know the job's secret;
- ``Redirect(at)``: connect to that relay instead. Every later agent is given a relay in turn at once, so each relay
  serves about as many agents as the others;
- ``Wait()``: its relay is not ready yet (asked a moment ago): the host holds the answer and sends the redirect as soon
  as that relay's connection is authenticated. No agent retries in a loop, and a crowd arriving together is not a crowd
  of retries;
- ``Retry()``: the relay it waited for was lost before it was ready: it tries again, as when the host is not up yet.

Once every relay has been asked, the others' answers come before the proof, in reply to the hello (``early``): the host
then holds each of the crowd's connections for one read and one write, not for a round trip to a busy agent, and does
no hashing for it. That gives nothing away: the agent makes its whole handshake again at the relay, which must prove
the secret to it; one who could forge a redirect could as well stand between the agent and the host.

A relay's agents are, on the host, virtual connections of their own (``server._Virtual``). A relay that goes loses its
agents' connections, and so their leases; it leaves the turn at once, and the next agent to arrive is asked in its
place. A relay nobody asked for (the benchmark's and the tests' own relay processes) joins the turn when it connects.

How many nodes one relay serves is decided on the host's limits (``fdlimit.rendezvous_group``); ``relays_for`` turns
that into how many relays to ask for.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Generic, TypeVar

C = TypeVar("C")  # a connection, as the server has it (the routing only tells them apart)


@dataclass(frozen=True)
class Serve:
    """Stay connected, and relay for others: the relay's own connection names ``token``."""

    token: int


@dataclass(frozen=True)
class Redirect:
    """Connect to the relay at ``at`` (``host:port``) instead."""

    at: str


@dataclass(frozen=True)
class Wait:
    """The host holds its answer until this agent's relay is ready (a ``Redirect``) or lost (a ``Retry``)."""


@dataclass(frozen=True)
class Retry:
    """Try again shortly."""


Route = Serve | Redirect | Wait | Retry


def relays_for(nodes: int, group: int) -> int:
    """Relays for a job of ``nodes`` (the host's own among them, which needs none) when each serves ``group`` nodes
    besides its own: the others split into groups of ``group + 1`` (the relay's node connects directly)."""
    if group <= 0 or nodes <= 1:
        return 0
    return math.ceil((nodes - 1) / (group + 1))


@dataclass
class _Slot(Generic[C]):
    """One relay: the agent asked to run it, its own connection and address once ready, who waits for it."""

    asked: C | None
    relay: C | None = None
    at: str = ""
    waiting: dict[C, None] = field(default_factory=dict)  # in arrival order


class Routing(Generic[C]):
    """The host's side: which answer each arriving agent gets (see the module)."""

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted  # relays to ask for
        self._slots: dict[int, _Slot[C]] = {}  # token -> its relay, in the order they were asked (the turn)
        self._order: list[int] = []
        self._of: dict[C, int] = {}  # an asked agent's, a relay's or a waiting agent's connection -> its token
        self._tokens = itertools.count(1)
        self._turn = 0

    def early(self, agent: C) -> Route | None:
        """The answer for an agent that offered to relay, from its hello alone: None while relays are still to be asked
        (one asked must first prove it knows the secret: ``route`` then); otherwise ``route``'s."""
        if len(self._slots) < self.wanted:
            return None
        return self.route(agent)

    def route(self, agent: C) -> Route:
        """The answer for an agent that has just proved it knows the secret and offered to relay."""
        if len(self._slots) < self.wanted:
            token = self._add(_Slot[C](agent))
            self._of[agent] = token
            return Serve(token)
        if not self._order:
            return Retry()
        token = self._order[self._turn % len(self._order)]
        self._turn += 1
        slot = self._slots[token]
        if slot.at:
            return Redirect(slot.at)
        slot.waiting[agent] = None
        self._of[agent] = token
        return Wait()

    def ready(self, relay: C, token: int | None, at: str) -> list[C]:
        """A relay's connection authenticated, for ``token`` (None: a relay nobody asked for); the agents that waited
        for it, to be sent there now."""
        if token is None or (slot := self._slots.get(token)) is None:  # nobody asked for it, or its slot went
            slot = _Slot[C](None)
            token = self._add(slot)
        self._of[relay] = token
        slot.relay, slot.at = relay, at
        waiting = list(slot.waiting)
        for agent in waiting:
            self._of.pop(agent, None)
        slot.waiting.clear()
        return waiting

    def ended(self, connection: C) -> list[C]:
        """A connection ended. An asked agent's or a relay's: its relay leaves the turn, and the agents that still
        waited for it are returned (to be told to retry). A waiting agent's: it no longer waits."""
        token = self._of.pop(connection, None)
        if token is None or (slot := self._slots.get(token)) is None:
            return []
        if connection is not slot.asked and connection is not slot.relay:
            slot.waiting.pop(connection, None)
            return []
        del self._slots[token]
        self._order.remove(token)
        for other in (slot.asked, slot.relay, *slot.waiting):
            if other is not None:
                self._of.pop(other, None)
        return list(slot.waiting)

    @property
    def relays(self) -> list[str]:
        """The addresses of the relays ready now, in turn."""
        return [self._slots[token].at for token in self._order if self._slots[token].at]

    def _add(self, slot: _Slot[C]) -> int:
        token = next(self._tokens)
        self._slots[token] = slot
        self._order.append(token)
        return token
