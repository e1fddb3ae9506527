"""Raw-socket probes of rankrun's TCPStore server, byte for byte (no torch needed).

The server runs on its own event loop in a background thread; each test talks to it
through blocking sockets with timeouts. "Still blocked" is checked without sleeping:
a PING sent behind a WAIT must be echoed before anything else arrives.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import socket
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankrun.errors import StoreError
from rankrun.workerstore import keyspace
from rankrun.workerstore.tcpstore import TCPStoreServer
from tcpwire import (
    CANCEL_WAIT,
    CANCELED,
    I64,
    LIST_KEYS,
    NUMKEYS,
    STOP,
    U64,
    add,
    append,
    barrier,
    cas,
    check,
    delete,
    get,
    i64,
    multi_get,
    multi_set,
    ping,
    qlen,
    qpop,
    qpush,
    s,
    set_,
    validate,
    wait,
)

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")
TIMEOUT_S = 5.0
HOST = "127.0.0.1"
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MIB8 = 8 * 1024 * 1024

# -- harness -----------------------------------------------------------------------------


class RawClient:
    """A blocking socket speaking raw bytes to the server, every read bounded."""

    def __init__(self, port: int, *, handshake: bool = True) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if handshake:
            self.send(validate(), ping(b"\x2a\x00\x00\x00"))
            assert self.recv(4) == b"\x2a\x00\x00\x00"

    def send(self, *parts: bytes) -> None:
        self.sock.sendall(b"".join(parts))

    def recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError(f"closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def call(self, request: bytes, reply_len: int) -> bytes:
        self.send(request)
        return self.recv(reply_len)

    def recv_i64(self) -> int:
        value: int = I64.unpack(self.recv(8))[0]
        return value

    def recv_bytes(self) -> bytes:
        return self.recv(U64.unpack(self.recv(8))[0])

    def assert_quiet(self) -> None:
        """Nothing is queued for us (e.g. a WAIT is still blocked): a PING echoes first."""
        assert self.call(ping(b"\x7fQT\x01"), 4) == b"\x7fQT\x01"

    def assert_closed(self) -> None:
        try:
            data = self.sock.recv(1)
        except ConnectionResetError:
            return
        assert data == b"", f"expected a closed connection, got {data!r}"

    def close(self) -> None:
        self.sock.close()


class ServedStore:
    """A TCPStoreServer on 127.0.0.1:0, run by an event loop in a background thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop_errors: list[dict[str, Any]] = []
        self.loop.set_exception_handler(lambda _loop, context: self.loop_errors.append(context))
        self.log_errors = _ErrorRecords()
        logging.getLogger("rankrun.workerstore.tcpstore").addHandler(self.log_errors)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = TCPStoreServer()
        self.port = self.run(self.server.start(HOST, 0))
        self._clients: list[RawClient] = []

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT_S)

    def snapshot(self) -> dict[bytes, bytes]:
        async def snap() -> dict[bytes, bytes]:
            return self.server.snapshot()

        return self.run(snap())

    def client(self, *, handshake: bool = True) -> RawClient:
        c = RawClient(self.port, handshake=handshake)
        self._clients.append(c)
        return c

    def stop(self) -> None:
        try:
            for c in self._clients:
                c.close()
            self.run(self.server.close())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(TIMEOUT_S)
            assert not self.thread.is_alive()
            self.loop.close()
            logging.getLogger("rankrun.workerstore.tcpstore").removeHandler(self.log_errors)
        assert self.loop_errors == [], "the event loop reported errors"
        assert self.log_errors.records == [], "the server logged errors"


