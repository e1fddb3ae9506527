"""The rendezvous store seam, shaped like etcd v3 so that an etcd backend is a thin client of it.

Vocabulary (etcd's): every write bumps the store's *revision*; each key remembers the revision
that created it and the one that last wrote it. A *lease* is a session: granted with a TTL,
kept alive by its owner, and when it expires (or its owner's connection is gone) every key
attached to it is deleted, as one event each. A *watch* delivers, in revision order, every
change under a prefix after a given revision: nothing is missed between a ``range`` and a
``watch`` started from the revision the range returned.

Implementations: ``store.memory.MemoryStore`` (the reference and the test double),
``store.embedded.client.StoreClient`` (the embedded store, over the wire to ``store.embedded.server``) and
``store.etcd.store.EtcdStore`` (a real etcd); one contract suite (``tests/contract/test_store_contract.py``) runs
against each.

Errors (all ``StoreUnavailable``, a ``rankrun.errors.LauncherError``, or below): the store cannot
be reached or the connection was lost; ``AuthenticationFailed`` when the secrets do not match; ``RendezvousHeld`` when
the embedded store there is another job's;
``LeaseLost`` for an operation on a lease that no longer exists;
``Compacted`` for a watch from a revision the store no longer has. No call takes a timeout:
callers bound them (``asyncio.timeout``), and every call may be cancelled. A networked store never
waits on a silent network for longer than its liveness allows, whatever the caller: the embedded
client gives its connection up after a window of silence (``store.embedded.liveness``), etcd's gateway
bounds each attempt and moves on to the next member.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol, TypeVar, overload

from rankrun.errors import AuthenticationFailed, Compacted, LeaseLost, RendezvousHeld, StoreUnavailable

# the seam's errors (rankrun.errors)
__all__ = ["AuthenticationFailed", "Compacted", "LeaseLost", "RendezvousHeld", "StoreUnavailable"]


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0  # 0: not attached to a lease


def exact(entries: list[Entry], key: str) -> Entry | None:
    """Exactly ``key`` among a prefix range's entries: ``range("a/n1")`` also finds ``a/n10``."""
    return next((e for e in entries if e.key == key), None)


class EventKind(Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True)
class Event:
    kind: EventKind
    key: str
    value: bytes  # empty for DELETE
    revision: int  # the revision of this change


class Watch(Protocol):
    """Changes under a prefix, in revision order; ``async for`` them, ``close()`` to stop."""

    def __aiter__(self) -> AsyncIterator[Event]: ...

    async def close(self) -> None: ...


class Lease(Protocol):
    """A session: keys attached to it live as long as it does."""

    @property
    def id(self) -> int: ...

    @property
    def ttl(self) -> float: ...

    @property
    def lost(self) -> asyncio.Event:
        """Set once the lease is gone (expired, revoked, or the connection that kept it dropped)."""
        ...

    @property
    def why(self) -> str:
        """Once ``lost`` is set: why, in words for the user ("" when nobody could tell)."""
        ...

    async def keep_alive(self) -> None:
        """Refresh the TTL once; ``LeaseLost`` if it is already gone."""
        ...

    def set_lost(self, why: str) -> None:
        """Give it up on this side (its keep-alives went unanswered too long): ``lost`` is set, with ``why``."""
        ...

    async def revoke(self) -> None:
        """End it now: its keys are deleted. Idempotent."""
        ...


class LeaseHandle:
    """What a client-side lease holds, whatever the store: its id, its TTL, and the event set once it is gone."""

    def __init__(self, lease_id: int, ttl: float) -> None:
        self._id = lease_id
        self._ttl = ttl
        self._lost = asyncio.Event()
        self._why = ""

    @property
    def id(self) -> int:
        return self._id

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def lost(self) -> asyncio.Event:
        return self._lost

    @property
    def why(self) -> str:
        return self._why

    def set_lost(self, why: str) -> None:
        """The lease is gone; the first reason given is the one kept (it is the cause, later ones are effects)."""
        if not self._lost.is_set():
            self._why = why
            self._lost.set()

    def _check_held(self) -> None:
        if self._lost.is_set():
            raise LeaseLost(f"lease {self._id:x} is gone")


class Store(Protocol):
    """The store, and what each implementation states of itself (its callers choose how to make requests by these,
    never by its class)."""

    @property
    def pipelines(self) -> bool:
        """Requests made together go out in one write and are answered in one (the embedded client): see ``together``."""
        ...

    @property
    def in_process(self) -> bool:
        """A request is answered in this process, in the turn it is made (the in-memory store): a write never
        suspends on the network, so making many at once gains nothing."""
        ...

    async def get(self, key: str) -> Entry | None: ...

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write ``key``; returns the new revision."""
        ...

    async def compare_and_set(self, key: str, value: bytes, *, revision: int, lease: int = 0) -> int | None:
        """Write ``key`` only if its ``mod_revision`` is ``revision`` (0: only if it does not exist).

        Returns the new revision, or ``None`` when the comparison failed (nothing written).
        """
        ...

    async def delete(self, key: str) -> bool:
        """Delete ``key``; whether it existed."""
        ...

    async def range(self, prefix: str) -> tuple[list[Entry], int]:
        """Every entry whose key starts with ``prefix`` (in key order), and the store's revision then."""
        ...

    async def watch(self, prefix: str, after: int) -> Watch:
        """Every change under ``prefix`` with a revision greater than ``after``, from now on and from history."""
        ...

    async def grant(self, ttl: float) -> Lease:
        """A new lease that expires ``ttl`` seconds after its last keep-alive."""
        ...

    async def close(self) -> None: ...


