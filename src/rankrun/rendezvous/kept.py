"""The step a round of several nodes resumes from (``rankrun.checkpoint``), agreed through the store before the round's
workers start.

Every node of the round writes what it holds (``kept/<round>/held/<g>``: a few holdings, ``checkpoint.plan``); the
round's group rank 0 waits for all of them, computes the plan (pure: ``checkpoint.plan.plan``) and writes it
(``kept/<round>/plan``); every node waits for the plan. One key written and one read per node, the round's first node
reads them all: the same shape as the network check's. A node that serves the neighbour's copy also writes where
(``kept/<round>/peer/<g>``): the node before it in the ring (group rank g - 1) puts its kept steps there. Unbounded:
the caller races it with the round moving on (a node lost before it wrote) and bounds it.
"""

from __future__ import annotations

from collections.abc import Sequence

from rankrun.checkpoint.plan import Holding, Plan, holdings_from, holdings_value, plan, plan_from, plan_value
from rankrun.rendezvous.keys import Keys, endpoint_from, endpoint_value
from rankrun.rendezvous.netcheck import first_value
from rankrun.store.api import Store, exact, next_event, watching


async def agree(store: Store, keys: Keys, round_: int, group_rank: int, size: int, *, mine: Sequence[Holding],
                lease: int = 0, peer: tuple[str, int] | None = None) -> Plan | str:
    """This node's part of round ``round_``'s agreement (``size`` nodes): where it serves the neighbour's copy
    (``peer``) and its holdings written, the plan read (the group rank 0 node computes and writes it); the plan, or
    why there is none (``""``: nothing is kept)."""
    if peer is not None:
        await store.put(keys.kept_peer(round_, group_rank), endpoint_value(*peer), lease=lease)
    await store.put(keys.kept_held(round_, group_rank), holdings_value(mine), lease=lease)
    if group_rank == 0:
        everyone = await _gather(store, keys.kept_holdings(round_), size)
        result = plan([h for held in everyone.values() for h in held])
        await store.put(keys.kept_plan(round_), plan_value(result), lease=lease)
        return result
    _, value = await first_value(store, [keys.kept_plan(round_)])
    return plan_from(value)


async def successor(store: Store, keys: Keys, round_: int, group_rank: int, size: int) -> tuple[str, int] | None:
    """Where the next node of the round's ring (group rank g + 1) serves the neighbour's copy, once the plan is
    agreed (every node wrote its keys before it); ``None`` for a round of one node, or a node that serves none."""
    if size < 2:
        return None
    key = keys.kept_peer(round_, (group_rank + 1) % size)
    entries, _ = await store.range(key)
    entry = exact(entries, key)
    return endpoint_from(entry.value) if entry is not None else None


async def _gather(store: Store, prefix: str, size: int) -> dict[int, list[Holding]]:
    """Every group rank's holdings under ``prefix``, as they come (a node's unreadable holdings count as none)."""
    found: dict[int, list[Holding]] = {}

    def take(key: str, value: bytes) -> None:
        try:
            rank = int(key[len(prefix):])
        except ValueError:
            return
        if 0 <= rank < size:
            try:
                found[rank] = holdings_from(value)
            except ValueError:
                found[rank] = []

    entries, revision = await store.range(prefix)
    for entry in entries:
        take(entry.key, entry.value)
    if len(found) < size:
        async with watching(store, [prefix], revision) as events:
            while len(found) < size:
                event = await next_event(events)
                take(event.key, event.value)
    return found


__all__ = ["agree", "successor"]
