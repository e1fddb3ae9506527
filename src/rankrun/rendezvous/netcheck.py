"""The network check of one round (``--network-check``), over the rendezvous's keys (``rendezvous.keys``): each member
measures its ring neighbour, the coordinator judges the ring with ``health.outliers``.

After a round of 3 nodes or more is assigned, and before its workers start, every member of group rank ``g``:

1. writes where its probe endpoint listens (``netcheck/<round>/endpoint/<g>``);
2. reads its neighbour's (group rank ``g + 1``, wrapping), measures that link (``Measure``: ``health.probe.measure``)
   and writes it (``netcheck/<round>/link/<g>``; no answer: ``NO_ANSWER``);
3. waits for the coordinator's word: a re-probe (``netcheck/<round>/reprobe``: each suspect's known-good partner),
   which a suspect measures and writes (``netcheck/<round>/re/<g>``), then the verdict (``netcheck/<round>/verdict``).

A member does O(1) work whatever the round's size: one key written and read for its endpoint, one measure, one or two
words read. Only the coordinator (``judge``) reads the round's ``n`` links, within ``PHASE`` seconds of the moment
every endpoint was published (a link still missing then counts as no answer), and the re-probes within ``PHASE`` more
(a re-probe still missing then leaves its node unjudged). The clock starts at the last endpoint, not at the round's
start, because a member runs its ``--health-check`` first in every round after the first: a slow check (up to its
timeout) must not make a healthy node's link look like no answer. How long a member may take to publish is its
``reach`` (``reach(health_timeout)``); one that has not published by then counts as no answer.

The coordinator writes the unhealthy nodes' ``unhealthy/`` keys itself (a node that does not answer cannot say it),
so the round is re-formed without them as for a failed ``--health-check``, and then the verdict, which tells every
member whether to start its workers or wait for the next round.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TypeVar

from rankrun.health.outliers import Link, confirm, find_suspects
from rankrun.rendezvous.keys import (
    Keys,
    endpoint_from,
    endpoint_value,
    link_from,
    link_value,
    reprobe_from,
    reprobe_value,
    verdict_from,
)
from rankrun.store.api import Store, exact, next_event, watching

MIN_NODES = 3  # fewer cannot tell which node is slow: every pair touches both
MEASURE_TIMEOUT = 10.0  # seconds one measure may take (the probe endpoint's own bound on a connection)
SIZE = 2 << 20  # bytes each way: a few ms on a fast link, about 1 s of TCP slow start at 150 ms round trips
PINGS = 5  # round trips of a small message per measure (their median): a node 150 ms late spends 0.75 s on them
MARGIN = 3.0  # seconds beyond a measure for the keys around it (a node busy with its --health-check, a slow store)
PHASE = MEASURE_TIMEOUT + MARGIN  # the coordinator waits this long for the links, then for the re-probes

NO_ANSWER = Link(rtt=float("inf"), forward=0.0, backward=0.0)

Measure = Callable[[str, int], Awaitable[Link | None]]  # (addr, port) → the link, None when it got no answer
Put = Callable[[str, bytes], Awaitable[None]]
T = TypeVar("T")


def reach(health_timeout: float | None) -> float:
    """Seconds a member may take to publish its endpoint after its round is assigned (pure): ``MARGIN``, plus its
    ``--health-check`` timeout when it runs one (before every round after the first, ahead of this check)."""
    return MARGIN + (health_timeout or 0.0)


def verdict_wait(reach_: float) -> float:
    """A member's bound on the whole check (pure): every endpoint published, the links and the re-probes read, and
    a margin; past it, no verdict excludes nobody."""
    return reach_ + 2 * PHASE + MARGIN


async def first_value(store: Store, keys: Sequence[str]) -> tuple[str, bytes]:
    """The first of these exact keys to hold a value, already or later (unbounded: the caller bounds it)."""
    revision: int | None = None
    for key in keys:
        entries, at = await store.range(key)
        entry = exact(entries, key)
        if entry is not None:
            return key, entry.value
        revision = at if revision is None else min(revision, at)
    assert revision is not None
    async with watching(store, keys, revision) as events:
        while True:
            event = await next_event(events)
            if event.key in keys:
                return event.key, event.value


# -- a member


async def take_part(store: Store, keys: Keys, round_: int, group_rank: int, size: int, *,
                    endpoint: tuple[str, int], measure: Measure, lease: int = 0,
                    endpoint_wait: float = MARGIN) -> dict[int, str]:
    """This member's part of round ``round_``'s check (``size`` members): its endpoint published, its neighbour
    measured (no answer when the neighbour's endpoint is not published within ``endpoint_wait`` seconds: its
    ``reach``), its re-probe if the coordinator asks; returns the verdict (group rank → line; empty: nobody).
    Unbounded: the caller bounds it with ``verdict_wait``."""
    await store.put(keys.netcheck_endpoint(round_, group_rank), endpoint_value(*endpoint), lease=lease)
    link = await _measure_rank(store, keys, round_, (group_rank + 1) % size, measure, endpoint_wait)
    await store.put(keys.netcheck_link(round_, group_rank), link_value(link or NO_ANSWER), lease=lease)
    verdict = keys.netcheck_verdict(round_)
    key, value = await first_value(store, [keys.netcheck_reprobe(round_), verdict])
    if key != verdict:
        partner = reprobe_from(value).get(group_rank)
        if partner is not None:
            link = await _measure_rank(store, keys, round_, partner, measure, endpoint_wait)
            if link is not None:  # no answer from a known-good node: left unwritten, the coordinator counts it so
                await store.put(keys.netcheck_re(round_, group_rank), link_value(link), lease=lease)
        _, value = await first_value(store, [verdict])
    return verdict_from(value)


async def _measure_rank(store: Store, keys: Keys, round_: int, group_rank: int, measure: Measure,  # noqa: PLR0917
                        wait: float) -> Link | None:
    """The link to the member of ``group_rank``, or None when its endpoint is not published within ``wait`` seconds
    or does not answer."""
    try:
        async with asyncio.timeout(wait):
            _, value = await first_value(store, [keys.netcheck_endpoint(round_, group_rank)])
    except TimeoutError:
        return None
    return await measure(*endpoint_from(value))


# -- the coordinator


async def judge(store: Store, keys: Keys, round_: int, size: int, put: Put, *,
                phase: float = PHASE, reach_: float = MARGIN) -> dict[int, str]:
    """The coordinator's side of round ``round_``'s check: every endpoint waited for (``reach_`` seconds at most),
    then the ring's links read (missing ``phase`` seconds after that: no answer), the suspects named
    (``find_suspects``), their re-probes asked (``put`` writes the ``reprobe`` key) and read (within ``phase`` more),
    and the nodes found unhealthy (``confirm``): group rank → the figures."""
    loop = asyncio.get_running_loop()
    await _collect(store, keys.netcheck_endpoints(round_), range(size), loop.time() + reach_, endpoint_from)
    found_links = await _collect(store, keys.netcheck_links(round_), range(size), loop.time() + phase, link_from)
    ring = [found_links.get(g, NO_ANSWER) for g in range(size)]
    found = find_suspects(ring)
    if not found.partners:
        return {}
    await put(keys.netcheck_reprobe(round_), reprobe_value(found.partners))
    re = await _collect(store, keys.netcheck_reprobes(round_), found.partners, loop.time() + phase, link_from)
    # a suspect whose re-probe never came (no answer from its known-good partner) counts as no answer
    reprobes: dict[int, Link | None] = {g: re.get(g) for g in found.partners}
    return confirm(found, ring, reprobes)


async def _collect(store: Store, prefix: str, wanted: Collection[int], until: float,
                      parse: Callable[[bytes], T]) -> dict[int, T]:
    """The records under ``prefix`` (``<prefix><group rank>``) of the ``wanted`` group ranks, as many as are there by
    ``until`` (the loop's clock), each read by ``parse``."""
    found: dict[int, T] = {}

    def take(key: str, value: bytes) -> None:
        with contextlib.suppress(ValueError):
            rank = int(key[len(prefix) :])
            if rank in wanted:
                found[rank] = parse(value)

    entries, revision = await store.range(prefix)
    for entry in entries:
        take(entry.key, entry.value)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(until), watching(store, [prefix], revision) as events:
            while len(found) < len(wanted):
                event = await next_event(events)
                take(event.key, event.value)
    return found