class _ErrorRecords(logging.Handler):
    """Collects ERROR records (a server bug shows up as logger.exception)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def store() -> Iterator[ServedStore]:
    served = ServedStore()
    try:
        yield served
    finally:
        served.stop()


# -- handshake ---------------------------------------------------------------------------


def test_handshake_echoes_ping_nonce(store: ServedStore) -> None:
    c = store.client(handshake=False)
    assert c.call(validate() + ping(b"\x3f\x0b\x00\x00"), 4) == b"\x3f\x0b\x00\x00"


def test_handshake_split_into_single_bytes(store: ServedStore) -> None:
    c = store.client(handshake=False)
    for byte in validate() + ping(b"\x01\x02\x03\x04"):
        c.send(bytes([byte]))
    assert c.recv(4) == b"\x01\x02\x03\x04"


def test_validate_without_ping_is_accepted(store: ServedStore) -> None:
    c = store.client(handshake=False)
    assert c.call(validate() + get(b"k"), 8) == U64.pack(0)


def test_pipelined_pings_echo_in_order(store: ServedStore) -> None:
    c = store.client()
    c.send(ping(b"AAAA"), ping(b"BBBB"), ping(b"CCCC"))
    assert c.recv(12) == b"AAAABBBBCCCC"


@pytest.mark.parametrize(
    "first",
    [validate(0x3C85F7CF), set_(b"/k", b"v"), ping(b"\x01\x02\x03\x04"), b"\x13"],
    ids=["bad-magic", "set-first", "ping-first", "unknown-first"],
)
def test_bad_handshake_closes(store: ServedStore, first: bytes) -> None:
    c = store.client(handshake=False)
    c.send(first)
    c.assert_closed()
    store.client().assert_quiet()


def test_bad_magic_on_later_validate_closes(store: ServedStore) -> None:
    c = store.client()
    c.send(validate(0x12345678))
    c.assert_closed()


# -- reply layouts -----------------------------------------------------------------------

LAYOUTS: list[tuple[str, list[bytes], bytes, bytes]] = [
    # (id, setup requests without replies, request, exact reply)
    ("get-missing-is-empty", [], get(b"/x"), s(b"")),
    ("set-get", [set_(b"/k", b"v\x00w")], get(b"/k"), s(b"v\x00w")),
    ("set-empty-value", [set_(b"/k", b"")], check(b"/k"), b"\x00"),
    ("set-overwrites", [set_(b"/k", b"a"), set_(b"/k", b"bb")], get(b"/k"), s(b"bb")),
    ("add-missing", [], add(b"/n", 5), i64(5)),
    ("add-negative", [set_(b"/n", b"3")], add(b"/n", -7), i64(-4)),
    ("check-empty-list", [], check(), b"\x00"),
    ("check-missing", [set_(b"/a", b"1")], check(b"/a", b"/b"), b"\x01"),
    ("check-present", [set_(b"/a", b"1"), set_(b"/b", b"")], check(b"/a", b"/b"), b"\x00"),
    ("wait-empty-list", [], wait(), b"\x00"),
    ("wait-present", [set_(b"/a", b"1")], wait(b"/a", b"/a"), b"\x00"),
    ("numkeys-empty", [], NUMKEYS, i64(0)),
    ("numkeys-no-queues", [set_(b"/a", b""), qpush(b"q", b"x")], NUMKEYS, i64(1)),
    ("delete-present", [set_(b"/a", b"1")], delete(b"/a") + check(b"/a"), i64(1) + b"\x01"),
    ("delete-missing", [], delete(b"/a"), i64(0)),
    ("append-creates", [append(b"/a", b"x")], get(b"/a"), s(b"x")),
    ("append-extends", [set_(b"/a", b"x"), append(b"/a", b"yz")], get(b"/a"), s(b"xyz")),
    (
        "multi-get-no-count",
        [set_(b"/a", b"1"), set_(b"/b", b"22")],
        multi_get(b"/a", b"/zz", b"/b"),
        s(b"1") + s(b"") + s(b"22"),
    ),
    ("multi-get-empty", [], multi_get() + ping(b"PPPP"), b"PPPP"),
    (
        "multi-set",
        [multi_set((b"/a", b"1"), (b"/b", b"2"))],
        multi_get(b"/a", b"/b"),
        s(b"1") + s(b"2"),
    ),
    ("cancel-wait-idle", [], CANCEL_WAIT, CANCELED),
    ("list-keys-empty", [], LIST_KEYS, i64(0)),
    ("list-keys-raw", [set_(b"/a", b"1")], LIST_KEYS, i64(1) + s(b"/a")),
    ("queue-len-missing", [], qlen(b"q"), i64(0)),
    ("queue-pop-empty", [], qpop(b"q"), i64(0)),
    (
        "queue-fifo",
        [qpush(b"q", b"a"), qpush(b"q", b"bb")],
        qlen(b"q") + qpop(b"q") + qpop(b"q") + qpop(b"q"),
        i64(2) + i64(2) + s(b"a") + i64(1) + s(b"bb") + i64(0),
    ),
    ("check-nonempty-queue", [qpush(b"q", b"a")], check(b"q"), b"\x00"),
    ("wait-nonempty-queue", [qpush(b"q", b"a")], wait(b"q"), b"\x00"),
    ("barrier-of-one", [], barrier(b"/bar", 1) + get(b"/bar"), b"\x00" + s(b"1")),
    ("barrier-size-zero", [], barrier(b"/bar", 0), b"\x00"),
    # COMPARE_SET, all four cases of §3.4
    ("cas-missing-empty-expected", [], cas(b"/c", b"", b"new") + get(b"/c"), s(b"new") * 2),
    (
        "cas-missing-nonempty-expected-lies",
        [],
        cas(b"/c", b"old", b"new") + check(b"/c"),
        s(b"old") + b"\x01",
    ),
    ("cas-match", [set_(b"/c", b"old")], cas(b"/c", b"old", b"new") + get(b"/c"), s(b"new") * 2),
    (
        "cas-mismatch",
        [set_(b"/c", b"cur")],
        cas(b"/c", b"old", b"new") + get(b"/c"),
        s(b"cur") * 2,
    ),
]


@pytest.mark.parametrize(
    ("setup", "request_", "reply"),
    [pytest.param(setup, req, rep, id=name) for name, setup, req, rep in LAYOUTS],
)
def test_reply_layout(store: ServedStore, setup: list[bytes], request_: bytes, reply: bytes) -> None:
    c = store.client()
    c.send(*setup)
    assert c.call(request_, len(reply)) == reply
    c.assert_quiet()


def test_list_keys_and_numkeys_count_raw_keys(store: ServedStore) -> None:
    c = store.client()
    c.send(add(b"init/", 1), set_(b"/a", b"1"), barrier(b"/b", 1))
    assert c.recv(9) == i64(1) + STOP
    assert c.call(NUMKEYS, 8) == i64(3)
    c.send(LIST_KEYS)
    keys = {c.recv_bytes() for _ in range(c.recv_i64())}
    assert keys == {b"init/", b"/a", b"/b"}
    assert store.snapshot() == {b"init/": b"1", b"/a": b"1", b"/b": b"1"}


# -- ADD parsing (strtoll-like, int64 wrap) ----------------------------------------------

ADD_CASES: list[tuple[bytes, int, int | None]] = [
    # (stored text, delta, new value or None = connection closed)
    (b"12abc", 1, 13),
    (b"1_0", 1, 2),
    (b" \t\n-5", 1, -4),
    (b"+7", 1, 8),
    (b"0x10", 1, 1),
    (b"007", 0, 7),
    (str(INT64_MAX).encode(), 1, INT64_MIN),
    (str(INT64_MIN).encode(), -1, INT64_MAX),
    (b"abc", 1, None),
    (b"", 1, None),
    (b"-", 1, None),
    (b" ", 1, None),
    (b"\x00" + b"5", 1, None),
    (b"9223372036854775808", 1, None),
    (b"-9223372036854775809", 1, None),
]


@pytest.mark.parametrize(("stored", "delta", "result"), ADD_CASES)
def test_add_parses_like_strtoll(store: ServedStore, stored: bytes, delta: int, result: int | None) -> None:
    c = store.client()
    c.send(set_(b"/n", stored), add(b"/n", delta))
    if result is None:
        c.assert_closed()
        assert store.snapshot()[b"/n"] == stored
        return
    assert c.recv_i64() == result
    assert c.call(get(b"/n"), 8 + len(str(result))) == s(str(result).encode())


def _libc_strtoll() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        pytest.skip("no libc to compare against")
    libc = ctypes.CDLL(name, use_errno=True)
    libc.strtoll.restype = ctypes.c_longlong
    libc.strtoll.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int]
    return libc.strtoll


@settings(database=None, deadline=None)
@given(st.binary(max_size=24) | st.from_regex(rb"\A[ \t+-]{0,3}[0-9]{0,21}[a-z_ ]?\Z"))
def test_parse_int_matches_libc_strtoll(text: bytes) -> None:
    strtoll = _libc_strtoll()
    end = ctypes.c_char_p()
    ctypes.set_errno(0)
    buf = ctypes.create_string_buffer(text)
    value = strtoll(buf, ctypes.byref(end), 10)
    consumed = ctypes.cast(end, ctypes.c_void_p).value != ctypes.addressof(buf)
    expected = value if consumed and ctypes.get_errno() == 0 else None
    assert keyspace.parse_int(text) == expected


# -- unknown codes and size limits -------------------------------------------------------


@pytest.mark.parametrize("code", [19, 0x7F, 0xFF])
def test_unknown_code_closes_only_that_connection(store: ServedStore, code: int) -> None:
    other = store.client()
    other.send(set_(b"/k", b"v"))
    bad = store.client()
    bad.send(bytes([code]))
    bad.assert_closed()
    assert other.call(get(b"/k"), 9) == s(b"v")


LIMIT_CASES: list[tuple[str, bytes, bool]] = [
    # (id, request, accepted); rejected requests need only their length fields
    ("key-8192", set_(b"k" * 8192, b"v"), True),
    ("key-8193", b"\x01" + U64.pack(8193) + b"k" * 8193, False),
    ("keylist-key-8193", b"\x05" + U64.pack(1) + U64.pack(8193), False),
    ("value-8MiB", set_(b"/k", b"v" * MIB8), True),
    ("value-8MiB+1", b"\x01" + s(b"/k") + U64.pack(MIB8 + 1), False),
    ("cas-desired-8MiB+1", b"\x02" + s(b"/k") + s(b"") + U64.pack(MIB8 + 1), False),
    ("queue-value-8MiB+1", b"\x0e" + s(b"q") + U64.pack(MIB8 + 1), False),
    ("keylist-131072", check(*[b"k"] * 131072), True),
    ("keylist-131073", b"\x05" + U64.pack(131073), False),
    ("multi-set-131073", b"\x0b" + U64.pack(131073), False),
    ("multi-get-131073", b"\x0a" + U64.pack(131073), False),
]


@pytest.mark.parametrize(
    ("request_", "accepted"),
    [pytest.param(req, ok, id=name) for name, req, ok in LIMIT_CASES],
)
def test_size_limits(store: ServedStore, request_: bytes, accepted: bool) -> None:
    c = store.client()
    c.send(request_)
    if not accepted:
        c.assert_closed()
        return
    reply_len = 1 if request_[0] == 5 else 0
    c.recv(reply_len)
    c.assert_quiet()


# -- WAIT --------------------------------------------------------------------------------

WAKERS: list[tuple[str, bytes, int]] = [
    # (id, request that creates /k, its reply length)
    ("set", set_(b"/k", b"v"), 0),
    ("add", add(b"/k", 1), 8),
    ("append", append(b"/k", b"v"), 0),
    ("multi-set", multi_set((b"/z", b"1"), (b"/k", b"v")), 0),
    ("compare-set", cas(b"/k", b"", b"v"), 9),
    ("barrier", barrier(b"/k", 5), 0),
]


@pytest.mark.parametrize(
    ("waker", "reply_len"),
    [pytest.param(req, n, id=name) for name, req, n in WAKERS],
)
def test_wait_is_woken_by(store: ServedStore, waker: bytes, reply_len: int) -> None:
    waiter, writer = store.client(), store.client()
    waiter.send(wait(b"/k"))
    waiter.assert_quiet()
    writer.send(waker)
    writer.recv(reply_len)
    assert waiter.recv(1) == STOP
    waiter.assert_quiet()


NON_WAKERS: list[tuple[str, bytes, bytes]] = [
    # (id, request that leaves /k missing, its exact reply)
    ("delete", delete(b"/k"), i64(0)),
    ("cas-missing-nonempty-expected", cas(b"/k", b"expected", b"v"), s(b"expected")),
    ("other-key", set_(b"/other", b"v"), b""),
    ("queue-pop", qpop(b"/k"), i64(0)),
    ("get", get(b"/k"), s(b"")),
]


@pytest.mark.parametrize(
    ("non_waker", "reply"),
    [pytest.param(req, rep, id=name) for name, req, rep in NON_WAKERS],
)
def test_wait_is_not_woken_by(store: ServedStore, non_waker: bytes, reply: bytes) -> None:
    waiter, writer = store.client(), store.client()
    waiter.send(wait(b"/k"))
    waiter.assert_quiet()  # the WAIT is registered
    assert writer.call(non_waker, len(reply)) == reply
    writer.assert_quiet()  # the server has handled non_waker
    waiter.assert_quiet()


def test_multi_key_wait_needs_every_key(store: ServedStore) -> None:
    waiter, writer = store.client(), store.client()
    writer.send(set_(b"/a", b"1"))
    waiter.send(wait(b"/a", b"/b", b"/c"))
    writer.send(set_(b"/b", b"1"))
    writer.assert_quiet()
    waiter.assert_quiet()
    writer.send(set_(b"/c", b"1"))
    assert waiter.recv(1) == STOP


def test_duplicate_key_wait_is_woken_by_one_set(store: ServedStore) -> None:
    waiter, writer = store.client(), store.client()
    waiter.send(wait(b"/k", b"/k"))
    waiter.assert_quiet()
    writer.send(set_(b"/k", b"v"))
    assert waiter.recv(1) == STOP


def test_set_wakes_every_waiter(store: ServedStore) -> None:
    waiters = [store.client() for _ in range(3)]
    for w in waiters:
        w.send(wait(b"/k"))
        w.assert_quiet()
    store.client().send(set_(b"/k", b"v"))
    assert [w.recv(1) for w in waiters] == [STOP] * 3


def test_cancel_wait_forgets_the_wait(store: ServedStore) -> None:
    waiter, writer = store.client(), store.client()
    waiter.send(wait(b"/k"))
    assert waiter.call(CANCEL_WAIT, 1) == CANCELED
    writer.send(set_(b"/k", b"v"))
    writer.assert_quiet()
    waiter.assert_quiet()
    assert waiter.call(wait(b"/k"), 1) == STOP  # the connection is reusable


def test_cancel_wait_after_wake_replies_00_then_01(store: ServedStore) -> None:
    waiter, writer = store.client(), store.client()
    waiter.send(wait(b"/k"))
    waiter.assert_quiet()
    writer.send(set_(b"/k", b"v"))
    writer.assert_quiet()  # the wake-up has been written before we "time out"
    waiter.send(CANCEL_WAIT)
    assert waiter.recv(2) == STOP + CANCELED
    waiter.assert_quiet()


def test_second_wait_while_pending_closes(store: ServedStore) -> None:
    c = store.client()
    c.send(wait(b"/a"), wait(b"/b"))
    c.assert_closed()


def test_disconnect_while_waiting_leaves_server_healthy(store: ServedStore) -> None:
    gone, other, writer = store.client(), store.client(), store.client()
    gone.send(wait(b"/k"))
    gone.assert_quiet()
    gone.close()
    other.send(wait(b"/k"))
    other.assert_quiet()
    writer.send(set_(b"/k", b"v"))
    assert other.recv(1) == STOP
    assert writer.call(get(b"/k"), 9) == s(b"v")


# -- BARRIER -----------------------------------------------------------------------------


def test_barrier_two_parties_and_reuse(store: ServedStore) -> None:
    a, b, late = store.client(), store.client(), store.client()
    a.send(barrier(b"/bar", 2))
    a.assert_quiet()
    assert b.call(barrier(b"/bar", 2), 1) == STOP
    assert a.recv(1) == STOP
    assert late.call(barrier(b"/bar", 2) + get(b"/bar"), 10) == STOP + s(b"3")


def test_barrier_arrival_survives_cancel(store: ServedStore) -> None:
    a, b = store.client(), store.client()
    a.send(barrier(b"/bar", 2))
    assert a.call(CANCEL_WAIT, 1) == CANCELED
    assert b.call(barrier(b"/bar", 2), 1) == STOP
    a.assert_quiet()


def test_barrier_counter_is_a_plain_key(store: ServedStore) -> None:
    a, b = store.client(), store.client()
    a.send(barrier(b"/bar", 3))
    a.assert_quiet()
    assert b.call(add(b"/bar", 1), 8) == i64(2)
    a.assert_quiet()
    b.send(set_(b"/bar", b"3"))
    assert a.recv(1) == STOP


def test_barrier_on_non_integer_counter_closes(store: ServedStore) -> None:
    c = store.client()
    c.send(set_(b"/bar", b"x"), barrier(b"/bar", 2))
    c.assert_closed()


# -- queues ------------------------------------------------------------------------------


def test_queue_push_wakes_one_waiter_in_order(store: ServedStore) -> None:
    first, second, pusher = store.client(), store.client(), store.client()
    first.send(wait(b"q"))
    first.assert_quiet()
    second.send(wait(b"q"))
    second.assert_quiet()
    pusher.send(qpush(b"q", b"1"))
    assert first.recv(1) == STOP
    second.assert_quiet()
    pusher.send(qpush(b"q", b"2"))
    assert second.recv(1) == STOP
    assert first.call(qpop(b"q"), 17) == i64(2) + s(b"1")


# -- lifecycle ---------------------------------------------------------------------------


def test_reset_closes_connections_and_empties_keys(store: ServedStore) -> None:
    old, blocked = store.client(), store.client()
    old.send(add(b"init/", 1), set_(b"/k", b"v"), qpush(b"q", b"x"))
    assert old.recv_i64() == 1
    blocked.send(wait(b"/never"))
    blocked.assert_quiet()
    store.run(store.server.reset())
    old.assert_closed()
    blocked.assert_closed()
    assert store.snapshot() == {}
    fresh = store.client()
    assert fresh.call(NUMKEYS + qlen(b"q") + check(b"/k"), 17) == i64(0) * 2 + b"\x01"
    fresh.send(set_(b"/never", b"v"))
    fresh.assert_quiet()
    assert store.server.port == store.port


def test_accepted_sockets_have_nodelay_and_keepalive(store: ServedStore) -> None:
    store.client()

    async def options() -> list[tuple[int, int]]:
        found = []
        for conn in store.server._connections:
            sock = conn._transport.get_extra_info("socket")
            nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            keepalive = sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
            found.append((nodelay, keepalive))
        return found

    assert [(bool(n), bool(k)) for n, k in store.run(options())] == [(True, True)]


def test_concurrent_adds_are_exact(store: ServedStore) -> None:
    clients = [store.client() for _ in range(10)]

    def hammer(c: RawClient) -> None:
        for _ in range(100):
            c.call(add(b"/n", 1), 8)

    threads = [threading.Thread(target=hammer, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 4)
    assert store.snapshot()[b"/n"] == b"1000"


def test_start_on_busy_port_raises_store_error() -> None:
    with socket.socket() as busy:
        busy.bind((HOST, 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = TCPStoreServer()
        with pytest.raises(StoreError, match=rf"^cannot listen on 127\.0\.0\.1:{port}: "):
            asyncio.run(server.start(HOST, port))


def test_close_is_idempotent_and_frees_the_port() -> None:
    async def scenario() -> None:
        server = TCPStoreServer()
        port = await server.start(HOST, 0)
        assert server.port == port
        await server.close()
        await server.close()
        with pytest.raises(RuntimeError):
            await server.start(HOST, 0)
        again = TCPStoreServer()
        assert await again.start(HOST, port) == port
        await again.close()

    asyncio.run(scenario())


def test_port_before_start_raises() -> None:
    with pytest.raises(RuntimeError):
        _ = TCPStoreServer().port


def test_port_zero_on_several_addresses_shares_one_port() -> None:
    """Host "" resolves to :: and 0.0.0.0; workers get one MASTER_PORT, so both must match."""

    async def scenario() -> set[int]:
        server = TCPStoreServer()
        try:
            await server.start("", 0)
            assert server._server is not None
            return {sock.getsockname()[1] for sock in server._server.sockets}
        finally:
            await server.close()

    assert len(asyncio.run(scenario())) == 1
