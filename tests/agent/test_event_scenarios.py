"""The job's event stream on fakes: a list consumer added to ``AgentDeps.events`` sees each lifecycle fact once, in the
order the agent decides them: one node's restart and give-up, and two nodes on one in-memory store (the failure and
the restart in both, a lost node in the survivor's)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from test_multinode_scenarios import _lose_node_1, _scenario, _until_stopped_then_ok
from test_multinode_scenarios import _spec as _multinode_spec

from fakes import Behaviour, FakeSpawner
from rankrun.agent.loop import AgentDeps, run_agent
from rankrun.cli import spec_from_args
from rankrun.events.goodput import account
from rankrun.events.records import EVENTS, Failure, JobEnd, JobStart, NodeLost, Record, Restart, WorkersEnd, WorkersStart
from rankrun.logs.console import Console
from rankrun.proc.early import EarlyCatcher

RAISED = b"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: bad lr 0.5\n"


class Told:
    """A consumer that keeps every record."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def on_event(self, event: Record) -> None:
        self.records.append(event)

    @property
    def names(self) -> list[str]:
        return [EVENTS[type(r)] for r in self.records]

    def of(self, kind: type[Record]) -> list[Record]:
        return [r for r in self.records if isinstance(r, kind)]


def _run(tmp_path: Path, spawner: FakeSpawner, *flags: str) -> tuple[int, Told]:
    script = tmp_path / "train.py"
    script.write_text("")
    spec = spec_from_args([*flags, str(script)], {"PATH": "/usr/bin"})
    told = Told()
    with (tmp_path / "out").open("wb") as out, (tmp_path / "err").open("wb") as err:
        console = Console(out.fileno(), err.fileno())
        deps = AgentDeps(spawner, console, "testhost")
        deps.events.add(told)
        catcher = EarlyCatcher(())
        try:
            rc = asyncio.run(asyncio.wait_for(run_agent(spec, deps, catcher), 30))
        finally:
            console.close()
            catcher.restore()
    assert {(r.run, r.node) for r in told.records} == {(spec.rendezvous.run_id, "127.0.0.1")}
    return rc, told


def test_a_restart_is_told_once_in_the_order_it_is_decided(tmp_path):
    def plan(attempt: int, rank: int) -> Behaviour:
        if (attempt, rank) == (0, 1):
            return Behaviour(exit_status=1, stderr=RAISED)
        return Behaviour(exit_status=0 if attempt else None)  # attempt 0's rank 0 runs until it is stopped

    rc, told = _run(tmp_path, FakeSpawner(plan), "--nproc-per-node", "2", "--max-restarts", "2")
    assert rc == 0
    assert told.names == ["job.start", "rdzv.round", "workers.start", "startup", "workers.end", "failure", "restart", "rdzv.round",
                          "workers.start", "startup", "workers.end", "job.end"]
    start, _, first, _, end0, failure, restart, _, second, _, end1, job_end = told.records
    assert isinstance(start, JobStart) and (start.nproc_per_node, start.max_restarts) == (2, 2)
    assert isinstance(first, WorkersStart) and (first.attempt, first.ranks, first.pids) == (0, "0-1", (10000, 10001))
    assert isinstance(second, WorkersStart) and (second.attempt, second.ranks) == (1, "0-1")
    assert isinstance(end0, WorkersEnd) and (end0.attempt, end0.outcome) == (0, "failed")
    assert isinstance(end1, WorkersEnd) and (end1.attempt, end1.outcome) == (1, "succeeded")
    assert failure == Failure(0, 1, "127.0.0.1", 1, None, "ValueError: bad lr 0.5", ts=failure.ts, mono=failure.mono,
                              run=failure.run, node=failure.node)
    assert isinstance(restart, Restart) and (restart.attempt, restart.restarts_left) == (1, 1)
    assert restart.reason == "rank 1 (pid 10001) exited 1: ValueError: bad lr 0.5"
    assert isinstance(job_end, JobEnd) and (job_end.exit_code, job_end.outcome) == (0, "succeeded")
    monos = [r.mono for r in told.records]
    assert monos == sorted(monos)


def test_each_failed_attempt_has_one_failure_and_the_job_ends_failed(tmp_path):
    def plan(attempt: int, rank: int) -> Behaviour:
        return Behaviour(exit_status=-9 if rank == 0 else None)  # killed by SIGKILL, every attempt

    rc, told = _run(tmp_path, FakeSpawner(plan), "--nproc-per-node", "2", "--max-restarts", "1")
    assert rc == 1
    assert told.names == ["job.start", "rdzv.round", "workers.start", "startup", "workers.end", "failure", "restart", "rdzv.round",
                          "workers.start", "startup", "workers.end", "failure", "job.end"]
    failures = told.of(Failure)
    assert [(f.attempt, f.rank, f.exit_code, f.signal, f.exception) for f in failures] == [  # type: ignore[union-attr]
        (0, 0, None, "SIGKILL", None), (1, 0, None, "SIGKILL", None)]
    end = told.records[-1]
    assert end == JobEnd(1, "failed", account(told.records[:-1], now=end.mono), ts=end.ts, mono=end.mono, run=end.run,
                         node=end.node)  # with the account of the events before it


