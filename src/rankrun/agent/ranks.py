"""Worker identities from a node's ranks (pure).

``RANK = sum(local world sizes of nodes with a smaller group rank) + LOCAL_RANK``; role ranks are
the same sums restricted to nodes of the same role (torchrun's slow path). The per-node sums are
computed once for a round (``rankrun.ranks.assign_node_ranks``, by the coordinator), so a node needs only its own.
"""

from __future__ import annotations

from rankrun.agent.env import WorkerIdentity
from rankrun.ranks import NodeRanks, NodeSlots, assign_node_ranks

__all__ = ["NodeRanks", "NodeSlots", "assign_node_ranks", "identities"]


def identities(mine: NodeRanks, group_rank: int, group_world_size: int, local_world_size: int) -> list[WorkerIdentity]:
    """The identities of one node's workers from its own ranks (all a node needs to know of the others)."""
    return [
        WorkerIdentity(
            local_rank=i,
            rank=mine.base_rank + i,
            group_rank=group_rank,
            role_rank=mine.base_role_rank + i,
            local_world_size=local_world_size,
            world_size=mine.world_size,
            group_world_size=group_world_size,
            role_world_size=mine.role_world_size,
        )
        for i in range(local_world_size)
    ]
