"""Supervise one worker group: wait for the first of {a failure, all done, a stop}, then stop it.

Exits are events (``handle.wait()`` tasks), not a polling tick. A stop is a signal from the
``StopStream`` (``Interrupted``), or ``ended``: an awaitable that ends with ``MovedOn`` when the
rendezvous round this group belongs to is over (a node joined or left), or with ``Stalled`` when the
group stalled and ``--hang-action fail`` treats that as a failure. Stopping is
one path: send the polite signal (SIGTERM after a failure or a regroup, the received signal
after an interrupt) to every worker's process group, wait until all have exited or the single
monotonic deadline (``--shutdown-timeout``) passes, then SIGKILL the rest. A worker still running
when the stop began counts as stopped, not failed, however it then ends; one whose own exit was
already under way (its event not yet heard) keeps that exit as its own. A second interrupt skips
the grace period.
Whatever happens, every process group gets a final SIGKILL so background children of workers
that already exited are cleaned up too.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rankrun.proc.signals import Interrupted
from rankrun.proc.spawn import WorkerHandle
from rankrun.record import record

KILL_WAIT = 10.0  # after SIGKILL, how long to wait for the kernel to report exits


@record
class Exit:
    index: int
    status: int
    at: float  # wall clock when noticed
    after_stop: bool  # rankrun had signalled it to stop while it still ran: how it ended is rankrun's doing


@dataclass
class GroupOutcome:
    exits: dict[int, Exit] = field(default_factory=dict)
    interrupted_by: int | None = None  # signal number, when a signal stopped the group
    second_signal: int | None = None  # a further signal, which killed the group without grace
    regrouped: str | None = None  # why the membership changed, when that stopped the group
    stalled: str | None = None  # the stall that stopped the group (--hang-action fail): a failure
    stall_blame: str | None = None  # the node the job's stall report holds to account for it (several nodes), if one
    unkillable: list[int] = field(default_factory=list)  # indexes still alive after SIGKILL

    @property
    def failed(self) -> bool:
        return self.stalled is not None or any(e.status != 0 and not e.after_stop for e in self.exits.values())


@record
class MovedOn:
    """The group's rendezvous round is over (a node joined or left): stop it, not counted as a failure."""

    why: str


@record
class Stalled:
    """The group stalled and ``--hang-action fail`` asks to stop it as after a failure."""

    what: str  # the stall's cause, one line
    blame: str | None = None  # the node holding the outliers, as the job's report names it (None: nobody specific)


GroupEnd = MovedOn | Stalled


@dataclass
class _Stop:
    deadline: float | None = None  # on the event loop's clock
    killed: bool = False
    ended_first: set[int] = field(default_factory=set)  # indexes already ending by themselves as the stop began

    def caused(self, index: int) -> bool:
        """Whether rankrun's stop is why worker ``index`` ended (asked only once the stop has begun)."""
        return self.deadline is not None and index not in self.ended_first


async def supervise(
    handles: Sequence[WorkerHandle],
    next_stop: Callable[[], Awaitable[Interrupted]],
    shutdown_timeout: float,
    wall: Callable[[], float] = time.time,
    ended: Awaitable[GroupEnd] | None = None,
) -> GroupOutcome:
    """Until every worker has exited; ``ended``, when it completes, stops the group (SIGTERM, then the deadline)."""
    group = _Group(handles, shutdown_timeout, {asyncio.ensure_future(_wait(h, wall)): i for i, h in enumerate(handles)})
    sig_task: asyncio.Future[Interrupted] = asyncio.ensure_future(next_stop())
    round_task: asyncio.Future[GroupEnd] | None = asyncio.ensure_future(ended) if ended is not None else None
    try:
        while group.waits:
            pending = [t for t in (sig_task, round_task) if t is not None and not (t is sig_task and t.done())]
            watched: set[asyncio.Future[Any]] = {*group.waits, *pending}
            done, _ = await asyncio.wait(watched, timeout=group.timeout(), return_when=asyncio.FIRST_COMPLETED)
            group.heard(done)
            if round_task is not None and round_task in done:
                group.on_ended(round_task.result())
                round_task = None
            if sig_task in done:
                group.on_stop(sig_task.result())
                if not group.stop.killed:
                    sig_task = asyncio.ensure_future(next_stop())
            group.kill_when_overdue()
            if group.stop.killed and group.waits:
                await group.wait_killed()
                break
    finally:
        await _cancelled(round_task)
        await _last_signal(sig_task, group.outcome)
        for h in handles:
            h.signal_group(signal.SIGKILL)  # grandchildren left in the group, even after success
    return group.outcome


