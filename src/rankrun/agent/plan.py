"""One attempt's plan, built purely from the rendezvous result and the restart counters.

Three counters that used to be one integer are kept apart: the rendezvous *round* (which
membership this is), the *restarts* used from ``--max-restarts`` (``TORCHELASTIC_RESTART_COUNT``),
and the *attempt* index of this node's worker groups (the log directory's ``attempt_<n>``; a
regroup is a new attempt but not a restart, so it never overwrites the previous attempt's logs).
"""

from __future__ import annotations

from rankrun.agent.env import AttemptContext, WorkerIdentity
from rankrun.agent.ranks import NodeRanks, NodeSlots, assign_node_ranks, identities
from rankrun.record import record
from rankrun.spec import LaunchSpec


@record
class Membership:
    """What a completed rendezvous round says about this node (all it needs of the others: O(1))."""

    round: int
    group_rank: int
    group_world_size: int
    local_world_size: int
    ranks: NodeRanks  # this node's first rank and the world's sizes
    master_addr: str  # the worker store (hosted by group rank 0)
    master_port: int


@record
class AttemptPlan:
    attempt: int
    restarts: int
    membership: Membership
    extra_env: tuple[tuple[str, str], ...] = ()  # what the agent adds to every worker's environment
    rendezvous: float = 0.0  # seconds the round took (its rdzv.round's), for the start-up timeline

    @property
    def identities(self) -> list[WorkerIdentity]:
        m = self.membership
        return identities(m.ranks, m.group_rank, m.group_world_size, m.local_world_size)


def single_node(spec: LaunchSpec, master_port: int) -> Membership:
    """The membership of a job that is this node alone (standalone, or one node of any backend)."""
    (ranks,) = assign_node_ranks([NodeSlots(spec.worker.role, spec.worker.nproc)])
    return Membership(0, 0, 1, spec.worker.nproc, ranks, spec.store.host, master_port)


def attempt_context(spec: LaunchSpec, plan: AttemptPlan) -> AttemptContext:
    """What every worker of the attempt shares (for ``worker_env``)."""
    return AttemptContext(
        role=spec.worker.role,
        master_addr=plan.membership.master_addr,
        master_port=plan.membership.master_port,
        restart_count=plan.restarts,
        max_restarts=spec.restart.max_restarts,
        run_id=spec.rendezvous.run_id,
        signals_to_handle=spec.signals_text,
        virtual_local_rank=spec.worker.virtual_local_rank,
        extra=plan.extra_env,
    )