A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")


def pipelines(store: Store) -> bool:
    """Whether ``store`` answers requests made together in one round trip (``Store.pipelines``): the embedded client
    writes one turn's frames at once and its server answers them in order, one read and one write each way for all of
    them, where the host's CPU per node goes mostly to its reads and writes. Elsewhere they go one after another: on
    etcd each is an exchange of its own (nothing saved), and made together there Member's reads and watches once left
    a re-forming round waiting (tests/e2e/test_etcd.py's killed-agent test, 2 runs in about 7; the cause not found)."""
    return store.pipelines


@overload
async def together(store: Store, a: Coroutine[Any, Any, A], b: Coroutine[Any, Any, B], /) -> tuple[A, B]: ...


@overload
async def together(store: Store, a: Coroutine[Any, Any, A], b: Coroutine[Any, Any, B],
                   c: Coroutine[Any, Any, C], /) -> tuple[A, B, C]: ...


async def together(store: Store, *requests: Coroutine[Any, Any, Any]) -> tuple[Any, ...]:
    """The requests' results, in order, made together where ``store`` pipelines them (in this order on the wire), else
    one after another. One failed (its error raised) or this was cancelled: none of the others is left running."""
    if not pipelines(store):
        try:
            return tuple([await request for request in requests])
        finally:
            for request in requests:  # those never started (an earlier one failed): closed, not left unawaited
                request.close()
    tasks = [asyncio.ensure_future(request) for request in requests]  # started in this order: their frames go so
    try:
        return tuple(await asyncio.gather(*tasks))  # the first error raised; gather marks the later ones seen
    finally:
        for task in tasks:
            task.cancel()


async def get_many(store: Store, keys: Sequence[str], at_once: int = 16) -> list[Entry | None]:
    """``get`` of each key, in order, ``at_once`` of them in flight (a big job's reader must not open one request per
    node at once)."""
    found: list[Entry | None] = []
    for start in range(0, len(keys), at_once):
        found += await asyncio.gather(*(store.get(key) for key in keys[start:start + at_once]))
    return found


Events = asyncio.Queue[Event | StoreUnavailable]  # several watches' events in one queue, their ends included


async def feed(watch: Watch, queue: Events) -> None:
    """A watch's events into a queue several watches share; its end (``StoreUnavailable``) too, for the reader to raise."""
    try:
        async for event in watch:
            queue.put_nowait(event)
    except StoreUnavailable as exc:
        queue.put_nowait(exc)


async def next_event(events: Events, *, deletes: bool = False) -> Event:
    """The next event in ``events``: a PUT, or also a DELETE with ``deletes`` (a reader waits for values, the
    coordinator for nodes leaving too); a watch's end raised, its ``StoreUnavailable``. Unbounded: callers bound it."""
    while True:
        event = await events.get()
        if isinstance(event, StoreUnavailable):
            raise event
        if deletes or event.kind is EventKind.PUT:
            return event


class WatchHandle:
    """What a watch holds, whatever the store (as ``LeaseHandle`` for a lease): its events queued as they arrive, and
    its end there too (the connection lost, the store closed) as the ``StoreUnavailable`` its iteration raises;
    iterated in order until closed."""

    def __init__(self) -> None:
        self.queue: Events = asyncio.Queue()
        self._closed = False

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        while not self._closed:
            yield await next_event(self.queue, deletes=True)


@contextlib.asynccontextmanager
async def watching(store: Store, prefixes: Sequence[str], after: int,
                   queue: Events | None = None) -> AsyncIterator[Events]:
    """Watches of ``prefixes`` from revision ``after``, their events in one queue (a watch's end as its
    ``StoreUnavailable``, for the reader to raise: ``next_event``); every watch closed on the way out."""
    merged: Events = queue if queue is not None else asyncio.Queue()
    watches: list[Watch] = []
    feeders: list[asyncio.Task[None]] = []
    try:
        if pipelines(store):  # every watch at once, one round trip; one failed, or this was cancelled: those that
            # did start are closed below, and the error raised
            starting = [asyncio.ensure_future(store.watch(prefix, after)) for prefix in prefixes]
            try:
                await asyncio.gather(*starting)
            finally:
                for started in starting:
                    started.cancel()
                watches += [s.result() for s in starting if s.done() and not s.cancelled() and s.exception() is None]
        else:
            for prefix in prefixes:
                watches.append(await store.watch(prefix, after))
        feeders += [asyncio.create_task(feed(watch, merged)) for watch in watches]
        yield merged
    finally:
        for task in feeders:
            task.cancel()
        for watch in watches:
            with contextlib.suppress(StoreUnavailable):
                await watch.close()
