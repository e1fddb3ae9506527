"""The job's preloading process (``--preload MODULES``), from the job's start to its end: sequencing only.

``preloading`` starts it before anything else of the job (a module that cannot be imported is the user's error, exit
2, before the node joins a round or starts a worker), pumps its output to the console (``[preload]``: a module's
import-time warning, said once per node), says a state that sends the node's workers back to cold starts, and closes
it at the end. The ``preload`` events wait for the first attempt's start (``job.start`` comes first in every events
file, and several nodes' observers begin only once the session is open); ``told`` emits them, then the attempt's
``warm`` event. The process itself is ``rankrun.proc.preload``'s; what runs in it is ``rankrun.preload``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, cast

from rankrun.agent.deps import AgentDeps
from rankrun.agent.env import preload_env
from rankrun.agent.race import first_of
from rankrun.agent.watch import StartedWorker
from rankrun.errors import UsageError
from rankrun.events.records import Preload, PreloadState, Warm
from rankrun.logs.pump import Route, pump
from rankrun.proc.signals import StopStream
from rankrun.ranges import range_string
from rankrun.spec import LaunchSpec

if TYPE_CHECKING:
    from rankrun.proc.preload import Preloader, Ready

PREFIX = b"[preload] "
OUTPUT_DRAIN = 5.0  # seconds the preloading process's last output may take to arrive once it is gone


class PreloadNews:
    """The ``preload`` events not emitted yet, and the modules' names (for the lines)."""

    def __init__(self, modules: str) -> None:
        self.modules = modules
        self.unsaid: list[Preload] = []
        self.ready: Preload | None = None  # the import, once it went well


@contextlib.asynccontextmanager
async def preloading(spec: LaunchSpec, deps: AgentDeps, argv: Sequence[str],
                     stops: StopStream) -> AsyncIterator[PreloadNews | None]:
    """The preloading process for the job's length (``None``: no ``--preload``, or a stop came during the import: it
    is left pending for the job, which stops as before any worker); ``argv``: the first worker's cold command line
    (``agent.attempt.worker_argv``)."""
    preloader = deps.preloader
    if preloader is None or not spec.worker.preload:
        yield None
        return
    news = PreloadNews(",".join(spec.worker.preload))
    preloader.on_change = lambda state, why: _changed(deps, news, "ended" if state == "ended" else "unsafe", why)
    output: asyncio.Task[None] | None = None
    try:
        handle = await preloader.start(spec.worker.preload, spec.worker.entry.python,
                                       preload_env(spec.base_env, spec.worker.nproc), argv)
        output = asyncio.ensure_future(pump(handle.stdout, Route(deps.console.source(deps.console.stderr_fd, PREFIX))))
        ready = await _ready(preloader, stops)
        if ready is None:
            yield None
            return
        if ready.error is not None:
            module, line = ready.error
            raise UsageError("--preload", module, f"cannot be imported: {line}")
        if ready.unsafe is not None:
            _changed(deps, news, "unsafe", ready.unsafe, ready.seconds)
        else:
            news.ready = Preload(news.modules, ready.seconds, "ready")
            news.unsaid.append(news.ready)
        deps.preload_news = news
        yield news
    finally:
        deps.preload_news = None
        await _closed(preloader, deps, output)


def _changed(deps: AgentDeps, news: PreloadNews, state: PreloadState, why: str, seconds: float = 0.0) -> None:
    """The node's workers start cold from now on: one line, and its event (emitted with the next attempt's)."""
    deps.console.say(f"--preload {news.modules}: {why}; starting this node's workers cold")
    news.unsaid.append(Preload(news.modules, seconds, state, why))
    preloader = deps.preloader
    if state == "ended" and deps.watchdog is not None and preloader is not None and preloader.pid is not None:
        deps.watchdog.unregister(preloader.pid)  # gone: its pid, and so its group's id, may be another's soon


async def _ready(preloader: Preloader, stops: StopStream) -> Ready | None:
    """How the import went; ``None`` when a stop came first (the process is killed, the stop left pending)."""
    index, ready = await first_of(preloader.ready(), stops.arrived())
    if index == 0:
        return cast("Ready", ready)
    preloader.stop()
    return None


async def _closed(preloader: Preloader, deps: AgentDeps, output: asyncio.Task[None] | None) -> None:
    """The process gone and reaped, its last output delivered (bounded), the watchdog told."""
    await preloader.close()
    if output is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(output, OUTPUT_DRAIN)
    if preloader.handle is not None:
        preloader.handle.close()
        if deps.watchdog is not None:
            deps.watchdog.unregister(preloader.handle.pid)


def warm(attempt: int, workers: Sequence[StartedWorker]) -> Warm:
    """The attempt's ``warm`` event: which ranks were forked, which started cold, how long the forks took (pure)."""
    forked = sorted((w.handle.forked_in, w.who.rank) for w in workers if w.handle.forked_in is not None)
    cold = [w.who.rank for w in workers if w.handle.forked_in is None]
    times = [t for t, _ in forked]
    return Warm(attempt, range_string(sorted(rank for _, rank in forked)), range_string(sorted(cold)),
                times[(len(times) - 1) // 2] if times else None, times[-1] if times else None)


def told(deps: AgentDeps, attempt: int, workers: Sequence[StartedWorker]) -> tuple[Warm, Preload | None] | None:
    """Emit the ``preload`` events not emitted yet, then the attempt's ``warm``; returns it with the node's import,
    for the start-up line (``None`` without ``--preload``)."""
    news = deps.preload_news
    if news is None:
        return None
    for record in news.unsaid:
        deps.events.emit(record)
    news.unsaid.clear()
    return deps.events.emit(warm(attempt, workers)), news.ready
