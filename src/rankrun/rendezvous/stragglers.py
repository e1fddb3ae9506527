"""The straggler watch of several nodes, over the rendezvous's keys (``rendezvous.keys``): every node sends its
windows, the host judges the whole job and publishes the verdict, every node says it.

For each round, while its workers run:

1. every node asks the host's clock a few times (``offset``: ``straggler/<round>/ask/<node>``, answered by the host
   in ``straggler/<round>/time/<node>``) and keeps the estimate with the shortest round trip (``straggler.clock``),
   so its ranks' arrival times (wall clock, as torch records them) go out on the host's clock;
2. every node writes each window's summary (``publish``: ``straggler/<round>/window/<node>``, a few hundred bytes,
   ``straggler.summary``);
3. the host (the coordinator's node) answers the clock questions (``answer_clocks``) and judges the job
   (``judge_job``): it merges each summary as it comes (``Windows``, pure), and judges once every node of the round
   sent a window since the last verdict (or ``LATE`` windows' time went by without one: a node whose agent is busy
   must not hold the verdict back); it writes the verdict (``straggler/<round>/verdict``) when it changed;
4. every node reads the verdicts (``verdicts``) and says what changed, so each line is printed once on each node.

Each node's keys are bound to its lease; the round's keys go with the job's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from rankrun.rendezvous.keys import Keys
from rankrun.store.api import EventKind, Events, Store, exact, next_event, watching
from rankrun.straggler import clock, verdict
from rankrun.straggler.summary import (
    Merge,
    NodeWindow,
    decode,
    encode,
    time_from,
    time_value,
    verdict_from,
    verdict_value,
)
from rankrun.straggler.verdict import Straggler

ASKS = 8  # clock questions a node asks; the shortest round trip of them counts
ASK_BOUND = 5.0  # seconds one question may wait for its answer
LATE = 1.5  # windows: the host judges without a node that has sent nothing for this long

Put = Callable[[str, bytes], Awaitable[None]]


# --- a node


async def offset(store: Store, keys: Keys, round_: int, node: str, now: Callable[[], float], *, lease: int = 0,
                 asks: int = ASKS) -> clock.Offset | None:
    """The host's clock minus this node's (``now``: its wall clock), from ``asks`` questions; None when no answer
    came within ``ASK_BOUND`` (the caller judges on its own clock then)."""
    ask, answer = keys.straggler_ask(round_, node), keys.straggler_time(round_, node)
    exchanges = []
    _, revision = await store.range(answer)
    async with watching(store, [answer], revision) as events:
        for count in range(asks):
            sent = now()
            await store.put(ask, str(count).encode(), lease=lease)
            remote = await _answer(events, answer, count)
            if remote is None:
                break
            exchanges.append(clock.Exchange(sent, remote, now()))
    return clock.estimate(exchanges)


async def _answer(events: Events, key: str, count: int) -> float | None:
    """The host's time in its answer to question ``count``; None when it did not come within ``ASK_BOUND``."""
    try:
        async with asyncio.timeout(ASK_BOUND):
            while True:
                event = await next_event(events)
                if event.key == key:
                    with contextlib.suppress(ValueError):
                        answered, remote = time_from(event.value)
                        if answered == count:
                            return remote
    except TimeoutError:
        return None


async def publish(store: Store, keys: Keys, round_: int, window: NodeWindow, *, lease: int = 0) -> None:
    """This node's latest window, for the host."""
    await store.put(keys.straggler_window(round_, window.node), encode(window), lease=lease)


async def verdicts(store: Store, keys: Keys, round_: int) -> AsyncIterator[list[Straggler]]:
    """The host's verdicts of round ``round_`` as they come (a malformed one is skipped)."""
    key = keys.straggler_verdict(round_)
    entries, revision = await store.range(key)
    entry = exact(entries, key)
    if entry is not None:
        yield verdict_from(entry.value)
    async with watching(store, [key], revision) as events:
        while True:
            event = await next_event(events)
            if event.key == key:
                try:
                    yield verdict_from(event.value)
                except ValueError:
                    continue


