"""The observers of one attempt's running workers, in one object: what looks at an attempt without steering it.

The round's own (the stacks exchange and the job's straggler watch of several nodes) are ``agent.features``'
``JobView``; the job's consumers of its event stream are ``agent.observers``'.

``OnDemand`` lives as long as the job on this node (``AgentDeps.on_demand``). It answers ``rankrun --stacks`` with
the running workers' stacks (the whole job's, through the round's exchange, while ``round`` holds one), or says what
the launcher does while none run. For each attempt it makes an ``AttemptWatch``, which is told the attempt's facts
in order and acts on them:

- ``env``: each worker's variables before it starts: the stack-dump shim (``stacks.channel``), torch's Flight
  Recorder (``stacks.flight``) and, with ``--straggler-window`` on, the shim's arrivals (``stacks.channel``), all
  composed by ``observed_env``; the first call starts the start-up timeline's spawn phase (``agent.startup``);
- ``started``: the workers run: ``workers.start`` goes to the job's event stream, ``--stacks`` samples them, the
  ``--hang-timeout`` watch (``agent.stall``) starts, and so does the look for the workers' signs of life, which
  emits the attempt's ``startup`` (and its line) once they are known; with ``--straggler-window``, its watch and the
  look for the first collective (``agent.training``: the ``training`` event); ``stalled`` ends with the stall (its cause, and
  the node blamed for it), only for ``--hang-action fail``;
- ``ended``: the group ends: the watch stops, ``--stacks`` says no workers run, and the ``startup`` and
  ``training`` events come now with what is known if they have not come;
- ``close``: every worker is reaped: a ``stacks.txt`` that holds no dump is removed;
- ``finished``: the attempt is over: ``workers.end``, with how the group ended.

``agent/attempt.py`` names none of these observers: it tells the watch these facts and races ``stalled``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rankrun.agent import stall
from rankrun.agent.env import WorkerIdentity
from rankrun.agent.facts import workers_outcome
from rankrun.agent.startup import StartupWatch
from rankrun.agent.training import TrainingWatch
from rankrun.errors import StoreUnavailable
from rankrun.events.records import Preload, Warm, WorkersEnd, WorkersStart
from rankrun.events.stream import EventStream
from rankrun.logs.console import Console
from rankrun.logs.layout import RunLogs
from rankrun.logs.pump import Activity
from rankrun.ranges import range_string
from rankrun.spec import EntryKind, LaunchSpec
from rankrun.stacks.channel import arrivals_env, arrivals_every, channel_env, drop_if_unused
from rankrun.stacks.flight import FOLDER, Recorder, enabled, flight_env
from rankrun.stacks.report import RankSample, render, request_title
from rankrun.stacks.sampler import Sampler, Target

if TYPE_CHECKING:  # one node never imports the exchange
    from rankrun.agent.plan import AttemptPlan
    from rankrun.agent.stragglers.job import JobStragglers
    from rankrun.agent.stragglers.watch import StragglerWatch
    from rankrun.proc.group import GroupOutcome, Stalled
    from rankrun.proc.spawn import WorkerHandle
    from rankrun.stacks.exchange import Exchange

CPU_WINDOW = 0.5  # seconds of CPU time a sample on request measures, when no sample was taken just before

STARTING = "starting"
WAITING = "waiting for the rendezvous"
BETWEEN = "between attempts"
DONE = "done (the launcher is finishing)"


class StartedWorker(Protocol):
    """A worker as the attempt started it: where it sits in the job, and its process (pid, signals)."""

    @property
    def who(self) -> WorkerIdentity: ...

    @property
    def handle(self) -> WorkerHandle: ...


class AttemptWatch:
    """One attempt's observers (from ``OnDemand.attempt``); see the module docstring for the facts it is told."""

    def __init__(self, spec: LaunchSpec, attempt_dir: Path | None, console: Console, host: str, on_demand: OnDemand, *,
                 events: EventStream, plan: AttemptPlan, store: Callable[[], Sequence[float]] | None) -> None:
        self._spec, self._attempt_dir, self._console, self._host = spec, attempt_dir, console, host
        self._on_demand, self._events, self._attempt = on_demand, events, plan.attempt
        self._startup = StartupWatch(events, console.say, attempt=plan.attempt, rendezvous=plan.rendezvous, store=store)
        self._python = spec.worker.entry.kind is not EntryKind.BINARY  # a --no-python program has no dump file
        self._dump_files: list[Path] = []
        loop = asyncio.get_running_loop()
        self.activity = Activity(loop.time())  # the workers' last byte, noted by the pumps; starting counts as output
        self._recorder = _recorder(spec, attempt_dir, console)
        self._stalled: asyncio.Future[Stalled] = loop.create_future()  # none until the workers run
        self._straggling: asyncio.Future[None] = loop.create_future()  # --straggler-window's watch, once they run
        self._training: TrainingWatch | None = None  # the look for the first collective, with that watch
        self._looking: asyncio.Future[None] = loop.create_future()

    def env(self, who: WorkerIdentity, env: dict[str, str]) -> dict[str, str]:
        """``env`` with what the observers need of the worker. A Python worker gets the stack-dump shim, so that a
        stall report or ``--stacks`` can show where it is; a ``--no-python`` program is described from /proc
        instead, and its environment left exactly as torchrun's. Where the user turned torch's Flight Recorder on,
        its dump file and pipe go into the attempt's directory (``observed_env``)."""
        self._startup.spawning()
        dump_file = RunLogs.stacks_file(self._attempt_dir, who.local_rank)
        if dump_file is not None and self._python:
            self._dump_files.append(dump_file)
        return observed_env(self._spec, self._attempt_dir, who, env)

    def started(self, workers: Sequence[StartedWorker]) -> None:
        """The workers run: ``rankrun --stacks`` samples them from now on, and the ``--hang-timeout`` watch starts."""
        spec, run_id = self._spec, self._spec.rendezvous.run_id
        targets = [Target(w.who.rank, self._host, w.handle.pid,
                          RunLogs.stacks_file(self._attempt_dir, w.who.local_rank) if self._python else None, w.handle.signal,
                          w.handle.signal_main)
                   for w in workers]
        self._on_demand.running(run_id, targets, self._recorder)
        began = self._events.emit(WorkersStart(self._attempt, range_string(w.who.rank for w in workers),
                                               tuple(w.handle.pid for w in workers)))
        self._startup.started({t.rank: t.dump_file for t in targets})
        if spec.hang.timeout > 0:
            self._stalled = asyncio.ensure_future(stall.watch(
                spec.hang.timeout, run_id, targets, self.activity, self._console, fail=spec.hang.action == "fail",
                job=self._on_demand.job, recorder=self._recorder, events=self._events))
        if spec.straggler.window > 0 and self._python and self._attempt_dir is not None:
            self._straggling = asyncio.ensure_future(self._straggler_watch(workers, targets).run())
            files = {w.who.rank: path for w in workers if (path := RunLogs.arrivals_file(self._attempt_dir, w.who.rank))}
            self._training = TrainingWatch(self._attempt, files, began.ts, self._events.emit)
            self._looking = asyncio.ensure_future(self._training.run())

    def preloaded(self, warm: Warm, preload: Preload | None) -> None:
        """Under ``--preload``: how the workers started (``warm``) and the node's one import (``preload``), for the
        start-up line."""
        self._startup.how = (warm, preload)

    def _straggler_watch(self, workers: Sequence[StartedWorker], targets: Sequence[Target]) -> StragglerWatch:
        """``--straggler-window``: one node judges its windows itself; several send them to the host (the round's
        ``JobStragglers``), which judges the job and tells every node."""
        from rankrun.agent.stragglers.watch import Said, StragglerWatch, local_judge  # noqa: PLC0415 - with the watch on

        files = {w.who.rank: path for w in workers if (path := RunLogs.arrivals_file(self._attempt_dir, w.who.rank))}
        job = self._on_demand.stragglers
        if job is not None:
            return StragglerWatch(self._spec.straggler.window, targets, files, job.where, job.judge)
        said = Said(lambda line: stall.show(self._console, [line]), self._events)
        return StragglerWatch(self._spec.straggler.window, targets, files, self._host, local_judge(said))

    @property
    def stalled(self) -> Awaitable[Stalled]:
        """Ends with the stall (its cause, and the node blamed for it), after its report, only for ``--hang-action
        fail``; never before ``started``, nor when ``--hang-timeout`` is off."""
        return self._stalled

    def ended(self) -> None:
        """The group ends (stopping, or gone): the stall watch stops, and ``--stacks`` says no workers run."""
        self._stalled.cancel()
        self._straggling.cancel()
        self._looking.cancel()
        if self._training is not None:
            self._training.last_look()
        self._on_demand.running(self._spec.rendezvous.run_id, [], None)
        self._startup.ended()

    def close(self) -> None:
        """Every worker is reaped: ``stacks.txt`` stays in a rank's log folder only where stacks were taken."""
        for dump_file in self._dump_files:
            drop_if_unused(dump_file)

    def finished(self, outcome: GroupOutcome) -> None:
        """The attempt is over, every worker gone and its output delivered: ``workers.end`` with how it ended."""
        self._events.emit(WorkersEnd(self._attempt, workers_outcome(outcome)))


