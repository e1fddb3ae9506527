"""The stall watch of one attempt: silent workers whose stacks do not move are reported, grouped (``--hang-timeout``).

A node's job is *stalled* when no worker of the node has written a byte for ``--hang-timeout`` seconds and
``SAMPLES`` samples of every worker's stacks over ``SAMPLE_GAP`` are all the same: a worker computing in
Python without printing moves between samples and is left alone. The report (``rankrun.stacks.report``) goes to
the launcher's stderr in one piece; it is printed again only when the stacks change, or after the workers
have written something and fallen silent again. Ranks that exited 0 while others went silent (a stuck
``destroy_process_group``, a non-daemon thread) are named on its first line: an exit that hangs.

Several nodes: the report is the whole job's, gathered through the rendezvous store (``stacks.exchange``);
when the store cannot be used within ``EXCHANGE_BOUND``, this node's own report is printed, saying so. With
``--hang-action fail`` the watch ends with the stall (``proc.group.Stalled``): its cause, and the node the job's
report blames (the one holding the smallest group of stacks, when one node does); a node's own report blames nobody:
it saw only its own ranks.

The attempt's watch (``agent.watch.AttemptWatch``) starts it when the workers run and cancels it when they end.
Each report printed is a ``stall`` event on the job's stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import field
from typing import TYPE_CHECKING

from rankrun.clock import seconds
from rankrun.errors import StoreUnavailable
from rankrun.events.records import Stall, StallEnd
from rankrun.events.stream import EventStream
from rankrun.logs.console import Console
from rankrun.logs.pump import Activity
from rankrun.proc.group import Stalled
from rankrun.ranges import range_string
from rankrun.record import record
from rankrun.stacks.report import RankSample, render, signature, stall_cause, stall_title
from rankrun.stacks.sampler import Sampler, Target

if TYPE_CHECKING:  # one node never imports the exchange
    from rankrun.stacks.exchange import Exchange
    from rankrun.stacks.flight import Recorder

SAMPLE_GAP = 1.0  # seconds from the first to the last of the samples that must agree
SAMPLES = 3  # a loop in Python can show one stack twice by chance; three times, over a second, hardly
EXCHANGE_BOUND = 8.0  # seconds the whole job's report may take before this node prints its own


async def watch(timeout: float, run_id: str, targets: Sequence[Target], activity: Activity, console: Console, *,
                fail: bool = False, job: Exchange | None = None, recorder: Recorder | None = None,
                events: EventStream | None = None) -> Stalled:
    """Runs until cancelled (the attempt's end); with ``fail``, returns the stall (its cause, and the node blamed for
    it where the job's report names one) after its report.
    ``job``: several nodes, whose report is the whole job's (each node's answer takes its own recorder dumps);
    ``recorder``: torch's Flight Recorder, asked for dumps at each report; ``events``: the job's event stream, which
    gets a ``stall`` for each report printed."""
    loop = asyncio.get_running_loop()
    sampler = Sampler()
    reporter = _Reporter(run_id, targets, console, job, recorder, events)
    reported: tuple[object, ...] | None = None
    reported_after = activity.last
    while True:
        if activity.last != reported_after:
            if reported is not None:  # the workers spoke since: the stall is over, and a new silence is a new stall
                reporter.over(loop.time() - reported_after)
            reported = None
        quiet = loop.time() - activity.last
        if quiet < timeout:
            await asyncio.sleep(timeout - quiet)
            continue
        since = activity.last
        samples = await _samples(sampler, targets)
        if activity.last != since or len({signature(s) for s in samples}) > 1:
            if reported is not None and activity.last == since:  # the stacks moved, silently: over too
                reporter.over(loop.time() - since)
                reported, reported_after = None, since
            continue  # output meanwhile, or the stacks moved: not stalled (look again)
        if signature(samples[-1]) != reported:
            stall = await reporter.report(seconds(loop.time() - since), since, samples[-1], loop.time() - since)
            reported, reported_after = signature(samples[-1]), since
            if fail:
                return stall
        await _quiet_for(activity, since, max(timeout, SAMPLE_GAP))


async def _quiet_for(activity: Activity, since: float, duration: float) -> None:
    """Up to ``duration`` seconds while the workers stay silent: a stall's end (their output) is seen within
    ``SAMPLE_GAP``, so its ``stall.end`` says when it ended to about a second."""
    loop = asyncio.get_running_loop()
    until = loop.time() + duration
    while activity.last == since and (left := until - loop.time()) > 0:
        await asyncio.sleep(min(left, SAMPLE_GAP))


async def _samples(sampler: Sampler, targets: Sequence[Target]) -> list[list[RankSample]]:
    """``SAMPLES`` samples of every worker's stacks, spread over ``SAMPLE_GAP``."""
    samples = [await sampler.sample(targets)]
    for _ in range(SAMPLES - 1):
        await asyncio.sleep(SAMPLE_GAP / (SAMPLES - 1))
        samples.append(await sampler.sample(targets))
    return samples


