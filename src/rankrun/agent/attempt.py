"""One attempt: spawn the local workers, pump their output, supervise, collect results.

Sequencing only; every decision it relies on (identities, environment, routes, the
ending of each worker) is made by a pure function elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import BinaryIO

from rankrun.agent.env import AttemptContext, WorkerIdentity, worker_env
from rankrun.agent.ranks import NodeSlots, worker_identities
from rankrun.logs.console import Console
from rankrun.logs.layout import RunLogs
from rankrun.logs.lines import Tail, render_prefix
from rankrun.logs.pump import Route, RoutePlan, plan_route, pump
from rankrun.proc.group import Exit, GroupOutcome, supervise
from rankrun.proc.signals import SignalStream
from rankrun.proc.spawn import Command, Spawner, WorkerHandle
from rankrun.report.errorfile import read_error_file
from rankrun.report.failure import Ending, WorkerResult
from rankrun.spec import EntryKind, EntrySpec, LaunchSpec

DRAIN_TIMEOUT = 10.0  # after the group is gone, how long output may still take to arrive


def worker_argv(entry: EntrySpec, local_rank: int) -> tuple[str, ...]:
    """torchrun's command line for each entry kind; ``${local_rank}`` substituted in the arguments."""
    args = tuple(Template(a).safe_substitute(local_rank=str(local_rank)) for a in entry.args)
    if entry.kind is EntryKind.BINARY:
        return (entry.script, *args)
    if entry.kind is EntryKind.MODULE:
        return (entry.python, "-u", "-m", entry.script, *args)
    if entry.kind is EntryKind.RUN_PATH:
        return (entry.python, "-u", "-m", "rankrun.run_path", entry.script, *args)
    return (entry.python, "-u", entry.script, *args)


def ending_of(exit_: Exit | None) -> Ending:
    if exit_ is None or exit_.after_stop:
        return Ending.STOPPED
    return Ending.SUCCEEDED if exit_.status == 0 else Ending.FAILED


@dataclass
class AttemptResult:
    outcome: GroupOutcome
    results: list[WorkerResult]


@dataclass
class _Worker:
    who: WorkerIdentity
    handle: WorkerHandle
    error_file: str
    tail: Tail
    routes: tuple[Route, Route]
    pumps: tuple[asyncio.Task[None], asyncio.Task[None]]


def _routes(spec: LaunchSpec, who: WorkerIdentity, attempt_dir: Path | None, console: Console) -> tuple[Route, Route]:
    prefix = render_prefix(spec.logs.prefix_template, role=spec.worker.role, rank=who.rank, local_rank=who.local_rank)
    rank_dir = attempt_dir / str(who.local_rank) if attempt_dir is not None else None

    def route(plan: RoutePlan, name: str, fd: int) -> Route:
        return Route.open(plan, fd, prefix, rank_dir / f"{name}.log" if rank_dir is not None else None)

    out = route(plan_route(spec.logs, who.local_rank, stdout=True), "stdout", console.stdout_fd)
    err = route(plan_route(spec.logs, who.local_rank, stdout=False), "stderr", console.stderr_fd)
    return out, err


async def run_attempt(  # noqa: PLR0917 - one call site; every argument is a distinct collaborator
    spec: LaunchSpec,
    ctx: AttemptContext,
    attempt_dir: Path | None,
    spawner: Spawner,
    console: Console,
    signals: SignalStream,
    after_group: Callable[[Sequence[WorkerHandle]], None],
) -> AttemptResult:
    identities = worker_identities([NodeSlots(spec.worker.role, spec.worker.nproc)], group_rank=0)
    workers: list[_Worker] = []
    filtered = _filtered_files(spec, attempt_dir)
    try:
        for who in identities:
            error_file = RunLogs.error_file(attempt_dir, who.local_rank)
            env = worker_env(spec.base_env, who, ctx, error_file)
            out, err = _routes(spec, who, attempt_dir, console)
            handle = await spawner.spawn(Command(worker_argv(spec.worker.entry, who.local_rank), env))
            err.tail = Tail()
            out.filtered, out.needles = filtered[0], tuple(f.encode() for f in spec.logs.stdout_filters)
            err.filtered, err.needles = filtered[1], tuple(f.encode() for f in spec.logs.stderr_filters)
            tasks = (
                asyncio.create_task(pump(handle.stdout, out, console)),
                asyncio.create_task(pump(handle.stderr, err, console)),
            )
            workers.append(_Worker(who, handle, error_file, err.tail, (out, err), tasks))
        outcome = await supervise([w.handle for w in workers], signals.next, spec.restart.shutdown_timeout)
    finally:
        for w in workers:
            w.handle.signal_group(signal.SIGKILL)
        after_group([w.handle for w in workers])
        await _drain(workers, signals, console)
        for fh in filtered:
            if fh is not None:
                fh.close()
    return AttemptResult(outcome, [_result(w, outcome.exits.get(i)) for i, w in enumerate(workers)])


def _filtered_files(spec: LaunchSpec, attempt_dir: Path | None) -> tuple[BinaryIO | None, BinaryIO | None]:
    if attempt_dir is None:
        return (None, None)
    out = open(attempt_dir / "filtered_stdout.log", "wb") if spec.logs.stdout_filters else None  # noqa: SIM115
    err = open(attempt_dir / "filtered_stderr.log", "wb") if spec.logs.stderr_filters else None  # noqa: SIM115
    return (out, err)


async def _drain(workers: list[_Worker], signals: SignalStream, console: Console) -> None:
    """Deliver every byte still in the pipes; console writes are never cut short.

    Only a pump stuck *reading* for ``DRAIN_TIMEOUT`` (its pipe held open by a process that
    could not be killed) has its pipes closed. A signal while draining means the user gave
    up on a console that does not read: the console is abandoned and the signal re-queued
    for the restart loop. Transports are always closed at the end.
    """
    sig_task: asyncio.Task[int] | None = None
    while pending := [t for w in workers for t in w.pumps if not t.done()]:
        sig_task = sig_task or asyncio.ensure_future(signals.next())
        done, _ = await asyncio.wait([*pending, sig_task], timeout=DRAIN_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        if sig_task in done:
            console.abandon()
            signals.deliver(sig_task.result())
            sig_task = None
            continue
        if done:
            continue
        for w in workers:
            live = [route for route, task in zip(w.routes, w.pumps, strict=True) if not task.done()]
            if live and all(route.reading for route in live):
                w.handle.close()
    if sig_task is not None:
        sig_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sig_task
    for w in workers:
        w.handle.close()


def _result(w: _Worker, exit_: Exit | None) -> WorkerResult:
    ending = ending_of(exit_)
    return WorkerResult(
        local_rank=w.who.local_rank,
        rank=w.who.rank,
        pid=w.handle.pid,
        status=exit_.status if exit_ is not None else -signal.SIGKILL,
        ending=ending,
        ended_at=exit_.at if exit_ is not None else 0.0,
        error_file=w.error_file,
        error=read_error_file(w.error_file) if ending is Ending.FAILED else None,
        stderr_tail=w.tail.text(),
    )
