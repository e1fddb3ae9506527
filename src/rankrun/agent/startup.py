"""An attempt's start-up timeline: when its workers came to life, summed up once as a ``startup`` event and a line.

The phases, all in seconds on this node's monotonic clock (CLOCK_MONOTONIC, which the workers share):

- ``rendezvous``: the round's own seconds (its ``rdzv.round``; one node: the fresh store keyspace, about 0);
- ``spawn``: from the first worker's command being made to the last worker started;
- ``script``, per rank: from the spawn's start to the moment its interpreter came up and ran rankrun's shim, just
  before the user's script (``stacks.shim``: the ``up=`` of the header line it writes to the rank's dump file);
  a ``--no-python`` program has no shim, and ``--logs discard`` no dump file: then null;
- ``store``, per connection: from the spawn's start to the first request the workers' store saw on it (its
  VALIDATE: ``workerstore.tcpstore``, whose keyspace and notes are fresh each attempt). torch's clients do not say
  their rank, so the slowest is not named (``store_slowest`` null). Measured on one node only: with several, the
  workers' store is on one node, which sees every node's workers, not its own.

Both per-rank phases count from the spawn's start, so they are points on one axis: ``store - script`` is the time
the user's script took to reach ``init_process_group``. Each is given as p50 (nearest rank: the lower middle value)
and max over ranks, with the slowest rank. ``total`` = ``rendezvous`` + from the spawn's start to the latest
sign of life known (the launcher's own milliseconds between the round and the spawn are not counted).

``StartupWatch`` is told the spawn's start and end and the workers' dump files, and looks for the signs of life in
a task of its own, off every worker's path: it reads the dump files' first line and the store's notes, every
``POLL_FIRST`` s at first and less often as time goes on (``POLL_MAX``). The summary comes once: as soon as every
rank's script and (one node) as many store connections as ranks are known, with its console line; else after
``BOUND`` s, with its line; else when the attempt ends, as the event alone, with what is known and null for the
rest (a job whose workers never use the store, as a plain script or ``--no-python`` program: its line would come
after the fact, on every such job).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rankrun.events.fields import ranks_in
from rankrun.events.records import Preload, Startup, Warm
from rankrun.events.stream import EventStream
from rankrun.stacks.dump import up_time

BOUND = 300.0  # seconds after the spawn: the summary comes with what is known by then
POLL_FIRST = 0.05  # seconds between looks at first
POLL_MAX = 1.0  # and at most, later
_HEADER_READ = 128  # bytes: the dump file's header line, and more


def spread(times: Mapping[int, float]) -> tuple[float | None, float | None, int | None]:
    """(p50, max, the slowest key) of ``times`` (key: a rank, or a connection's index); all None when empty. p50 is
    the nearest-rank one, the lower middle value of an even count; the slowest is the lowest key of a tie (pure)."""
    if not times:
        return None, None, None
    ordered = sorted(times.values())
    slowest = min(key for key, value in times.items() if value == ordered[-1])
    return ordered[(len(ordered) - 1) // 2], ordered[-1], slowest


def summary(attempt: int, rendezvous: float, spawn: float, script: Mapping[int, float],
            store: Sequence[float]) -> Startup:
    """The ``startup`` record from the phases: ``script`` by rank and ``store`` by connection, seconds after the spawn
    began (pure). ``total`` is the rendezvous plus the latest of the spawn and every sign of life."""
    script_p50, script_max, script_slowest = spread(script)
    store_p50, store_max, _ = spread(dict(enumerate(store)))
    latest = max(spawn, script_max or 0.0, store_max or 0.0)
    return Startup(attempt, _s(rendezvous + latest), _s(rendezvous), _s(spawn), _r(script_p50), _r(script_max),
                   script_slowest, _r(store_p50), _r(store_max), None)


def line(s: Startup, warm: Warm | None = None, preload: Preload | None = None) -> str:
    """The console line (without ``rankrun: ``): ``attempt 0 started in 4.2 s: rendezvous 0.9 s, spawn 0.1 s, script
    p50 2.1 s / max 3.8 s (rank 5), store p50 0.2 s / max 0.4 s``; a phase not known is ``-``. Under ``--preload``,
    ``warm`` (the attempt's) and ``preload`` (the node's, whose ``seconds`` the import took) say how the workers
    started: ``attempt 0 started in 0.061 s (forked; torch imported once in 2.3 s): ...`` (pure)."""
    return (f"attempt {s.attempt} started in {seconds(s.total)}{how_started(warm, preload)}: "
            f"rendezvous {seconds(s.rendezvous)}, spawn {seconds(s.spawn)}, "
            f"script {_phase(s.script_p50, s.script_max, s.script_slowest)}, "
            f"store {_phase(s.store_p50, s.store_max, s.store_slowest)}")


def how_started(warm: Warm | None, preload: Preload | None = None) -> str:
    """`` (forked; torch imported once in 2.3 s)`` when every worker was forked from the preloading process,
    `` (3 forked, 1 cold; ...)`` when some started cold; without ``preload``, no import clause; ``""`` when no
    worker was forked (no ``--preload``, or all cold): the line is then a cold start's (pure)."""
    if warm is None or (forked := ranks_in(warm.forked)) == 0:
        return ""
    cold = ranks_in(warm.cold)
    words = "forked" if cold == 0 else f"{forked} forked, {cold} cold"
    if preload is not None:
        modules = ", ".join(name.strip() for name in preload.modules.split(",") if name.strip())
        words += f"; {modules or 'the modules'} imported once in {seconds(preload.seconds)}"
    return f" ({words})"


def seconds(value: float) -> str:
    """``4.2 s``; three decimals under 0.1 s (a local spawn takes milliseconds), none from 100 s (pure)."""
    if value >= 100:
        return f"{value:.0f} s"
    return f"{value:.1f} s" if value >= 0.1 else f"{value:.3f} s"


def _phase(p50: float | None, most: float | None, slowest: int | None) -> str:
    if p50 is None or most is None:
        return "-"
    return f"p50 {seconds(p50)} / max {seconds(most)}" + (f" (rank {slowest})" if slowest is not None else "")


def _s(value: float) -> float:
    return round(max(value, 0.0), 6)  # a sign of life seen before the spawn's start is one at its start


def _r(value: float | None) -> float | None:
    return None if value is None else _s(value)


def script_up(dump_file: Path) -> float | None:
    """When the rank's interpreter came up, from its dump file's header line; None while there is none (yet)."""
    try:
        with dump_file.open("rb") as fh:
            head = fh.read(_HEADER_READ)
    except OSError:
        return None
    first, newline, _ = head.partition(b"\n")
    return up_time((first + newline).decode(errors="replace"))


class StartupWatch:
    """One attempt's start-up: ``spawning`` (the first worker's command is made), ``started`` (every worker runs:
    the looking begins), ``ended`` (the workers are gone: the summary now, if it has not come)."""

    def __init__(self, events: EventStream, say: Callable[[str], None], *, attempt: int, rendezvous: float,
                 store: Callable[[], Sequence[float]] | None, clock: Callable[[], float] = time.monotonic) -> None:
        """``store``: the workers' store's first requests (``TCPStoreServer.first_requests``), None where this node's
        store does not see its own workers alone (several nodes)."""
        self._events, self._say, self._attempt, self._rendezvous = events, say, attempt, rendezvous
        self._store, self._clock = store, clock
        self._begin: float | None = None
        self._spawn = 0.0
        self._files: dict[int, Path] = {}  # rank: its dump file, for the ranks whose interpreter is not up yet
        self._script: dict[int, float] = {}
        self._python = False
        self._ranks = 0
        self._task: asyncio.Task[None] | None = None
        self._done = False
        self.how: tuple[Warm | None, Preload | None] = (None, None)  # --preload: how the workers started (the line's)

    def spawning(self) -> None:
        if self._begin is None:
            self._begin = self._clock()

    def started(self, dump_files: Mapping[int, Path | None]) -> None:
        """Every worker runs (``dump_files``: rank to dump file, None where it has none): look for their signs of
        life from now on."""
        now = self._clock()
        begin = self._begin = self._begin if self._begin is not None else now
        self._spawn = now - begin
        self._ranks = len(dump_files)
        self._files = {rank: path for rank, path in dump_files.items() if path is not None}
        self._python = bool(self._files) and len(self._files) == self._ranks
        self._task = asyncio.ensure_future(self._look())

    def ended(self) -> None:
        """The attempt's workers are gone: the summary, with what is known, unless it came already."""
        if self._task is None:  # no worker started (a spawn failed): no start-up to tell
            return
        self._task.cancel()
        if not self._done:
            self._look_once()
            self._emit(say=False)

    async def _look(self) -> None:
        pause, waited = POLL_FIRST, 0.0
        while not self._look_once() and waited < BOUND:
            await asyncio.sleep(min(pause, BOUND - waited))  # files and a list: there is nothing to wait on
            waited += pause
            pause = min(pause * 1.5, POLL_MAX)
        self._emit(say=True)

    def _look_once(self) -> bool:
        """Read the signs of life not yet seen; whether every one expected is known."""
        begin = self._begin or 0.0
        for rank, path in list(self._files.items()):
            up = script_up(path)
            if up is not None:
                self._script[rank] = up - begin
                del self._files[rank]
        scripts = not self._files or not self._python
        return scripts and (self._store is None or len(self._store()) >= self._ranks)

    def _emit(self, *, say: bool) -> None:
        if self._done:
            return
        self._done = True
        begin = self._begin or 0.0
        store = [t - begin for t in self._store()[: self._ranks]] if self._store is not None else []
        script = self._script if self._python else {}
        fact = self._events.emit(summary(self._attempt, self._rendezvous, self._spawn, script, store))
        if say:
            self._say(line(fact, *self.how))
