"""When an attempt's workers began training: the first collective any of this node's ranks entered, as a ``training``
event, the end of the attempt's start-up in the goodput account (``events.goodput``).

With ``--straggler-window`` on Python workers, each rank's shim appends the collectives torch's Flight Recorder saw to
its arrivals file (``straggler.frfile``: ``<group> <seq> <time_created_ns>``, every ``window/6`` s). ``TrainingWatch``
looks at the head of each file every ``POLL`` s until one holds an arrival, then emits the earliest it finds, by its own
time (the wall clock at which the rank entered it), so a late look costs no precision. It costs the workers nothing: the
files are the straggler watch's. At the attempt's end (``last_look``) it looks once more, before ``workers.end``, so an
attempt shorter than one dump period still gets its event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path

from rankrun.events.records import Training
from rankrun.straggler.frfile import parse_line

POLL = 0.5  # seconds between looks at the files, until one holds an arrival
HEAD = 4096  # bytes of each file read: its status line and its first arrivals


def first_arrival(heads: Mapping[int, bytes]) -> int | None:
    """The earliest ``time_created_ns`` among the first whole arrival lines of each rank's file head (pure); None
    when none holds one yet."""
    found: list[int] = []
    for head in heads.values():
        for raw in head[: head.rfind(b"\n") + 1].split(b"\n")[:-1]:
            arrival = parse_line(raw.decode(errors="replace"))
            if arrival is not None:
                found.append(arrival.created_ns)
                break
    return min(found) if found else None


def _heads(files: Mapping[int, Path]) -> dict[int, bytes]:
    heads = {}
    for rank, path in files.items():
        try:
            with open(path, "rb") as fh:
                heads[rank] = fh.read(HEAD)
        except OSError:
            continue  # not made yet: torch.distributed not initialized in that rank
    return heads


class TrainingWatch:
    """One attempt's look for its first collective (see the module docstring); ``emit`` takes the event."""

    def __init__(self, attempt: int, files: Mapping[int, Path], started: float, emit: Callable[[Training], object]) -> None:
        """``started``: the workers' start by the wall clock (``workers.start``'s ``ts``)."""
        self._attempt, self._files, self._started, self._emit = attempt, files, started, emit
        self._done = False

    def look(self) -> bool:
        """One look; True once the event was emitted (then never again)."""
        if self._done:
            return True
        first = first_arrival(_heads(self._files))
        if first is None:
            return False
        self._done = True
        self._emit(Training(self._attempt, round(first / 1e9 - self._started, 6)))
        return True

    async def run(self) -> None:
        """Looks every ``POLL`` s until the first collective is found (cancelled at the attempt's end)."""
        while not self.look():  # a few small reads of local files: on the loop, as the stream's emits must be
            await asyncio.sleep(POLL)

    def last_look(self) -> None:
        """The attempt ends: one more look, so the event comes before ``workers.end``."""
        self.look()
