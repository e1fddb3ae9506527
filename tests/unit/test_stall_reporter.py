"""Where one node's stall report goes (``agent.stall._Reporter``), in process: with no job to ask, this node's report
is printed in one piece, the stream gets one ``stall`` event naming the ranks and the report's first line, and the
stall returned for ``--hang-action fail`` carries the report's cause and blames nobody (one node sees only its own
ranks)."""

from __future__ import annotations

import asyncio

from rankrun.agent.stall import _Reporter
from rankrun.events.records import Record, Stall
from rankrun.events.stream import EventStream
from rankrun.proc.group import Stalled
from rankrun.stacks.report import ProcState, RankSample
from rankrun.stacks.sampler import Target


class Printed:
    """The console's one method the reporter uses; each report is one call."""

    stderr_fd = 2

    def __init__(self) -> None:
        self.reports: list[str] = []

    def write_blocking(self, fd: int, data: bytes) -> None:
        assert fd == self.stderr_fd
        self.reports.append(data.decode())


class Told:
    def __init__(self) -> None:
        self.events: list[Record] = []

    def on_event(self, event: Record) -> None:
        self.events.append(event)


def test_this_nodes_report_is_printed_once_told_once_and_blames_nobody():
    printed, told = Printed(), Told()
    targets = [Target(rank, "h0", 1000 + rank, None, lambda _signum: True) for rank in (4, 5)]
    stacks = [RankSample(4, "h0", None, ProcState("S", 0.0, "futex_wait")),
              RankSample(5, "h0", None, ProcState("D", 0.0, "io_schedule"))]
    reporter = _Reporter("job9", targets, printed, None, None, EventStream("job9", "h0", [told]))  # type: ignore[arg-type]

    stalled = asyncio.run(reporter.report("31", 12.5, stacks, 31.2))

    assert stalled == Stalled("no output for 31 s; rank 4 (the smallest group of stacks)", None)
    [report] = printed.reports
    title = report.splitlines()[0]
    assert title.startswith("rankrun: job job9 stalled: no output for 31 s; ")
    assert [(e.ranks, e.title, e.silent) for e in told.events if isinstance(e, Stall)] == [("4-5", title, 31.2)]
