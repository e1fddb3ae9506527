"""Rank sums over the nodes of one round, in group-rank order (pure; imported by the agent and the rendezvous).

``RANK = sum(local world sizes of nodes with a smaller group rank) + LOCAL_RANK``; role ranks are the same sums
restricted to nodes of the same role (torchrun's slow path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeSlots:
    role: str
    local_world_size: int


@dataclass(frozen=True)
class NodeRanks:
    base_rank: int
    world_size: int
    base_role_rank: int
    role_world_size: int


def assign_node_ranks(nodes: Sequence[NodeSlots]) -> list[NodeRanks]:
    """One ``NodeRanks`` per node, in the given (group rank) order."""
    world = sum(n.local_world_size for n in nodes)
    role_totals: dict[str, int] = {}
    for n in nodes:
        role_totals[n.role] = role_totals.get(n.role, 0) + n.local_world_size
    out: list[NodeRanks] = []
    base = 0
    role_base: dict[str, int] = {}
    for n in nodes:
        rb = role_base.get(n.role, 0)
        out.append(NodeRanks(base, world, rb, role_totals[n.role]))
        base += n.local_world_size
        role_base[n.role] = rb + n.local_world_size
    return out
