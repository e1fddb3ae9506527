"""The stall watch of one attempt: silent workers whose stacks do not move are reported, grouped (``--hang-timeout``).

A node's job is *stalled* when no worker of the node has written a byte for ``--hang-timeout`` seconds and
``SAMPLES`` samples of every worker's stacks over ``SAMPLE_GAP`` are all the same: a worker computing in
Python without printing moves between samples and is left alone. The report (``rankrun.stacks.report``) goes to
the launcher's stderr in one piece; it is printed again only when the stacks change, or after the workers
have written something and fallen silent again. Ranks that exited 0 while others went silent (a stuck
``destroy_process_group``, a non-daemon thread) are named on its first line: an exit that hangs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rankrun.clock import seconds
from rankrun.logs.console import Console
from rankrun.logs.pump import Activity
from rankrun.stacks.report import RankSample, group, render, signature, stall_cause, stall_title
from rankrun.stacks.sampler import Sampler, Target

SAMPLE_GAP = 1.0  # seconds from the first to the last of the samples that must agree
SAMPLES = 3  # a loop in Python can show one stack twice by chance; three times, over a second, hardly


async def watch(timeout: float, run_id: str, targets: Sequence[Target], activity: Activity, console: Console, *,
                fail: bool = False) -> str:
    """Runs until cancelled (the attempt's end); with ``fail``, returns the stall's cause after its report."""
    loop = asyncio.get_running_loop()
    sampler = Sampler()
    reported: tuple[object, ...] | None = None
    reported_after = activity.last
    while True:
        if activity.last != reported_after:
            reported = None  # the workers spoke since: a new silence is a new stall
        quiet = loop.time() - activity.last
        if quiet < timeout:
            await asyncio.sleep(timeout - quiet)
            continue
        since = activity.last
        samples = [await sampler.sample(targets)]
        for _ in range(SAMPLES - 1):
            await asyncio.sleep(SAMPLE_GAP / (SAMPLES - 1))
            samples.append(await sampler.sample(targets))
        if activity.last != since or len({signature(s) for s in samples}) > 1:
            continue  # output meanwhile, or the stacks moved: not stalled (look again)
        if signature(samples[-1]) != reported:
            _report(console, run_id, loop.time() - since, samples[-1])
            reported, reported_after = signature(samples[-1]), since
            if fail:
                return stall_cause(seconds(loop.time() - since), samples[-1])
        await asyncio.sleep(max(timeout, SAMPLE_GAP))


def _report(console: Console, run_id: str, silent: float, samples: Sequence[RankSample]) -> None:
    title, running = stall_title(run_id, seconds(silent), samples)
    console.write_blocking(console.stderr_fd, ("\n".join(render(title, running)) + "\n").encode())


class OnDemand:
    """What a ``rankrun --stacks`` request samples: the running attempt's workers (none between attempts)."""

    def __init__(self) -> None:
        self.run_id = ""
        self.targets: list[Target] = []
        self._sampler = Sampler()

    async def report(self) -> list[str]:
        if not self.targets:
            return [f"rankrun: job {self.run_id}: no workers are running right now (between attempts, or done)"]
        samples = await self._sampler.sample(self.targets)
        groups, n = len(group(samples)), len(samples)
        return render(f"rankrun: job {self.run_id} stacks on request: {groups} distinct stack{'s' if groups > 1 else ''} "
                      f"across {n} rank{'s' if n > 1 else ''}", samples)
