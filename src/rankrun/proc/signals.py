"""Signals as data: with ``rankrun.proc.early``, the only modules that install signal handlers.

``EarlyCatcher.install`` runs in the entry point before anything else is imported, so a
SIGTERM that arrives while arguments are parsed or the store is binding is recorded, not
fatal. Once the event loop runs, ``attach`` moves delivery of exactly the handled set
(``--signals-to-handle``) onto the loop and replays what arrived before; every other signal
keeps the disposition rankrun inherited. The rest of rankrun only sees ints coming out of
``SignalStream.next()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from rankrun.proc.early import EarlyCatcher


class SignalStream:
    """An async stream of received signal numbers."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[int] = asyncio.Queue()

    def deliver(self, signum: int) -> None:
        self._queue.put_nowait(signum)

    def take_pending(self) -> int | None:
        """A signal that arrived and nobody consumed yet, if any."""
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None

    async def next(self) -> int:
        return await self._queue.get()


def attach(catcher: EarlyCatcher, loop: asyncio.AbstractEventLoop, signums: Iterable[int]) -> SignalStream:
    """Deliver exactly ``signums`` through a stream on ``loop``, replaying what came early."""
    catcher.adopt(signums)  # any other signal keeps the disposition rankrun inherited
    stream = SignalStream()
    for signum in catcher.signums:
        loop.add_signal_handler(signum, stream.deliver, signum)
    for signum in catcher.pending:
        stream.deliver(signum)
    catcher.pending.clear()
    return stream