def _with_consumers(agents: list, tolds: list[Told]) -> None:
    for agent, told in zip(agents, tolds, strict=True):
        agent.deps.events.add(told)


def test_two_nodes_both_tell_the_jobs_root_cause_and_restart(tmp_path, monkeypatch):
    def failing_once(attempt: int, rank: int) -> Behaviour:
        return Behaviour(exit_status=2, stderr=RAISED) if attempt == 0 else Behaviour(exit_status=0)

    def waiting_then_ok(attempt: int, rank: int) -> Behaviour:
        return Behaviour() if attempt == 0 else Behaviour(exit_status=0)

    tolds = [Told(), Told()]

    async def attach(store, agents) -> None:
        del store
        _with_consumers(agents, tolds)

    spec = _multinode_spec(tmp_path, "2", "--max-restarts", "1")
    ends, _, _ = _scenario(tmp_path, spec, [waiting_then_ok, failing_once], during=attach)
    assert [e.exit_code for e in ends] == [0, 0]
    outcomes = [[r.outcome for r in t.of(WorkersEnd)] for t in tolds]  # type: ignore[attr-defined]
    assert outcomes == [["moved_on", "succeeded"], ["failed", "succeeded"]]
    for told in tolds:
        assert told.names == ["rdzv.round", "workers.start", "startup", "workers.end", "failure", "restart", "rdzv.round",
                              "workers.start", "startup", "workers.end"]
    failures = [t.of(Failure)[0] for t in tolds]
    assert {(f.attempt, f.rank, f.host, f.exit_code, f.exception) for f in failures} == {  # type: ignore[attr-defined]
        (0, 1, "", 2, "ValueError: bad lr 0.5")}  # run_multinode alone: no address was given to the stream
    restarts = [t.of(Restart)[0] for t in tolds]
    assert {(r.attempt, r.restarts_left) for r in restarts} == {(1, 0)}  # type: ignore[attr-defined]
    # the root cause's line, not the coordinator's "node N reported a worker failure"
    assert {r.reason for r in restarts} == {"rank 1 exited 2: ValueError: bad lr 0.5"}  # type: ignore[attr-defined]


def test_the_survivor_tells_the_lost_node_before_the_next_round(tmp_path):
    tolds = [Told(), Told()]

    async def lose(store, agents) -> None:
        _with_consumers(agents, tolds)
        await _lose_node_1(store, agents)

    spec = _multinode_spec(tmp_path, "1:2", "--rdzv-conf", "last_call_timeout=0.1")
    _scenario(tmp_path, spec, [_until_stopped_then_ok, _until_stopped_then_ok], during=lose)
    host = tolds[0]
    assert host.names == ["rdzv.round", "workers.start", "startup", "workers.end", "node.lost", "rdzv.round", "workers.start",
                          "startup", "workers.end"]
    (lost,) = host.of(NodeLost)
    assert len(lost.nodes) == 1 and lost.nodes[0].endswith(" at 127.0.0.2")  # type: ignore[union-attr]
    assert "was lost" in lost.reason  # type: ignore[union-attr]
    assert [r.outcome for r in host.of(WorkersEnd)] == ["moved_on", "succeeded"]  # type: ignore[attr-defined]


def test_when_the_budget_is_spent_every_node_tells_the_root_cause_and_no_restart(tmp_path):
    def failing(attempt: int, rank: int) -> Behaviour:
        return Behaviour(exit_status=7, stderr=RAISED)

    def waiting(attempt: int, rank: int) -> Behaviour:
        return Behaviour()

    tolds = [Told(), Told()]

    async def attach(store, agents) -> None:
        del store
        _with_consumers(agents, tolds)

    ends, _, _ = _scenario(tmp_path, _multinode_spec(tmp_path, "2"), [waiting, failing], during=attach)
    assert [e.exit_code for e in ends] == [1, 1]
    for told in tolds:
        assert told.names == ["rdzv.round", "workers.start", "startup", "workers.end", "failure"]
    assert {(f.attempt, f.rank, f.exit_code) for t in tolds for f in t.of(Failure)} == {(0, 1, 7)}  # type: ignore[attr-defined]
