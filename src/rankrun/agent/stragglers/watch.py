"""The straggler watch (``--straggler-window``): every window, which rank the others waited for
(``rankrun.straggler.verdict``), said once on every node when that changes, and a ``straggler`` event.

What one attempt's watch (``StragglerWatch``) gathers on its node over a window, with no change to the training
script:

- **arrivals**: each Python worker's shim thread appends the collectives torch's Flight Recorder saw to its rank's
  file (``straggler.frfile``), read at the window's end. Only collectives every local rank recording their group has
  reached are taken; the rest wait for the next window.
- **stack samples**, only where a rank's shim said its recorder cannot be read (torch.distributed is initialized, but
  the private API is gone or changed) and the last window had too few arrivals to judge on: ``SAMPLES`` a window,
  each a signal to every worker (``stacks.sampler``), whose dump is taken back out of its ``stacks.txt`` once read
  (samples every few seconds for days must not fill the disk). Never otherwise: a signal interrupts the worker's
  blocking calls, and some give up on ``EINTR`` (torch's store client backs off for seconds, then minutes, when its
  connect is interrupted during ``init_process_group``). A job without torch.distributed has no collectives to judge.
- **/proc**: each worker's CPU time over the window, and its state letter at every look.

Where the window goes: one node judges it at once (``local_judge``). Several nodes: ``agent.stragglers.job`` sends it
to the host, which judges the whole job, and every node (the host too) says the verdicts (``Said``). A window that
tells nothing leaves the verdict as it was. Loaded once the workers run, and only with the watch on.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from rankrun.events.records import StragglerEvent
from rankrun.events.stream import EventStream
from rankrun.stacks.sampler import Sampler, Target, proc_stat
from rankrun.straggler import verdict
from rankrun.straggler.frfile import read
from rankrun.straggler.verdict import Arrivals, Change, RankWindow, Straggler

SAMPLES = 20  # stack samples a window, when they are taken (at least verdict.MIN_SAMPLES)
LOOKS = 12  # /proc looks a window when no stacks are sampled
MIN_GAP = 0.5  # seconds between two looks at the workers, whatever the window

Judge = Callable[[list[RankWindow], Arrivals, float], Awaitable[None]]  # a window's ranks, arrivals, length


class Said:
    """What this node said of the verdict so far: each change's line goes to ``say`` (whole, ``rankrun: straggler:
    ...``) and its event to the job's stream."""

    def __init__(self, say: Callable[[str], None], events: EventStream) -> None:
        self._say, self._events = say, events
        self.verdict: dict[int, Straggler] = {}

    def update(self, found: Sequence[Straggler]) -> None:
        for change in verdict.changes(self.verdict, found):
            self._say(change.line)
            self._events.emit(event(change))
        self.verdict = {s.rank: s for s in found}


def event(change: Change) -> StragglerEvent:
    """A change of the verdict as the job's ``straggler`` event (a recovery carries its last naming's figures)."""
    s = change.straggler
    by_arrivals = s.lag is not None
    share = (s.late / s.total if s.total else 0.0) if by_arrivals else (s.others_waiting or 0.0)
    return StragglerEvent(rank=s.rank, where=s.where, verdict="named" if change.named else "recovered", lag=s.lag,
                          share=share, collectives=s.total if by_arrivals else 0, line=change.line)


def local_judge(said: Said) -> Judge:
    """One node: each window judged at once."""
    async def judge(ranks: list[RankWindow], arrivals: Arrivals, length: float) -> None:
        found = verdict.judge(ranks, arrivals, length)
        if found is not None:
            said.update(found)
    return judge


class LocalArrivals:
    """The collectives read from the local ranks' files, until every local rank recording their group reached them."""

    def __init__(self, files: Mapping[int, Path]) -> None:
        self._files = dict(files)
        self._offsets = dict.fromkeys(files, 0)
        self.off = False  # a rank's shim said its recorder cannot be read (torch.distributed is up, without it)
        self._pending: defaultdict[tuple[str, int], dict[int, float]] = defaultdict(dict)
        self._reached: defaultdict[str, dict[int, int]] = defaultdict(dict)  # group → rank → its last seq read

    def complete(self) -> dict[tuple[str, int], dict[int, float]]:
        """What the files hold now: the collectives every local rank recording their group has reached (taken out)."""
        for rank, path in self._files.items():
            found = read(path, self._offsets[rank])
            self._offsets[rank] = found.offset
            self.off = self.off or (found.status is not None and found.status != "on")
            for a in found.arrivals:
                self._pending[(a.group, a.seq)][rank] = a.created_ns / 1e9
                reached = self._reached[a.group]
                reached[rank] = max(reached.get(rank, 0), a.seq)
        out = {}
        for key in list(self._pending):
            group, seq = key
            if seq <= min(self._reached[group].values()):
                out[key] = self._pending.pop(key)
        return out


class StragglerWatch:
    """One attempt's watch on this node: ``run`` until cancelled, each window handed to ``judge``."""

    def __init__(self, window: float, targets: Sequence[Target], fr_files: Mapping[int, Path], where: str,
                 judge: Judge, *, samples: int = SAMPLES) -> None:
        self._window, self._targets, self._where, self._judge = window, list(targets), where, judge
        self._arrivals = LocalArrivals(fr_files)
        self._samples = max(samples, verdict.MIN_SAMPLES)
        self._sampler = Sampler()
        self.stacks = False  # signals interrupt a worker's blocking calls (torch's store connect gives up on EINTR)

    async def run(self) -> None:
        while True:
            await self.window()

    async def window(self) -> None:
        """One window watched, then judged."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        cpu = {t.rank: _cpu(t) for t in self._targets}
        seen: defaultdict[int, Counter[str]] = defaultdict(Counter)
        sampled, waiting = Counter[int](), Counter[int]()
        stacks = self.stacks
        gap = max(MIN_GAP, self._window / (self._samples if stacks else LOOKS))
        while (left := started + self._window - loop.time()) > 0:
            await asyncio.sleep(min(gap, left))
            if stacks:
                for s in await self._sampler.sample(self._targets, keep=False):
                    if s.proc is not None:
                        seen[s.rank][s.proc.state] += 1
                    main = s.dump.main if s.dump is not None else None
                    if main is not None:
                        sampled[s.rank] += 1
                        waiting[s.rank] += verdict.in_collective([(f.file, f.function) for f in main.frames])
            else:
                for t in self._targets:
                    stat = proc_stat(t.pid) if t.signal(0) else None
                    if stat is not None:
                        seen[t.rank][stat[0]] += 1
        took = loop.time() - started
        arrivals = self._arrivals.complete()
        self.stacks = self._arrivals.off and len(arrivals) < verdict.MIN_COLLECTIVES
        ranks = [RankWindow(t.rank, self._where, sampled[t.rank], waiting[t.rank], _share(cpu[t.rank], _cpu(t), took),
                            seen[t.rank].most_common(1)[0][0] if seen[t.rank] else "")
                 for t in self._targets]
        await self._judge(ranks, arrivals, took)


def _cpu(target: Target) -> float | None:
    stat = proc_stat(target.pid) if target.signal(0) else None
    return stat[1] if stat is not None else None


def _share(before: float | None, after: float | None, took: float) -> float | None:
    """CPU seconds over the window's wall time; None where the worker was gone at either end."""
    if before is None or after is None or took <= 0:
        return None
    return max(0.0, after - before) / took
