"""Wall-clock time as a seam (failure timestamps in reports); deadlines use the event loop's own clock."""

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
