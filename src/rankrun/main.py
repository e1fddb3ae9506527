"""The process around the agent: what must happen once, in order, before and after the job.

Fork the lifetime watchdog before any thread exists, become a child subreaper, use the pidfd
child watcher, start the console thread and route logging through it, then run the async agent
(``rankrun.agent.loop.run_agent``) while answering ``rankrun --stacks`` (``rankrun.stacks.control``) and
reaping orphans as they exit (PID 1 of a container);
afterwards reap orphans, flush the console (a signal meanwhile abandons a console nobody reads) and
close the watchdog. The exit code is ``rankrun.errors.exit_code``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import sys
from collections.abc import Coroutine
from typing import Any

from rankrun import procfs
from rankrun.agent.deps import AgentDeps
from rankrun.agent.loop import run_agent
from rankrun.errors import EXIT_LAUNCHER, NodeExcluded, RankrunError, exit_code
from rankrun.fdlimit import raise_soft_limit
from rankrun.logs.console import Console
from rankrun.logs.routes import ConsoleFacts
from rankrun.proc.early import EarlyCatcher
from rankrun.proc.spawn import OsSpawner
from rankrun.proc.watchdog import Watchdog, become_subreaper, reap_on_sigchld, reap_orphans
from rankrun.spec import LaunchSpec
from rankrun.stacks.control import serve


def launch(spec: LaunchSpec, catcher: EarlyCatcher, *, note: str = "") -> int:
    """Run the job to completion in this process; returns the exit code. ``note``: a line for stderr when the first
    worker starts (``python -m rankrun.launch``'s deprecation note: a launch that fails before has its one line)."""
    # Started by `exec` from a shell that already had children? Those are not ours to reap.
    keep = frozenset(procfs.children("self"))
    raise_soft_limit()  # one connection per rank on the host: the common soft default (1,024) is too few for a large job
    collect_less_often()
    watchdog = Watchdog.start()
    become_subreaper()
    _use_pidfd_child_watcher()
    console = Console()
    _log_through(console)
    facts = ConsoleFacts(merged=console.merged, interactive=_interactive())
    unsaid = [note] if note else []

    def on_spawn(pid: int) -> None:
        watchdog.register(pid)
        if unsaid:
            console.write_blocking(console.stderr_fd, f"{unsaid.pop()}\n".encode())

    spawner, preloader = OsSpawner(on_spawn=on_spawn), None
    if spec.worker.preload:
        from rankrun.proc.preload import PreloadSpawner  # noqa: PLC0415 - only --preload pays for its messages (json)

        spawner = PreloadSpawner(on_spawn=on_spawn)
        preloader = spawner.preloader
    deps = AgentDeps(spawner, console, socket.gethostname(), watchdog, keep, facts, preloader=preloader)
    code = EXIT_LAUNCHER
    try:
        code = asyncio.run(_serving_stacks(run_agent(spec, deps, catcher), deps, spawner))
    except RankrunError as exc:
        console.say(str(exc) if isinstance(exc, NodeExcluded) else f"error: {exc}")  # a verdict on the node, not an error
        code = exc.exit_code
    finally:
        reap_orphans(exclude={watchdog.pid, *keep})
        # The catcher has the handled signals back (run_agent detached them): one during the flush means
        # the user gave up on a console that does not read.
        catcher.on_signal = lambda _signum: console.abandon()
        console.close()
        watchdog.close()
    return exit_code(code, catcher.first)  # a signal during the flush counts too


YOUNG = 10_000
"""Allocations between two collections of the youngest generation (CPython's default: 700)."""


def collect_less_often() -> None:
    """A host serving thousands of nodes allocates a few objects per frame, nearly all freed at once; at CPython's
    default every 700 it stopped to collect, and those collections cost it a tenth of a 16,384-node round's CPU
    (``bench/rendezvous.py``, the host's CPU: 8.5 s, and 7.6-7.7 s at this threshold). The older generations keep
    their defaults: what lives on (connections, leases) is collected as before."""
    gc.set_threshold(YOUNG, *gc.get_threshold()[1:])


def _interactive() -> bool:
    """A person at a terminal in the foreground: only then is the terminal relay imported at all."""
    if not os.isatty(1):
        return False
    from rankrun.proc.terminal import is_foreground_terminal  # noqa: PLC0415 - see the docstring

    return is_foreground_terminal(0)


async def _serving_stacks(agent: Coroutine[Any, Any, int], deps: AgentDeps, spawner: OsSpawner) -> int:
    """The agent, with ``rankrun --stacks`` answered and orphans reaped as they exit, for as long as it runs."""
    server = await serve(deps.on_demand.report)
    keep = {*deps.keep, *((deps.watchdog.pid,) if deps.watchdog is not None else ())}
    stop_reaping = reap_on_sigchld(lambda: keep | spawner.live, lambda: spawner.spawning > 0)
    try:
        return await agent
    finally:
        stop_reaping()
        if server is not None:
            server.close()


class _ConsoleLogHandler(logging.Handler):
    """Log records (asyncio's, the store's) go through the console like every other line."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self._console = console

    def emit(self, record: logging.LogRecord) -> None:
        self._console.say(record.getMessage() if not record.exc_info else self.format(record))


def _log_through(console: Console) -> None:
    root = logging.getLogger()
    root.handlers[:] = [_ConsoleLogHandler(console)]
    root.setLevel(logging.WARNING)


def _use_pidfd_child_watcher() -> None:
    """On Python 3.11 asyncio's default child watcher runs one thread per worker; a pidfd watcher
    needs none (3.12+ picks it by default). Exits still arrive as loop events either way."""
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return  # kernel without pidfd: keep the threaded watcher
    asyncio.get_event_loop_policy().set_child_watcher(asyncio.PidfdChildWatcher())
