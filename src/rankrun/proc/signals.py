"""Signals as data: with ``rankrun.proc.early``, where the handled signals' handlers are installed.

(The terminal relay also handles SIGWINCH and SIGCONT, and the watchdog's own child ignores signals:
``tests/unit/test_claims.py`` lists every module allowed to touch signal handlers.)

``EarlyCatcher.install`` runs in the entry point before anything else is imported, so a SIGTERM that
arrives while arguments are parsed or the store is binding is recorded, not fatal. Once the event
loop runs, ``attach`` moves delivery of exactly the handled set (``--signals-to-handle``) onto the
loop and replays what arrived before; every other signal keeps the disposition rankrun inherited.
The rest of rankrun sees signals only as ``Interrupted`` events on the ``StopStream``. (The other
reason to stop a group, the rendezvous round moving on, is not a signal: it reaches
``proc.group.supervise`` as an awaitable of its own.) Every arrival is also noted in the catcher's
``received`` by Python's handler as it happens, not by the loop's callback (which may run only after
the agent has returned), so that a stop nobody takes off the stream, or one a consumer takes and
cannot act on (the group had already ended), still decides the exit code. ``detach`` gives the
signals back to the catcher before the loop closes, so they stay caught until the process exits.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterable

from rankrun.proc.early import EarlyCatcher
from rankrun.record import record


@record
class Interrupted:
    """A handled signal arrived: forward it, stop the job, exit 128+N."""

    signum: int



class StopStream:
    """The handled signals, in arrival order, one consumer at a time."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Interrupted] = asyncio.Queue()
        self._waiting = asyncio.Event()  # set while a stop is queued

    def deliver(self, signum: int) -> None:
        self.put_back(Interrupted(signum))

    def put_back(self, stop: Interrupted) -> None:
        """Queue a stop (also: re-queue one a consumer took but cannot act on, for the next consumer)."""
        self._queue.put_nowait(stop)
        self._waiting.set()

    def take_pending(self) -> Interrupted | None:
        """A stop that arrived and nobody consumed yet, if any."""
        try:
            stop = self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return None
        if self._queue.empty():
            self._waiting.clear()
        return stop

    async def arrived(self) -> None:
        """Until a stop is queued, without taking it (safe to race: a loser consumes nothing)."""
        await self._waiting.wait()

    async def next(self) -> Interrupted:
        stop = await self._queue.get()
        if self._queue.empty():
            self._waiting.clear()
        return stop


def attach(catcher: EarlyCatcher, loop: asyncio.AbstractEventLoop, signums: Iterable[int]) -> StopStream:
    """Deliver exactly ``signums`` through a stream on ``loop``, replaying what came early."""
    catcher.adopt(signums)  # any other signal keeps the disposition rankrun inherited
    stream = StopStream()
    for signum in catcher.signums:
        loop.add_signal_handler(signum, stream.deliver, signum)  # the loop wakes and queues the stop ...
        # ... and the catcher notes it on arrival, not when the loop gets round to it or a consumer takes it:
        # the exit code must depend on neither
        catcher.note_as_it_arrives(signum)
    for signum in catcher.pending:  # already noted by the catcher
        stream.deliver(signum)
    catcher.pending.clear()
    return stream


def detach(catcher: EarlyCatcher, loop: asyncio.AbstractEventLoop) -> None:
    """Hand the signals ``attach`` gave ``loop`` back to the catcher, which records them until the process exits.

    Called while the loop still runs: closing it would reset them to their defaults, and a signal
    during the final flush would kill rankrun (SIGINT: raise KeyboardInterrupt) instead of being
    counted. Between removing and re-arming, a signal meets that default for a few instructions:
    a SIGINT then is a KeyboardInterrupt, counted here; any other ends rankrun by that signal,
    which is still 128+N to its parent's shell, never success.
    """
    for signum in catcher.signums:
        try:
            loop.remove_signal_handler(signum)
            catcher.rearm(signum)
        except KeyboardInterrupt:
            catcher.note(signal.SIGINT)
            catcher.rearm(signum)
