"""The store seam (``store.api.Store``) on etcd v3: a thin client over ``store.etcd.gateway``.

Each seam call is one gateway request (``kv/range``, ``kv/put``, ``kv/txn``, ``kv/deleterange``,
``lease/grant``, ``lease/keepalive``, ``lease/revoke``, ``lease/timetolive``) or one ``watch``
stream, so the rendezvous algorithm (``rendezvous.coordinator`` and ``rendezvous.member``) is the same as on the embedded store
and the same contract suite runs against both. What etcd does differently, and how it is met:

- A lease is not tied to a connection: it lives until its TTL runs out without a keep-alive, on
  whichever member answers. Its *expiry* here is the last refresh etcd confirmed, counted from
  when that request was sent (etcd refreshed it later, never earlier), plus the TTL etcd gave:
  before then it surely lives. A lease call (keep-alive, time-to-live) gives each member a third
  of the TTL to answer, and never more than is left before the expiry, so that a member cut off
  from the client (no RST, only silence) leaves time for the others before etcd drops the lease
  (``attempt_bound``). ``lost`` is set, with the reason (``why``), when etcd says the lease is
  gone (a keep-alive without a TTL, a put on an unknown lease, a time-to-live of -1). At the
  expiry, if no keep-alive was confirmed meanwhile, the lease asks etcd whether it still lives
  (etcd renews every lease when a new leader is elected, and other clients may keep a shared one
  alive), on every member, until one more TTL has passed (``give_up_at``): an etcd that cannot
  vouch for the lease that long is not believed to keep it. A timer, not a polling loop.
- A watch stream ends when its member dies or loses the leader; it is re-created on the next
  endpoint from the revision after the last one delivered, so no event is missed or repeated.
  A watch from compacted history is refused with ``Compacted``: etcd tells that only some time
  after the watch is created, so ``watch`` first asks for that revision (one ``count_only``
  range).
- ``compare_and_set`` retried after an ambiguous failure (the member died after applying it)
  would find its own write: a failed comparison whose key holds exactly our value on our lease
  is our success.
- Integers travel as JSON strings, keys and values as base64, and proto3 leaves defaults out
  (a missing ``succeeded``, ``kvs`` or ``type`` is false, none, or PUT).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
from typing import Any

from rankrun.store.api import (
    AuthenticationFailed,
    Compacted,
    Entry,
    Event,
    EventKind,
    LeaseHandle,
    LeaseLost,
    StoreUnavailable,
    WatchHandle,
)
from rankrun.store.etcd.gateway import Connection, EtcdError, Gateway, Transport, error_of

_NOT_FOUND = 5
_OUT_OF_RANGE = 11


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def _unb64(value: Any) -> bytes:
    return base64.b64decode(value) if value else b""


def prefix_end(prefix: str) -> str:
    """etcd's ``range_end`` for "every key starting with ``prefix``": the prefix with its last byte + 1."""
    raw = bytearray(prefix.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return _b64(bytes(raw))
        raw.pop()
    return _b64(b"\x00")  # every key


def _entry(kv: dict[str, Any]) -> Entry:
    return Entry(_unb64(kv.get("key")).decode(), _unb64(kv.get("value")), int(kv.get("create_revision", 0)),
                 int(kv.get("mod_revision", 0)), int(kv.get("lease", 0)))


def _put_body(key: str, value: bytes, lease: int) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        body["lease"] = str(lease)
    return body


def _revision(obj: dict[str, Any]) -> int:
    return int(obj.get("header", {}).get("revision", 0))


# --------------------------------------------------------------------------- a lease's time (pure)

MIN_ATTEMPT = 0.2  # seconds: the least one member gets to answer a lease call


def attempt_bound(ttl: float, left: float, members: int) -> float | None:
    """Seconds one member may take to answer a lease call; None: the gateway's own bound (one member: nowhere else to go).

    A third of the TTL, so that a member that does not answer leaves time for two more before etcd may
    drop the lease; no more than ``left`` (seconds to the lease's expiry); never less than ``MIN_ATTEMPT``.
    """
    if members < 2:
        return None
    return max(MIN_ATTEMPT, min(ttl / 3, left))


def give_up_at(expiry: float, ttl: float) -> float:
    """When a lease that no member could vouch for since ``expiry`` is taken for gone: one more TTL later."""
    return expiry + ttl


def next_look(expiry: float, looked: float, ttl: float) -> float:
    """When to ask etcd about the lease: at its expiry, but not within a tenth of the TTL of the last look.

    etcd rounds a remaining TTL down to whole seconds: a lease with 0 s left still lives for up to a second.
    """
    return max(expiry, looked + ttl / 10)


class EtcdLease(LeaseHandle):
    def __init__(self, store: EtcdStore, lease_id: int, ttl: float, *, confirmed: float | None = None) -> None:
        """``confirmed``: when the request that granted or last refreshed it was sent (now if not given)."""
        super().__init__(lease_id, ttl)
        self._store = store
        loop = asyncio.get_running_loop()
        self._confirmed = loop.time() if confirmed is None else confirmed
        self._expiry = self._confirmed + ttl  # before this, etcd surely holds it
        self._checker = asyncio.create_task(self._watch_expiry())

    @property
    def expiry(self) -> float:
        return self._expiry

    def mark_lost(self, why: str) -> None:
        self.set_lost(why)
        self._checker.cancel()
        self._store.leases.pop(self._id, None)

    async def keep_alive(self) -> None:
        self._check_held()
        sent = asyncio.get_running_loop().time()
        obj = await self._call("/v3/lease/keepalive")
        ttl = int(obj.get("result", obj).get("TTL", 0))
        if ttl <= 0:  # etcd's word for an unknown or expired lease: no TTL, HTTP 200
            self.mark_lost(self._expired("etcd says it is gone"))
            raise LeaseLost(f"lease {self._id:x} expired")
        self._confirm(sent, ttl)

    async def revoke(self) -> None:
        if self._lost.is_set():
            return
        try:
            await self._store.gateway.call("/v3/lease/revoke", {"ID": str(self._id)})
        except EtcdError as exc:
            if exc.code != _NOT_FOUND:
                raise
        finally:
            self.mark_lost("it was revoked")

    def _confirm(self, sent: float, ttl: float) -> None:
        """etcd vouched, for a request sent at ``sent``, that the lease lives ``ttl`` s more."""
        if sent + ttl > self._expiry:
            self._confirmed, self._expiry = sent, sent + ttl

    async def _call(self, path: str) -> dict[str, Any]:
        """A lease request: each member bounded by what is left of the lease, every member tried until the give-up time."""
        gateway = self._store.gateway
        now = asyncio.get_running_loop().time()
        return await gateway.call(path, {"ID": str(self._id)},
                                  attempt_timeout=attempt_bound(self._ttl, self._expiry - now, len(gateway.endpoints)),
                                  retry_for=max(0.0, give_up_at(self._expiry, self._ttl) - now))

    def _expired(self, how: str) -> str:
        since = asyncio.get_running_loop().time() - self._confirmed
        return f"its etcd lease expired: {how} (no keep-alive reached etcd for {since:.0f} s; its TTL is {self._ttl:g} s)"

    async def _watch_expiry(self) -> None:
        """At the expiry, unless a keep-alive was confirmed meanwhile, ask etcd whether the lease still lives."""
        loop = asyncio.get_running_loop()
        looked = -math.inf
        while True:
            await asyncio.sleep(max(0.0, next_look(self._expiry, looked, self._ttl) - loop.time()))  # a timer, not a poll
            if loop.time() < self._expiry:
                continue  # refreshed meanwhile
            looked = loop.time()
            why = await self._ask_etcd()
            if why is not None and loop.time() >= self._expiry:  # (a keep-alive may have been confirmed meanwhile)
                break
        self.set_lost(why)
        self._store.leases.pop(self._id, None)

    async def _ask_etcd(self) -> str | None:
        """None if etcd vouches for the lease (its expiry moves on); else why it is taken for gone."""
        sent = asyncio.get_running_loop().time()
        try:
            obj = await self._call("/v3/lease/timetolive")
        except StoreUnavailable as exc:
            return self._expired(f"no etcd member could say otherwise ({exc})")
        left = int(obj.get("TTL", -1))
        if left < 0:  # -1: etcd has no such lease (0: it lives, for less than a second)
            return self._expired("etcd says it is gone")
        self._confirm(sent, left)
        return None


class EtcdWatch(WatchHandle):
    def __init__(self, store: EtcdStore, prefix: str, after: int) -> None:
        super().__init__()
        self._store = store
        self._prefix = prefix
        self._next = after + 1  # the first revision not delivered yet
        self._conn: Connection | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._open()
        self._reader = asyncio.create_task(self._read_forever())

    async def _open(self) -> None:
        # progress_notify: etcd says now and then "nothing up to revision R", so a quiet watch's resume point moves
        # on too (a reconnect long after the last event would otherwise ask for history compaction has removed)
        body = {"create_request": {"key": _b64(self._prefix), "range_end": prefix_end(self._prefix),
                                   "start_revision": str(self._next), "progress_notify": True}}
        conn, first = await self._store.gateway.open_stream("/v3/watch", body)
        self._conn = conn
        result = first.get("result", {})
        if not self._take(result):  # refused at creation (permission denied, ...): the stream would stay silent
            conn.close()
            reason = result.get("cancel_reason") or "cancelled by etcd"
            raise (AuthenticationFailed if "permission" in reason or "auth" in reason else StoreUnavailable)(
                f"etcd: a watch on {self._prefix!r} was refused: {reason}")

    def _take(self, result: dict[str, Any]) -> bool:
        """Queue a response's events; False when etcd ended the watch (compacted: raised to the reader)."""
        if int(result.get("compact_revision", 0)) > 0:
            raise Compacted(f"etcd: history before revision {result['compact_revision']} was compacted "
                            f"(a watch from {self._next} on {self._prefix!r})")
        for raw in result.get("events", ()):
            kv = raw.get("kv", {})
            revision = int(kv.get("mod_revision", 0))
            if revision < self._next:
                continue  # already delivered before a reconnect
            kind = EventKind.DELETE if raw.get("type") == "DELETE" else EventKind.PUT
            value = b"" if kind is EventKind.DELETE else _unb64(kv.get("value"))
            self.queue.put_nowait(Event(kind, _unb64(kv.get("key")).decode(), value, revision))
        events = result.get("events", ())
        if events:
            self._next = max(self._next, max(int(e.get("kv", {}).get("mod_revision", 0)) for e in events) + 1)
        elif not result.get("created") and not result.get("canceled"):  # a progress notification: synced up to R
            self._next = max(self._next, _revision(result) + 1)
        return not result.get("canceled", False)

    async def _read_forever(self) -> None:
        try:
            while not self._closed:
                conn = self._conn
                assert conn is not None
                with contextlib.suppress(OSError, EOFError, asyncio.IncompleteReadError, ValueError, Transport):
                    while (message := await conn.line()) is not None:
                        if error_of(message) is not None or not self._take(message.get("result", {})):
                            break
                conn.close()
                if self._closed:
                    return
                await self._open()  # the member died or lost its leader: resume on another, from self._next
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.queue.put_nowait(exc if isinstance(exc, StoreUnavailable) else StoreUnavailable(f"etcd watch: {exc}"))

    async def close(self) -> None:
        self._closed = True
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._conn is not None:
            self._conn.close()
        self._store.watches.discard(self)


class EtcdStore:
    """``Store`` on an etcd v3 cluster, through ``gateway`` (which owns the endpoints and their failover)."""

    # each request is an HTTP exchange of its own (``store.api.pipelines``: made together, nothing is saved), and one
    # that etcd commits: concurrent writes are committed together, one after another each waits for its own commit
    pipelines = False
    in_process = False

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.leases: dict[int, EtcdLease] = {}
        self.watches: set[EtcdWatch] = set()

    @property
    def local_address(self) -> str | None:
        return self.gateway.local_address

    async def get(self, key: str) -> Entry | None:
        obj = await self.gateway.call("/v3/kv/range", {"key": _b64(key)})
        kvs = obj.get("kvs", ())
        return _entry(kvs[0]) if kvs else None

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        return _revision(await self._lease_call("/v3/kv/put", _put_body(key, value, lease), lease))

    async def compare_and_set(self, key: str, value: bytes, *, revision: int, lease: int = 0) -> int | None:
        put = _put_body(key, value, lease)
        body = {"compare": [{"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}],
                "success": [{"request_put": put}], "failure": [{"request_range": {"key": _b64(key)}}]}
        obj = await self._lease_call("/v3/kv/txn", body, lease)
        if obj.get("succeeded", False):
            return _revision(obj)
        responses = obj.get("responses", [])
        kvs = responses[0].get("response_range", {}).get("kvs", ()) if responses else ()
        current = _entry(kvs[0]) if kvs else None
        if current is not None and value and current.value == value and current.lease == lease:
            return current.mod_revision  # our own write, applied before a failover retried it
        return None

    async def put_if_held(self, key: str, value: bytes, *, lease: int, holder_key: str, holder: bytes) -> bool:
        """Write ``key`` only while ``holder_key`` holds ``holder`` (one txn): how an elected coordinator is fenced."""
        put = _put_body(key, value, lease)
        body = {"compare": [{"key": _b64(holder_key), "target": "VALUE", "result": "EQUAL", "value": _b64(holder)}],
                "success": [{"request_put": put}]}
        return bool((await self._lease_call("/v3/kv/txn", body, lease)).get("succeeded", False))

    async def delete(self, key: str) -> bool:
        obj = await self.gateway.call("/v3/kv/deleterange", {"key": _b64(key)})
        return int(obj.get("deleted", 0)) > 0

    async def delete_prefix(self, prefix: str, *, keep: str | None = None) -> int:
        """Delete every key under ``prefix`` except ``keep``; how many went."""
        start, end = _b64(prefix), prefix_end(prefix)
        spans = [(start, end)] if keep is None else [(start, _b64(keep)), (_b64(keep.encode() + b"\x00"), end)]
        deleted = 0
        for key, range_end in spans:
            obj = await self.gateway.call("/v3/kv/deleterange", {"key": key, "range_end": range_end})
            deleted += int(obj.get("deleted", 0))
        return deleted

    async def range(self, prefix: str) -> tuple[list[Entry], int]:
        obj = await self.gateway.call("/v3/kv/range", {"key": _b64(prefix), "range_end": prefix_end(prefix)})
        return [_entry(kv) for kv in obj.get("kvs", ())], _revision(obj)

    async def watch(self, prefix: str, after: int) -> EtcdWatch:
        await self._check_history(prefix, after + 1)
        watch = EtcdWatch(self, prefix, after)
        await watch.start()
        self.watches.add(watch)
        return watch

    async def _check_history(self, prefix: str, revision: int) -> None:
        try:
            await self.gateway.call("/v3/kv/range", {"key": _b64(prefix), "range_end": prefix_end(prefix),
                                                     "revision": str(revision), "count_only": True})
        except EtcdError as exc:
            if exc.code != _OUT_OF_RANGE:
                raise
            if "compacted" in exc.message:
                raise Compacted(f"etcd: revision {revision} of {prefix!r} was compacted") from None
            # "a future revision": nothing to replay, the watch starts with what comes next

    async def grant(self, ttl: float) -> EtcdLease:
        sent = asyncio.get_running_loop().time()
        obj = await self.gateway.call("/v3/lease/grant", {"TTL": str(max(1, math.ceil(ttl)))})
        if not obj.get("ID"):
            raise StoreUnavailable(f"etcd granted no lease: {obj.get('error') or obj}")
        lease = EtcdLease(self, int(obj["ID"]), float(obj.get("TTL", ttl)), confirmed=sent)  # the TTL etcd gave
        self.leases[lease.id] = lease
        return lease

    def lease(self, lease_id: int, ttl: float) -> EtcdLease:
        """A handle on a lease someone else granted (etcd lets any client keep any lease alive)."""
        lease = self.leases.get(lease_id)
        if lease is None:
            lease = self.leases[lease_id] = EtcdLease(self, lease_id, ttl)
        return lease

    async def compact(self, revision: int) -> None:
        await self.gateway.call("/v3/kv/compaction", {"revision": str(revision), "physical": True})

    async def _lease_call(self, path: str, body: dict[str, Any], lease: int) -> dict[str, Any]:
        try:
            return await self.gateway.call(path, body)
        except EtcdError as exc:
            if exc.code == _NOT_FOUND and lease:
                held = self.leases.get(lease)
                if held is not None:
                    held.mark_lost(f"its etcd lease expired or was revoked: etcd refused a write on it ({exc.message})")
                raise LeaseLost(f"etcd: lease {lease:x} is gone ({exc.message})") from None
            raise

    async def close(self) -> None:
        for watch in list(self.watches):
            await watch.close()
        for lease in list(self.leases.values()):
            lease.mark_lost("the etcd client was closed")  # forgotten, not revoked: owners revoke what they end
        await self.gateway.close()
