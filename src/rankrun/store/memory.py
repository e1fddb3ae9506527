"""The in-memory store: the reference implementation of ``store.api.Store`` and its test double.

Everything happens synchronously inside one event loop, so each operation is atomic. Lease
expiry runs on an injected ``Timers`` (the event loop's clock by default; tests advance a fake
one), never on a sleep. The embedded server (``store.embedded.server``) serves exactly this object
to its peers, so what the contract suite pins here is what the wire delivers.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from rankrun.store.api import Compacted, Entry, Event, EventKind, LeaseLost, StoreUnavailable, WatchHandle


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """A clock that can call back: the event loop's (``LoopTimers``) or a fake one in tests."""

    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable: ...


class LoopTimers:
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def call_at(self, when: float, callback: Callable[[], None]) -> Cancellable:
        return asyncio.get_running_loop().call_at(when, callback)


@dataclass(eq=False)
class _LeaseState:
    id: int
    ttl: float
    keys: set[str] = field(default_factory=set)
    timer: Cancellable | None = None
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    on_lost: list[Callable[[str], None]] = field(default_factory=list)
    why: str = ""


class MemoryLease:
    def __init__(self, store: MemoryStore, state: _LeaseState) -> None:
        self._store = store
        self._state = state

    @property
    def id(self) -> int:
        return self._state.id

    @property
    def ttl(self) -> float:
        return self._state.ttl

    @property
    def lost(self) -> asyncio.Event:
        return self._state.lost

    @property
    def why(self) -> str:
        return self._state.why

    async def keep_alive(self) -> None:
        self._store.refresh(self._state.id)

    async def revoke(self) -> None:
        self._store.revoke(self._state.id)

    def set_lost(self, why: str) -> None:
        self._store.revoke(self._state.id, why)


class MemoryWatch(WatchHandle):
    def __init__(self, store: MemoryStore, prefix: str) -> None:
        super().__init__()
        self._store = store
        self.prefix = prefix
        self.token = 0
        store.on_close(self.end)

    def push(self, event: Event) -> None:
        if not self._closed:
            self.queue.put_nowait(event)

    def end(self) -> None:
        """The store went away: the iteration ends with ``StoreUnavailable``."""
        if not self._closed:
            self.queue.put_nowait(StoreUnavailable("the store was closed"))

    async def close(self) -> None:
        self._closed = True
        self._store.unsubscribe(self.token)


class SortedKeys:
    """Distinct strings in order, in chunks of at most ``2 * CHUNK``: an insert or a removal costs log(n) + a chunk,
    where one sorted list costs a move of half of it (measured: 1.2 s over a 32,768-node join, quadratic)."""

    CHUNK = 512

    def __init__(self) -> None:
        self._chunks: list[list[str]] = []
        self._maxes: list[str] = []  # each chunk's last (largest) key

    def __len__(self) -> int:
        return sum(len(chunk) for chunk in self._chunks)

    def add(self, key: str) -> None:
        """Insert ``key`` (not already there)."""
        if not self._chunks:
            self._chunks.append([key])
            self._maxes.append(key)
            return
        i = bisect.bisect_left(self._maxes, key)
        if i == len(self._maxes):  # past every key: the last chunk's new end
            i -= 1
            chunk = self._chunks[i]
            chunk.append(key)
            self._maxes[i] = key
        else:
            chunk = self._chunks[i]
            bisect.insort(chunk, key)
        if len(chunk) > 2 * self.CHUNK:
            self._chunks.insert(i + 1, chunk[self.CHUNK :])
            del chunk[self.CHUNK :]
            self._maxes.insert(i, chunk[-1])

    def remove(self, key: str) -> None:
        """Remove ``key`` (there)."""
        i = bisect.bisect_left(self._maxes, key)
        chunk = self._chunks[i]
        del chunk[bisect.bisect_left(chunk, key)]
        if not chunk:
            del self._chunks[i], self._maxes[i]
        else:
            self._maxes[i] = chunk[-1]

    def starting(self, prefix: str) -> Iterator[str]:
        """The keys that start with ``prefix``, in order."""
        i = bisect.bisect_left(self._maxes, prefix)
        if i == len(self._maxes):
            return
        j = bisect.bisect_left(self._chunks[i], prefix)
        for chunk in itertools.islice(self._chunks, i, None):
            # by index: islice(chunk, j, None) steps over the j keys before the first one (up to 1,024, for each of
            # the 4 ranges and watches a node's round makes: 1.4 s of the host's CPU at 32,768 nodes)
            for at in range(j, len(chunk)):
                key = chunk[at]
                if not key.startswith(prefix):
                    return
                yield key
            j = 0


