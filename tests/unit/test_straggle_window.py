"""What a window's end decides on a node (``rankrun.agent.straggle``): no stack-sampling signal to the workers unless
their recorders cannot be read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rankrun.agent.straggle import StragglerWatch
from rankrun.straggler.frfile import STATUS
from rankrun.straggler.verdict import Arrivals, RankWindow

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
