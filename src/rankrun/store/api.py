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
be reached or the connection was lost; ``AuthenticationFailed`` when the secrets do not match;
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
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from rankrun.errors import AuthenticationFailed, Compacted, LeaseLost, StoreUnavailable

__all__ = ["AuthenticationFailed", "Compacted", "LeaseLost", "StoreUnavailable"]  # the seam's errors (rankrun.errors)


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


@contextlib.asynccontextmanager
async def watching(store: Store, prefixes: Sequence[str], after: int,
                   queue: Events | None = None) -> AsyncIterator[Events]:
    """Watches of ``prefixes`` from revision ``after``, their events in one queue (a watch's end as its
    ``StoreUnavailable``, for the reader to raise); every watch closed on the way out."""
    merged: Events = queue if queue is not None else asyncio.Queue()
    watches: list[Watch] = []
    feeders: list[asyncio.Task[None]] = []
    try:
        for prefix in prefixes:
            watches.append(await store.watch(prefix, after))
            feeders.append(asyncio.create_task(feed(watches[-1], merged)))
        yield merged
    finally:
        for task in feeders:
            task.cancel()
        for watch in watches:
            with contextlib.suppress(StoreUnavailable):
                await watch.close()
