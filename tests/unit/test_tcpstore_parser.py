"""The worker store's incremental parser on a fake transport: requests cut anywhere, pipelined, huge, or reset mid-way.

Each test drives one connection object directly (``get_buffer`` / ``buffer_updated``, as the event loop
does) with a recording fake transport, so every split point really is a separate read. The same parser
behind real sockets is ``tests/integration/test_tcpstore_sockets.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankrun.workerstore.queries import MAX_KEY_COUNT, MAX_VALUE_LEN
from rankrun.workerstore.tcpstore import TCPStoreServer, _Connection
from tcpwire import (
    CANCEL_WAIT,
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

pytestmark = pytest.mark.timeout(120)

HANDSHAKE = validate() + ping(b"NNCE")


# -- a connection driven by hand ---------------------------------------------------------


class FakeTransport(asyncio.Transport):
    """Records what the connection writes; flow control and closing as flags."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol: asyncio.BaseProtocol | None = None
        self.data = bytearray()
        self.writes = 0
        self.closed = False
        self.aborted = False
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "write after close"
        self.data += data
        self.writes += 1

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        """As asyncio's: connection_lost() follows on the loop's next turn."""
        self.aborted = self.closed = True
        if self.protocol is not None:
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:  # noqa: ARG002 - no socket here
        return default


class Fed:
    """One server-side connection fed by hand, the way asyncio's selector transport feeds it."""

    def __init__(self, server: TCPStoreServer) -> None:
        self.server = server
        self.transport = FakeTransport()
        self.conn = server._connection()
        self.transport.protocol = self.conn
        self.conn.connection_made(self.transport)

    def feed(self, data: bytes, chunk: int | None = None) -> int:
        """Deliver ``data`` in reads of at most ``chunk`` bytes (each also bounded by the buffer offered); count them."""
        view = memoryview(data)
        reads = 0
        while view:
            reads += 1
            buf = self.conn.get_buffer(-1)
            n = min(len(buf), len(view), chunk or len(view))
            assert n > 0
            buf[:n] = view[:n]
            del buf  # asyncio drops its view before the next read, too
            self.conn.buffer_updated(n)
            view = view[n:]
        return reads

    def take(self) -> bytes:
        out = bytes(self.transport.data)
        self.transport.data.clear()
        self.transport.writes = 0
        return out


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


def fed(test: Callable[[TCPStoreServer, Fed], Coroutine[Any, Any, None]]) -> None:
    async def scenario() -> None:
        server = TCPStoreServer()
        conn = Fed(server)
        conn.feed(HANDSHAKE)
        assert conn.take() == b"NNCE"
        await test(server, conn)

    run(scenario())


# A stream touching every request layout, and exactly the replies it must produce.
STREAM: list[tuple[bytes, bytes]] = [
    (set_(b"/a", b"1"), b""),
    (set_(b"/empty", b""), b""),
    (get(b"/a"), s(b"1")),
    (get(b"/missing"), s(b"")),
    (add(b"/n", 7), i64(7)),
    (add(b"/n", -9), i64(-2)),
    (check(b"/a", b"/empty"), b"\x00"),
    (check(b"/a", b"/missing"), b"\x01"),
    (check(), b"\x00"),
    (wait(b"/a", b"/n"), STOP),
    (wait(), STOP),
    (NUMKEYS, i64(3)),
    (append(b"/a", b"23"), b""),
    (multi_set((b"/m1", b"x"), (b"/m2", b"yy")), b""),
    (multi_get(b"/m1", b"/nope", b"/m2", b"/a"), s(b"x") + s(b"") + s(b"yy") + s(b"123")),
    (multi_get(), b""),
    (cas(b"/c", b"", b"new"), s(b"new")),
    (cas(b"/c", b"bad", b"z"), s(b"new")),
    (delete(b"/m1"), i64(1)),
    (delete(b"/m1"), i64(0)),
    (qpush(b"q", b"first"), b""),
    (qpush(b"q", b"second"), b""),
    (qlen(b"q"), i64(2)),
    (qpop(b"q"), i64(2) + s(b"first")),
    (CANCEL_WAIT, b"\x01"),
    (barrier(b"/bar", 1), STOP),
    (ping(b"PONG"), b"PONG"),
    (LIST_KEYS, b""),  # checked apart: its order is arbitrary
]
REQUESTS = b"".join(req for req, _ in STREAM)
# LIST_KEYS' order is arbitrary: compare everything before it exactly, and its keys as a set.
REPLIES_BEFORE_LIST = b"".join(rep for _, rep in STREAM[:-1])
KEYS_AT_END = {b"/a", b"/empty", b"/n", b"/m2", b"/c", b"/bar"}


