"""The worker store's incremental parser behind real sockets: bursts, large values, backpressure, drops and resets.

Through the real server (``ServedStore`` from the protocol probes), synchronised on replies, never on sleeps.
The same parser on a fake transport, split at every byte, is ``tests/unit/test_tcpstore_parser.py``.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest
from test_tcpstore_protocol import RawClient, ServedStore

from rankrun.workerstore.queries import MAX_VALUE_LEN
from tcpwire import NUMKEYS, U64, add, check, get, i64, ping, s, set_

pytestmark = pytest.mark.timeout(120)

# -- the real server over sockets ---------------------------------------------------------


@pytest.fixture
def store() -> Iterator[ServedStore]:
    served = ServedStore()
    try:
        yield served
    finally:
        served.stop()


def test_socket_pipelined_burst(store: ServedStore) -> None:
    c = store.client()
    c.send(b"".join(add(b"/n", 1) for _ in range(2000)))
    assert c.recv(8 * 2000) == b"".join(i64(n) for n in range(1, 2001))


def test_socket_large_value_in_client_sized_segments(store: ServedStore) -> None:
    c = store.client()
    value = b"0123456789abcdef" * (MAX_VALUE_LEN // 16)
    request = set_(b"/big", value)
    for at in range(0, len(request), 1440):
        c.send(request[at : at + 1440])
    c.send(get(b"/big"))
    assert c.recv_bytes() == value
    c.assert_quiet()


def test_socket_reply_backpressure(store: ServedStore) -> None:
    """64 GETs of 1 MiB without reading: the server pauses, then every reply arrives, in order."""
    c = store.client()
    value = b"x" * (1024 * 1024)
    c.send(set_(b"/v", value))
    c.send(b"".join(get(b"/v") + ping(b"%04d" % i) for i in range(64)))
    for i in range(64):
        assert c.recv_bytes() == value
        assert c.recv(4) == b"%04d" % i


@pytest.mark.parametrize("cut", [1, 5, 9, 12, 20])
def test_socket_drop_mid_request(store: ServedStore, cut: int) -> None:
    gone = store.client()
    gone.send(set_(b"/k", b"value")[:cut])
    gone.sock.shutdown(socket.SHUT_WR)  # EOF behind a partial request
    gone.assert_closed()
    gone.close()
    other = store.client()
    assert other.call(check(b"/k") + NUMKEYS, 9) == b"\x01" + i64(0)


def test_socket_drop_mid_large_value(store: ServedStore) -> None:
    gone = store.client()
    gone.send(b"\x01" + s(b"/big") + U64.pack(MAX_VALUE_LEN) + b"x" * 100_000)
    gone.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    gone.close()  # RST
    other = store.client()
    assert other.call(check(b"/big"), 1) == b"\x01"
    assert store.run(_connections(store)) == 1  # only `other` is left


async def _connections(store: ServedStore) -> int:
    return len(store.server._connections)


def test_socket_reset_while_a_request_is_half_sent(store: ServedStore) -> None:
    old = store.client()
    request = set_(b"/stale", b"v" * 1000)
    old.send(request[:500])
    store.run(store.server.reset())
    old.assert_closed()
    fresh = store.client()
    assert fresh.call(check(b"/stale"), 1) == b"\x01"
    assert store.snapshot() == {}


def test_socket_many_clients_pipelining_concurrently(store: ServedStore) -> None:
    clients = [store.client() for _ in range(16)]
    errors: list[BaseException] = []

    def hammer(c: RawClient, n: int) -> None:
        try:
            for burst in range(20):
                c.send(b"".join(add(b"/total", 1) + add(b"/c%d" % n, 1) for _ in range(25)))
                replies = c.recv(16 * 25)
                own = [struct.unpack_from("<q", replies, 16 * i + 8)[0] for i in range(25)]
                assert own == list(range(burst * 25 + 1, burst * 25 + 26))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(c, n)) for n, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert store.snapshot()[b"/total"] == b"%d" % (16 * 20 * 25)
