"""The step a round of several nodes resumes from and where each rank's state is read (``rankrun.checkpoint.plan``),
and the agreement through the store (``rankrun.rendezvous.kept``, on the in-memory store)."""

from __future__ import annotations

import asyncio

import pytest

from rankrun.checkpoint.plan import (
    Holding,
    Plan,
    Source,
    holdings_from,
    holdings_value,
    plan,
    plan_from,
    plan_value,
    summarize,
)
from rankrun.rendezvous.kept import agree, successor
from rankrun.rendezvous.keys import Keys
from rankrun.store.memory import MemoryStore

A, B, C = ("10.0.0.1", 7001), ("10.0.0.2", 7002), ("10.0.0.3", 7003)


def test_ranks_that_hold_the_same_steps_are_one_holding():
    held = {0: [(12, 4), (11, 4)], 1: [(11, 4), (12, 4)], 2: [(11, 4), (10, 4)], 3: []}
    assert summarize(held, "memory", "n1", A) == [Holding("0-1", ((12, 4), (11, 4)), "memory", "n1", A),
                                                  Holding("2", ((11, 4), (10, 4)), "memory", "n1", A)]


def test_every_node_kept_its_ranks_in_memory():
    found = plan([Holding("0-3", ((12, 8), (11, 8)), "memory", "n1", A),
                  Holding("4-7", ((12, 8), (11, 8)), "memory", "n2", B)])
    assert found == Plan(12, 8, (Source("0-3", "memory", "n1", A), Source("4-7", "memory", "n2", B)))
    assert isinstance(found, Plan) and found.source(5) == Source("4-7", "memory", "n2", B) and found.source(8) is None


def test_a_rank_torn_on_one_node_takes_every_node_back_one_step():
    found = plan([Holding("0-2", ((12, 8), (11, 8)), "memory", "n1", A), Holding("3", ((11, 8), (10, 8)), "memory", "n1", A),
                  Holding("4-7", ((12, 8), (11, 8)), "memory", "n2", B)])
    assert isinstance(found, Plan) and found.step == 11


def test_a_lost_nodes_ranks_come_from_its_neighbours_copy_and_memory_is_preferred():
    found = plan([Holding("0-3", ((12, 8),), "memory", "n1", A),
                  Holding("0-3", ((12, 8),), "neighbour", "n3", C),  # n1's copy, held by n3: memory wins
                  Holding("4-7", ((12, 8),), "neighbour", "n1", A)])  # n2 was lost: n1 holds its copy
    assert found == Plan(12, 8, (Source("0-3", "memory", "n1", A), Source("4-7", "neighbour", "n1", A)))


def test_two_lost_neighbours_fall_back_to_the_disk():
    found = plan([Holding("0-3", ((12, 8),), "memory", "n1", A), Holding("0-7", ((10, 8),), "disk", "n1", A)])
    assert found == Plan(10, 8, (Source("0-7", "disk", "n1", A),))


def test_nothing_held_and_no_common_step_say_why():
    assert plan([]) == ""
    why = plan([Holding("0-3", ((12, 8),), "memory", "n1", A), Holding("4-7", ((10, 8),), "memory", "n2", B)])
    assert isinstance(why, str) and why.startswith("no step is kept by every rank")


def test_records_round_trip_and_garbage_is_refused():
    holdings = [Holding("0-3", ((12, 8), (11, 8)), "memory", "n1", A), Holding("4-7", ((12, 8),), "disk", "n1", None)]
    assert holdings_from(holdings_value(holdings)) == holdings
    result = Plan(12, 8, (Source("0-7", "memory", "n1", A),))
    assert plan_from(plan_value(result)) == result
    assert plan_from(plan_value("no step is kept by every rank")) == "no step is kept by every rank"
    for bad in (b"{", b'[{"ranks": "0"}]', b'[{"ranks": "0", "held": [], "where": "disk", "node": "n", "peer": [1]}]'):
        with pytest.raises(ValueError, match="not a node's kept holdings"):
            holdings_from(bad)
    with pytest.raises(ValueError, match="not a round's kept plan"):
        plan_from(b'{"step": 1}')


def test_every_node_gets_the_plan_group_rank_0_computed():
    store, keys = MemoryStore(), Keys.for_run("job")
    mine = [[Holding("0-3", ((12, 8), (11, 8)), "memory", "n1", A)],
            [Holding("4-7", ((11, 8), (10, 8)), "memory", "n2", B)],
            []]

    async def main() -> list[Plan | str]:
        return list(await asyncio.gather(*(agree(store, keys, 5, g, 3, mine=mine[g]) for g in (2, 1, 0))))

    results = asyncio.run(main())
    expected = Plan(11, 8, (Source("0-3", "memory", "n1", A), Source("4-7", "memory", "n2", B)))
    assert results == [expected] * 3


def test_the_first_node_waits_for_late_holdings_and_skips_what_is_not_a_nodes():
    """Group rank 0 writes first: it waits for the others' keys as they come; a key that is not a group rank, a group
    rank outside the round and unreadable holdings do not count as a node's (the last counts as holding nothing)."""
    store, keys = MemoryStore(), Keys.for_run("job")

    async def main() -> tuple[Plan | str, Plan | str]:
        first = asyncio.ensure_future(agree(store, keys, 7, 0, 3, mine=[Holding("0", ((4, 3),), "memory", "n0", A)]))
        await asyncio.sleep(0)
        await store.put(keys.kept_holdings(7) + "junk", b"[]")
        await store.put(keys.kept_held(7, 5), holdings_value([Holding("1-2", ((4, 3),), "memory", "n5", B)]))
        await store.put(keys.kept_held(7, 2), b"not json")
        assert not first.done()
        second = await agree(store, keys, 7, 1, 3, mine=[Holding("1-2", ((4, 3),), "memory", "n1", B)])
        return await first, second

    first, second = asyncio.run(main())
    expected = Plan(4, 3, (Source("0", "memory", "n0", A), Source("1-2", "memory", "n1", B)))
    assert first == second == expected


def test_each_node_finds_the_next_nodes_keep_endpoint():
    store, keys = MemoryStore(), Keys.for_run("job")

    async def main() -> list[tuple[str, int] | None]:
        await asyncio.gather(*(agree(store, keys, 3, g, 3, mine=[], peer=peer) for g, peer in enumerate((A, B, C))))
        found = [await successor(store, keys, 3, g, 3) for g in range(3)]
        return [*found, await successor(store, keys, 3, 0, 1), await successor(store, keys, 4, 0, 2)]

    assert asyncio.run(main()) == [B, C, A, None, None]  # the ring wraps; one node has none; no key, none
