"""The TCPStore query table (``workerstore.queries``) against both of its readers: every query, its request built from
its row alone, is cut where it ends by the relays' walk (``mux.RequestCutter``), consumed exactly by the store's own
parser (``tcpstore``), and answered with one reply of its row's shape, as the relays' ``ReplyTracker`` follows it.
The connections are handed their bytes as another listener's first read is (``TCPStoreServer.adopt``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rankrun.workerstore import mux
from rankrun.workerstore.queries import LAYOUTS, MAGIC, Layout, Query
from rankrun.workerstore.tcpstore import TCPStoreServer
from tcpwire import U32, U64, get, i64, ping, s, set_, validate

NONCE = b"NNCE"
KEY, VALUE = b"/k", b"3"  # an integer's text: ADD and BARRIER count on it
COUNT = 2  # entries of a key list or pair list


def built(query: Query, layout: Layout) -> tuple[bytes, int]:
    """The request for ``query`` made from its row's fields, and its list's count (0 without a list)."""
    out, count = bytes([query]), 0
    for field in layout.request:
        if field == "4":
            out += U32.pack(MAGIC) if query == Query.VALIDATE else NONCE
        elif field == "8":
            out += i64(1)
        elif field in "KV":
            out += s(KEY if field == "K" else VALUE)
        elif field in "kp":
            count = COUNT
            out += U64.pack(COUNT) + (s(KEY) + (s(VALUE) if field == "p" else b"")) * COUNT
        else:
            raise AssertionError(f"a field the test does not know: {field!r}")
    return out, count


class Recorder(asyncio.Transport):
    """What the store writes; whether it closed the connection (its only error signal)."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:  # noqa: ARG002 - no socket here
        return default


def served(data: bytes) -> Recorder:
    """``data`` handed to a fresh store's connection in one read."""
    transport = Recorder()
    TCPStoreServer().adopt(transport, data)
    return transport


def test_the_table_has_a_row_for_every_query():
    assert set(LAYOUTS) == set(Query)


@pytest.mark.parametrize("query", list(Query), ids=lambda q: q.name)
def test_every_query_is_cut_served_and_answered_as_its_row_says(query):
    layout = LAYOUTS[query]
    request, count = built(query, layout)
    assert mux.RequestCutter().cut(request, 0, len(request)) == (query, len(request), count)
    # the row's request, between a key set before it and a PING after it: the PING's echo comes right after the
    # row's reply only if the store read exactly the request's bytes
    transport = served(validate() + set_(KEY, VALUE) + request + ping(NONCE))
    assert not transport.closed
    tracker = mux.ReplyTracker(collect=True)
    tracker.expect(layout.reply, count)
    tracker.expect("4")
    done, replies = tracker.feed(bytes(transport.data))
    assert replies[-1] == NONCE
    assert (done, tracker.owed) == (2 if layout.reply else 1, 0)


def test_a_first_read_larger_than_a_connections_buffer_is_served_whole():
    value = bytes(range(256)) * 20  # 5 KiB: more than a fresh connection's buffer takes at once
    transport = served(validate() + set_(KEY, value) + get(KEY) + ping(NONCE))
    assert bytes(transport.data) == s(value) + NONCE
