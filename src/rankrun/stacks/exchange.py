"""Several nodes: one stack report of the whole job, through the rendezvous store (the ``stacks/`` keys).

While its workers run a round, each agent serves that round's asks: it samples its own workers and writes
them, grouped (``stacks.wire``: a node's identical stacks once), under its own key. The asker collects the
answers of every node of the round for at most ``ANSWER_BOUND`` seconds, names each node that did not answer
("node 3 (10.0.0.4; ranks 24-31): no answer — its agent is stuck or gone"), and renders one report with the
host of every group. For a stall it writes the report back, and every agent prints it, once per distinct set
of stacks; for ``rankrun --stacks`` only the asker has it, for the client. A stall's report also names the node to
blame for it (``report.stall_outlier``: the one holding the smallest group of stacks, when one node does), which
``--hang-action fail`` carries into each node's failed result for the coordinator.

Who asks for a stall: the agent that detects it first, by a compare-and-set on the ask key. An agent that
detects the same stall a moment later finds that ask pending and waits for its report (for at most
``REPORT_BOUND``: its asker may be the stuck one), or finds the report already printed since it fell silent.
What crosses the store per ask: the ask, one answer per node (a few hundred bytes to a few KB), one report;
only the asker reads the answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Sequence

from rankrun.rendezvous.keys import Assignment, Keys, node_from, place_from
from rankrun.stacks.report import (
    RankSample,
    render,
    request_title,
    signature,
    stall_cause,
    stall_outlier,
    stall_title,
    who,
)
from rankrun.stacks.wire import Answer, Ask, JobReport
from rankrun.store.api import Store, StoreUnavailable, next_event, watching

ANSWER_BOUND = 3.0  # seconds the asker waits for the answers (a node samples its workers in about one)
REPORT_BOUND = ANSWER_BOUND + 2.0  # seconds a node waits for a report another node is making, before asking itself

Sample = Callable[[str], Awaitable[list[RankSample]]]  # why: "stall" or "request"
Show = Callable[[Sequence[str]], None]


def fingerprint(samples: Sequence[RankSample]) -> str:
    """A short digest of every rank's main-thread stack: two reports with the same one show the same stall."""
    return hashlib.sha256(repr(signature(samples)).encode()).hexdigest()[:16]


