"""What a window's end decides on a node (``rankrun.agent.stragglers.watch``): no stack-sampling signal to the workers unless
their recorders cannot be read; what a window gives the judge; a verdict's change as the job's event."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from rankrun.agent.stragglers.watch import StragglerWatch, event
from rankrun.stacks.sampler import Target
from rankrun.straggler.frfile import STATUS
from rankrun.straggler.verdict import Arrivals, Change, RankWindow, Straggler

BOUND = 30


def _watch(tmp_path: Path, status: str | None) -> StragglerWatch:
    """A watch of one rank (no worker: its /proc is simply gone) whose recorder file says ``status`` and holds 3
    collectives, too few to judge on."""
    path = tmp_path / "rank_0.fr"
    lines = [f"{STATUS}{status}"] if status is not None else []
    lines += [f"0 {seq} {1_796_000_000_000_000_000 + seq}" for seq in (1, 2, 3)]
    path.write_text("".join(f"{line}\n" for line in lines))

    async def judge(ranks: list[RankWindow], arrivals: Arrivals, length: float) -> None:
        del ranks, arrivals, length

    return StragglerWatch(0.01, [], {0: path}, "node-0/127.0.0.2", judge)


@pytest.mark.parametrize(("status", "stacks"), [("on", False), (None, False), ("off AttributeError", True)])
def test_stack_samples_only_where_the_recorder_cannot_be_read(tmp_path, status, stacks):
    """A window with fewer collectives than a verdict needs (a job starting up, an evaluation) sends no signal to the
    workers while their recorders work: a signal interrupts torch's store connect, which backs off for seconds."""
    watch = _watch(tmp_path, status)
    asyncio.run(asyncio.wait_for(watch.window(), BOUND))
    assert watch.stacks is stacks


def test_a_window_gives_each_rank_its_cpu_share_and_state_and_the_collectives_every_rank_reached(tmp_path):
    """Real workers: one busy, one asleep, one gone (its handle says so). The judge gets each rank's CPU share over
    the window and the state /proc showed most, and the collectives both live ranks' files hold."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    asleep = subprocess.Popen(["sleep", "60"])
    try:
        files = {}
        for rank in (0, 1):
            files[rank] = tmp_path / f"rank_{rank}.fr"
            files[rank].write_text(f"{STATUS}on\n" + "".join(f"0 {seq} {1_796_000_000_000_000_000 + seq * 1000 + rank}\n"
                                                             for seq in (1, 2, 3)))
        alive = {p.pid: p for p in (busy, asleep)}
        targets = [Target(0, "h", busy.pid, None, lambda _sig, p=busy.pid: p in alive),
                   Target(1, "h", asleep.pid, None, lambda _sig, p=asleep.pid: p in alive),
                   Target(2, "h", 1, None, lambda _sig: False)]  # reaped: never looked at (pid 1 is another's)
        judged: list[tuple[list[RankWindow], Arrivals, float]] = []

        async def judge(ranks: list[RankWindow], arrivals: Arrivals, length: float) -> None:
            judged.append((ranks, arrivals, length))

        watch = StragglerWatch(1.2, targets, files, "node-0/127.0.0.2", judge)
        asyncio.run(asyncio.wait_for(watch.window(), BOUND))
    finally:
        for p in (busy, asleep):
            p.kill()
            p.wait()
    [(ranks, arrivals, length)] = judged
    assert 1.2 <= length < 5
    by_rank = {r.rank: r for r in ranks}
    assert [r.rank for r in ranks] == [0, 1, 2] and {r.where for r in ranks} == {"node-0/127.0.0.2"}
    assert by_rank[0].state == "R" and by_rank[0].cpu is not None and by_rank[0].cpu > 0.1
    assert by_rank[1].state == "S" and by_rank[1].cpu is not None and by_rank[1].cpu < 0.05
    assert (by_rank[2].state, by_rank[2].cpu) == ("", None)
    assert {key: dict(when) for key, when in arrivals.items()} == {
        ("0", seq): {0: (1_796_000_000_000_000_000 + seq * 1000) / 1e9, 1: (1_796_000_000_000_000_001 + seq * 1000) / 1e9}
        for seq in (1, 2, 3)}
    assert not watch.stacks


def test_a_change_of_the_verdict_as_the_jobs_straggler_event():
    by_arrivals = Straggler(3, "node-1/127.0.0.3", 0.4, late=30, total=40, lag=0.25)
    by_samples = Straggler(5, "node-2/127.0.0.4", 0.3, its_waiting=0.1, others_waiting=0.8)
    named = event(Change(by_arrivals, True, "named line"))
    assert (named.rank, named.where, named.verdict, named.lag, named.share, named.collectives, named.line) == (
        3, "node-1/127.0.0.3", "named", 0.25, 0.75, 40, "named line")
    sampled = event(Change(by_samples, False, "recovered line"))
    assert (sampled.rank, sampled.verdict, sampled.lag, sampled.share, sampled.collectives, sampled.line) == (
        5, "recovered", None, 0.8, 0, "recovered line")
    assert event(Change(Straggler(1, "h", 0.1, late=0, total=0, lag=0.01), True, "")).share == 0.0
