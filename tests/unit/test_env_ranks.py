"""The pure worker environment (golden) and rank assignment (invariants)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from conftest import GOLDEN_DIR
from rankrun.agent.env import AttemptContext, WorkerIdentity, worker_env
from rankrun.agent.plan import AttemptPlan, Membership
from rankrun.agent.ranks import NodeSlots, assign_node_ranks

GOLDEN = GOLDEN_DIR / "env_pure_nproc4.json"
BASE = {"HOME": "/home/u", "TORCHELASTIC_ERROR_FILE": "/outer/error.json", "CUDA_VISIBLE_DEVICES": "3,5,6,7"}
CTX = AttemptContext(role="default", master_addr="127.0.0.1", master_port=29555, restart_count=1, max_restarts=3,
                     run_id="job", signals_to_handle="SIGTERM,SIGINT,SIGHUP,SIGQUIT")


def _plan(nodes: list[NodeSlots], group_rank: int) -> AttemptPlan:
    """As production gets there: the coordinator's sums over the round (``assign_node_ranks``), a node's own share of
    them in its Membership (one node: ``plan.single_node``; several: ``multinode._membership``), its identities from
    the plan."""
    ranks = assign_node_ranks(nodes)[group_rank]
    return AttemptPlan(0, 1, Membership(3, group_rank, len(nodes), nodes[group_rank].local_world_size, ranks, "10.0.0.7", 29400))


def _identities(nodes: list[NodeSlots], group_rank: int) -> list[WorkerIdentity]:
    return _plan(nodes, group_rank).identities


def _envs(ctx: AttemptContext = CTX, base: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    return {
        str(who.local_rank): worker_env(base or BASE, who, ctx, f"/logs/attempt_1/{who.local_rank}/error.json")
        for who in _identities([NodeSlots("default", 4)], 0)
    }


def test_worker_env_golden_nproc4():
    assert _envs() == json.loads(GOLDEN.read_text())


def test_env_rules():
    envs = _envs()
    assert all(e["HOME"] == "/home/u" for e in envs.values())  # inherited
    assert all(e["TORCHELASTIC_ERROR_FILE"].startswith("/logs/") for e in envs.values())  # never the outer one
    assert envs["0"]["OMP_NUM_THREADS"] == "1"
    assert "RANKRUN_REPORT_JSON" not in worker_env({"RANKRUN_REPORT_JSON": "/caller/report.json"},
                                                   _identities([NodeSlots("d", 1)], 0)[0], CTX, "")  # never the outer one
    assert "OMP_NUM_THREADS" not in worker_env({}, _identities([NodeSlots("d", 1)], 0)[0], CTX, "")
    assert worker_env({"OMP_NUM_THREADS": "8"}, _identities([NodeSlots("d", 2)], 0)[0], CTX, "")["OMP_NUM_THREADS"] == "8"
    assert worker_env({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, _identities([NodeSlots("d", 1)], 0)[0], CTX, "")[
        "TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


def test_virtual_local_rank():
    ctx = AttemptContext(**{**CTX.__dict__, "virtual_local_rank": True})
    envs = _envs(ctx)
    assert [envs[r]["LOCAL_RANK"] for r in "0123"] == ["0"] * 4
    assert [envs[r]["CUDA_VISIBLE_DEVICES"] for r in "0123"] == ["3", "5", "6", "7"]
    envs = _envs(ctx, {"PATH": "/bin"})
    assert [envs[r]["CUDA_VISIBLE_DEVICES"] for r in "0123"] == ["0", "1", "2", "3"]


nodes_strategy = st.lists(st.builds(NodeSlots, st.sampled_from(["a", "b"]), st.integers(1, 8)), min_size=1, max_size=6)


@given(nodes_strategy)
def test_ranks_are_dense_unique_and_consistent(nodes):
    everyone = [who for g in range(len(nodes)) for who in _identities(nodes, g)]
    assert sorted(w.rank for w in everyone) == list(range(sum(n.local_world_size for n in nodes)))
    assert {w.world_size for w in everyone} == {len(everyone)}
    for role in {n.role for n in nodes}:
        mine = [w for w in everyone if nodes[w.group_rank].role == role]
        assert sorted(w.role_rank for w in mine) == list(range(len(mine)))
        assert {w.role_world_size for w in mine} == {len(mine)}


def test_heterogeneous_running_sums():
    got = assign_node_ranks([NodeSlots("a", 2), NodeSlots("b", 3), NodeSlots("a", 1)])
    assert [(r.base_rank, r.base_role_rank, r.role_world_size) for r in got] == [(0, 0, 3), (2, 0, 3), (5, 2, 3)]


def _node_envs(nodes: list[NodeSlots], group_rank: int) -> dict[str, dict[str, str]]:
    """Through the path multi-node takes: the rendezvous hands a node only its own ranks (a Membership)."""
    plan = _plan(nodes, group_rank)
    m = plan.membership
    ctx = AttemptContext(**{**CTX.__dict__, "master_addr": m.master_addr, "master_port": m.master_port, "restart_count": plan.restarts})
    return {str(w.local_rank): worker_env({"HOME": "/home/u"}, w, ctx, f"/l/{w.local_rank}") for w in plan.identities}


def test_worker_env_golden_for_a_later_node_of_a_heterogeneous_job():
    """Group rank 2 of [4 x a, 2 x b, 3 x a]: LOCAL_RANK is local, RANK global, ROLE_RANK counts role a only."""
    envs = _node_envs([NodeSlots("a", 4), NodeSlots("b", 2), NodeSlots("a", 3)], group_rank=2)
    assert envs == json.loads((GOLDEN_DIR / "env_group2_heterogeneous.json").read_text())
    assert [(e["LOCAL_RANK"], e["RANK"], e["ROLE_RANK"]) for e in envs.values()] == [("0", "6", "4"), ("1", "7", "5"), ("2", "8", "6")]
