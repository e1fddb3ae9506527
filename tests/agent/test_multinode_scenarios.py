"""Several agents in one process, on one in-memory store, with fake spawners: the multi-node algorithm's edges, cheap.

Each agent runs the real rounds (``agent.multinode.run_multinode``) in the real session
(``rendezvous.session.open_session``: keep-alives, coordinator, leaving); only the backend is
swapped for one that joins a shared ``MemoryStore`` (whose lease timers never fire on their own),
and workers are fakes that exit as each scenario plans. The real-process tests
(``tests/integration/test_multinode.py``, ``tests/e2e``) stay: these make the edges cheap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from fakes import Behaviour, FakeHandle, FakeSpawner, FakeTimers
from rankrun.agent.attempt import Outcome
from rankrun.agent.deps import AgentDeps
from rankrun.agent.multinode import run_multinode
from rankrun.cli import spec_from_args
from rankrun.errors import EXIT_WORKERS_FAILED, LauncherError
from rankrun.logs.console import Console
from rankrun.logs.layout import RunLogs
from rankrun.proc.signals import StopStream
from rankrun.rendezvous.coordinator import Coordinator
from rankrun.rendezvous.keys import Keys
from rankrun.rendezvous.member import Member
from rankrun.rendezvous.session import Backend, Session, node_info, settings, ttl
from rankrun.spec import LaunchSpec
from rankrun.store.memory import MemoryStore

BOUND = 30.0
Plan = Callable[[int, int], Behaviour]


def _spec(tmp_path: Path, nnodes: str, *flags: str) -> LaunchSpec:
    script = tmp_path / "train.py"
    script.write_text("")
    argv = ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-id", "fake",
            "--nproc-per-node", "1", *flags, str(script)]
    return spec_from_args(argv, {"PATH": "/usr/bin", "RANKRUN_RDZV_SECRET": "fake-secret"})


def shared(store: MemoryStore, index: int, *, host: bool) -> Backend:
    """A backend that joins ``store`` as node ``index`` (at 127.0.0.<index+1>); the host also coordinates."""

    async def backend(spec, worker_store, say, stack, unhealthy=None) -> tuple[Session, None]:
        del say, stack
        keys, addr = Keys.for_run(spec.rendezvous.run_id), f"127.0.0.{index + 1}"
        coordinator = Coordinator(store, keys, settings(spec), master=lambda: ("127.0.0.1", 29500),
                                  before_round=worker_store.reset, why_gone=store.why_deleted) if host else None
        member = await Member.join(store, keys, node_info(spec, addr, is_host=host, unhealthy=unhealthy), ttl(spec))
        return Session(member, addr, store, "the shared store ended its lease", coordinator), None

    return backend


class Agent:
    def __init__(self, tmp_path: Path, store: MemoryStore, index: int, plan: Plan, *, host: bool = False) -> None:
        self.spawner = FakeSpawner(plan, after_spawn=self._spawned)
        self.err_path = tmp_path / f"agent{index}.err"
        self._files = [(tmp_path / f"agent{index}.out").open("wb"), self.err_path.open("wb")]
        self.console = Console(self._files[0].fileno(), self._files[1].fileno())
        self.deps = AgentDeps(self.spawner, self.console, f"host{index}", rendezvous=shared(store, index, host=host))
        self.running = asyncio.Event()  # set once its first worker runs (binds to the loop on first use)

    def _spawned(self, handle: FakeHandle) -> None:
        del handle
        self.running.set()

    async def run(self, spec: LaunchSpec) -> Outcome | LauncherError:
        logs = RunLogs(spec.logs, spec.rendezvous.run_id)  # a private temp dir, as run_agent makes and removes
        try:
            return await run_multinode(spec, self.deps, StopStream(), logs)
        except LauncherError as exc:
            return exc
        finally:
            logs.finish()

    def close(self) -> str:
        self.console.close()
        for f in self._files:
            f.close()
        return self.err_path.read_text()


def _scenario(tmp_path: Path, spec: LaunchSpec, plans: list[Plan], during=None):
    """Run one agent per plan (the first hosts) to their ends; ``during(store, agents)`` acts while they run."""
    store = MemoryStore(FakeTimers())
    agents = [Agent(tmp_path, store, i, plan, host=i == 0) for i, plan in enumerate(plans)]

    async def main():
        runs = [asyncio.create_task(a.run(spec)) for a in agents]
        if during is not None:
            await during(store, agents)
        return await asyncio.gather(*runs)

    try:
        ends = asyncio.run(asyncio.wait_for(main(), BOUND))
    finally:
        errs = [a.close() for a in agents]
    return ends, agents, errs


def _ok(attempt: int, rank: int) -> Behaviour:
    return Behaviour(exit_status=0)


def _until_stopped_then_ok(attempt: int, rank: int) -> Behaviour:
    return Behaviour() if attempt == 0 else Behaviour(exit_status=0)


def test_two_agents_form_one_world_and_succeed(tmp_path):
    ends, agents, _ = _scenario(tmp_path, _spec(tmp_path, "2"), [_ok, _ok])
    assert [e.exit_code for e in ends] == [0, 0]
    envs = [a.spawner.spawned[0].env for a in agents]
    assert [(e["RANK"], e["GROUP_RANK"], e["WORLD_SIZE"]) for e in envs] == [("0", "0", "2"), ("1", "1", "2")]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs} == {("127.0.0.1", "29500")}


async def _fail_node_1_once_both_run(store: MemoryStore, agents: list[Agent]) -> None:
    """Node 1's first worker exits 2 once both nodes run theirs: failing at once, it could end round 1 before a slow
    host started its own (that node then skips the round, as it may, and its first worker is round 2's)."""
    del store
    for agent in agents:
        await agent.running.wait()
    agents[1].spawner.spawned[0].exit(2)


def test_a_worker_failure_restarts_every_node_on_one_budget(tmp_path):
    spec = _spec(tmp_path, "2", "--max-restarts", "1")
    ends, agents, _ = _scenario(tmp_path, spec, [_until_stopped_then_ok, _until_stopped_then_ok],
                                during=_fail_node_1_once_both_run)
    assert [e.exit_code for e in ends] == [0, 0]
    assert [[h.env["TORCHELASTIC_RESTART_COUNT"] for h in a.spawner.spawned] for a in agents] == [["0", "1"], ["0", "1"]]
    assert agents[0].spawner.spawned[0].signals[:1] == [15]  # the healthy node's worker was stopped for the restart


def test_the_jobs_first_failure_is_in_every_nodes_outcome_when_the_budget_is_spent(tmp_path):
    def failing(attempt: int, rank: int) -> Behaviour:
        return Behaviour(exit_status=7, stderr=b"Traceback (most recent call last):\nValueError: node one broke\n")

    def waiting(attempt: int, rank: int) -> Behaviour:
        return Behaviour()

    ends, _, _ = _scenario(tmp_path, _spec(tmp_path, "2"), [waiting, failing])
    assert [e.exit_code for e in ends] == [EXIT_WORKERS_FAILED, EXIT_WORKERS_FAILED]
    for end in ends:
        assert "on host1" in end.job_cause and "ValueError: node one broke" in end.job_cause


async def _lose_node_1(store: MemoryStore, agents: list[Agent]) -> None:
    """Once both run their workers: end node 1's lease as an expiry would (its keep-alives stopped)."""
    for agent in agents:
        await agent.running.wait()
    entries, _ = store.scan(Keys.for_run("fake").nodes)
    (lease,) = {e.lease for e in entries if "127.0.0.2" in e.value.decode()}
    store.revoke(lease, "its lease expired after 15 s of silence (no keep-alive)")


def test_a_lost_node_is_named_and_the_others_reform_without_it(tmp_path):
    spec = _spec(tmp_path, "1:2", "--rdzv-conf", "last_call_timeout=0.1")
    ends, agents, errs = _scenario(tmp_path, spec, [_until_stopped_then_ok, _until_stopped_then_ok], during=_lose_node_1)
    host, lost = ends
    assert isinstance(host, Outcome) and host.exit_code == 0
    assert agents[0].spawner.spawned[-1].env["WORLD_SIZE"] == "1"  # re-formed without it
    assert "was lost: its lease expired after 15 s of silence (no keep-alive)" in errs[0]
    assert isinstance(lost, LauncherError)
    assert str(lost).endswith("this node lost its place in the job: its lease expired after 15 s of silence (no keep-alive); "
                              "workers stopped")


def test_a_host_left_alone_below_min_ends_the_job_after_last_call_as_an_infrastructure_error(tmp_path):
    spec = _spec(tmp_path, "2", "--rdzv-conf", "last_call_timeout=0.1")
    ends, _, _ = _scenario(tmp_path, spec, [_until_stopped_then_ok, _until_stopped_then_ok], during=_lose_node_1)
    host = ends[0]
    assert isinstance(host, LauncherError)
    assert "every other node was lost and none came back within last_call_timeout (0.1 s): 1 node left, min 2" in str(host)


def test_waiting_nodes_say_how_many_have_joined_while_they_wait_not_only_at_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr("rankrun.agent.multinode.PROGRESS_EVERY", 0.1)  # the cadence, not what is said
    spec = _spec(tmp_path, "2", "--rdzv-conf", "join_timeout=1")
    (end,), _, (err,) = _scenario(tmp_path, spec, [_ok])
    assert isinstance(end, LauncherError)
    assert "timed out after 1 s (join_timeout) waiting for the other nodes: 1 of 2 joined" in str(end)
    progress = [line for line in err.splitlines() if "1/2 nodes joined (min 2, max 2), waiting" in line]
    assert len(progress) >= 3, err  # every 0.1 s while it waited, each naming who joined
    assert progress[0].endswith("; joined: 127.0.0.1")


def test_a_spare_takes_a_lost_nodes_place_in_the_very_next_round(tmp_path):
    """A spare waits for the round after the one it was told about, no later: it must not skip the next one."""
    spec = _spec(tmp_path, "1:2", "--rdzv-conf", "last_call_timeout=0.1")
    store = MemoryStore(FakeTimers())
    host, member = (Agent(tmp_path, store, i, _until_stopped_then_ok, host=i == 0) for i in range(2))
    spare = Agent(tmp_path, store, 2, _ok)

    async def main():
        runs = [asyncio.create_task(a.run(spec)) for a in (host, member)]
        await _lose_after_a_spare_waits(store, [host, member], spare, lambda: runs.append(asyncio.create_task(spare.run(spec))))
        return await asyncio.gather(*runs)

    try:
        ends = asyncio.run(asyncio.wait_for(main(), BOUND))
    finally:
        for agent in (host, member, spare):
            agent.close()
    assert isinstance(ends[0], Outcome) and ends[0].exit_code == 0
    assert isinstance(ends[2], Outcome) and ends[2].exit_code == 0
    (started,) = spare.spawner.spawned
    assert (started.env["GROUP_RANK"], started.env["WORLD_SIZE"]) == ("1", "2")  # the lost node's place, in round 2


async def _lose_after_a_spare_waits(store: MemoryStore, agents: list[Agent], spare: Agent,
                                    start_spare: Callable[[], None]) -> None:
    for agent in agents:
        await agent.running.wait()
    waiting = asyncio.Event()
    say = spare.console.say

    def heard(line: str) -> None:  # the spare has read its word: the round is full, it waits
        say(line)
        if "this node waits as a spare" in line:
            waiting.set()

    spare.console.say = heard  # type: ignore[method-assign]
    start_spare()
    await waiting.wait()
    await _lose_node_1(store, agents)


def test_a_python_api_job_gives_every_node_the_values_of_the_round_that_succeeded(tmp_path):
    """``rankrun.launch``'s workers (faked here: a value file written as each one starts) on two nodes; round 1 fails
    on node 1 after node 0's worker returned, round 2 succeeds: both nodes get round 2's values, of every rank."""
    from rankrun.api.ship import dumps, loads  # noqa: PLC0415

    store = MemoryStore(FakeTimers())

    def node_plan(fails_first: bool) -> Plan:
        return lambda attempt, rank: Behaviour(exit_status=2 if fails_first and attempt == 0 else 0)

    agents, specs = [], []
    for index in range(2):
        results = tmp_path / f"results{index}"
        results.mkdir()
        argv = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-id", "fake",
                "--nproc-per-node", "1", "--max-restarts", "1", "-m", "rankrun.api.worker", "payload", str(results), "fn"]
        specs.append(spec_from_args(argv, {"PATH": "/usr/bin", "RANKRUN_RDZV_SECRET": "fake-secret"}))
        agent = Agent(tmp_path, store, index, node_plan(fails_first=index == 1), host=index == 0)
        started = agent.spawner.after_spawn

        def returned(handle: FakeHandle, results: Path = results, started=started) -> None:
            # by the job's restart count, not this node's attempt: a node may skip a round that failed at once
            rank, restart = handle.env["RANK"], handle.env["TORCHELASTIC_RESTART_COUNT"]
            (results / f"{rank}.value").write_bytes(dumps(f"rank {rank} restart {restart}"))
            started(handle)

        agent.spawner.after_spawn = returned
        agents.append(agent)

    async def main():
        return await asyncio.gather(*(agent.run(spec) for agent, spec in zip(agents, specs, strict=True)))

    try:
        ends = asyncio.run(asyncio.wait_for(main(), BOUND))
    finally:
        for agent in agents:
            agent.close()
    assert [e.exit_code for e in ends] == [0, 0]
    for index in range(2):
        got = {int(p.stem): loads(p.read_bytes()) for p in (tmp_path / f"results{index}").glob("*.value")}
        assert got == {0: "rank 0 restart 1", 1: "rank 1 restart 1"}, index
