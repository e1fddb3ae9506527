"""How far another agent's clock is from this one's, from timed round trips (pure).

Arrival times from different hosts compare only on one clock. An agent asks the host for its time and notes its own
clock when it asked (``sent``) and when the answer came (``received``); the host's answer (``remote``) was read at some
moment between the two, so ``remote - (sent + received) / 2`` is the offset within half the round trip, whatever the
asymmetry of the two ways. Of several exchanges the one with the shortest round trip bounds it best (NTP's clock
filter does the same); a queue or a scheduler's delay only lengthens a round trip, never shortens it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Exchange:
    """One timed round trip: this agent's clock when it asked and when the answer came, the other's in between."""

    sent: float
    remote: float
    received: float

    @property
    def round_trip(self) -> float:
        return self.received - self.sent


@dataclass(frozen=True)
class Offset:
    """The other clock minus this one (seconds), within ``error`` either way."""

    offset: float
    error: float

    def to_remote(self, local: float) -> float:
        """A time of this clock on the other's."""
        return local + self.offset


def estimate(exchanges: Iterable[Exchange]) -> Offset | None:
    """The offset the shortest round trip gives (pure); None without one (a round trip that went backwards, a clock
    stepped meanwhile, is left out)."""
    best = min((e for e in exchanges if e.round_trip >= 0), key=lambda e: e.round_trip, default=None)
    if best is None:
        return None
    return Offset(best.remote - (best.sent + best.received) / 2, best.round_trip / 2)
