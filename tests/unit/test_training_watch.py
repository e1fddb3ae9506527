"""The first collective of an attempt (``agent.training``): read from the head of each rank's arrivals file (as the
worker's shim writes it), emitted once as a ``training`` event, at its own time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rankrun.agent import training
from rankrun.agent.training import TrainingWatch, first_arrival
from rankrun.events.records import Training

pytestmark = pytest.mark.unit

STARTED = 1_767_225_600.0  # the workers' start, by the wall clock
NS = 1_000_000_000


def _line(seq: int, at: float, group: str = "0") -> bytes:
    return f"{group} {seq} {round(at * NS)}\n".encode()


@pytest.mark.parametrize(("heads", "expected"), [
    ({}, None),
    ({0: b"", 1: b"rankrun-arrivals on\n"}, None),  # initialized, nothing recorded yet
    ({0: b"rankrun-arrivals on\n0 1 17"}, None),  # a line still being written is not read
    ({0: b"rankrun-arrivals off RuntimeError\n"}, None),
    ({0: b"rankrun-arrivals on\n" + _line(1, STARTED + 4.5) + _line(2, STARTED + 4.0)}, (STARTED + 4.5) * NS),
    ({0: b"rankrun-arrivals on\n" + _line(1, STARTED + 4.5), 1: b"rankrun-arrivals on\n" + _line(1, STARTED + 4.25)},
     (STARTED + 4.25) * NS),  # the earliest rank's first
    ({0: b"rankrun-arrivals on\ngarbage\n" + _line(1, STARTED + 3.0, "my group")}, (STARTED + 3.0) * NS),
])
def test_the_first_arrival_is_the_earliest_ranks_first_whole_line(heads, expected):
    found = first_arrival(heads)
    assert (found is None) if expected is None else found == pytest.approx(expected, abs=1)


def test_the_event_comes_once_with_the_collectives_own_time_and_at_the_attempts_end_at_the_latest(tmp_path: Path):
    files = {0: tmp_path / "rank_0.fr", 1: tmp_path / "rank_1.fr", 2: tmp_path / "missing.fr"}
    emitted: list[Training] = []
    watch = TrainingWatch(3, files, STARTED, emitted.append)
    assert not watch.look()  # no file yet: torch.distributed not initialized
    files[0].write_bytes(b"rankrun-arrivals on\n")
    assert not watch.look()
    files[1].write_bytes(b"rankrun-arrivals on\n" + _line(1, STARTED + 6.125))
    files[0].write_bytes(b"rankrun-arrivals on\n" + _line(1, STARTED + 6.5))
    watch.last_look()
    assert emitted == [Training(3, 6.125)]
    files[1].write_bytes(b"rankrun-arrivals on\n" + _line(1, STARTED + 1.0))
    assert watch.look() and watch.last_look() is None
    assert emitted == [Training(3, 6.125)]  # once


def test_the_watch_looks_until_the_first_collective_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(training, "POLL", 0.01)
    path = tmp_path / "rank_0.fr"
    emitted: list[Training] = []

    async def scenario() -> None:
        task = asyncio.create_task(TrainingWatch(0, {0: path}, STARTED, emitted.append).run())
        for _ in range(5):
            await asyncio.sleep(0.02)
            assert not task.done()
        path.write_bytes(b"rankrun-arrivals on\n" + _line(1, STARTED + 2.0))
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())
    assert emitted == [Training(0, 2.0)]
