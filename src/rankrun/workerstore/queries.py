"""torch's TCPStore queries, described once (``reference/tcpstore-protocol.md`` §1.3, §2.1): each query's code, the
fields of its request after the query byte, the shape of its reply, and the store's limits. Pure data, a leaf.

Read by the store (``tcpstore``: its dispatch table has one handler per query here, named after it; the limits bound
what it parses) and by the relays' wire (``mux``: where a request ends, which replies a connection still owes), so the
two cannot drift apart. ``tests/unit/test_tcpstore_queries.py`` sends every query, built from its row, to the store
and follows the reply it gets with the relay's tracker.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["LAYOUTS", "MAGIC", "MAX_KEY_COUNT", "MAX_KEY_LEN", "MAX_VALUE_LEN", "STOP_WAITING", "WAIT_CANCELED", "Layout",
           "Query"]

MAGIC = 0x3C85F7CE
"""The ``u32`` a client sends with VALIDATE as its very first query."""
MAX_KEY_LEN = 8192
"""Longest key accepted (bytes), as torch's libuv server."""
MAX_VALUE_LEN = 8 * 1024 * 1024
"""Longest value accepted (bytes), as torch's libuv server."""
MAX_KEY_COUNT = 128 * 1024
"""Most keys accepted in one key list or MULTI_SET, as torch's libuv server."""

STOP_WAITING = b"\x00"
"""A WAIT's or BARRIER's reply: the caller is released."""
WAIT_CANCELED = b"\x01"
"""CANCEL_WAIT's reply (sent whether or not a wait was pending)."""


class Query(enum.IntEnum):
    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


class Layout(NamedTuple):
    """One query's bytes, as letters.

    ``request``, the fields after the query byte, in order: ``4`` a ``u32``; ``8`` an ``i64``; ``K`` a key, ``V`` a
    value (each a ``u64`` length, then the bytes); ``k`` a key list (a ``u64`` count, then that many keys); ``p``
    MULTI_SET's pairs (a ``u64`` count, then that many key, value).

    ``reply``: ``""`` none; ``1`` one byte; ``4`` four; ``8`` an ``i64``; ``s`` a sized value; ``n`` one sized value per
    key of the request, no count in front; ``q`` QUEUE_POP's (an ``i64`` length, then a value when it is > 0); ``l``
    LIST_KEYS' (an ``i64`` count, then that many keys); ``w`` a WAIT's or BARRIER's byte (it may come much later, and a
    CANCEL_WAIT's ``c`` may take its place).
    """

    request: str
    reply: str


LAYOUTS: dict[Query, Layout] = {
    Query.VALIDATE: Layout("4", ""),  # the magic
    Query.SET: Layout("KV", ""),
    Query.COMPARE_SET: Layout("KVV", "s"),  # key, expected, desired; the value it leaves (§3.4)
    Query.GET: Layout("K", "s"),  # a missing key's value is empty
    Query.ADD: Layout("K8", "8"),  # key, delta; the new value
    Query.CHECK: Layout("k", "1"),  # 00 all exist, 01 not all
    Query.WAIT: Layout("k", "w"),
    Query.GETNUMKEYS: Layout("", "8"),
    Query.DELETE_KEY: Layout("K", "8"),  # 1 if it existed, else 0
    Query.APPEND: Layout("KV", ""),
    Query.MULTI_GET: Layout("k", "n"),
    Query.MULTI_SET: Layout("p", ""),
    Query.CANCEL_WAIT: Layout("", "c"),
    Query.PING: Layout("4", "4"),  # a nonce, echoed
    Query.QUEUE_PUSH: Layout("KV", ""),
    Query.QUEUE_POP: Layout("K", "q"),
    Query.QUEUE_LEN: Layout("K", "8"),
    Query.LIST_KEYS: Layout("", "l"),
    Query.BARRIER: Layout("K8", "w"),  # key, world size
}