def observed_env(spec: LaunchSpec, attempt_dir: Path | None, who: WorkerIdentity, env: dict[str, str]) -> dict[str, str]:
    """One worker's ``env`` with what the observers need of it (pure): a Python worker gets the stack-dump shim; the
    Flight Recorder's dumps and pipe go into ``attempt_dir`` where the user turned it on; and with ``--straggler-window``
    on, a Python worker's shim writes its collectives' arrivals, with a recorder buffer of rankrun's where the user set
    none. In this order: whether the user turned the recorder on is decided on their settings alone, never on the
    buffer rankrun adds for the arrivals. No run directory (``--log-dir /dev/null``): neither file, nor the buffer."""
    python = spec.worker.entry.kind is not EntryKind.BINARY
    dump_file = RunLogs.stacks_file(attempt_dir, who.local_rank)
    if dump_file is not None and python:
        env = channel_env(env, str(dump_file))
    env = flight_env(env, attempt_dir)
    arrivals = RunLogs.arrivals_file(attempt_dir, who.rank)
    if arrivals is not None and python and spec.straggler.window > 0:
        env = arrivals_env(env, str(arrivals), arrivals_every(spec.straggler.window))
    return env


def _recorder(spec: LaunchSpec, attempt_dir: Path | None, console: Console) -> Recorder | None:
    """torch's Flight Recorder, where the user turned it on: its folder in the attempt's directory, made before
    the workers start (they create their pipes there), and what a stall asks of it (``stacks.flight``)."""
    if attempt_dir is None or not enabled(spec.base_env):
        return None
    (attempt_dir / FOLDER).mkdir(exist_ok=True)
    return Recorder(flight_env(spec.base_env, attempt_dir), lambda line: stall.show(console, [line]))


