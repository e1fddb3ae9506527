"""The coordinator's side of ``--network-check`` on the in-memory store: a round of 5 is judged before its workers
start; the node whose links are 150 ms (a made-up measure: the seam ``rendezvous.netcheck.take_part`` is given) is
told it is excluded, with the check's figures, and the round re-forms without it spending no restart; the next
round's check finds nobody. The members are ``take_part`` itself, as the agents run it."""

from __future__ import annotations

import asyncio

from fakes import FakeTimers
from rankrun.health.outliers import Link
from rankrun.rendezvous import netcheck
from rankrun.rendezvous.coordinator import Coordinator
from rankrun.rendezvous.keys import Assignment, Excluded, Keys, RoundWord, node_value, place_from
from rankrun.rendezvous.round import NodeInfo, Settings
from rankrun.store.memory import MemoryStore

KEYS = Keys.for_run("fake")
FAST = Link(rtt=0.0002, forward=1e9, backward=1e9)
LATE = Link(rtt=0.151, forward=1e9, backward=1e9)
BOUND = 30.0


async def _places(store: MemoryStore, ids: list[str], round_: int) -> dict[str, Assignment | Excluded]:
    """Each node's word once it is round ``round_``'s assignment or an exclusion."""
    _, revision = await store.range(KEYS.assigns)
    found: dict[str, Assignment | Excluded] = {}
    for entry in (await store.range(KEYS.assigns))[0]:
        place = place_from(entry.value)
        if isinstance(place, Excluded) or (isinstance(place, Assignment) and place.round == round_):
            found[entry.key[len(KEYS.assigns):]] = place
    if len(found) == len(ids):  # all there already (the coordinator was quicker than this reader): no event will come
        return found
    watch = await store.watch(KEYS.assigns, revision)
    try:
        async for event in watch:
            if len(found) == len(ids):
                break
            place = place_from(event.value)
            if isinstance(place, Excluded) or (isinstance(place, Assignment) and place.round == round_):
                found[event.key[len(KEYS.assigns):]] = place
            if len(found) == len(ids):
                break
    finally:
        await watch.close()
    return found


async def _check(store: MemoryStore, places: dict[str, Assignment], late: str | None) -> list[dict[int, str]]:
    """Every member's part, node ``late``'s links 150 ms."""
    by_port = {9000 + a.group_rank: node for node, a in places.items()}

    def measure(me: str):
        async def one(addr: str, port: int) -> Link | None:
            return LATE if late in (me, by_port[port]) else FAST
        return one

    return list(await asyncio.gather(*(
        netcheck.take_part(store, KEYS, a.round, a.group_rank, a.group_world_size, endpoint=("127.0.0.1", 9000 + a.group_rank),
                           measure=measure(node), endpoint_wait=1.0)
        for node, a in places.items())))


def test_a_late_node_is_excluded_before_the_workers_and_the_round_re_forms_without_a_restart():
    said: list[str] = []

    async def main() -> tuple[dict, list, dict, list, RoundWord]:
        store = MemoryStore(FakeTimers())

        async def fresh_keyspace() -> None:
            return None

        coordinator = Coordinator(store, KEYS, Settings(3, 5, 0.1, 3, max_node_failures=2, network_check=True),
                                  master=lambda: ("127.0.0.1", 29500), before_round=fresh_keyspace, say=said.append)
        running = asyncio.create_task(coordinator.run())
        lease = await store.grant(60)
        ids = [f"n{i}" for i in range(5)]
        for i, node in enumerate(ids):
            info = NodeInfo(node, 0, 1, "default", f"127.0.0.{i + 2}", f"h{i}", is_host=i == 0)
            await store.put(KEYS.node(node), node_value(info), lease=lease.id)
        first = await _places(store, ids, 1)
        verdicts = await _check(store, first, late="n3")  # type: ignore[arg-type]
        second = await _places(store, ids, 2)
        rest = {n: p for n, p in second.items() if isinstance(p, Assignment)}
        again = await _check(store, rest, late=None)
        word = RoundWord.parse((await store.get(KEYS.round)).value)  # type: ignore[union-attr]
        while len(said) < 3:  # the coordinator says round 2's check just after its verdict (bounded: BOUND)
            await asyncio.sleep(0.01)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return first, verdicts, second, again, word

    first, verdicts, second, again, word = asyncio.run(asyncio.wait_for(main(), BOUND))
    late = first["n3"].group_rank
    assert all(list(v) == [late] for v in verdicts)  # every member heard the one verdict
    line = verdicts[0][late]
    assert line.startswith(f"node {late} (127.0.0.5): network check: 151 ms round trip to its neighbours (median"), line
    assert second["n3"] == Excluded(f"unhealthy: {line}", second["n3"].at)  # its exit-4 line names the figures
    others = [p for n, p in second.items() if n != "n3"]
    assert all(isinstance(p, Assignment) and p.group_world_size == 4 and p.restarts == 0 for p in others)
    assert again == [{}] * 4
    assert word.round == 2 and word.restarts == 0
    assert said[0] == line
    assert said[1].startswith("rendezvous round 1: network check of 5 nodes in ") and said[1].endswith(
        "1 unhealthy, re-forming without them")
    assert said[2].startswith("rendezvous round 2: network check of 4 nodes in ") and said[2].endswith("nobody unhealthy")