@dataclass
class _Group:
    """What ``supervise`` knows of its group between two wake-ups: the workers, the exits not yet heard (each wait
    task and its worker's index), the outcome so far and the stop under way. Each wake-up's news is one method."""

    handles: Sequence[WorkerHandle]
    grace: float  # --shutdown-timeout: from the polite signal to SIGKILL
    waits: dict[asyncio.Task[tuple[int, float]], int]
    outcome: GroupOutcome = field(default_factory=GroupOutcome)
    stop: _Stop = field(default_factory=_Stop)

    def timeout(self) -> float | None:
        """How long the next wait may last: until the stop's deadline, or for ever when no stop is under way."""
        if self.stop.deadline is None:
            return None
        return max(0.0, self.stop.deadline - asyncio.get_running_loop().time())

    def heard(self, done: set[asyncio.Future[Any]]) -> None:
        """Exits noticed together happened before anything we do now: none of them was "stopped". Each keeps the
        time its own exit was heard, in the order the kernel told them (a loaded machine hears several at once, and
        the first failure, the root cause, must not be the lowest rank of the batch). A first failure stops the rest."""
        stopping = self.stop.deadline is not None
        exited = sorted((self.waits.pop(t), *t.result()) for t in done if t in self.waits)
        for index, status, at in exited:
            self._exited(index, status, at)
        if not stopping and any(status != 0 for _, status, _ in exited):
            self.begin_stop(signal.SIGTERM)

    def on_ended(self, end: GroupEnd) -> None:
        """The round is over or the group stalled: stop it, unless a signal already did (that is the story then)."""
        if self.outcome.interrupted_by is None:
            if isinstance(end, Stalled):
                self.outcome.stalled, self.outcome.stall_blame = end.what, end.blame
            else:
                self.outcome.regrouped = end.why
            if self.stop.deadline is None:
                self.begin_stop(signal.SIGTERM)

    def on_stop(self, request: Interrupted) -> None:
        signum = request.signum
        if self.outcome.interrupted_by is not None:
            self.outcome.second_signal = self.outcome.second_signal or signum
            self.kill_all()  # a second signal: no more patience
            return
        self.outcome.interrupted_by = signum
        if self.stop.deadline is None:
            self.begin_stop(signum)
        else:  # already stopping after a failure: pass the signal on, keep the deadline
            for index in self.waits.values():
                self.handles[index].signal_group(signum)

    def begin_stop(self, signum: int) -> None:
        """Signal every worker not yet heard of to stop. One that had ended by itself already (two ranks failing on
        the same bad argument: the first exit heard starts the stop, the other's event is still on its way) is told
        apart now, before the signal, and keeps its own exit: reported as failed, never as stopped by rankrun. Its
        exit code says nothing either way: a Python worker that dies of a forwarded SIGINT re-raises it at exit
        (status -2, not exit code 2), but a handler may exit with any code, so how the worker ended counts only for
        those rankrun signalled while they ran. An exit that begins between this look and the signal (one syscall)
        is still taken as stopped."""
        self.stop.deadline = asyncio.get_running_loop().time() + self.grace
        for index in self.waits.values():
            if self.handles[index].ended():
                self.stop.ended_first.add(index)
            self.handles[index].signal_group(signum)  # its own children may still run

    def kill_when_overdue(self) -> None:
        """SIGKILL the workers still running once the stop's deadline (``--shutdown-timeout``) has passed."""
        deadline = self.stop.deadline
        if deadline is not None and not self.stop.killed and asyncio.get_running_loop().time() >= deadline:
            self.kill_all()

    def kill_all(self) -> None:
        """SIGKILL every worker not yet heard of (its whole process group): no more patience."""
        self.stop.killed = True
        for index in self.waits.values():
            self.handles[index].signal_group(signal.SIGKILL)

    async def wait_killed(self) -> None:
        """The exits SIGKILL brings, for at most ``KILL_WAIT``; the workers still alive then are unkillable."""
        done, pending = await asyncio.wait(set(self.waits), timeout=KILL_WAIT)
        for task in done:
            self._exited(self.waits.pop(task), *task.result())
        for task in pending:
            task.cancel()
        self.outcome.unkillable = sorted(self.waits[t] for t in pending)

    def _exited(self, index: int, status: int, at: float) -> None:
        self.outcome.exits[index] = Exit(index, status, at, after_stop=self.stop.caused(index))


async def _last_signal(sig_task: asyncio.Future[Interrupted], outcome: GroupOutcome) -> None:
    """Stop waiting for signals; one that arrived while the last workers were being killed still names the stop."""
    if not sig_task.done():
        await _cancelled(sig_task)
    elif not sig_task.cancelled() and outcome.interrupted_by is None:
        outcome.interrupted_by = sig_task.result().signum


async def _cancelled(task: asyncio.Future[Any] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _wait(handle: WorkerHandle, wall: Callable[[], float]) -> tuple[int, float]:
    """Its exit status and when it was heard: the watcher resolves exits in the order the kernel reports them, and
    each wait resumes in that order, so the times keep it."""
    status = await handle.wait()
    return status, wall()