def check_stream_replies(replies: bytes) -> None:
    assert replies[: len(REPLIES_BEFORE_LIST)] == REPLIES_BEFORE_LIST
    rest = memoryview(replies)[len(REPLIES_BEFORE_LIST) :]
    (count,) = struct.unpack_from("<q", rest)
    keys, at = set(), 8
    for _ in range(count):
        (n,) = U64.unpack_from(rest, at)
        keys.add(bytes(rest[at + 8 : at + 8 + n]))
        at += 8 + n
    assert at == len(rest)
    assert keys == KEYS_AT_END


def test_stream_in_one_read_gives_one_write() -> None:
    async def scenario(_server: TCPStoreServer, conn: Fed) -> None:
        assert conn.feed(REQUESTS) == 1
        assert conn.transport.writes == 1  # every reply of one read in one write
        check_stream_replies(conn.take())

    fed(scenario)


@pytest.mark.parametrize("split", range(1, len(REQUESTS)))
def test_stream_split_at_every_byte(split: int) -> None:
    async def scenario(_server: TCPStoreServer, conn: Fed) -> None:
        conn.feed(REQUESTS[:split])
        conn.feed(REQUESTS[split:])
        check_stream_replies(conn.take())
        assert conn.conn._start == conn.conn._end == 0

    fed(scenario)


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 13, 64])
def test_stream_in_small_reads(chunk: int) -> None:
    async def scenario(_server: TCPStoreServer, conn: Fed) -> None:
        conn.feed(REQUESTS, chunk)
        check_stream_replies(conn.take())

    fed(scenario)


@settings(database=None, deadline=None, max_examples=200)
@given(st.lists(st.integers(min_value=1, max_value=len(REQUESTS)), min_size=1, max_size=12))
def test_stream_cut_anywhere(cuts: list[int]) -> None:
    async def scenario(_server: TCPStoreServer, conn: Fed) -> None:
        points = sorted({0, *cuts, len(REQUESTS)})
        for a, b in itertools.pairwise(points):
            conn.feed(REQUESTS[a:b])
        check_stream_replies(conn.take())

    fed(scenario)


KEYS = st.sampled_from([b"/a", b"/b", b"/c"])
COUNTERS = st.sampled_from([b"/n1", b"/n2"])  # only ADD touches these, so ADD never meets a non-integer
VALUES = st.binary(max_size=24)
REQUEST = st.one_of(
    st.builds(set_, KEYS, VALUES),
    st.builds(get, KEYS | COUNTERS),
    st.builds(add, COUNTERS, st.integers(min_value=-(2**40), max_value=2**40)),
    st.builds(lambda keys: check(*keys), st.lists(KEYS | COUNTERS, max_size=4)),
    st.builds(lambda keys: multi_get(*keys), st.lists(KEYS, max_size=4)),
    st.builds(lambda pairs: multi_set(*pairs), st.lists(st.tuples(KEYS, VALUES), max_size=4)),
    st.builds(append, KEYS, VALUES),
    st.builds(delete, KEYS),
    st.builds(cas, KEYS, VALUES, VALUES),
    st.builds(qpush, KEYS, VALUES),
    st.builds(qpop, KEYS),
    st.builds(qlen, KEYS),
    st.just(NUMKEYS),
    st.just(LIST_KEYS),
    st.builds(ping, st.binary(min_size=4, max_size=4)),
)


