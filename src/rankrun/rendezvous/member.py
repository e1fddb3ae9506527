"""One node's side of the rendezvous: join once, then read its own assignment and the round key, round after round.

A join costs a node a fixed handful of operations and a few hundred bytes, whatever the number of nodes: nobody reads
or rewrites a list of everyone. The gets of its blocklist key and of ``closed`` and a grant, then
its put; a round, the ranges of its assign key and of the round key, then (unless the assignment was already there)
the two watches. Each group is made together where the store pipelines them (``store.api.together``): one round trip,
and one read and one write of the host's, where its CPU per node goes.

A node excluded from the job learns it from its own assign key (``Excluded``, in the same watch as its rounds); one
that comes back to a job that excluded it is refused at join (``NodeExcluded``, exit code 4). A node that finds itself
unhealthy says so with ``report_unhealthy`` (or, unhealthy before it joins, in its join: ``NodeInfo.unhealthy``): the
coordinator excludes it as it does a node blamed too often.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rankrun.clock import seconds
from rankrun.errors import NodeExcluded, RendezvousClosed
from rankrun.rendezvous.keys import (
    Assignment,
    Blocked,
    Excluded,
    Keys,
    RoundWord,
    Spare,
    Status,
    node_value,
    place_from,
    result_value,
    unhealthy_value,
)
from rankrun.rendezvous.round import NodeInfo, Phase
from rankrun.store.api import Entry, Lease, Store, StoreUnavailable, exact, next_event, together, watching


@dataclass(frozen=True)
class Ended:
    word: RoundWord
    placed: bool = False  # the coordinator had given this node a place, not a spare's (it may not have run it yet)


class Member:
    """One node's side: join once, then read its own assignment and the round key, round after round."""

    def __init__(self, store: Store, keys: Keys, info: NodeInfo, lease: Lease, job: Lease | None = None) -> None:
        self.store = store
        self.keys = keys
        self.info = info
        self.lease = lease
        self.job = job  # a shared store: the job lease, which this node helps keep alive and writes results on
        self.word: RoundWord | None = None  # the round key's word that came with the last ``next_round``

    @classmethod
    async def join(cls, store: Store, keys: Keys, info: NodeInfo, ttl: float, job: Lease | None = None) -> Member:
        """Register (a lease-bound node key); ``RendezvousClosed`` if the job is already over, ``NodeExcluded`` if it
        excluded this node (its hostname and address are on the job's blocklist)."""
        # the lease with the reads, in one round trip where the store pipelines them: a node refused gives it back
        blocked, closed, lease = await together(store, store.get(keys.blocked(info.host, info.addr)),
                                                store.get(keys.closed), store.grant(ttl))
        if blocked is not None or closed is not None:
            with contextlib.suppress(StoreUnavailable):
                await lease.revoke()
        if blocked is not None:
            record = Blocked.parse(blocked.value)
            raise NodeExcluded(f"this node ({info.host}, {info.addr}) was excluded from job {record.run or keys.run_id} at "
                               f"{wall_time(record.at)}: {record.reason}; drain it or reschedule elsewhere")
        if closed is not None:
            raise RendezvousClosed("the job has already finished")
        await store.put(keys.node(info.id), node_value(info), lease=lease.id)
        return cls(store, keys, info, lease, job)

    async def next_round(self, after: int) -> Assignment | Spare | Ended | Excluded:
        """The first word after round ``after``: an assignment, a place as a spare, the end of the job, or this node's
        exclusion (which comes first: a node excluded as the job ends is told so)."""
        key, round_key = self.keys.assign(self.info.id), self.keys.round
        # a prefix: "assign/n1" also finds "assign/n10", so match exactly; in this order (on the wire too): the watches
        # start from the first one's revision, so the second's value is never newer than what they replay after it
        (entries, revision), (round_entries, _) = await together(self.store, self.store.range(key), self.store.range(round_key))
        latest_assign, latest_round = _value(entries, key), _value(round_entries, round_key)
        found = self._read(latest_assign, latest_round, after)
        if found is not None:
            return found
        async with watching(self.store, (key, round_key), revision) as merged:
            while True:
                event = await next_event(merged)
                if event.key == key:
                    latest_assign = event.value
                elif event.key == round_key:
                    latest_round = event.value
                found = self._read(latest_assign, latest_round, after)
                if found is not None:
                    return found

    def _read(self, assign: bytes | None, round_value: bytes | None, after: int) -> Assignment | Spare | Ended | Excluded | None:
        place = place_from(assign) if assign is not None else None
        if isinstance(place, Excluded):
            return place
        word = RoundWord.parse(round_value) if round_value else None
        if word is not None and word.phase is Phase.ENDED:
            return Ended(word, placed=isinstance(place, Assignment))
        if place is None or word is None or word.phase is not Phase.RUNNING:
            return None
        if after < place.round == word.round:
            self.word = word
            return place
        return None

    async def round_changed(self, round_: int) -> RoundWord:
        """Wait until the round key says round ``round_`` is over (re-forming, or the job ended)."""
        return await self._round_word(lambda word: word.round != round_ or word.phase is not Phase.RUNNING)

    async def report(self, round_: int, ok: bool, summary: str = "", root: Mapping[str, object] | None = None, *,
                     stall: str | None = None, blame: str | None = None) -> None:
        """How this node's workers of ``round_`` ended; a stall (``--hang-action fail``) with its cause and the node
        the job's stall report blames (``rendezvous.round.Result``)."""
        await self.store.put(self.keys.result(round_, self.info.id), result_value(ok, summary, root, stall=stall, blame=blame),
                             lease=self.job.id if self.job is not None else 0)

    async def report_unhealthy(self, reason: str) -> None:
        """Say that this node cannot run workers (its health check failed: ``reason``, one line). The coordinator
        excludes it as it excludes a node blamed ``--max-node-failures`` times; ``next_round`` then says so."""
        await self.store.put(self.keys.unhealthy_node(self.info.id), unhealthy_value(reason), lease=self.lease.id)

    async def wait_for_end(self, heard: Callable[[RoundWord], None] | None = None) -> RoundWord:
        """The round key's word once the job has ended (an excluded node that still serves the job waits for it);
        ``heard`` is given every word before it, the current one first (the exclusions the job makes meanwhile)."""
        return await self._round_word(lambda word: word.phase is Phase.ENDED, heard)

    async def _round_word(self, done: Callable[[RoundWord], bool],
                          heard: Callable[[RoundWord], None] | None = None) -> RoundWord:
        """The round key's first word that is ``done``, already or later; ``heard`` is given every word before it."""
        entries, revision = await self.store.range(self.keys.round)
        current = _value(entries, self.keys.round)
        if current is not None:
            word = RoundWord.parse(current)
            if done(word):
                return word
            if heard is not None:
                heard(word)
        async with watching(self.store, (self.keys.round,), revision) as events:
            while True:
                event = await next_event(events)
                if event.key == self.keys.round:
                    word = RoundWord.parse(event.value)
                    if done(word):
                        return word
                    if heard is not None:
                        heard(word)

    async def status(self) -> Status:
        entry = await self.store.get(self.keys.status)
        return Status.parse(entry.value) if entry is not None else Status()

    async def keep_alive(self, interval: float, max_attempts: int) -> None:
        """Refresh the lease every ``interval`` s until it is lost.

        Each keep-alive gets ``interval`` s to be answered (a silent network must not hold it for TCP's
        15 minutes); one that fails or is not answered in time is a miss. After ``max_attempts`` misses in
        a row the lease is given up on this side, whatever TCP believes: the store has expired it too.
        """
        loop = asyncio.get_running_loop()
        misses, started, first_miss = 0, loop.time(), 0.0
        while True:
            with contextlib.suppress(TimeoutError):  # a keep-alive every interval, or the lease's end
                async with asyncio.timeout_at(started + interval):
                    await self.lease.lost.wait()
                    return
            started = loop.time()
            try:
                async with asyncio.timeout(interval):
                    await self.lease.keep_alive()
                misses = 0
            except (StoreUnavailable, TimeoutError) as exc:
                misses += 1
                first_miss = started if misses == 1 else first_miss
                if misses >= max_attempts or self.lease.lost.is_set():
                    why = f"no answer within {interval:g} s" if isinstance(exc, TimeoutError) else str(exc)
                    over = seconds(loop.time() - first_miss)
                    self.lease.set_lost(f"{misses} keep-alives in a row failed over {over} s ({why})")
                    return
                continue
            if self.job is not None:  # every node keeps the job's keys alive (a shared store); its failures are not ours
                with contextlib.suppress(StoreUnavailable, TimeoutError):
                    async with asyncio.timeout(interval):
                        await self.job.keep_alive()

    async def leave(self) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.lease.revoke()



def wall_time(at: float) -> str:
    """A wall-clock time as a node says it to a person on another host: UTC, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def _value(entries: list[Entry], key: str) -> bytes | None:
    entry = exact(entries, key)
    return entry.value if entry is not None else None
