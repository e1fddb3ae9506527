"""A fake spawner for agent scenarios: the seam ``rankrun.proc.spawn.Spawner`` provides.

Each fake worker has a behaviour: exit with a status at once, or wait for a signal and
react to it (exit, or ignore SIGTERM until SIGKILL). Nothing here sleeps.
"""

from __future__ import annotations

import asyncio
import heapq
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from rankrun.proc.output import OutputReader, StreamSource
from rankrun.proc.spawn import Command, Stdio


@dataclass
class Behaviour:
    exit_status: int | None = None  # exit at once with this status
    stderr: bytes = b""
    stdout: bytes = b""
    ignore_term: bool = False  # survive SIGTERM (only SIGKILL ends it)
    # exit by itself with this status, but be heard of only once signalled (an exit under way as rankrun stops the
    # group: its event comes in a later turn of the loop, after the signal, which changes nothing)
    exiting_status: int | None = None


class FakeHandle:
    def __init__(self, pid: int, command: Command, behaviour: Behaviour) -> None:
        self._pid = pid
        self.command = command
        self.behaviour = behaviour
        self.signals: list[int] = []
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._out = OutputReader()
        self._err = OutputReader() if command.stdio is Stdio.PIPES else None
        self._out.feed_data(behaviour.stdout)
        (self._err or self._out).feed_data(behaviour.stderr)
        if behaviour.exit_status is not None:
            self._finish(behaviour.exit_status)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def stdout(self) -> StreamSource:
        return self._out

    @property
    def stderr(self) -> StreamSource | None:
        return self._err

    @property
    def terminal_fd(self) -> int | None:
        return None

    @property
    def forked_in(self) -> float | None:
        return None  # a cold start

    @property
    def env(self) -> dict[str, str]:
        return dict(self.command.env)

    def _finish(self, status: int) -> None:
        if not self._exit.done():
            self._exit.set_result(status)
            self.close()

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    def exit(self, status: int) -> None:
        """Exit now, by itself, with ``status`` (a scenario's trigger for a worker that was waiting)."""
        self._finish(status)

    def close(self) -> None:
        self._out.feed_eof()
        if self._err is not None:
            self._err.feed_eof()

    def ended(self) -> bool:
        return self._exit.done() or self.behaviour.exiting_status is not None

    def signal(self, signum: int) -> bool:
        if self._exit.done():
            return False
        if signum:
            self.signal_group(signum)
        return True

    def signal_main(self, signum: int) -> bool:
        return self.signal(signum)

    def signal_group(self, signum: int) -> None:
        self.signals.append(signum)
        if self._exit.done():
            return
        if self.behaviour.exiting_status is not None:  # gone already: heard of in a later turn, with its own status
            asyncio.get_running_loop().call_soon(self._finish, self.behaviour.exiting_status)
            return
        if signum == signal.SIGKILL or not (self.behaviour.ignore_term and signum == signal.SIGTERM):
            self._finish(-signum)


@dataclass
class FakeSpawner:
    """``plan(attempt, local_rank) -> Behaviour``; ``after_spawn(handle)`` runs after each spawn."""

    plan: Callable[[int, int], Behaviour]
    after_spawn: Callable[[FakeHandle], None] | None = None
    spawned: list[FakeHandle] = field(default_factory=list)

    async def spawn(self, command: Command) -> FakeHandle:
        attempt, local_rank = command.attempt, int(command.env["LOCAL_RANK"])
        handle = FakeHandle(10_000 + len(self.spawned), command, self.plan(attempt, local_rank))
        self.spawned.append(handle)
        if self.after_spawn is not None:
            self.after_spawn(handle)
        return handle

    def attempt(self, n: int) -> list[FakeHandle]:
        return [h for h in self.spawned if h.command.attempt == n]


class FakeTimers:
    """``rankrun.store.memory.Timers`` on a clock that moves only when a test says so."""

    def __init__(self) -> None:
        self.time = 0.0
        self._due: list[tuple[float, int, _FakeTimer]] = []
        self._seq = 0

    def now(self) -> float:
        return self.time

    def call_at(self, when: float, callback: Callable[[], None]) -> _FakeTimer:
        timer = _FakeTimer(callback)
        self._seq += 1
        heapq.heappush(self._due, (when, self._seq, timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move the clock on, firing (in order) every callback that falls due."""
        self.time += seconds
        while self._due and self._due[0][0] <= self.time:
            _, _, timer = heapq.heappop(self._due)
            if not timer.cancelled:
                timer.callback()


@dataclass(eq=False)
class _FakeTimer:
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True