@settings(database=None, deadline=None, max_examples=300)
@given(st.lists(REQUEST, max_size=30), st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=50))
def test_random_streams_parse_the_same_in_any_reads(requests: list[bytes], chunks: list[int]) -> None:
    """Whatever the reads look like, the replies and the keyspace equal those of one read of the whole stream."""
    stream = b"".join(requests)

    async def scenario() -> None:
        whole_server, cut_server = TCPStoreServer(), TCPStoreServer()
        whole, cut = Fed(whole_server), Fed(cut_server)
        whole.feed(HANDSHAKE + stream)
        at, i = 0, 0
        data = HANDSHAKE + stream
        while at < len(data):
            n = chunks[i % len(chunks)]
            cut.feed(data[at : at + n])
            at, i = at + n, i + 1
        assert cut.take() == whole.take()
        assert cut_server.snapshot() == whole_server.snapshot()
        assert not cut.transport.closed and not whole.transport.closed

    run(scenario())


def test_handshake_at_every_byte_boundary() -> None:
    async def scenario() -> None:
        for split in range(1, len(HANDSHAKE)):
            conn = Fed(TCPStoreServer())
            conn.feed(HANDSHAKE[:split])
            assert conn.take() == b""
            conn.feed(HANDSHAKE[split:] + get(b"/k"))
            assert conn.take() == b"NNCE" + s(b"")

    run(scenario())


def test_many_pipelined_requests_in_one_read() -> None:
    async def scenario(server: TCPStoreServer, conn: Fed) -> None:
        assert conn.feed(b"".join(add(b"/n", 1) for _ in range(50))) == 1  # 50 x 19 bytes: one idle buffer (1 KiB)
        assert conn.transport.writes == 1  # 50 replies, one write
        assert conn.take() == b"".join(i64(n) for n in range(1, 51))
        reads = conn.feed(b"".join(add(b"/n", 1) for _ in range(4950)))  # many buffers' worth
        assert conn.transport.writes == reads
        assert conn.take() == b"".join(i64(n) for n in range(51, 5001))
        assert server.snapshot()[b"/n"] == b"5000"

    fed(scenario)