class MemoryStore:
    pipelines = False  # nothing to put on one wire: each request is answered as it is made
    in_process = True  # a request never suspends: the hosting agent's writes all happen in the turn they are made

    def __init__(self, timers: Timers | None = None) -> None:
        self._timers = timers or LoopTimers()
        self._data: dict[str, Entry] = {}
        self._keys = SortedKeys()  # the same keys, sorted (for prefix ranges)
        self._revision = 0
        # history per key (also of deleted keys), and those keys sorted: a watch from a revision replays only the
        # keys under its prefix, not every event since (thousands of nodes each watch their own key)
        self._history: dict[str, list[Event]] = {}
        self._history_keys = SortedKeys()
        self._compacted = 0  # history before this revision is gone
        # watches indexed by prefix, and the prefix lengths in use: an event finds its watchers with one
        # dict lookup per distinct length, not a scan of every watch (thousands of nodes each watch a key)
        self._watches: dict[int, str] = {}
        self._by_prefix: dict[str, dict[int, Callable[[Event], None]]] = {}
        self._lengths: dict[int, int] = {}
        self._closing: list[Callable[[], None]] = []
        self._leases: dict[int, _LeaseState] = {}
        self._deleted_why: dict[str, str] = {}  # a key a lease's end deleted → why it ended (one entry per key)
        self._ids = itertools.count(1)
        self._closed = False

    @property
    def revision(self) -> int:
        return self._revision

    # -- the Store protocol (async, as every implementation; nothing here ever suspends)

    async def get(self, key: str) -> Entry | None:
        return self.read(key)

    async def range(self, prefix: str) -> tuple[list[Entry], int]:
        return self.scan(prefix)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        return self.write(key, value, lease)

    async def compare_and_set(self, key: str, value: bytes, *, revision: int, lease: int = 0) -> int | None:
        return self.cas(key, value, revision, lease)

    async def delete(self, key: str) -> bool:
        return self.remove(key)

    async def watch(self, prefix: str, after: int) -> MemoryWatch:
        watch = MemoryWatch(self, prefix)
        watch.token = self.subscribe(prefix, after, watch.push)
        return watch

    async def grant(self, ttl: float) -> MemoryLease:
        return MemoryLease(self, self._leases[self.new_lease(ttl)])

    # -- the synchronous core (what the embedded server calls)

    def read(self, key: str) -> Entry | None:
        self._check_open()
        return self._data.get(key)

    def scan(self, prefix: str) -> tuple[list[Entry], int]:
        self._check_open()
        data = self._data
        # the keys are kept sorted: a range costs log(n) + its size
        return [data[key] for key in self._keys.starting(prefix)], self._revision

    def write(self, key: str, value: bytes, lease: int = 0) -> int:
        self._check_open()
        return self._write(key, value, lease)

    def cas(self, key: str, value: bytes, revision: int, lease: int = 0) -> int | None:
        self._check_open()
        current = self._data.get(key)
        if (current.mod_revision if current is not None else 0) != revision:
            return None
        return self._write(key, value, lease)

    def remove(self, key: str) -> bool:
        self._check_open()
        return self._remove(key)

    def _write(self, key: str, value: bytes, lease: int) -> int:
        if lease and lease not in self._leases:
            raise LeaseLost(f"lease {lease:x} is gone")
        previous = self._data.get(key)
        if previous is None:
            self._keys.add(key)
        if previous is not None and previous.lease and previous.lease != lease and previous.lease in self._leases:
            self._leases[previous.lease].keys.discard(key)
        self._revision += 1
        created = previous.create_revision if previous is not None else self._revision
        self._data[key] = Entry(key, value, created, self._revision, lease)
        if lease:
            self._leases[lease].keys.add(key)
        self._publish(Event(EventKind.PUT, key, value, self._revision))
        return self._revision

    def _remove(self, key: str) -> bool:
        entry = self._data.pop(key, None)
        if entry is None:
            return False
        self._keys.remove(key)
        if entry.lease in self._leases:
            self._leases[entry.lease].keys.discard(key)
        self._revision += 1
        self._publish(Event(EventKind.DELETE, key, b"", self._revision))
        return True

    # -- watches

    def subscribe(self, prefix: str, after: int, sink: Callable[[Event], None]) -> int:
        """Call ``sink`` with every change under ``prefix`` after revision ``after`` (history first); a token."""
        self._check_open()
        if after < self._compacted:
            raise Compacted(f"revision {after} is compacted (oldest kept: {self._compacted})")
        replay: list[Event] = []
        for key in self._history_keys.starting(prefix):
            events = self._history[key]
            replay += events[_index_after(events, after) :]
        for event in sorted(replay, key=lambda e: e.revision) if len(replay) > 1 else replay:
            sink(event)
        token = next(self._ids)
        self._watches[token] = prefix
        self._by_prefix.setdefault(prefix, {})[token] = sink
        self._lengths[len(prefix)] = self._lengths.get(len(prefix), 0) + 1
        return token

    def unsubscribe(self, token: int) -> None:
        prefix = self._watches.pop(token, None)
        if prefix is None:
            return
        sinks = self._by_prefix[prefix]
        del sinks[token]
        if not sinks:
            del self._by_prefix[prefix]
        self._lengths[len(prefix)] -= 1
        if not self._lengths[len(prefix)]:
            del self._lengths[len(prefix)]

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once when the store closes (watchers and servers learn of it)."""
        self._closing.append(callback)

    def _publish(self, event: Event) -> None:
        events = self._history.get(event.key)
        if events is None:
            events = self._history[event.key] = []
            self._history_keys.add(event.key)
        events.append(event)
        key = event.key
        for length in list(self._lengths):
            if length <= len(key):
                for sink in list(self._by_prefix.get(key[:length], {}).values()):
                    sink(event)

    def compact(self, revision: int) -> None:
        """Forget history up to ``revision`` (watches from before it get ``Compacted``)."""
        for events in self._history.values():
            del events[: _index_after(events, revision)]
        self._compacted = max(self._compacted, revision)

    # -- leases

    def new_lease(self, ttl: float) -> int:
        self._check_open()
        state = _LeaseState(next(self._ids), ttl)
        self._leases[state.id] = state
        self._arm(state)
        return state.id

    def on_lease_lost(self, lease_id: int, callback: Callable[[str], None]) -> None:
        """Call ``callback(why)`` once the lease is gone (at once if it already is)."""
        state = self._leases.get(lease_id)
        if state is None:
            callback("it no longer exists")
        else:
            state.on_lost.append(callback)

    def why_deleted(self, key: str) -> str:
        """Why the lease that ``key`` was attached to ended, if a lease's end deleted it ("" otherwise)."""
        return self._deleted_why.get(key, "")

    def refresh(self, lease_id: int) -> None:
        state = self._leases.get(lease_id)
        if state is None:
            raise LeaseLost(f"lease {lease_id:x} is gone")
        self._arm(state)

    def revoke(self, lease_id: int, why: str = "it left (revoked its lease)") -> None:
        """End a lease now: its keys are deleted, each as one event. Idempotent."""
        state = self._leases.pop(lease_id, None)
        if state is None:
            return
        if state.timer is not None:
            state.timer.cancel()
        state.why = why
        for key in sorted(state.keys):
            self._deleted_why[key] = why
            self._remove(key)
        state.lost.set()
        for callback in state.on_lost:
            callback(why)

    def _arm(self, state: _LeaseState) -> None:
        if state.timer is not None:
            state.timer.cancel()
        why = f"its lease expired after {state.ttl:g} s of silence (no keep-alive)"
        state.timer = self._timers.call_at(self._timers.now() + state.ttl, lambda: self.revoke(state.id, why))

    # -- lifetime

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for state in self._leases.values():
            if state.timer is not None:
                state.timer.cancel()
            state.lost.set()
        self._watches.clear()
        self._by_prefix.clear()
        self._lengths.clear()
        for callback in self._closing:
            callback()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("the store was closed")


def _index_after(events: list[Event], revision: int) -> int:
    """Index of the first of ``events`` (in revision order) with a revision greater than ``revision``."""
    lo, hi = 0, len(events)
    while lo < hi:
        mid = (lo + hi) // 2
        if events[mid].revision <= revision:
            lo = mid + 1
        else:
            hi = mid
    return lo