# --- the host


async def answer_clocks(store: Store, keys: Keys, round_: int, now: Callable[[], float], put: Put) -> None:
    """Answer every node's clock questions of round ``round_`` with ``now`` as each is read; until cancelled."""
    prefix = keys.straggler_asks(round_)
    entries, revision = await store.range(prefix)
    for entry in entries:
        await _tell_time(put, keys, round_, entry.key[len(prefix):], entry.value, now)
    async with watching(store, [prefix], revision) as events:
        while True:
            event = await next_event(events)
            if event.key.startswith(prefix):
                await _tell_time(put, keys, round_, event.key[len(prefix):], event.value, now)


async def _tell_time(put: Put, keys: Keys, round_: int, node: str, asked: bytes,  # noqa: PLR0917
                     now: Callable[[], float]) -> None:
    try:
        count = int(asked)
    except ValueError:
        return
    await put(keys.straggler_time(round_, node), time_value(count, now()))


Told = Callable[[list[Straggler], Mapping[int, str]], Awaitable[None]]  # a verdict, and each rank's node id


class Windows:
    """The host's account of a round's windows (pure): each merged as it comes, which nodes sent one since the last
    verdict, and the last verdict written (a verdict of nobody is written only after one that named somebody)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix  # the round's windows' keys: ``<prefix><node>``
        self.merge = Merge()
        self.fresh: set[str] = set()  # nodes that sent a window since the last verdict
        self.last: list[Straggler] | None = None

    def take(self, key: str, value: bytes) -> None:
        """A node's window, merged (a malformed one is passed over)."""
        try:
            self.merge.add(decode(value))
        except ValueError:
            return
        self.fresh.add(key[len(self.prefix):])

    def judge(self) -> list[Straggler] | None:
        """The verdict on the windows merged so far (the next one waits for fresh windows), or None when there is
        nothing to write: it told nothing, or it names nobody and so did the last."""
        ranks, ready, length, total = self.merge.take()
        self.fresh.clear()
        found = verdict.judge(ranks, ready, length, scale=total / len(ready) if ready else 1.0)
        if found is None or (not found and not self.last):
            return None
        self.last = found
        return found

    def owners(self) -> dict[int, str]:
        """Each rank's node id, from every node's latest window."""
        return {r.rank: w.node for w in self.merge.latest.values() for r in w.ranks}


async def judge_job(store: Store, keys: Keys, round_: int, nodes: int, put: Put,  # noqa: PLR0917
                    window: float, *, tell: Told | None = None) -> None:
    """Judge round ``round_`` from its ``nodes`` nodes' windows (``window``: their length in seconds) until
    cancelled; each verdict that names somebody, or no longer does, is written, and given to ``tell`` with the node
    id of every rank. Only the round's members write under its keys, so any node's window counts."""
    loop = asyncio.get_running_loop()
    windows = Windows(keys.straggler_windows(round_))
    since = loop.time()
    entries, revision = await store.range(windows.prefix)
    for entry in entries:
        windows.take(entry.key, entry.value)
    async with watching(store, [windows.prefix], revision) as events:
        while True:
            try:
                async with asyncio.timeout(max(0.0, since + LATE * window - loop.time())):
                    # a DELETE too: every node's window already there as this began is judged at the first change
                    event = await next_event(events, deletes=True)
                    if event.kind is EventKind.PUT:
                        windows.take(event.key, event.value)
                    if len(windows.fresh) < nodes:
                        continue
            except TimeoutError:
                if not windows.fresh:
                    since = loop.time()
                    continue
            since = loop.time()
            found = windows.judge()
            if found is not None:
                await put(keys.straggler_verdict(round_), verdict_value(found))
                if tell is not None:
                    await tell(found, windows.owners())