@record
class _Reporter:
    """Where one attempt's stall reports go: the whole job's report (several nodes) or this node's, on the
    launcher's stderr, then a ``stall`` event on the job's stream."""

    run_id: str
    targets: Sequence[Target]
    console: Console
    job: Exchange | None
    recorder: Recorder | None
    events: EventStream | None
    said: list[str] = field(default_factory=list)  # the ranks of the stall reported last (its stall.end's)

    async def report(self, silent: str, since: float, stacks: Sequence[RankSample], quiet: float) -> Stalled:
        """Print the report of a stall silent for ``silent`` since ``since`` (the job's when the store gives it,
        else this node's, with the recorder's dumps) and tell the stream; the stall, as ``--hang-action fail`` ends
        the group with it. ``quiet``: the silence's seconds, for the event."""
        found = await _job_report(self.job, silent, since, self.console) if self.job is not None else None
        blame = None
        if found is not None:
            cause, title, blame = found
            stalled = range_string(t.rank for t in self.targets)  # this node's silent ranks; the title names the job's
        else:
            title, stalled = _report(self.console, self.run_id, silent, stacks)
            cause = stall_cause(silent, stacks)
            if self.recorder is not None:
                self.recorder.take()
        self.said[:] = [stalled]
        if self.events is not None:
            self.events.emit(Stall(stalled, title, round(quiet, 3)))
        return Stalled(cause, blame)

    def over(self, seconds: float) -> None:
        """The stall reported last is over, ``seconds`` after its silence began: a ``stall.end`` on the stream."""
        if self.events is not None:
            self.events.emit(StallEnd(self.said[0] if self.said else "", round(seconds, 3)))


async def _job_report(job: Exchange, silent: str, since: float, console: Console) -> tuple[str, str, str | None] | None:
    """The whole job's report (printed by the exchange): its cause, first line and the node it blames (None: nobody
    specific); None when the store could not give it."""
    try:
        async with asyncio.timeout(EXCHANGE_BOUND):
            report = await job.stall(silent, since)
            return report.cause, report.lines[0] if report.lines else "", report.blame or None
    except (StoreUnavailable, TimeoutError) as exc:
        why = str(exc) or f"no report within {EXCHANGE_BOUND:g} s"
        console.write_blocking(console.stderr_fd, f"rankrun: the other nodes' stacks could not be gathered ({why}): "
                                                  "this node's report follows\n".encode())
        return None


def _report(console: Console, run_id: str, silent: str, samples: Sequence[RankSample]) -> tuple[str, str]:
    """This node's report, printed; its first line and the ranks it is about (a range string)."""
    title, running = stall_title(run_id, silent, samples)
    show(console, render(title, running))
    return title, range_string(s.rank for s in running)


def show(console: Console, lines: Sequence[str]) -> None:
    """A report on the launcher's stderr, in one piece."""
    console.write_blocking(console.stderr_fd, ("\n".join(lines) + "\n").encode())