class OnDemand:
    """What a ``rankrun --stacks`` request samples: the running attempt's workers, and with several nodes the
    round's exchange, through which the report is the whole job's. With no workers running, the answer says
    what the launcher is doing instead (``STARTING``, ``WAITING``, ``BETWEEN``, ``DONE``)."""

    def __init__(self) -> None:
        self.run_id = ""
        self.state = STARTING  # what the launcher does while no workers run
        self.targets: list[Target] = []
        self.job: Exchange | None = None
        self.stragglers: JobStragglers | None = None  # several nodes: the round's straggler watch, judged by the host
        self.recorder: Recorder | None = None  # torch's Flight Recorder, where on: asked for dumps at a stall
        self.on_running: Callable[[list[Target]], None] | None = None  # kept progress: which pids are the workers
        self._sampler = Sampler()
        self._sampled = float("-inf")

    def attempt(self, spec: LaunchSpec, attempt_dir: Path | None, console: Console, host: str, *,
                events: EventStream, plan: AttemptPlan,
                store: Callable[[], Sequence[float]] | None = None) -> AttemptWatch:
        """The observers of ``plan``'s attempt, made before its workers start (their ``env``); ``store``: the first
        requests the workers' store saw this attempt (``TCPStoreServer.first_requests``), where it sees this node's
        workers alone (one node)."""
        return AttemptWatch(spec, attempt_dir, console, host, self, events=events, plan=plan, store=store)

    @contextlib.contextmanager
    def round(self, exchange: Exchange, stragglers: JobStragglers | None = None) -> Iterator[None]:
        """Several nodes, for one round: a stall or a ``--stacks`` request gets the whole job's stacks through
        ``exchange``; the straggler watch sends its windows to ``stragglers``."""
        self.job, self.stragglers = exchange, stragglers
        try:
            yield
        finally:
            self.job = self.stragglers = None

    def running(self, run_id: str, targets: list[Target], recorder: Recorder | None) -> None:
        """The attempt's workers as they start (and ``[]`` once they are gone: between attempts), with their
        recorder if any."""
        self.run_id, self.targets, self.recorder = run_id, targets, recorder
        if self.on_running is not None:
            self.on_running(targets)
        if not targets:
            self.state = BETWEEN

    def waiting(self, run_id: str) -> None:
        """No workers run: the launcher waits for the rendezvous (``WAITING``)."""
        self.idle(run_id, WAITING)

    def idle(self, run_id: str, state: str) -> None:
        """No workers run: the launcher is ``state`` (``STARTING``, ``WAITING``, ``DONE``)."""
        self.run_id, self.targets, self.recorder, self.state = run_id, [], None, state

    async def sample(self, why: str = "request") -> list[RankSample]:
        """The running workers' stacks now, with the CPU each used over the last ``CPU_WINDOW`` s at least;
        for a stall (``why``), this node's Flight Recorder dumps are asked for too."""
        loop = asyncio.get_running_loop()
        if why == "stall" and self.recorder is not None:
            self.recorder.take()
        targets = list(self.targets)
        if loop.time() - self._sampled > 2 * CPU_WINDOW:
            self._sampler.prime(targets)
            await asyncio.sleep(CPU_WINDOW)  # CPU used over a window: blocked at 0 % or spinning
        samples = await self._sampler.sample(targets)
        self._sampled = loop.time()
        return samples

    async def report(self) -> list[str]:
        if self.job is not None:
            try:
                async with asyncio.timeout(stall.EXCHANGE_BOUND):
                    return await self.job.request()
            except (StoreUnavailable, TimeoutError) as exc:
                note = f"rankrun: the other nodes' stacks could not be gathered ({exc or 'no answer in time'}): this node's only"
                return [note, *await self._local()]
        return await self._local()

    async def _local(self) -> list[str]:
        if not self.targets:
            return [f"rankrun: job {self.run_id}: no workers are running right now: {self.state}"]
        samples = await self.sample()
        return render(request_title(self.run_id, samples), samples)
