"""One attempt: spawn the local workers, pump their output, supervise, collect results.

``run_attempt`` is sequencing only: the identities, the environment and the routes are pure functions elsewhere,
and the attempt's observers (the stack dump channel and the Flight Recorder's worker variables, ``rankrun
--stacks``'s targets, the ``--hang-timeout`` watch) are one ``agent.watch.AttemptWatch``, told when the workers
start and end. Three small decisions live in this module: a worker's command line (``worker_argv``), how its exit
is read (``ending_of``), and ``Outcome``, whose constructors choose the job's exit codes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any, BinaryIO

from rankrun.agent import preload
from rankrun.agent.deps import AgentDeps
from rankrun.agent.env import WorkerIdentity, worker_env
from rankrun.agent.plan import AttemptPlan, attempt_context
from rankrun.agent.race import first_error, first_of
from rankrun.errors import EXIT_SIGNAL_BASE, EXIT_SUCCESS, EXIT_WORKERS_FAILED
from rankrun.logs.console import Console
from rankrun.logs.layout import RunLogs
from rankrun.logs.lines import Tail, render_prefix
from rankrun.logs.pump import Activity, Route, pump
from rankrun.logs.routes import ConsoleFacts, plan_route, plan_stdio, prefix_template
from rankrun.proc.group import Exit, GroupEnd, GroupOutcome, MovedOn, Stalled, supervise
from rankrun.proc.signals import Interrupted, StopStream
from rankrun.proc.spawn import Command, WorkerHandle
from rankrun.record import record
from rankrun.report.errorfile import read_error_file
from rankrun.report.failure import Ending, WorkerResult
from rankrun.spec import DEFAULT_PREFIX_TEMPLATE, EntryKind, EntrySpec, LaunchSpec

if TYPE_CHECKING:
    from rankrun.proc.terminal import TerminalRelay

DRAIN_TIMEOUT = 10.0  # after the group is gone, how long output may still take to arrive


def worker_argv(entry: EntrySpec, local_rank: int) -> tuple[str, ...]:
    """torchrun's command line for each entry kind; ``${local_rank}`` substituted in the arguments. The legacy
    launcher (``rankrun.launch`` without ``--use-env``) puts ``--local-rank=N`` between the script and its arguments."""
    args = tuple(Template(a).safe_substitute(local_rank=str(local_rank)) for a in entry.args)
    if entry.local_rank_arg:
        args = (f"--local-rank={local_rank}", *args)
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


@record
class Outcome:
    """How the job ended on this node (one node or several): its exit code, and what the report needs."""

    exit_code: int
    restarts: int
    report: AttemptResult | None = None  # this node's last attempt, when a failure report is due
    job_cause: str = ""  # several nodes: the job's first failure, from whichever node had it
    excluded: tuple[tuple[str, str], ...] = ()  # several nodes: the nodes the job excluded, each with why

    # The job's exit codes are chosen by these three (and a launcher error's by ``rankrun.errors``), nowhere else.

    @classmethod
    def succeeded(cls, restarts: int) -> Outcome:
        return cls(EXIT_SUCCESS, restarts)

    @classmethod
    def failed(cls, restarts: int, report: AttemptResult | None, job_cause: str = "", *,
               excluded: dict[str, str] | None = None) -> Outcome:
        return cls(EXIT_WORKERS_FAILED, restarts, report, job_cause, tuple((excluded or {}).items()))

    @classmethod
    def signalled(cls, signum: int, restarts: int) -> Outcome:
        return cls(EXIT_SIGNAL_BASE + signum, restarts)


@dataclass
class _Worker:
    who: WorkerIdentity
    handle: WorkerHandle
    error_file: str
    tail: Tail
    tail_label: str
    routes: tuple[Route, ...]
    pumps: tuple[asyncio.Task[None], ...]


@record
class _Layout:
    """Per attempt: where output goes (the console, the attempt's directory, the duplicate-filter files)."""

    template: str
    console: Console
    attempt_dir: Path | None
    filtered: tuple[BinaryIO | None, BinaryIO | None]


def _routes(spec: LaunchSpec, layout: _Layout, who: WorkerIdentity, handle: WorkerHandle) -> tuple[Route, ...]:
    """Routes for the worker's streams: stdout and stderr, or the one stream that carries both."""
    role, rank, local_rank = spec.worker.role, who.rank, who.local_rank
    console, attempt_dir = layout.console, layout.attempt_dir
    prefix = render_prefix(layout.template, role=role, rank=rank, local_rank=local_rank)
    rank_dir = attempt_dir / str(local_rank) if attempt_dir is not None else None

    def route(stdout: bool) -> Route:
        plan = plan_route(spec.logs, local_rank, stdout=stdout)
        name, fd = ("stdout", console.stdout_fd) if stdout else ("stderr", console.stderr_fd)
        file = Route.open_file(plan, rank_dir / f"{name}.log" if rank_dir is not None else None)
        filters = spec.logs.stdout_filters if stdout else spec.logs.stderr_filters
        template = DEFAULT_PREFIX_TEMPLATE if spec.logs.prefix_template is None else spec.logs.prefix_template
        filter_prefix = render_prefix(template, role=role, rank=rank, local_rank=local_rank)  # torchrun's tee format
        return Route(
            console.source(fd, prefix) if plan.to_console else None,
            file,
            filtered=layout.filtered[0 if stdout else 1],
            filter_prefix=filter_prefix,
            needles=tuple(f.encode() for f in filters),
        )

    if handle.stderr is None:  # merged or a terminal: everything goes where stdout goes
        return (Route(console.source(console.stdout_fd, prefix)),)
    return route(stdout=True), route(stdout=False)


async def run_attempt(  # noqa: PLR0917 - the attempt's inputs, each from a different owner
    spec: LaunchSpec, plan: AttemptPlan, attempt_dir: Path | None, deps: AgentDeps, stops: StopStream,
    moved_on: Awaitable[str] | None = None,
) -> AttemptResult:
    """One attempt of the worker group; ``moved_on`` ends (with why) when its rendezvous round is over."""
    console = deps.console
    watch = deps.on_demand.attempt(spec, attempt_dir, console, deps.host, events=deps.events, plan=plan,
                                   store=None if spec.multi_node else lambda: deps.worker_store.first_requests)
    workers: list[_Worker] = []
    relays: list[TerminalRelay] = []
    layout = _Layout(prefix_template(spec.logs, spec.worker.nproc), console, attempt_dir, _filtered_files(spec, attempt_dir))
    try:
        async with asyncio.TaskGroup() as group:  # the output pumps end within the attempt, or it ends with their error
            try:
                error_files = [RunLogs.error_file(attempt_dir, who.local_rank) for who in plan.identities]
                handles = await _spawn_all(deps, _commands(spec, plan, error_files, watch.env, deps.console_facts))
                for who, error_file, handle in zip(plan.identities, error_files, handles, strict=True):
                    if handle.terminal_fd is not None:
                        relays.append(_relay(handle.terminal_fd, workers, deps))
                    workers.append(_pumped(spec, layout, who, error_file, handle, group=group, activity=watch.activity))
                watch.started(workers)
                if (how := preload.told(deps, plan.attempt, workers)) is not None:
                    watch.preloaded(*how)
                outcome = await supervise([w.handle for w in workers], stops.next, spec.restart.shutdown_timeout,
                                          deps.clock.wall, _group_end(moved_on, watch.stalled))
            finally:
                watch.ended()
                await _bury(deps, workers)
                watch.close()
                try:
                    await _drain(workers, stops, console, written=bool(relays))  # the terminal worker's last bytes: raw
                finally:
                    for relay in relays:
                        relay.stop()  # the user's terminal as it was, before rankrun prints anything of its own
                    for fh in layout.filtered:
                        if fh is not None:
                            fh.close()
    except BaseExceptionGroup as failed:  # a spawn or a pump failed: that error, not a group
        raise first_error(failed) from None
    watch.finished(outcome)
    return AttemptResult(outcome, [_result(w, outcome.exits.get(i)) for i, w in enumerate(workers)])


def _commands(spec: LaunchSpec, plan: AttemptPlan, error_files: list[str],
              observed: Callable[[WorkerIdentity, dict[str, str]], dict[str, str]], facts: ConsoleFacts) -> list[Command]:
    """Each worker's command line, stdio and environment: torchrun's variables, with what the attempt's observers
    add (``observed``)."""
    ctx = attempt_context(spec, plan)
    commands = []
    for who, error_file in zip(plan.identities, error_files, strict=True):
        env = observed(who, worker_env(spec.base_env, who, ctx, error_file))
        stdio, stdin_null = plan_stdio(spec.logs, spec.worker.nproc, who.local_rank, facts)
        commands.append(Command(worker_argv(spec.worker.entry, who.local_rank), env, stdio, stdin_null, attempt=plan.attempt,
                                cpus=spec.worker.cpus[who.local_rank] if spec.worker.cpus else None))
    return commands


def _relay(terminal_fd: int, workers: list[_Worker], deps: AgentDeps) -> TerminalRelay:
    """An interactive worker's pty relayed to the user's terminal (``workers``: the attempt's, read as they start)."""
    from rankrun.proc.terminal import TerminalRelay  # noqa: PLC0415 - interactive runs only

    relay = TerminalRelay(terminal_fd, lambda: [w.handle.pid for w in workers], guard=deps.terminal_guard)
    relay.start()
    return relay


def _pumped(spec: LaunchSpec, layout: _Layout, who: WorkerIdentity, error_file: str, handle: WorkerHandle, *,
            group: asyncio.TaskGroup, activity: Activity) -> _Worker:
    """The started worker with its output routed and pumped (in ``group``), each byte noted in ``activity``."""
    routes = _routes(spec, layout, who, handle)
    for route in routes:
        route.activity = activity
    tail = routes[-1].tail = Tail()
    sources = (handle.stdout, handle.stderr) if handle.stderr is not None else (handle.stdout,)
    tasks = tuple(group.create_task(pump(src, route)) for src, route in zip(sources, routes, strict=True))
    label = "stderr" if handle.stderr is not None else "output"
    return _Worker(who, handle, error_file, tail, label, routes, tasks)


async def _bury(deps: AgentDeps, workers: list[_Worker]) -> None:
    """Every worker's process group killed (children left behind too) and reaped."""
    for w in workers:
        w.handle.signal_group(signal.SIGKILL)
    await deps.after_group([w.handle for w in workers])


async def _group_end(moved_on: Awaitable[str] | None, stalled: Awaitable[Stalled]) -> GroupEnd:
    """What stops the group early: the round moving on, or (``--hang-action fail``) a stall; the first of them."""
    if moved_on is None:
        return await stalled
    index, end = await first_of(moved_on, stalled)
    return MovedOn(end) if index == 0 else end


async def _spawn_all(deps: AgentDeps, commands: list[Command]) -> list[WorkerHandle]:
    """Start every worker before routing anyone's output (their pipes hold it meanwhile).

    Each spawn forks in the first step of its own task, so the forks come back to back: spawned
    one by one, each worker's pipe set-up would wait while the workers already started compete with
    the launcher for the cores. If any cannot start, the others are killed and its error raised.
    """
    started = await asyncio.gather(*(deps.spawner.spawn(c) for c in commands), return_exceptions=True)
    handles = [h for h in started if not isinstance(h, BaseException)]
    failures = [e for e in started if isinstance(e, BaseException)]
    if failures:
        for handle in handles:
            handle.signal_group(signal.SIGKILL)
        await deps.after_group(handles)
        for handle in handles:
            handle.close()
        raise failures[0]
    return handles


def _filtered_files(spec: LaunchSpec, attempt_dir: Path | None) -> tuple[BinaryIO | None, BinaryIO | None]:
    if attempt_dir is None:
        return (None, None)
    out = open(attempt_dir / "filtered_stdout.log", "wb") if spec.logs.stdout_filters else None  # noqa: SIM115
    err = open(attempt_dir / "filtered_stderr.log", "wb") if spec.logs.stderr_filters else None  # noqa: SIM115
    return (out, err)


async def _drain(workers: list[_Worker], stops: StopStream, console: Console, *, written: bool = False) -> None:
    """Deliver every byte still in the pipes (``written``: and wait until the console has written them); console
    writes are never cut short.

    Only a pump stuck *reading* for ``DRAIN_TIMEOUT`` (its pipe held open by a process that
    could not be killed) has its pipes closed. A signal while draining means the user gave
    up on a console that does not read: the console is abandoned and the signal re-queued
    for the restart loop. Transports are always closed at the end. Written, not only queued, where an
    interactive worker's terminal is given back to the user's modes right after this: bytes its raw
    mode was meant for must not meet them (a loaded machine's console thread lags).
    """
    sig_task: asyncio.Task[Interrupted] | None = None
    flushed: asyncio.Future[None] | None = None
    while True:
        pending: list[asyncio.Future[Any]] = [t for w in workers for t in w.pumps if not t.done()]
        if not pending:
            if not written:
                break
            flushed = flushed or asyncio.ensure_future(console.written())  # every byte is queued: until written
            if flushed.done():
                break
            pending = [flushed]
        sig_task = sig_task or asyncio.ensure_future(stops.next())
        done, _ = await asyncio.wait([*pending, sig_task], timeout=DRAIN_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        if sig_task in done:
            _give_up_console(sig_task.result(), stops, console)
            sig_task = None
        elif not done:  # DRAIN_TIMEOUT passed with nothing done: cut the pumps stuck on a pipe
            for w in workers:
                if _stuck_reading(w.routes, w.pumps):
                    w.handle.close()
    if sig_task is not None:
        sig_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sig_task
    for w in workers:
        w.handle.close()


def _give_up_console(stop: Interrupted, stops: StopStream, console: Console) -> None:
    """A signal while draining: the user gave up on a console that does not read. The console is abandoned and the
    signal re-queued, for the restart loop to act on."""
    if isinstance(stop, Interrupted):
        console.abandon()
    stops.put_back(stop)


def _stuck_reading(routes: Sequence[Route], pumps: Sequence[asyncio.Future[None]]) -> bool:
    """Whether a worker's pumps still running all wait on their pipes, none on the console: after ``DRAIN_TIMEOUT``
    without a byte, the pipes are held open by a process that could not be killed, and only closing them ends the
    drain. A pump waiting on the console is never cut short."""
    live = [route for route, task in zip(routes, pumps, strict=True) if not task.done()]
    return bool(live) and all(route.reading for route in live)


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
        tail_label=w.tail_label,
    )
