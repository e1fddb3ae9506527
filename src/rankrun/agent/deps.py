"""What the agent acts through: the seams a scenario test replaces (spawner, console, the worker store, the clock,
the watchdog, and, for several nodes, the rendezvous backend), the running workers ``rankrun --stacks`` asks, and the
job's event stream (a test adds its own consumer)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rankrun.agent.watch import OnDemand
from rankrun.clock import Clock, SystemClock
from rankrun.events.stream import EventStream
from rankrun.logs.console import Console
from rankrun.logs.routes import ConsoleFacts
from rankrun.proc.spawn import Spawner, WorkerHandle
from rankrun.proc.watchdog import Watchdog, reap_orphans
from rankrun.workerstore.tcpstore import TCPStoreServer

if TYPE_CHECKING:  # one node never imports the rendezvous (rankrun.agent.loop imports multinode only for several)
    from rankrun.agent.preload import PreloadNews
    from rankrun.proc.preload import Preloader
    from rankrun.rendezvous.session import Backend


@dataclass
class AgentDeps:
    spawner: Spawner
    console: Console
    host: str
    watchdog: Watchdog | None = None
    keep: frozenset[int] = frozenset()  # children we had before launching (e.g. an entrypoint's sidecar)
    facts: ConsoleFacts | None = None  # the launcher's stdio; None: the console's own, never interactive
    worker_store: TCPStoreServer = field(default_factory=TCPStoreServer)  # what env:// connects to
    clock: Clock = field(default_factory=SystemClock)
    rendezvous: Backend | None = None  # several nodes: how the session joins (None: as the spec says; tests: a shared store)
    on_demand: OnDemand = field(default_factory=OnDemand)  # the running workers, for rankrun --stacks
    # the job's lifecycle facts (run_agent names the run and node, and adds --events/--metrics-port's consumers)
    events: EventStream = field(default_factory=lambda: EventStream("", ""))
    preloader: Preloader | None = None  # --preload: the node's preloading process (the spawner forks from it)
    preload_news: PreloadNews | None = None  # --preload: its events not emitted yet (agent.preload.preloading's)

    @property
    def console_facts(self) -> ConsoleFacts:
        return self.facts or ConsoleFacts(merged=self.console.merged, interactive=False)

    @property
    def terminal_guard(self) -> Callable[[list[Any] | None], None] | None:
        return self.watchdog.terminal_modes if self.watchdog is not None else None

    async def after_group(self, handles: Sequence[WorkerHandle]) -> None:
        """Once a group is gone: reap re-parented descendants (off the event loop, which also serves
        the stores), then stop watching its process groups."""
        if self.watchdog is None:
            return
        resident = self.preloader.pid if self.preloader is not None else None  # lives on, for the next attempt
        exclude = {self.watchdog.pid, *self.keep, *(h.pid for h in handles), *((resident,) if resident else ())}
        await asyncio.to_thread(reap_orphans, exclude)
        for h in handles:
            self.watchdog.unregister(h.pid)
