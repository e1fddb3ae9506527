"""A round's network check over the rendezvous's keys (``rendezvous.netcheck``) on the in-memory store: members
publish their endpoints and measure their ring neighbour (``take_part``), the coordinator reads the ring, asks the
suspects to re-probe and names the unhealthy (``judge``). The measure is the seam: a table of made-up links (one node
150 ms late), or the real probe endpoint on loopback; the records' spelling is checked alone."""

from __future__ import annotations

import asyncio
import math

from fakes import FakeTimers
from rankrun.health.outliers import Link
from rankrun.health.probe import ProbeServer, measure
from rankrun.rendezvous import netcheck
from rankrun.rendezvous.keys import (
    Keys,
    endpoint_from,
    endpoint_value,
    link_from,
    link_value,
    reprobe_from,
    reprobe_value,
    verdict_from,
    verdict_value,
)
from rankrun.store.memory import MemoryStore

KEYS = Keys.for_run("job")
FAST = Link(rtt=0.0002, forward=1e9, backward=1e9)
LATE = Link(rtt=0.151, forward=1e9, backward=1e9)


def test_the_records_read_back_as_written():
    assert endpoint_from(endpoint_value("10.0.0.3", 4711)) == ("10.0.0.3", 4711)
    assert link_from(link_value(FAST)) == FAST
    gone = link_from(link_value(netcheck.NO_ANSWER))
    assert math.isinf(gone.rtt) and gone.throughput == 0.0
    assert reprobe_from(reprobe_value({3: 1, 4: 1})) == {3: 1, 4: 1}
    assert verdict_from(verdict_value({3: "node 3 (a): network check: x"})) == {3: "node 3 (a): network check: x"}
    assert verdict_from(verdict_value({})) == {}
    assert KEYS.netcheck_link(2, 1).startswith(KEYS.netcheck_links(2)) and KEYS.netcheck_re(2, 1).startswith(
        KEYS.netcheck_reprobes(2))


def _table(late: int | None, asked: list[tuple[int, int]], me: int):
    """Node ``me``'s measure on made-up links: any link touching node ``late`` is 150 ms; each asked pair noted."""
    async def one(addr: str, port: int) -> Link | None:
        other = port - 9000
        asked.append((me, other))
        return LATE if late in (me, other) else FAST
    return one


async def _round(size: int, late: int | None, absent: tuple[int, ...] = (), *, slow: int | None = None,
                 reach: float = 0.5, phase: float = 2.0) -> tuple[dict[int, str], list, list]:
    store = MemoryStore(FakeTimers())
    asked: list[tuple[int, int]] = []
    written: list[str] = []

    async def put(key: str, value: bytes) -> None:
        written.append(key)
        await store.put(key, value)

    async def coordinator() -> dict[int, str]:
        found = await netcheck.judge(store, KEYS, 1, size, put, phase=phase, reach_=reach)
        await put(KEYS.netcheck_verdict(1), verdict_value({g: f"line {g}" for g in found}))
        return found

    async def member(g: int) -> dict[int, str]:
        if g == slow:  # its --health-check before this round takes longer than the phase (within its reach)
            await asyncio.sleep(2 * phase)
        return await netcheck.take_part(store, KEYS, 1, g, size, endpoint=(f"10.0.0.{g}", 9000 + g),
                                        measure=_table(late, asked, g), endpoint_wait=reach)

    members = [member(g) for g in range(size) if g not in absent]
    found, *verdicts = await asyncio.wait_for(asyncio.gather(coordinator(), *members), 10)
    assert all(v == {g: f"line {g}" for g in found} for v in verdicts)  # every member reads the one verdict
    return found, asked, written


def test_a_late_node_is_found_after_its_re_probe_against_a_known_good_node():
    found, asked, written = asyncio.run(_round(5, late=3))
    assert list(found) == [3] and "151 ms round trip to its neighbours (median 0.2 ms)" in found[3]
    ring = [(g, (g + 1) % 5) for g in range(5)]
    assert sorted(asked) == sorted([*ring, (3, 0)])  # each its neighbour once; then only the suspect, its partner
    assert KEYS.netcheck_reprobe(1) in written


def test_a_clean_ring_finds_nobody_and_asks_no_re_probe():
    found, asked, written = asyncio.run(_round(5, late=None))
    assert found == {}
    assert sorted(asked) == [(g, (g + 1) % 5) for g in range(5)]
    assert written == [KEYS.netcheck_verdict(1)]


def test_a_member_that_never_answers_is_found_as_no_answer():
    # two phases waited out whole (the links, then the re-probes): short ones, each well past the members' 0.5 s reach
    found, asked, _ = asyncio.run(_round(5, late=None, absent=(2,), phase=1.0))
    assert list(found) == [2] and "no answer" in found[2]
    assert (1, 2) not in asked  # its endpoint never published: no measure, no answer


def test_a_member_still_in_its_health_check_is_waited_for_within_its_reach():
    # the links' phase counts from the last endpoint: a member publishing 2 phases late (a slow --health-check before
    # a later round) is no outlier, and its neighbour measured it rather than giving up on it
    found, asked, _ = asyncio.run(_round(5, late=None, slow=2, reach=3.0, phase=0.3))
    assert found == {}
    assert sorted(asked) == [(g, (g + 1) % 5) for g in range(5)]


def test_reach_adds_the_health_checks_timeout_and_the_members_bound_covers_it():
    assert netcheck.reach(None) == netcheck.MARGIN
    assert netcheck.reach(60.0) == 60.0 + netcheck.MARGIN
    assert netcheck.verdict_wait(netcheck.reach(60.0)) > netcheck.reach(60.0) + 2 * netcheck.PHASE


def test_real_probe_endpoints_on_loopback_find_nobody():
    async def main() -> tuple[dict[int, str], float]:
        store = MemoryStore(FakeTimers())
        servers = [ProbeServer("127.0.0.1", b"secret") for _ in range(4)]
        ports = [await s.start() for s in servers]
        try:
            async def one(addr: str, port: int) -> Link | None:
                return await measure(addr, port, b"secret", size=netcheck.SIZE, pings=netcheck.PINGS)

            async def put(key: str, value: bytes) -> None:
                await store.put(key, value)

            async def coordinator() -> dict[int, str]:
                found = await netcheck.judge(store, KEYS, 1, 4, put)
                await put(KEYS.netcheck_verdict(1), verdict_value(found))
                return found

            loop = asyncio.get_running_loop()
            started = loop.time()
            found, *verdicts = await asyncio.gather(
                coordinator(),
                *(netcheck.take_part(store, KEYS, 1, g, 4, endpoint=("127.0.0.1", ports[g]), measure=one)
                  for g in range(4)))
            assert found == {} and verdicts == [{}] * 4
            return found, loop.time() - started
        finally:
            for s in servers:
                await s.close()

    async def bounded():
        return await asyncio.wait_for(main(), 30)

    found, took = asyncio.run(bounded())
    assert found == {} and took < 5, took
