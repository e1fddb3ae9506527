"""Record death signals from the launcher's first instant.

Imports nothing but ``signal`` so the entry points can install it before anything else is
imported. Until the event loop takes over (``rankrun.proc.signals.attach``), a signal is only
recorded; the agent then replays it and exits without starting workers.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from types import FrameType

DEFAULT_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


class EarlyCatcher:
    def __init__(self, signums: tuple[int, ...]) -> None:
        self.signums = signums
        self.pending: list[int] = []

    @classmethod
    def install(cls, signums: Iterable[int] = DEFAULT_SIGNALS) -> EarlyCatcher:
        catcher = cls(tuple(signums))
        for signum in catcher.signums:
            signal.signal(signum, catcher._record)
        return catcher

    def _record(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.pending.append(signum)
