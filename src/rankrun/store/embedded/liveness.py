"""How a silent peer is noticed on a rendezvous connection, in seconds rather than TCP's ~15 minutes.

A pulled cable or a switch port dropping frames sends no RST and no FIN: TCP retransmits for
``tcp_retries2`` (about 930 s) before it gives up, and a connection that is only read from never
notices at all. Both sides of the embedded store's connection therefore watch the silence
themselves: the client tells the server its ``Liveness`` in the hello, the server pings a
connection that has been idle for ``interval``, the client answers, and either side gives the
connection up once nothing has arrived for ``window`` (the lease TTL:
``keep_alive_interval x keep_alive_max_attempt``). ``tune_socket`` is the second line of defence:
``TCP_USER_TIMEOUT`` and TCP keep-alive at the same window, so the kernel never holds on longer.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class Liveness:
    """Pinged after ``interval`` s idle, given up after ``window`` s of silence."""

    interval: float = 5.0
    window: float = 15.0

    @classmethod
    def of_lease(cls, interval: float, attempts: int) -> Liveness:
        """The rendezvous's keep-alive settings: the window is the lease TTL (interval x attempts)."""
        return cls(interval, interval * attempts)

    @classmethod
    def parse(cls, value: object) -> Liveness | None:
        """From a hello's ``live`` field (``[interval, window]``); None if absent or not sensible."""
        if not isinstance(value, list) or len(value) != 2:
            return None
        try:
            interval, window = float(value[0]), float(value[1])
        except (TypeError, ValueError):
            return None
        return cls(interval, window) if 0 < interval <= window else None


def froze_for(late: float, liveness: Liveness) -> float | None:
    """How long this process stood still, judged by how late a timer fired (pure); None if it was running.

    A timer due every half interval that fires more than an interval late (a second at least), or
    more than half the window late, was not serviced: the process was stopped (SIGSTOP) or starved,
    and whatever a peer said meanwhile could not be heard.
    """
    return late if late > min(max(1.0, liveness.interval), liveness.window / 2) else None


def tune_socket(sock: socket.socket | None, liveness: Liveness) -> None:
    """TCP keep-alive probes after ``interval`` idle, and ``TCP_USER_TIMEOUT`` at the window: unacknowledged data
    (a probe included) fails the connection with ``ETIMEDOUT`` once the window has passed."""
    if sock is None:
        return
    idle = max(1, round(liveness.interval))
    count = max(1, round(liveness.window / liveness.interval))
    with contextlib.suppress(OSError, AttributeError):  # not TCP (a test's socketpair), or not Linux
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1000, round(liveness.window * 1000)))
