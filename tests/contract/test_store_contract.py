"""One contract for every ``rankrun.store.api.Store``: the in-memory store, the embedded one over TCP, and etcd.

Each test runs against each implementation. For the first two, lease expiry is driven by a
fake clock on the serving side, so nothing waits on time; a real etcd keeps real time, so
there a lease's TTL is etcd's shortest (1 s with the test cluster's election timeout) and the
test waits for the expiry event, bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from counting import count_writes
from etcdserver import etcd_cluster
from fakes import FakeTimers
from rankrun.api.values import VALUE_LIMIT, encode
from rankrun.spec import parse_etcd_endpoints
from rankrun.store.api import (
    Compacted,
    Event,
    EventKind,
    LeaseLost,
    Store,
    StoreUnavailable,
    get_many,
    next_event,
    pipelines,
    together,
    watching,
)
from rankrun.store.embedded.client import StoreClient
from rankrun.store.embedded.relay import Relay
from rankrun.store.embedded.server import StoreServer
from rankrun.store.etcd.gateway import Connection, EtcdError, Gateway
from rankrun.store.etcd.store import EtcdStore
from rankrun.store.memory import MemoryStore

BOUND = 20.0  # every test is one asyncio.run under this bound


@dataclass
class Harness:
    store: Store
    advance: Callable[[float], Awaitable[None]]  # let this much (fake) time pass on the serving side
    compact: Callable[[int], Awaitable[None]]  # drop history before a revision
    shut_down: Callable[[], Awaitable[None]]  # the serving side goes away
    real_time: bool = False  # leases expire by the wall clock: TTLs are scaled down to seconds

    def ttl(self, fake: float) -> float:
        return 2.0 if self.real_time else fake


def _fake_time(timers: FakeTimers) -> Callable[[float], Awaitable[None]]:
    async def advance(seconds: float) -> None:
        timers.advance(seconds)

    return advance


def _compact(backing: MemoryStore) -> Callable[[int], Awaitable[None]]:
    async def compact(revision: int) -> None:
        backing.compact(revision)

    return compact


@contextlib.asynccontextmanager
async def _memory(tmp_path: object) -> AsyncIterator[Harness]:
    del tmp_path
    timers = FakeTimers()
    store = MemoryStore(timers)
    try:
        yield Harness(store, _fake_time(timers), _compact(store), store.close)
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def _embedded(tmp_path: object) -> AsyncIterator[Harness]:
    """The embedded store: a client over TCP to a server that serves the in-memory store."""
    del tmp_path
    timers = FakeTimers()
    backing = MemoryStore(timers)
    server = StoreServer(backing, secret=b"contract-secret")
    port = await server.start("127.0.0.1", 0)
    client = await StoreClient.connect("127.0.0.1", port, secret=b"contract-secret")
    try:
        yield Harness(client, _fake_time(timers), _compact(backing), backing.close)
    finally:
        await client.close()
        await server.close()
        await backing.close()


@contextlib.asynccontextmanager
async def _relayed(tmp_path: object) -> AsyncIterator[Harness]:
    """The embedded store through a relay (``store.embedded.relay``): the client's connection is one of the relay's
    agents, a virtual connection on the server; the store going away reaches the client through the relay."""
    del tmp_path
    timers = FakeTimers()
    backing = MemoryStore(timers)
    server = StoreServer(backing, secret=b"contract-secret")
    port = await server.start("127.0.0.1", 0)
    relay = Relay(b"contract-secret")
    relay_port = await relay.start("127.0.0.1", 0, ("127.0.0.1", port))
    client = await StoreClient.connect("127.0.0.1", relay_port, secret=b"contract-secret")
    try:
        yield Harness(client, _fake_time(timers), _compact(backing), backing.close)
    finally:
        await client.close()
        await relay.close()
        await server.close()
        await backing.close()


@contextlib.asynccontextmanager
async def _etcd(tmp_path: object) -> AsyncIterator[Harness]:
    """A real single-member etcd, its own process, through the gateway client."""
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed (scripts/test installs Debian's etcd-server)")
    with etcd_cluster(tmp_path, 1) as cluster:  # type: ignore[arg-type]
        store = EtcdStore(Gateway(parse_etcd_endpoints(cluster.endpoints), retry_for=1.5))

        async def passes(seconds: float) -> None:
            del seconds  # the wall clock moves by itself; the test waits for the event

        async def shut_down() -> None:
            await asyncio.to_thread(cluster.stop_all)

        try:
            yield Harness(store, passes, store.compact, shut_down, real_time=True)
        finally:
            await store.close()


IMPLEMENTATIONS: dict[str, Callable[[object], contextlib.AbstractAsyncContextManager[Harness]]] = {
    "memory": _memory,
    "embedded": _embedded,
    "relayed": _relayed,
    "etcd": _etcd,
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def run(request: pytest.FixtureRequest, tmp_path: object) -> Callable[[Callable[[Harness], Awaitable[None]]], None]:
    make = IMPLEMENTATIONS[request.param]

    def runner(body: Callable[[Harness], Awaitable[None]]) -> None:
        async def main() -> None:
            async with make(tmp_path) as harness:
                await body(harness)

        asyncio.run(asyncio.wait_for(main(), BOUND))

    return runner


async def _next(events: AsyncIterator[Event], count: int) -> list[Event]:
    return [await anext(events) for _ in range(count)]


def test_put_get_and_revisions(run):
    async def body(h: Harness) -> None:
        s = h.store
        assert await s.get("/a") is None
        r1 = await s.put("/a", b"1")
        r2 = await s.put("/a", b"2")
        assert r2 > r1
        entry = await s.get("/a")
        assert entry is not None
        assert (entry.value, entry.create_revision, entry.mod_revision, entry.lease) == (b"2", r1, r2, 0)

    run(body)


def test_compare_and_set_on_revisions(run):
    async def body(h: Harness) -> None:
        s = h.store
        created = await s.compare_and_set("/k", b"first", revision=0)  # 0: only if absent
        assert created is not None
        assert await s.compare_and_set("/k", b"again", revision=0) is None
        assert await s.compare_and_set("/k", b"stale", revision=created - 1) is None
        updated = await s.compare_and_set("/k", b"second", revision=created)
        assert updated is not None and updated > created
        entry = await s.get("/k")
        assert entry is not None and entry.value == b"second"

    run(body)


def test_delete_and_range_by_prefix(run):
    async def body(h: Harness) -> None:
        s = h.store
        for key in ("/j/nodes/b", "/j/nodes/a", "/j/round", "/other"):
            await s.put(key, key.encode())
        assert await s.delete("/j/round") is True
        assert await s.delete("/j/round") is False
        entries, revision = await s.range("/j/nodes/")
        assert [e.key for e in entries] == ["/j/nodes/a", "/j/nodes/b"]
        assert [e.value for e in entries] == [b"/j/nodes/a", b"/j/nodes/b"]
        other = await s.get("/other")
        assert other is not None and revision == other.mod_revision + 1  # the store's revision: the delete came last
        assert await s.range("/none/") == ([], revision)

    run(body)


def test_binary_values_pass_unchanged(run):
    async def body(h: Harness) -> None:
        value = bytes(range(256)) * 3
        await h.store.put("/bin", value)
        entry = await h.store.get("/bin")
        assert entry is not None and entry.value == value

    run(body)


def test_a_value_as_large_as_rankrun_launch_sends_through_the_store_passes(run):
    """``rankrun.api.values``: a rank's value of up to ``VALUE_LIMIT`` bytes travels as one key (etcd's default
    request limit is 1.5 MiB)."""
    async def body(h: Harness) -> None:
        value = encode(3, "node-with-a-rather-long-host-name.cluster.example/10.0.0.1", bytes(range(256)) * (VALUE_LIMIT // 256))
        await h.store.put("/big", value)
        entry = await h.store.get("/big")
        assert entry is not None and entry.value == value

    run(body)


def test_get_many_reads_each_key_in_order_a_batch_at_a_time(run):
    async def body(h: Harness) -> None:
        for i in range(0, 40, 3):
            await h.store.put(f"/many/{i}", str(i).encode())
        found = await get_many(h.store, [f"/many/{i}" for i in range(40)], at_once=16)
        assert [e.value.decode() if e is not None else None for e in found] == \
            [str(i) if i % 3 == 0 else None for i in range(40)]

    run(body)


def test_requests_made_together_answer_in_order_and_none_is_left_running_when_one_fails(run):
    async def body(h: Harness) -> None:
        s = h.store
        await s.put("/t/a", b"1")
        a, missing, lease = await together(s, s.get("/t/a"), s.get("/t/none"), s.grant(h.ttl(30)))
        assert a is not None and a.value == b"1" and missing is None
        assert (await s.put("/t/leased", b"x", lease=lease.id)) > a.mod_revision  # the lease is a real one
        later, running = asyncio.sleep(BOUND), asyncio.all_tasks()  # a request that would not end by itself
        with pytest.raises(LeaseLost):  # no such lease: the first fails
            await together(s, s.put("/t/b", b"2", lease=0x7FFF1234), later)
        for _ in range(3):
            await asyncio.sleep(0)
        assert later.cr_frame is None  # cancelled, or closed unstarted: neither running nor left to warn unawaited
        assert asyncio.all_tasks() <= running
        with pytest.raises(LeaseLost):  # both fail: the first's error, and nothing said of the second's
            await together(s, s.put("/t/b", b"2", lease=0x7FFF1234), s.put("/t/c", b"3", lease=0x7FFF1235))
        await lease.revoke()

    run(body)


def test_the_embedded_client_sends_requests_made_together_in_one_write(run):
    """Where ``pipelines`` (the embedded client, also through a relay) the frames of requests made together go out in
    one write, the server answers them in one (a round trip, and one read of the host's, for all); elsewhere they are
    one after another."""
    async def body(h: Harness) -> None:
        s = h.store
        if not isinstance(s, StoreClient):
            assert not pipelines(s)
            return
        assert pipelines(s)
        writes = count_writes(s)  # each write still goes out: the harness closes the client as it would
        first, second = await together(s, s.range("/x/"), s.get("/x/a"))
        assert first == ([], first[1]) and second is None
        assert len(writes) == 1 and writes[0].count(b'"op":') == 2

    run(body)


def test_only_the_in_memory_store_answers_in_process(run):
    """``Store.in_process``: a store in this process answers a request in the turn it is made (the coordinator writes a
    round one key after another on it); every networked store waits on the network (it writes a round concurrently)."""
    async def body(h: Harness) -> None:
        assert h.store.in_process is isinstance(h.store, MemoryStore)
        if h.store.in_process:
            put = h.store.put("/p/a", b"1")
            with pytest.raises(StopIteration):  # done without suspending once: nothing in it waits
                put.send(None)

    run(body)


def test_watch_from_a_revision_misses_nothing_and_repeats_nothing(run):
    async def body(h: Harness) -> None:
        s = h.store
        await s.put("/w/x", b"before")
        _, revision = await s.range("/w/")
        await s.put("/w/x", b"after-range")  # between range and watch: must be delivered
        await s.put("/elsewhere", b"no")
        watch = await s.watch("/w/", after=revision)
        try:
            events = watch.__aiter__()
            await s.delete("/w/x")
            await s.put("/w/y", b"live")
            got = await _next(events, 3)
            assert [(e.kind, e.key, e.value) for e in got] == [
                (EventKind.PUT, "/w/x", b"after-range"),
                (EventKind.DELETE, "/w/x", b""),
                (EventKind.PUT, "/w/y", b"live"),
            ]
            assert [e.revision for e in got] == sorted({e.revision for e in got})
        finally:
            await watch.close()

    run(body)


def test_two_watches_each_get_every_event(run):
    async def body(h: Harness) -> None:
        s = h.store
        first, second = await s.watch("/p/", after=0), await s.watch("/p/", after=0)
        try:
            for i in range(50):
                await s.put(f"/p/{i % 5}", str(i).encode())
            for watch in (first, second):
                got = await _next(watch.__aiter__(), 50)
                assert [e.value for e in got] == [str(i).encode() for i in range(50)]
        finally:
            await first.close()
            await second.close()

    run(body)


def test_leased_keys_vanish_when_the_lease_expires(run):
    async def body(h: Harness) -> None:
        s = h.store
        lease = await s.grant(h.ttl(10.0))
        await s.put("/n/mine", b"x", lease=lease.id)
        await s.put("/n/other", b"y")
        _, revision = await s.range("/n/")
        watch = await s.watch("/n/", after=revision)
        try:
            await h.advance(6.0)
            await lease.keep_alive()  # refreshed: the TTL counts from now
            await h.advance(6.0)
            assert await s.get("/n/mine") is not None
            await h.advance(5.0)  # 11 s since the keep-alive
            (gone,) = await _next(watch.__aiter__(), 1)
            assert (gone.kind, gone.key) == (EventKind.DELETE, "/n/mine")
            assert await s.get("/n/mine") is None and await s.get("/n/other") is not None
            await asyncio.wait_for(lease.lost.wait(), BOUND)
            with pytest.raises(LeaseLost):
                await lease.keep_alive()
            with pytest.raises(LeaseLost):
                await s.put("/n/late", b"z", lease=lease.id)
        finally:
            await watch.close()

    run(body)


def test_revoke_deletes_the_keys_at_once(run):
    async def body(h: Harness) -> None:
        s = h.store
        lease = await s.grant(60.0)
        for i in range(3):
            await s.put(f"/r/{i}", b"v", lease=lease.id)
        await s.put("/r/0", b"moved")  # re-put without the lease: no longer the lease's
        await lease.revoke()
        await lease.revoke()  # idempotent
        entries, _ = await s.range("/r/")
        assert [(e.key, e.value) for e in entries] == [("/r/0", b"moved")]
        assert lease.lost.is_set()

    run(body)


def test_watch_from_compacted_history_is_refused(run):
    async def body(h: Harness) -> None:
        revisions = [await h.store.put("/c", str(i).encode()) for i in range(5)]
        await h.compact(revisions[2])
        with pytest.raises(Compacted):
            await h.store.watch("/c", after=revisions[0])
        watch = await h.store.watch("/c", after=revisions[2])
        try:
            got = await _next(watch.__aiter__(), 2)
            assert [e.value for e in got] == [b"3", b"4"]
        finally:
            await watch.close()

    run(body)


def test_a_closed_store_says_so(run):
    async def body(h: Harness) -> None:
        watch = await h.store.watch("/x", after=0)
        await h.shut_down()
        with pytest.raises(StoreUnavailable):
            await anext(watch.__aiter__())
        with pytest.raises(StoreUnavailable):
            await h.store.get("/x")

    run(body)


def test_a_watch_queue_is_read_one_put_at_a_time_and_its_end_is_raised(run):
    """``next_event``: the PUTs of ``watching``'s queue in order, a DELETE passed over unless asked for, and a
    watch's end raised as its ``StoreUnavailable``."""
    async def body(h: Harness) -> None:
        s = h.store
        _, revision = await s.range("/nx/")
        await s.put("/nx/a", b"1")
        await s.delete("/nx/a")
        await s.put("/nx/b", b"2")
        async with watching(s, ["/nx/"], revision) as events:
            assert [(e.kind, e.key, e.value) for e in [await next_event(events), await next_event(events)]] == \
                [(EventKind.PUT, "/nx/a", b"1"), (EventKind.PUT, "/nx/b", b"2")]
        async with watching(s, ["/nx/"], revision) as events:
            assert [(await next_event(events, deletes=True)).kind for _ in range(3)] == \
                [EventKind.PUT, EventKind.DELETE, EventKind.PUT]
            await h.shut_down()
            with pytest.raises(StoreUnavailable):
                await next_event(events)

    run(body)


def _on_etcd(tmp_path: object, body: Callable[[Harness], Awaitable[None]]) -> None:
    """An etcd-only case: ``body`` against a fresh etcd, under the same bound."""

    async def main() -> None:
        async with _etcd(tmp_path) as harness:
            await body(harness)

    asyncio.run(asyncio.wait_for(main(), BOUND))


def test_etcd_fences_a_write_on_who_holds_a_key(tmp_path):
    """``put_if_held``: the elected coordinator's writes land only while it holds the election key."""
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed")

    async def body(h: Harness) -> None:
        s = h.store
        assert isinstance(s, EtcdStore)
        await s.put("/e/coordinator", b"me")
        assert await s.put_if_held("/e/round", b"1", lease=0, holder_key="/e/coordinator", holder=b"me")
        await s.put("/e/coordinator", b"someone else")
        assert not await s.put_if_held("/e/round", b"2", lease=0, holder_key="/e/coordinator", holder=b"me")
        entry = await s.get("/e/round")
        assert entry is not None and entry.value == b"1"

    _on_etcd(tmp_path, body)


def test_a_watch_replays_a_long_history_in_order(run):
    """Many events before the watch starts: they come back in one burst (on etcd, several per HTTP chunk)."""

    async def body(h: Harness) -> None:
        s = h.store
        _, before = await s.range("/h/")
        for i in range(300):
            await s.put(f"/h/{i % 7}", str(i).encode())
        watch = await s.watch("/h/", after=before)
        try:
            got = await _next(watch.__aiter__(), 300)
            assert [e.value for e in got] == [str(i).encode() for i in range(300)]
        finally:
            await watch.close()

    run(body)


def test_etcd_reuses_one_connection_for_calls_one_after_another(tmp_path, monkeypatch):
    """Kept-alive connections carry answer after answer (chunked ones, and error answers with a trailer, included)
    without a new connection each, and no request is ever sent twice."""
    if shutil.which("etcd") is None:
        pytest.skip("etcd is not installed")
    opened: list[object] = []
    sent: list[str] = []
    original_open, original_send = Connection.open, Connection.send

    async def counting(endpoint: object, context: object) -> Connection:
        conn = await original_open(endpoint, context)  # type: ignore[arg-type]
        opened.append(conn)
        return conn

    async def send(self: Connection, path: str, body: bytes, headers: dict[str, str]) -> None:
        sent.append(path)
        await original_send(self, path, body, headers)

    monkeypatch.setattr(Connection, "open", staticmethod(counting))
    monkeypatch.setattr(Connection, "send", send)

    async def body(h: Harness) -> None:
        s = h.store
        assert isinstance(s, EtcdStore)
        lease = await s.grant(30)
        before, sent_before = len(opened), len(sent)
        for i in range(20):
            await lease.keep_alive()  # etcd streams keep-alive answers (chunked)
            await s.put(f"/k/{i}", b"v", lease=lease.id)
            with pytest.raises(EtcdError) as refused:  # an error answer: chunked, with a Grpc-Trailer-* trailer
                await s.gateway.call("/v3/kv/range", {"key": "L2sv", "revision": "1000000"})
            assert refused.value.code == 11  # a future revision (as watch() provokes on purpose)
        assert sent[sent_before:] == ["/v3/lease/keepalive", "/v3/kv/put", "/v3/kv/range"] * 20  # each once
        assert len(opened) == before  # the same connection throughout
        await lease.revoke()

    _on_etcd(tmp_path, body)
