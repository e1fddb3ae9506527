"""Which agents the host serves itself, and which it sends to a relay: the launcher's rendezvous relays.

Past what one process can hold (its open-files limit), the host of a large job stops taking every agent's connection
itself. An agent says in its hello that it can relay (``"relays": true``: the launcher's agents do). Once the handshake
has proved both sides know the job's secret, the host answers such an agent with one of three words:

- ``serve``: this agent stays connected as usual and also becomes a relay (``store.embedded.relay``) on its own address:
  the first ``wanted`` agents to arrive are asked, so the relays are up before the crowd is;
- ``redirect`` to a relay that is ready (its own connection to the host authenticated and its address known), taken in
  turn, so each serves about as many agents as the others: the agent connects there instead;
- ``retry``: no relay is ready yet (they were asked a moment ago): the agent tries again shortly, as it does when the
  host is not up yet.

A relay's agents are, on the host, virtual connections of their own (``server._Virtual``). A relay that goes loses its
agents' connections, and so their leases; it leaves the turn at once, and an asked agent whose connection ends no longer
counts, so the next agent to arrive is asked in its place.

How many nodes one relay serves is decided on the host's limits (``fdlimit.rendezvous_group``); ``relays_for`` turns
that into how many relays to ask for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Serve:
    """Stay connected, and relay for others."""


@dataclass(frozen=True)
class Redirect:
    """Connect to the relay at ``at`` (``host:port``) instead."""

    at: str


@dataclass(frozen=True)
class Retry:
    """No relay is ready yet: try again shortly."""


Route = Serve | Redirect | Retry


def relays_for(nodes: int, group: int) -> int:
    """Relays for a job of ``nodes`` (the host's own among them, which needs none) when each serves ``group`` nodes
    besides its own: the others split into groups of ``group + 1`` (the relay's node connects directly)."""
    if group <= 0 or nodes <= 1:
        return 0
    return math.ceil((nodes - 1) / (group + 1))


class Routing:
    """The host's side: which word each arriving agent gets (see the module)."""

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted  # relays to ask for
        self._asked: set[object] = set()  # the agents' connections asked to serve (until they end)
        self._ready: dict[object, str] = {}  # a relay's own connection -> the address its agents connect to
        self._order: list[str] = []  # the ready relays' addresses, taken in turn
        self._turn = 0

    def route(self, agent: object) -> Route:
        """The word for an agent that has just proved it knows the secret and offered to relay."""
        if len(self._asked) < self.wanted:
            self._asked.add(agent)
            return Serve()
        if not self._order:
            return Retry()
        at = self._order[self._turn % len(self._order)]
        self._turn += 1
        return Redirect(at)

    def ready(self, relay: object, at: str) -> None:
        """A relay's connection authenticated: its agents may be sent to ``at``."""
        self._ready[relay] = at
        self._order.append(at)

    def ended(self, connection: object) -> None:
        """A connection ended: an asked agent no longer counts, a relay leaves the turn."""
        self._asked.discard(connection)
        at = self._ready.pop(connection, None)
        if at is not None:
            self._order.remove(at)

    @property
    def relays(self) -> list[str]:
        """The addresses of the relays ready now."""
        return list(self._order)
