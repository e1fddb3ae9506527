"""The workers' store's raw protocol suite (``test_tcpstore_protocol``), run again through a store relay.

Every test of that module that speaks to the store through sockets runs here with its clients connected to a
``StoreRelay`` whose one multiplexed connection reaches the host's ``StoreRelayHost`` (the same ``TCPStoreServer``): the
replies must be byte for byte the same. Then what only a relay has: coalescing (8 local waiters on one key cost the
host one WAIT and one GET), a waiter that cancels or disconnects while others keep waiting, reset() following through
the relay, the host refusing a relay without the job's secret, and the relay's clients dropped with its connection.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import test_tcpstore_protocol as suite
from test_tcpstore_protocol import RawClient, ServedStore

from rankrun.errors import StoreError
from rankrun.workerstore import tcpstore
from rankrun.workerstore.keyspace import Keyspace
from rankrun.workerstore.relay import StoreRelay
from rankrun.workerstore.relayhost import StoreRelayHost
from tcpwire import CANCEL_WAIT, CANCELED, STOP, get, i64, qlen, qpush, s, set_, wait

pytestmark = pytest.mark.timeout(60)

HOST = suite.HOST
SECRET = b"the job's secret"

# not about the bytes a client sees: socket options of the host's own sockets, binding the store's listener, the
# store's own port (the reset test's last line; test_reset_closes_the_relays_clients_... below is its relayed twin)
_NOT_RELAYED = {"test_reset_closes_connections_and_empties_keys", "test_accepted_sockets_have_nodelay_and_keepalive", "test_start_on_busy_port_raises_store_error",
                "test_close_is_idempotent_and_frees_the_port", "test_port_before_start_raises",
                "test_port_zero_on_several_addresses_shares_one_port", "test_parse_int_matches_libc_strtoll"}
for _name in dir(suite):
    if _name.startswith("test_") and _name not in _NOT_RELAYED:
        globals()[_name] = getattr(suite, _name)


class RelayedStore(ServedStore):
    """The store, its relay host on a port of its own, and a relay in front of it: clients reach the relay."""

    def __init__(self, *, secret: bytes | None = SECRET) -> None:
        super().__init__()
        self.host = StoreRelayHost(self.server, secret)
        self.relay_port = self.run(self.host.start(HOST, 0))
        self.relay = StoreRelay((HOST, self.relay_port), secret, bind=HOST)
        self.store_port = self.port
        self.port = self.run(self.relay.start(HOST, 0))  # what every client of the suite connects to

    def stop(self) -> None:
        try:
            self.run(self.relay.close())
            self.run(self.host.close())
        finally:
            super().stop()


@pytest.fixture
def store() -> Iterator[ServedStore]:
    served = RelayedStore()
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many WAITs the host's keyspace registered (a client's, or a shared wait's)."""
    counts = {"wait": 0}
    for name in ("wait", "enqueue"):
        original = getattr(Keyspace, name)

        def counting(self: Keyspace, *args: object, _original: object = original, **kwargs: object) -> object:
            counts["wait"] += 1
            return _original(self, *args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(Keyspace, name, counting)
    return counts


def _gets(store: RelayedStore) -> int:
    return store.relay.stats.shared


def test_eight_waiters_on_one_key_cost_the_host_one_wait_and_one_get(store: RelayedStore, counted: dict[str, int],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    gets = [0]
    original = tcpstore._HANDLERS[3]

    def counting_get(connection: object, *args: object) -> int:
        gets[0] += 1
        return original(connection, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(tcpstore, "_HANDLERS", (*tcpstore._HANDLERS[:3], counting_get, *tcpstore._HANDLERS[4:]))
    waiters = [store.client() for _ in range(8)]
    for w in waiters:
        w.send(wait(b"/id"))
    for w in waiters:
        w.assert_quiet()  # every WAIT has joined the shared one (the PING behind it went upstream and back)
    writer = store.client()
    writer.send(set_(b"/id", b"unique-id"))
    assert [w.recv(1) for w in waiters] == [STOP] * 8
    assert counted["wait"] == 1

    async def host_reads(reading: bool) -> None:
        for link in store.host.links:
            assert link._transport is not None
            (link._transport.resume_reading if reading else link._transport.pause_reading)()

    # the eight GET at once, as ranks woken together do; the host reads nothing meanwhile, so all join the first
    store.run(host_reads(False))
    for w in waiters:
        w.send(get(b"/id"))
    stats = store.relay.stats

    async def settled() -> bool:
        return stats.shared + stats.coalesced == 16

    for _ in range(10_000):  # bounded: until the relay has read every GET (its counters are the event)
        if store.run(settled()):
            break
    store.run(host_reads(True))
    assert [w.recv(17) for w in waiters] == [s(b"unique-id")] * 8
    assert (stats.shared, stats.coalesced) == (2, 14)  # one WAIT and one GET upstream
    assert gets[0] == 1  # the host served one GET for the eight


def test_a_waiter_that_cancels_leaves_the_others_waiting(store: RelayedStore, counted: dict[str, int]) -> None:
    a, b, writer = store.client(), store.client(), store.client()
    a.send(wait(b"/k"))
    b.send(wait(b"/k"))
    a.assert_quiet()
    b.assert_quiet()
    assert a.call(CANCEL_WAIT, 1) == CANCELED
    writer.send(set_(b"/k", b"v"))
    assert b.recv(1) == STOP
    a.assert_quiet()  # nothing more for the one that canceled
    assert a.call(wait(b"/k"), 1) == STOP  # its connection is reusable
    assert counted["wait"] == 2


def test_a_waiter_that_disconnects_leaves_the_others_waiting(store: RelayedStore) -> None:
    gone, stays, writer = store.client(), store.client(), store.client()
    gone.send(wait(b"/k"))
    stays.send(wait(b"/k"))
    gone.assert_quiet()
    stays.assert_quiet()
    gone.close()
    writer.send(set_(b"/k", b"v"))
    assert stays.recv(1) == STOP
    assert writer.call(get(b"/k"), 9) == s(b"v")


def test_the_last_waiter_gone_cancels_the_wait_upstream(store: RelayedStore) -> None:
    a = store.client()
    a.send(wait(b"/k"))
    a.assert_quiet()
    assert a.call(CANCEL_WAIT, 1) == CANCELED

    async def pending() -> int:
        keyspace = store.server._keyspace
        return sum(len(v) for v in getattr(keyspace, "_waiters", {}).values()) if hasattr(keyspace, "_waiters") else -1

    b = store.client()
    b.assert_quiet()  # the CANCEL_WAIT went upstream before b's PING came back
    assert store.run(pending()) in (0, -1)
    writer = store.client()
    writer.send(set_(b"/k", b"v"))
    a.assert_quiet()


def test_reset_closes_the_relays_clients_and_the_relay_serves_the_next_attempt(store: RelayedStore) -> None:
    old, waiting = store.client(), store.client()
    old.send(set_(b"/k", b"v"))
    old.assert_quiet()
    waiting.send(wait(b"/never"))  # a coalesced WAIT, on the relay's own connection
    waiting.assert_quiet()
    store.run(store.server.reset())
    old.assert_closed()
    waiting.assert_closed()
    fresh = store.client()
    assert fresh.call(get(b"/k"), 8) == s(b"")
    fresh.send(set_(b"/never", b"x"))
    fresh.assert_quiet()


def test_a_relay_without_the_secret_is_refused() -> None:
    served = ServedStore()
    try:
        host = StoreRelayHost(served.server, SECRET)
        port = served.run(host.start(HOST, 0))
        for secret, why in ((b"another secret", "refused this relay"), (None, "has a job secret and this node none")):
            relay = StoreRelay((HOST, port), secret)
            with pytest.raises(StoreError, match=why):
                served.run(relay.start(HOST, 0))
            served.run(relay.close())
        served.run(host.close())
    finally:
        served.stop()


def test_the_hosts_close_drops_the_relays_clients(store: RelayedStore) -> None:
    c = store.client()
    c.send(wait(b"/never"))
    c.assert_quiet()
    store.run(store.host.close())
    c.assert_closed()


def test_many_clients_through_one_relay_add_exactly(store: RelayedStore) -> None:
    clients: list[RawClient] = [store.client() for _ in range(50)]

    def hammer(c: RawClient) -> None:
        for _ in range(20):
            c.call(b"\x04" + s(b"/n") + (1).to_bytes(8, "little"), 8)

    threads = [threading.Thread(target=hammer, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert store.snapshot()[b"/n"] == b"1000"
    assert len(store.host.links) == 1



def test_a_lost_link_closes_the_relays_clients_and_the_next_client_reconnects(store: RelayedStore) -> None:
    old = store.client()
    old.send(set_(b"/k", b"v"))
    old.assert_quiet()
    lost: list[str] = []
    store.relay.on_lost = lost.append

    async def cut() -> None:
        for link in list(store.host.links):
            assert link._transport is not None
            link._transport.abort()  # the network between the node and the host fails

    store.run(cut())
    old.assert_closed()  # as a store that went away
    fresh = store.client()  # the relay connects again for it
    assert fresh.call(get(b"/k"), 9) == s(b"v")  # the same store: the keys are still there
    assert len(lost) == 1 and "was lost" in lost[0]


def test_queue_pushes_release_shared_and_direct_waiters_in_arrival_order(store: RelayedStore, counted: dict[str, int]) -> None:
    """Two relayed waiters share one wait; a direct client's WAIT came between theirs: each push releases the oldest."""
    a, b = store.client(), store.client()
    direct = RawClient(store.store_port)
    pusher = RawClient(store.store_port)
    try:
        a.send(wait(b"q"))
        a.assert_quiet()  # its JOIN reached the host before its PING did
        direct.send(wait(b"q"))
        direct.assert_quiet()
        b.send(wait(b"q"))
        b.assert_quiet()
        assert store.relay.stats.coalesced == 1  # b joined a's shared wait
        pusher.send(qpush(b"q", b"1"))
        assert a.recv(1) == STOP
        direct.assert_quiet()
        b.assert_quiet()
        pusher.send(qpush(b"q", b"2"))
        assert direct.recv(1) == STOP
        b.assert_quiet()
        pusher.send(qpush(b"q", b"3"))
        assert b.recv(1) == STOP
        assert pusher.call(qlen(b"q"), 8) == i64(3)  # nobody popped: the three values are still there
    finally:
        direct.close()
        pusher.close()
