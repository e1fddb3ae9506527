"""Several nodes' round-level features (``agent.features``), in process on fakes of the seams they are handed (the
member, the API's node): what each does at its hook, and which a job gets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from rankrun.agent import features
from rankrun.agent.attempt import AttemptResult
from rankrun.agent.deps import AgentDeps
from rankrun.agent.features import ApiValues, JobView, MemberReport, _api, _collective_env, host_name
from rankrun.agent.round import Round
from rankrun.cli import spec_from_args
from rankrun.logs.console import Console
from rankrun.proc.group import Exit, GroupOutcome
from rankrun.rendezvous.keys import Assignment, RoundWord
from rankrun.rendezvous.round import NodeRanks, Phase
from rankrun.report.failure import Ending, WorkerResult
from rankrun.spec import LaunchSpec

ENV = {"PATH": "/usr/bin"}


class Said:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, line: str) -> None:
        self.lines.append(line)


class FakeMember:
    def __init__(self, addr: str = "127.0.0.5") -> None:
        self.info = SimpleNamespace(addr=addr, id="n1")
        self.reports: list[tuple[Any, ...]] = []

    async def report(self, round_: int, ok: bool, summary: str = "", root: Any = None, *, stall: Any = None,
                     blame: Any = None) -> None:
        self.reports.append((round_, ok, summary, root, stall, blame))


class FakeApi:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def report(self, placed: Assignment, failed: bool, results: list[WorkerResult]) -> None:
        self.calls.append(("report", placed.round, failed, len(results)))

    async def job_ended(self, end: RoundWord, placed: Assignment | None, say: Any) -> None:
        self.calls.append(("ended", end.round, placed.round if placed is not None else None, say))


def _spec(*flags: str) -> LaunchSpec:
    return spec_from_args(["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29400", *flags, "--no-python", "true"], ENV)


def _deps(said: Said, host: str = "h1") -> AgentDeps:
    deps = AgentDeps(spawner=None, console=Console(), host=host)  # type: ignore[arg-type]
    deps.console.say = said.say  # type: ignore[method-assign]
    deps.events.node = "127.0.0.5"
    return deps


def _place(round_: int = 3) -> Assignment:
    return Assignment(round_, 1, 2, NodeRanks(4, 8, 4, 4), "127.0.0.1", 29500, 1)


def _result(status: int, *, regrouped: str | None = None, stalled: str | None = None) -> AttemptResult:
    ending = Ending.SUCCEEDED if status == 0 else Ending.FAILED
    worker = WorkerResult(0, 4, 4242, status, ending, 0.0, "", None, "Traceback (most recent call last):\n"
                          '  File "t.py", line 1, in <module>\nValueError: bad\n')
    outcome = GroupOutcome({0: Exit(0, status, 0.0, after_stop=False)}, regrouped=regrouped, stalled=stalled)
    return AttemptResult(outcome, [worker])


def test_a_node_reports_how_its_workers_ended_and_a_regrouped_round_is_only_said():
    said, member = Said(), FakeMember()
    report = MemberReport(_spec("--rdzv-id", "job"), _deps(said), member)  # type: ignore[arg-type]

    async def main() -> None:
        await report.after(Round(2, 1, _place(3)), _result(0))
        await report.after(Round(3, 1, _place(4)), _result(1))
        await report.after(Round(4, 1, _place(5)), _result(0, regrouped="node n4 joined"))

    asyncio.run(main())
    ok, failed = member.reports
    assert ok == (3, True, "", None, None, None)
    round_, good, summary, root, stall, blame = failed
    assert (round_, good, stall, blame) == (4, False, None, None)
    assert summary.startswith("rank 4 (local_rank 0) on h1, pid 4242: exit code 1\nTraceback")
    assert "ValueError: bad" in summary
    assert root == {"rank": 4, "host": "127.0.0.5", "exit_code": 1, "signal": None, "exception": "ValueError: bad"}
    assert len(member.reports) == 2  # the regrouped round reports nothing: the coordinator re-formed it
    assert said.lines == ["rendezvous job: round 5 stopped: node n4 joined"]


def test_a_stalled_round_is_reported_as_a_failure_without_a_root_cause():
    member = FakeMember()
    report = MemberReport(_spec(), _deps(Said()), member)  # type: ignore[arg-type]
    asyncio.run(report.after(Round(0, 0, _place()), _result(0, stalled="no output for 60 s")))
    [(_, ok, summary, root, stall, _blame)] = member.reports
    assert (ok, root, stall) == (False, None, "no output for 60 s")
    assert summary == "the workers on h1 stalled: no output for 60 s"


def test_the_api_reports_the_rounds_that_ended_by_themselves_and_hears_the_jobs_end_for_the_last_round_placed():
    api = FakeApi()
    values = ApiValues(api, print)  # type: ignore[arg-type]

    async def main() -> None:
        for number, result in ((1, _result(0, regrouped="node n4 joined")), (2, _result(1))):
            round_ = Round(number, 0, _place(number))
            async with values.serving(round_):
                pass
            await values.after(round_, result)
        await values.ended(RoundWord(2, Phase.ENDED, 0, "done"))

    asyncio.run(main())
    assert api.calls == [("report", 2, True, 1), ("ended", 2, 2, print)]


def test_only_a_rankrun_launch_job_gets_the_api_feature():
    said = Said()
    logs = SimpleNamespace(base=None, temporary=True)
    assert _api(_spec(), _deps(said), logs, FakeMember()) == []  # type: ignore[arg-type]


def test_the_jobs_straggler_watch_is_for_python_workers_with_a_window_and_the_host_judges():
    said, member = Said(), FakeMember()
    member.store, member.keys, member.lease = object(), object(), SimpleNamespace(id=7)  # type: ignore[attr-defined]
    session = SimpleNamespace(member=member, coordinator=None)
    word = _place()
    off = JobView(_spec(), _deps(said), session)  # type: ignore[arg-type]
    assert off._stragglers(word) is None  # no --straggler-window
    binary = JobView(_spec("--straggler-window", "30"), _deps(said), session)  # type: ignore[arg-type]
    assert binary._stragglers(word) is None  # --no-python: no collectives to watch
    python = spec_from_args(["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29400", "--straggler-window", "30",
                             "--straggler-action", "exclude", "-m", "json.tool"], ENV)
    judge = SimpleNamespace(straggler=object())
    watch = JobView(python, _deps(said), SimpleNamespace(member=member, coordinator=judge))  # type: ignore[arg-type]
    made = watch._stragglers(word)
    assert made is not None and made._host and made._blame is judge.straggler  # type: ignore[attr-defined]
    member_only = JobView(python, _deps(said), session)._stragglers(word)  # type: ignore[arg-type]
    assert member_only is not None and not member_only._host and member_only._blame is None  # type: ignore[attr-defined]


def test_a_node_is_named_by_host_and_address_where_it_has_one():
    assert host_name(_deps(Said(), "h1"), FakeMember("127.0.0.5")) == "h1/127.0.0.5"  # type: ignore[arg-type]
    assert host_name(_deps(Said(), "h1"), FakeMember("")) == "h1"  # type: ignore[arg-type]


def test_the_workers_collective_interface_is_said_when_the_hosts_name_resolves_to_loopback(monkeypatch):
    said = Said()
    seen: list[tuple[Any, ...]] = []

    def collective_interface(base_env: Any, address: str, hostname_address: str, interface: str | None) -> dict[str, str]:
        seen.append((address, hostname_address, interface))
        return {"NCCL_SOCKET_IFNAME": interface, "GLOO_SOCKET_IFNAME": interface} if interface else {}

    monkeypatch.setattr(features, "collective_interface", collective_interface)
    monkeypatch.setattr(features.socket, "gethostname", lambda: "localhost")
    assert asyncio.run(_collective_env(_spec(), _deps(said), "127.0.0.1")) == ()  # a loopback rendezvous: nothing
    monkeypatch.setattr(features, "is_loopback", lambda address: False)  # as a real address's would be
    monkeypatch.setattr(features, "interface_of", lambda address: "eth9")
    env = asyncio.run(_collective_env(_spec(), _deps(said), "127.0.0.1"))
    assert env == (("GLOO_SOCKET_IFNAME", "eth9"), ("NCCL_SOCKET_IFNAME", "eth9"))
    assert seen == [("127.0.0.1", "127.0.0.1", None), ("127.0.0.1", "127.0.0.1", "eth9")]
    assert said.lines == ["this host's name resolves to 127.0.0.1: the workers get "
                          "GLOO_SOCKET_IFNAME=NCCL_SOCKET_IFNAME=eth9, the interface of 127.0.0.1"]
