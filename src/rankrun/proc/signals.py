"""Signals as data: the one module that installs signal handlers.

``EarlyCatcher.install`` runs as the CLI's first statement, so a SIGTERM that arrives while
arguments are parsed or the store is binding is recorded, not fatal. Once the event loop
runs, ``attach`` moves delivery onto the loop and replays what arrived before; the rest
of rankrun only sees ints coming out of ``SignalStream.next()``.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterable
from types import FrameType

DEFAULT_SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


class SignalStream:
    """An async stream of received signal numbers."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[int] = asyncio.Queue()
        self.received: list[int] = []

    def deliver(self, signum: int) -> None:
        self.received.append(signum)
        self._queue.put_nowait(signum)

    def take_pending(self) -> int | None:
        """A signal that arrived and nobody consumed yet, if any."""
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None

    async def next(self) -> int:
        return await self._queue.get()

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None


class EarlyCatcher:
    """Records signals from the launcher's first instant until the event loop takes over."""

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

    def attach(self, loop: asyncio.AbstractEventLoop, signums: Iterable[int]) -> SignalStream:
        """Deliver ``signums`` (plus the early ones) through a stream on ``loop``."""
        stream = SignalStream()
        for signum in dict.fromkeys((*self.signums, *signums)):
            loop.add_signal_handler(signum, stream.deliver, signum)
        for signum in self.pending:
            stream.deliver(signum)
        self.pending.clear()
        return stream

    @staticmethod
    def detach(loop: asyncio.AbstractEventLoop, signums: Iterable[int]) -> None:
        for signum in signums:
            loop.remove_signal_handler(signum)