class Exchange:
    """One node's side of the exchange for one round (made and dropped with the round)."""

    def __init__(self, store: Store, keys: Keys, node_id: str, place: Assignment, *, host: str, run_id: str,
                 sample: Sample, show: Show, lease: int = 0, job_lease: int = 0) -> None:
        self.store, self.keys, self.node_id, self.place = store, keys, node_id, place
        self.host, self.run_id = host, run_id
        self._sample, self._show_lines = sample, show
        self._lease, self._job_lease = lease, job_lease  # answers live with this node; asks and reports with the job
        self._reports: dict[int, tuple[float, JobReport]] = {}  # ask → (when it arrived here, the report)
        self._news = asyncio.Event()
        self._printed: set[str] = set()
        self.sent = 0  # bytes of this node's latest answer
        self.serving = asyncio.Event()  # set once this node's watches are in place: asks from then on are answered

    # ------------------------------------------------------------------ every node: answer, print

    async def serve(self) -> None:
        """Answer this round's asks and print its stall reports, until cancelled or the store is gone."""
        _, revision = await self.store.range(self.keys.stacks_ask)
        async with watching(self.store, (self.keys.stacks_ask, self.keys.stacks_report), revision) as merged:
            self.serving.set()
            while True:
                try:
                    event = await next_event(merged)
                except StoreUnavailable:  # the store is gone: nothing more to answer
                    return
                if event.key == self.keys.stacks_ask:
                    ask = Ask.parse(event.value)
                    if ask is not None and ask.round == self.place.round:
                        await self._answer(event.revision, ask.why)
                elif event.key == self.keys.stacks_report:
                    report = JobReport.parse(event.value)
                    if report is not None and report.round == self.place.round:
                        self._arrived(report)

    async def _answer(self, ask: int, why: str) -> None:
        value = Answer(ask, self.place.round, self.place.group_rank, self.host, tuple(await self._sample(why)),
                       self.node_id).value()
        self.sent = len(value)
        await self.store.put(self.keys.stacks_answer(self.node_id), value, lease=self._lease)

    def _arrived(self, report: JobReport) -> None:
        self._reports[report.ask] = (asyncio.get_running_loop().time(), report)
        self._news.set()
        self._news = asyncio.Event()
        if report.why == "stall":
            self._show(report)

    def _show(self, report: JobReport) -> None:
        if report.signature not in self._printed:
            self._printed.add(report.signature)
            self._show_lines(report.lines)

    # ------------------------------------------------------------------ the asker

    async def stall(self, silent: str, since: float) -> JobReport:
        """This node's workers stalled (silent since loop time ``since``): the job's report, printed here once.
        Callers bound it; ``StoreUnavailable`` when the store cannot be used."""
        while True:
            covered = [r for at, r in self._reports.values() if r.why == "stall" and at >= since]
            if covered:  # another node reported the job's stall after this node fell silent: that one covers it
                return covered[-1]
            entry = await self.store.get(self.keys.stacks_ask)
            ask = Ask.parse(entry.value) if entry is not None else None
            if entry is not None and ask is not None and ask.why == "stall" and ask.round == self.place.round \
                    and entry.mod_revision not in self._reports:
                report = await self._wait_for(entry.mod_revision, REPORT_BOUND)
                if report is not None:
                    self._show(report)
                    return report
                # its asker never reported (stuck or gone): ask over it
            number = await self.store.compare_and_set(self.keys.stacks_ask, Ask(self.place.round, self.node_id, "stall").value(),
                                                      revision=entry.mod_revision if entry is not None else 0,
                                                      lease=self._job_lease)
            if number is None:
                continue  # another node asked just now: wait for that one
            samples, notes, nodes, owners = await self._collect(number)
            title, running = stall_title(self.run_id, silent, samples, nodes=nodes)
            report = JobReport(number, self.place.round, "stall", fingerprint(running), tuple(render(title, running, notes)),
                               stall_cause(silent, samples), stall_outlier(samples, owners) or "")
            await self.store.put(self.keys.stacks_report, report.value(), lease=self._job_lease)
            self._show(report)
            return report

    async def request(self) -> list[str]:
        """``rankrun --stacks``: the whole job's report, for the asker alone."""
        number = await self.store.put(self.keys.stacks_ask, Ask(self.place.round, self.node_id, "request").value(),
                                      lease=self._job_lease)
        samples, notes, nodes, _ = await self._collect(number)
        return render(request_title(self.run_id, samples, nodes=nodes), samples, notes)

    async def _wait_for(self, ask: int, bound: float) -> JobReport | None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(bound):
                while ask not in self._reports:
                    await self._news.wait()
        found = self._reports.get(ask)
        return found[1] if found is not None else None

    async def _collect(self, ask: int) -> tuple[list[RankSample], list[str], int, dict[int, str]]:
        """Every node's answer to ``ask`` within ``ANSWER_BOUND``: the samples, a line for each node without
        workers or without an answer, how many nodes answered, and each rank's node id: empty unless every node
        of the round answered with its workers' stacks and its id (a stall blames nobody on a partial view)."""
        world = self.place.group_world_size
        answers: dict[int, Answer] = {}

        def take(value: bytes) -> None:
            answer = Answer.parse(value)
            if answer is not None and answer.ask == ask:
                answers[answer.node] = answer

        entries, revision = await self.store.range(self.keys.stacks_answers)
        for entry in entries:
            take(entry.value)
        if len(answers) < world:
            async with watching(self.store, (self.keys.stacks_answers,), revision) as events:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(ANSWER_BOUND):
                        while len(answers) < world:
                            take((await next_event(events)).value)
        idle = [f"node {n}: no workers running (between attempts)" for n, a in sorted(answers.items()) if not a.samples]
        silent = await self._silent(sorted(set(range(world)) - answers.keys()))
        samples = [s for a in answers.values() for s in a.samples]
        whole = len(answers) >= world and all(a.samples and a.id for a in answers.values())
        owners = {s.rank: a.id for a in answers.values() for s in a.samples} if whole else {}
        return samples, [*idle, *silent], len(answers), owners

    async def _silent(self, missing: list[int]) -> list[str]:
        """A line for each node of the round that did not answer, with its address and ranks where known."""
        if not missing:
            return []
        named: dict[int, str] = {}
        assigns, _ = await self.store.range(self.keys.assigns)
        nodes, _ = await self.store.range(self.keys.nodes)
        infos = {e.key[len(self.keys.nodes):]: e for e in nodes}
        for entry in assigns:
            node_id = entry.key[len(self.keys.assigns):]
            with contextlib.suppress(KeyError, TypeError, ValueError):
                place = place_from(entry.value)
                if isinstance(place, Assignment) and place.round == self.place.round and place.group_rank in missing:
                    info = infos.get(node_id)
                    if info is None:  # its node key is gone with its lease
                        named[place.group_rank] = f"node {place.group_rank} ({node_id})"
                        continue
                    node = node_from(info.value, info.create_revision, node_id)
                    first = place.ranks.base_rank
                    named[place.group_rank] = f"node {place.group_rank} ({node.addr}; {who(range(first, first + node.nproc))})"
        return [f"{named.get(n, f'node {n}')}: no answer — its agent is stuck or gone" for n in missing]
