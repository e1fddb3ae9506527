"""Wall-clock time as a seam (failure timestamps in reports), and durations as messages say them; deadlines use
the event loop's own clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall(self) -> float:
        """Seconds since the epoch (for humans: when a worker failed). Never compared across machines."""
        ...


class SystemClock:
    def wall(self) -> float:
        return time.time()


def seconds(value: float) -> str:
    """A duration for a message: whole seconds from 10 s on, tenths below ("0.4", "3", "12")."""
    return f"{value:.0f}" if value >= 10 else f"{round(value, 1):g}"
