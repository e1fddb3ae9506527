"""Who coordinates a job on a shared store (etcd): the node that creates the coordinator key, on its own lease.

Every node campaigns when it joins: a compare-and-set that creates ``coordinator`` only if it is
absent, bound to the node's lease. The winner runs the ``Coordinator``; the others watch the key
and campaign again when it is deleted, which happens when the winner's lease ends (its agent
died, hung past its TTL, or left). The job lease, which every node keeps alive, holds the round
key meanwhile, so the next coordinator carries on from it (``Coordinator._take_over``).

The embedded store needs none of this: its host coordinates, and its loss ends the job.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from rankrun.store.api import EventKind, Lease, Store, StoreUnavailable, exact


async def campaign(store: Store, key: str, node_id: str, lease: Lease) -> None:
    """Return once this node holds ``key`` (or its lease is lost); waits on a watch while another node holds it."""
    mine = node_id.encode()
    while not lease.lost.is_set():
        if await store.compare_and_set(key, mine, revision=0, lease=lease.id) is not None:
            return
        entries, revision = await store.range(key)
        holder = exact(entries, key)
        if holder is not None and holder.value == mine:
            return
        if holder is None:
            continue  # it went between the two calls: campaign again
        watch = await store.watch(key, revision)
        try:
            async for event in watch:
                if event.key == key and event.kind is EventKind.DELETE:
                    break
        finally:
            with contextlib.suppress(StoreUnavailable):
                await watch.close()


async def job_lease(store: Store, key: str, ttl: float, adopt: Callable[[int, float], Lease]) -> Lease:
    """The job lease: the first node creates it (and the key naming it); later nodes adopt it by id.

    ``adopt(lease_id, ttl)`` makes a handle on a lease another node granted (etcd allows that).
    """
    entry = await store.get(key)
    while entry is None:
        lease = await store.grant(ttl)
        if await store.compare_and_set(key, str(lease.id).encode(), revision=0, lease=lease.id) is not None:
            return lease
        await lease.revoke()  # another node created it first
        entry = await store.get(key)
    try:
        lease_id = int(entry.value)
    except ValueError:
        raise StoreUnavailable(f"{key} holds {entry.value[:40]!r}, not a lease id: another program uses this prefix?") from None
    return adopt(lease_id, ttl)
