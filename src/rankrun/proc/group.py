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
    outcome = GroupOutcome()
    waits = {asyncio.ensure_future(_wait(h, wall)): i for i, h in enumerate(handles)}
    sig_task: asyncio.Future[Interrupted] = asyncio.ensure_future(next_stop())
    round_task: asyncio.Future[GroupEnd] | None = asyncio.ensure_future(ended) if ended is not None else None
    stop = _Stop()
    try:
        while waits:
            timeout = None if stop.deadline is None else max(0.0, stop.deadline - asyncio.get_running_loop().time())
            pending = [t for t in (sig_task, round_task) if t is not None and not (t is sig_task and t.done())]
            watched: set[asyncio.Future[Any]] = {*waits, *pending}
            done, _ = await asyncio.wait(watched, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            # Exits noticed together happened before anything we do now: none of them was "stopped". Each keeps the
            # time its own exit was heard, in the order the kernel told them (a loaded machine hears several at once,
            # and the first failure, the root cause, must not be the lowest rank of the batch).
            stopping = stop.deadline is not None
            exited = sorted((waits.pop(t), *t.result()) for t in done if t in waits)
            for index, status, at in exited:
                outcome.exits[index] = Exit(index, status, at, after_stop=stop.caused(index))
            if not stopping and any(status != 0 for _, status, _ in exited):
                _begin_stop(signal.SIGTERM, handles, waits, stop, shutdown_timeout)
            if round_task is not None and round_task in done:
                _on_ended(round_task.result(), handles, waits, outcome, stop, shutdown_timeout)
                round_task = None
            if sig_task in done:
                _on_stop(sig_task.result(), handles, waits, outcome, stop, shutdown_timeout)
                if not stop.killed:
                    sig_task = asyncio.ensure_future(next_stop())
            if stop.deadline is not None and not stop.killed and asyncio.get_running_loop().time() >= stop.deadline:
                _kill(handles, waits, stop)
            if stop.killed and waits:
                outcome.unkillable = await _wait_killed(waits, outcome, stop)
                break
    finally:
        await _cancelled(round_task)
        if not sig_task.done():
            await _cancelled(sig_task)
        elif not sig_task.cancelled() and outcome.interrupted_by is None:
            outcome.interrupted_by = sig_task.result().signum  # arrived while the last workers were being killed
        for h in handles:
            h.signal_group(signal.SIGKILL)  # grandchildren left in the group, even after success
    return outcome


def _on_ended(  # noqa: PLR0917 - private helper of supervise()
    end: GroupEnd,
    handles: Sequence[WorkerHandle],
    waits: dict[asyncio.Task[tuple[int, float]], int],
    outcome: GroupOutcome,
    stop: _Stop,
    shutdown_timeout: float,
) -> None:
    if outcome.interrupted_by is None:
        if isinstance(end, Stalled):
            outcome.stalled, outcome.stall_blame = end.what, end.blame
        else:
            outcome.regrouped = end.why
        if stop.deadline is None:
            _begin_stop(signal.SIGTERM, handles, waits, stop, shutdown_timeout)


def _on_stop(  # noqa: PLR0917 - private helper of supervise()
    request: Interrupted,
    handles: Sequence[WorkerHandle],
    waits: dict[asyncio.Task[tuple[int, float]], int],
    outcome: GroupOutcome,
    stop: _Stop,
    shutdown_timeout: float,
) -> None:
    signum = request.signum
    if outcome.interrupted_by is not None:
        outcome.second_signal = outcome.second_signal or signum
        _kill(handles, waits, stop)  # a second signal: no more patience
        return
    outcome.interrupted_by = signum
    if stop.deadline is None:
        _begin_stop(signum, handles, waits, stop, shutdown_timeout)
    else:  # already stopping after a failure: pass the signal on, keep the deadline
        for index in waits.values():
            handles[index].signal_group(signum)


def _begin_stop(
    signum: int, handles: Sequence[WorkerHandle], waits: dict[asyncio.Task[tuple[int, float]], int], stop: _Stop, grace: float
) -> None:
    """Signal every worker not yet heard of to stop. One that had ended by itself already (two ranks failing on
    the same bad argument: the first exit heard starts the stop, the other's event is still on its way) is told
    apart now, before the signal, and keeps its own exit: reported as failed, never as stopped by rankrun. Its
    exit code says nothing either way: a Python worker that dies of a forwarded SIGINT re-raises it at exit
    (status -2, not exit code 2), but a handler may exit with any code, so how the worker ended counts only for
    those rankrun signalled while they ran. An exit that begins between this look and the signal (one syscall)
    is still taken as stopped."""
    stop.deadline = asyncio.get_running_loop().time() + grace
    for index in waits.values():
        if handles[index].ended():
            stop.ended_first.add(index)
        handles[index].signal_group(signum)  # its own children may still run


def _kill(handles: Sequence[WorkerHandle], waits: dict[asyncio.Task[tuple[int, float]], int], stop: _Stop) -> None:
    stop.killed = True
    for index in waits.values():
        handles[index].signal_group(signal.SIGKILL)


async def _wait_killed(
    waits: dict[asyncio.Task[tuple[int, float]], int], outcome: GroupOutcome, stop: _Stop
) -> list[int]:
    done, pending = await asyncio.wait(set(waits), timeout=KILL_WAIT)
    for task in done:
        index = waits.pop(task)
        status, at = task.result()
        outcome.exits[index] = Exit(index, status, at, after_stop=stop.caused(index))
    for task in pending:
        task.cancel()
    return sorted(waits[t] for t in pending)


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
