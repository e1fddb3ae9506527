"""The stall watch of one node (``agent.stall.watch``) on a real silent process: when a stall is reported, and when
it is reported again.

The worker is a real ``sleep`` (no Python, so its sample is its /proc state, the same at every look); its output is
the ``Activity`` the pumps would update, set by the test. The console is a recorder of what the watch prints.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator, Sequence

import pytest

from rankrun.agent import stall
from rankrun.events.records import Stall, StallEnd
from rankrun.events.stream import EventStream
from rankrun.logs.pump import Activity
from rankrun.stacks.report import ProcState, RankSample
from rankrun.stacks.sampler import Sampler, Target

BOUND = 30.0
HANG_TIMEOUT = 0.2  # --hang-timeout, small: the watch itself is under test, not its timing


class Printed:
    """The console's one method the watch uses; each report is one call."""

    stderr_fd = 2

    def __init__(self) -> None:
        self.reports: list[str] = []
        self.news = asyncio.Event()

    def write_blocking(self, fd: int, data: bytes) -> None:
        assert fd == self.stderr_fd
        self.reports.append(data.decode())
        self.news.set()

    async def count(self, n: int) -> None:
        while len(self.reports) < n:
            self.news.clear()
            await self.news.wait()


class CountingSampler(Sampler):
    """The real sampler, counting its samples (every look of the watch takes ``stall.SAMPLES``)."""

    taken = 0
    more = asyncio.Event()

    async def sample(self, targets: Sequence[Target], timeout: float = 1.0) -> list[RankSample]:
        samples = await super().sample(targets, timeout)
        CountingSampler.taken += 1
        CountingSampler.more.set()
        return samples


@pytest.fixture
def silent_worker() -> Iterator[Target]:
    proc = subprocess.Popen(["sleep", "60"])

    def send(signum: int) -> bool:
        if proc.returncode is not None:
            return False
        os.kill(proc.pid, signum)
        return True

    try:
        yield Target(0, "h0", proc.pid, None, send)
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_stall_that_resumes_and_stalls_again_in_the_same_place_is_reported_again(monkeypatch, silent_worker):
    monkeypatch.setattr(stall, "SAMPLE_GAP", 0.05)
    monkeypatch.setattr(stall, "Sampler", CountingSampler)
    printed = Printed()

    async def until_taken(n: int) -> None:
        while CountingSampler.taken < n:
            CountingSampler.more.clear()
            await CountingSampler.more.wait()

    async def scenario() -> None:
        CountingSampler.taken, CountingSampler.more = 0, asyncio.Event()
        activity = Activity(asyncio.get_running_loop().time())
        watch = asyncio.create_task(stall.watch(HANG_TIMEOUT, "job", [silent_worker], activity, printed))  # type: ignore[arg-type]
        try:
            async with asyncio.timeout(BOUND):
                await printed.count(1)
                await until_taken(CountingSampler.taken + 2 * stall.SAMPLES)  # two more looks at the same silence
                assert len(printed.reports) == 1  # the same stall, still silent: not reported twice
                activity.last = asyncio.get_running_loop().time()  # the worker wrote, then fell silent again
                await printed.count(2)  # the same stacks as before: a new stall all the same
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        first, second = printed.reports
        assert first.startswith("rankrun: job job stalled: no output for ") and second.splitlines()[1:] == first.splitlines()[1:]

    asyncio.run(scenario())


class Tap:
    """A consumer of the job's stream: the events the watch emits."""

    def __init__(self) -> None:
        self.seen: list[object] = []

    def on_event(self, event: object) -> None:
        self.seen.append(event)


def test_a_stall_says_how_long_the_workers_were_silent_and_its_end_when_they_write_again(monkeypatch, silent_worker):
    """The goodput account's stall: it began ``silent`` seconds before its report, and ``stall.end`` comes within about
    a second (``SAMPLE_GAP``) of the workers' output, not a whole ``--hang-timeout`` later."""
    monkeypatch.setattr(stall, "SAMPLE_GAP", 0.05)
    printed, tap = Printed(), Tap()
    stream = EventStream("job", "127.0.0.1", [tap])
    long_timeout = 2.0  # the watch's next look would be this far off: the end must come sooner

    async def scenario() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        activity = Activity(loop.time())
        began = activity.last
        watch = asyncio.create_task(stall.watch(long_timeout, "job", [silent_worker], activity, printed,  # type: ignore[arg-type]
                                                events=stream))
        try:
            async with asyncio.timeout(BOUND):
                await printed.count(1)
                reported = loop.time()
                activity.last = loop.time()  # the worker wrote: the stall is over
                spoke = activity.last
                while not any(isinstance(e, StallEnd) for e in tap.seen):
                    await asyncio.sleep(0.01)
                return reported - began, spoke - began
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    quiet, spoke = asyncio.run(scenario())
    [report, end] = tap.seen
    assert isinstance(report, Stall) and isinstance(end, StallEnd)
    assert long_timeout <= report.silent <= quiet + 0.01  # measured from the silence's start, not the report
    assert end.ranks == report.ranks == "0"
    assert spoke <= end.seconds <= spoke + 0.5  # seen within a look (SAMPLE_GAP), far below the hang timeout
    assert end.mono - report.mono < long_timeout


class MovingSampler(Sampler):
    """The real sampler; once ``moving`` is set, each look finds the worker somewhere else (its kernel wait moves), as
    a stalled rank that resumed computing without a word would."""

    moving = False
    looks = 0

    async def sample(self, targets: Sequence[Target], timeout: float = 1.0) -> list[RankSample]:
        samples = await super().sample(targets, timeout)
        if not MovingSampler.moving:
            return samples
        MovingSampler.looks += 1
        return [RankSample(s.rank, s.host, s.dump, ProcState("R", 0.0, f"moved_{MovingSampler.looks}")) for s in samples]


def test_a_stall_whose_stacks_move_without_a_word_is_over_too(monkeypatch, silent_worker):
    monkeypatch.setattr(stall, "SAMPLE_GAP", 0.05)
    monkeypatch.setattr(stall, "Sampler", MovingSampler)
    MovingSampler.moving, MovingSampler.looks = False, 0
    printed, tap = Printed(), Tap()

    async def scenario() -> None:
        activity = Activity(asyncio.get_running_loop().time())
        watch = asyncio.create_task(stall.watch(HANG_TIMEOUT, "job", [silent_worker], activity, printed,  # type: ignore[arg-type]
                                                events=EventStream("job", "127.0.0.1", [tap])))
        try:
            async with asyncio.timeout(BOUND):
                await printed.count(1)
                MovingSampler.moving = True  # no output: only the stacks move
                while not any(isinstance(e, StallEnd) for e in tap.seen):
                    await asyncio.sleep(0.01)
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)

    asyncio.run(scenario())
    [report, end] = tap.seen[:2]
    assert isinstance(report, Stall) and isinstance(end, StallEnd) and end.ranks == report.ranks
    assert end.seconds >= report.silent
