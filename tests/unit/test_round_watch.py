"""The round's seam (``agent.round``), in process: the order in which a ``RoundWatch`` calls its features' hooks, the
news a node tells (pure), each exclusion told once, the health gate's verdicts and the open-files line said once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from rankrun.agent import round as round_module
from rankrun.agent.gate import HealthGate
from rankrun.agent.round import Feature, NewsEvents, OpenFiles, Round, Rounds, ended_news, exclusions, formed
from rankrun.cli import spec_from_args
from rankrun.events.records import Failure, NodeExcluded, NodeLost, RdzvRound, Record, Restart
from rankrun.events.stream import EventStream
from rankrun.rendezvous.keys import Assignment, RoundWord
from rankrun.rendezvous.round import NodeRanks, Phase
from rankrun.spec import LaunchSpec


class Kept:
    def __init__(self) -> None:
        self.events: list[Record] = []

    def on_event(self, event: Record) -> None:
        self.events.append(event)


class Noted(Feature):
    """A feature that notes each hook it is called in, and may skip the round or set its master."""

    def __init__(self, name: str, notes: list[str], *, go: bool = True) -> None:
        self.name, self.notes, self.go = name, notes, go

    async def before(self, round_: Round) -> bool:
        self.notes.append(f"{self.name}.before {round_.attempt}")
        return self.go

    def told(self, news: object) -> None:
        self.notes.append(f"{self.name}.told {len(news)}")  # type: ignore[arg-type]

    @contextlib.asynccontextmanager
    async def serving(self, round_: Round) -> AsyncIterator[None]:
        self.notes.append(f"{self.name}.serving")
        round_.master = ("127.0.0.9", 7)
        try:
            yield
        finally:
            self.notes.append(f"{self.name}.served")

    async def after(self, round_: Round, result: object) -> None:
        self.notes.append(f"{self.name}.after {result} {round_.attempt}")


def _place(round_: int = 3) -> Assignment:
    return Assignment(round_, 1, 2, NodeRanks(4, 8, 4, 4), "127.0.0.1", 29500, 1)


def test_hooks_are_called_in_the_features_order_and_serving_nests_around_the_attempt():
    notes: list[str] = []
    news = NewsEvents(EventStream("r", "n"))
    rounds = Rounds([Noted("a", notes), Noted("b", notes), news], news)

    async def main() -> Round:
        watch = rounds.round(Round(2, 1, _place()))
        assert await watch.before()
        watch.told(())
        async with watch.serving() as served:
            notes.append("attempt")
        await watch.after("done")  # type: ignore[arg-type]
        return served

    served = asyncio.run(main())
    assert notes == ["a.before 2", "b.before 2", "a.told 0", "b.told 0", "a.serving", "b.serving", "attempt",
                     "b.served", "a.served", "a.after done 2", "b.after done 2"]
    assert served.master == ("127.0.0.9", 7)


def test_the_first_feature_that_skips_ends_the_asking():
    notes: list[str] = []
    news = NewsEvents(EventStream("r", "n"))
    rounds = Rounds([Noted("a", notes, go=False), Noted("b", notes)], news)
    assert asyncio.run(rounds.round(Round(0, 0)).before()) is False
    assert notes == ["a.before 0"]


def test_each_exclusion_is_told_once_and_heard():
    kept = Kept()
    news = NewsEvents(EventStream("r", "n", [kept]))
    rounds = Rounds([news], news)
    word = RoundWord(4, Phase.RUNNING, 1, "node n2 was excluded", excluded=(("n2", "unhealthy"),))
    rounds.told(exclusions(word))
    rounds.told(exclusions(RoundWord(5, Phase.RUNNING, 1, "", excluded=(("n2", "unhealthy"), ("n3", "blamed")))))
    assert [(e.nodes, e.reason) for e in kept.events if isinstance(e, NodeExcluded)] == [(("n2",), "unhealthy"),
                                                                                          (("n3",), "blamed")]
    assert rounds.heard == {"n2": "unhealthy", "n3": "blamed"}
    assert exclusions(None) == ()


def test_what_ended_a_round_is_its_lost_nodes_its_root_cause_then_the_restart():
    word = RoundWord(3, Phase.RUNNING, 2, "node n3 reported a worker failure", lost=("n4",),
                     failure={"rank": 2, "host": "h", "exit_code": 1, "signal": None, "exception": "ValueError: x"})
    told = ended_news(word, 1, restarts_left=2)
    assert [type(e) for e in told] == [NodeLost, Failure, Restart]
    lost, fact, restart = told
    assert isinstance(lost, NodeLost) and lost.nodes == ("n4",) and lost.reason == word.reason
    assert isinstance(fact, Failure) and (fact.attempt, fact.rank, fact.exception) == (1, 2, "ValueError: x")
    assert isinstance(restart, Restart) and (restart.attempt, restart.restarts_left) == (2, 2)
    assert "ValueError: x" in restart.reason  # the root cause says more than the coordinator's words
    assert [type(e) for e in ended_news(word, 1)] == [NodeLost, Failure]  # no restart counted: none told
    assert ended_news(None, 1, restarts_left=2) == ()
    plain = ended_news(RoundWord(3, Phase.RUNNING, 2, "node n4 was lost"), 0, restarts_left=1)
    assert [(type(e), getattr(e, "reason", None)) for e in plain] == [(Restart, "node n4 was lost")]


def test_a_round_formed_is_told_with_this_nodes_place():
    assert formed(3, _place(), 0.25) == RdzvRound(3, 2, 8, 1, 0.25)


def test_the_health_gate_checks_each_round_after_the_first_and_a_sick_node_stays_out():
    checks: list[str | None] = [None, "disk full"]
    said: list[str] = []

    async def check() -> str | None:
        return checks.pop(0)

    async def report(why: str) -> None:
        said.append(why)

    async def main() -> list[bool]:
        gate = HealthGate(check, first=False, report=report)
        return [await gate.before(Round(0, 0)), await gate.before(Round(1, 0)), await gate.before(Round(2, 0)),
                await gate.before(Round(3, 0)), gate.sick == "disk full"]

    assert asyncio.run(main()) == [True, True, False, False, True]
    assert said == ["health check: disk full"]
    assert checks == []  # no check after the node is sick, none before the first round


def test_one_nodes_gate_checks_the_first_attempt_too_and_a_node_sick_before_joining_never_goes():
    async def sick() -> str | None:
        return "no GPU"

    async def main() -> tuple[bool, bool]:
        return (await HealthGate(sick, first=True).before(Round(0, 0)),
                await HealthGate(sick, first=False, sick="earlier").before(Round(0, 0)))

    assert asyncio.run(main()) == (False, False)


def test_the_open_files_line_is_said_once_before_the_first_round(monkeypatch):
    calls: list[tuple[int, int, int]] = []

    def job_fits(*, world_size: int, nodes: int, local_workers: int) -> str:
        calls.append((world_size, nodes, local_workers))
        return "too few open files"

    monkeypatch.setattr(round_module, "job_fits", job_fits)
    monkeypatch.setattr(round_module, "listen_fits", lambda *, world_size: None)
    said: list[str] = []
    feature = OpenFiles(said.append, _spec(4), nodes=None, relaying=lambda word: False)

    async def main() -> list[bool]:
        return [await feature.before(Round(0, 0, _place())), await feature.before(Round(1, 0, _place()))]

    assert asyncio.run(main()) == [True, True]
    assert said == ["too few open files"]
    assert calls == [(8, 2, 4)]  # the round's world, its nodes' connections, this node's workers


def _spec(nproc: int) -> LaunchSpec:
    return spec_from_args(["--nproc-per-node", str(nproc), "--no-python", "true"], {"PATH": "/usr/bin"})


def test_one_nodes_open_files_line_counts_its_own_workers_and_no_nodes(monkeypatch):
    calls: list[tuple[int, int, int]] = []

    def job_fits(*, world_size: int, nodes: int, local_workers: int) -> str | None:
        calls.append((world_size, nodes, local_workers))
        return None

    monkeypatch.setattr(round_module, "job_fits", job_fits)
    monkeypatch.setattr(round_module, "listen_fits", lambda *, world_size: f"listen queue short of {world_size}")
    feature = OpenFiles(print, _spec(3), nodes=0)
    assert feature.lines(None) == ["listen queue short of 3"]
    assert calls == [(3, 0, 3)]


def test_a_host_whose_nodes_relay_says_the_relays_budget_instead(monkeypatch):
    budgets: list[dict[str, object]] = []

    def relay_budget(**kw: object) -> list[str]:
        budgets.append(kw)
        return ["one connection per node"]

    monkeypatch.setattr(round_module, "relay_budget", relay_budget)
    feature = OpenFiles(print, _spec(4), nodes=None, relaying=lambda word: word.round == 3)
    assert feature.lines(_place(3)) == ["one connection per node"]
    assert budgets == [{"world_size": 8, "nodes": 2, "local_workers": 4, "asked": False}]