def test_large_value_in_many_reads_is_parsed_once_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    process = _Connection._process

    def counting(self: _Connection) -> None:
        nonlocal calls
        calls += 1
        process(self)

    monkeypatch.setattr(_Connection, "_process", counting)

    async def scenario(server: TCPStoreServer, conn: Fed) -> None:
        nonlocal calls
        value = bytes(range(256)) * (MAX_VALUE_LEN // 256)
        calls = 0
        conn.feed(set_(b"/big", value) + get(b"/big"), 1440)  # the client flushes every ~1440 bytes
        assert calls == 2, "parsed when the header arrived and when the announced size was in, not on every read"
        assert conn.take() == s(value)
        assert server.snapshot()[b"/big"] == value
        assert len(conn.conn._buf) < 1024 * 1024, "the buffer shrinks back after a large request"

    fed(scenario)


def test_long_key_list_resumes_instead_of_rescanning() -> None:
    async def scenario(_server: TCPStoreServer, conn: Fed) -> None:
        keys = [b"/k%d" % i for i in range(MAX_KEY_COUNT)]
        conn.feed(set_(b"/k7", b"v"))
        request = check(*keys)
        seen = []
        view = memoryview(request)
        while view:  # feed by hand to watch the walk's progress between reads
            buf = conn.conn.get_buffer(-1)
            n = min(len(buf), len(view), 4096)
            buf[:n] = view[:n]
            del buf
            conn.conn.buffer_updated(n)
            view = view[n:]
            if conn.conn._resume is not None:
                seen.append(len(conn.conn._resume.items))
        assert conn.take() == b"\x01"
        assert len(seen) > 100
        assert seen == sorted(seen), "each read continues the walk where the last one stopped"

    fed(scenario)


def test_multi_set_pairs_split_between_key_and_value() -> None:
    async def scenario(server: TCPStoreServer, conn: Fed) -> None:
        request = multi_set(*[(b"/k%d" % i, b"v" * i) for i in range(50)])
        conn.feed(request, 5)
        assert server.snapshot() == {b"/k%d" % i: b"v" * i for i in range(50)}
        assert conn.take() == b""

    fed(scenario)


def test_oversize_length_is_refused_before_the_data_arrives() -> None:
    async def scenario(_server: TCPStoreServer, conn: Fed) -> None:
        conn.feed(get(b"/a") + b"\x01" + s(b"/k") + U64.pack(MAX_VALUE_LEN + 1))
        assert conn.take() == s(b"")  # the reply due before the bad request still goes out
        assert conn.transport.closed

    fed(scenario)


def test_protocol_error_mid_batch_sends_earlier_replies_then_closes() -> None:
    async def scenario(_server: TCPStoreServer, conn: Fed) -> None:
        conn.feed(ping(b"AAAA") + b"\x13" + ping(b"BBBB"))
        assert conn.take() == b"AAAA"
        assert conn.transport.closed
        conn.feed(ping(b"CCCC"))  # anything the loop still delivers is ignored
        assert conn.take() == b""

    fed(scenario)


def test_own_release_keeps_reply_order() -> None:
    """WAIT, PING, SET of the awaited key in one read: the PING's echo first, then the WAIT's 00."""

    async def scenario(_server: TCPStoreServer, conn: Fed) -> None:
        conn.feed(wait(b"/k") + ping(b"PPPP") + set_(b"/k", b"v"))
        assert conn.take() == b"PPPP" + STOP

    fed(scenario)


def test_paused_writer_stops_parsing_until_resumed() -> None:
    async def scenario(_server: TCPStoreServer, conn: Fed) -> None:
        conn.conn.pause_writing()
        assert not conn.transport.reading
        conn.feed(add(b"/n", 1) + add(b"/n", 1))
        assert conn.take() == b""
        conn.conn.resume_writing()
        assert conn.transport.reading
        assert conn.take() == i64(1) + i64(2)

    fed(scenario)


def test_reset_discards_buffered_requests() -> None:
    async def scenario(server: TCPStoreServer, conn: Fed) -> None:
        conn.conn.pause_writing()  # complete requests that stay buffered (flow control)
        conn.feed(set_(b"/stale", b"1"))
        conn.feed(set_(b"/half", b"value")[:12])  # and an incomplete one
        await server.reset()
        assert conn.transport.aborted
        conn.conn.resume_writing()
        assert server.snapshot() == {}
        assert server._connections == {}

    fed(scenario)


def test_reset_with_incomplete_request_then_the_rest_arrives() -> None:
    async def scenario(server: TCPStoreServer, conn: Fed) -> None:
        request = set_(b"/late", b"v" * 100)
        conn.feed(request[:20])
        await server.reset()
        conn.conn.buffer_updated(0)  # a read racing the abort changes nothing
        assert server.snapshot() == {}
        fresh = Fed(server)
        fresh.feed(HANDSHAKE + check(b"/late"))
        assert fresh.take() == b"NNCE\x01"

    fed(scenario)


def test_connection_lost_mid_request_forgets_everything() -> None:
    async def scenario(server: TCPStoreServer, conn: Fed) -> None:
        other = Fed(server)
        other.feed(HANDSHAKE + wait(b"/k"))
        conn.feed(set_(b"/k", b"v")[:-1])  # the last byte never comes
        conn.conn.connection_lost(ConnectionResetError())
        assert conn.conn not in server._connections
        assert server.snapshot() == {}
        assert other.take() == b"NNCE"  # still blocked

    fed(scenario)
