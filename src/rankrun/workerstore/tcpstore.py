"""An asyncio server for torch's c10d TCPStore wire protocol (torch >= 2.4): the worker store.

Owns: the listening socket, which stays bound from ``start()`` to ``close()`` so restarts never race for the port; the
client connections; and the current :class:`~rankrun.workerstore.keyspace.Keyspace` (keys, queues, blocked callers),
which ``reset()`` swaps for a fresh one after dropping the previous attempt's connections (the stale-key restart bug of
torchrun). Must not depend on: torch, threads, blocking calls on the event loop, or anything in rankrun except
``rankrun.listen`` (how every listening socket is bound), ``workerstore.keyspace`` and ``workerstore.queries``, the
protocol's table (its imports are checked by ``tests/unit/test_import_directions.py``). Byte layouts follow
``reference/tcpstore-protocol.md`` (written from observation, not from torch's code).

Design: one ``asyncio.BufferedProtocol`` per connection (no streams, no task per client). On its own listener the
transport is ``rankrun.listen.Polled``: every connection in one epoll of the listener's own, watched by the loop as one
reader (``listen(..., polled=True)``; a connection the shared rendezvous port hands over keeps asyncio's). The transport
reads straight into the connection's ``bytearray``; an incremental parser decodes every complete request in it with
``struct.unpack_from`` on a ``memoryview`` (one copy per key or value, none for framing), leaves an incomplete tail in
place (a large value is awaited until the exact size it announced has arrived; a long key list resumes where it
stopped), and all replies to the requests of one read go out in one ``transport.write``. Dispatch is a 256-entry
table indexed by the query byte (a second table before VALIDATE). Wake-ups of blocked WAIT/BARRIER callers are
written straight to the waiter's transport. Nothing runs off the event loop, and no request ever awaits.

Why this shape (profiled with cProfile, ``strace -c`` and /proc CPU times under ``bench/store_bench.py``): the previous
streams server cost 44 us of CPU per ADD (19 user, 25 system) against libuv's 10, with 6 syscalls per request
(asyncio's default read allocates a 256 KiB ``bytes`` and shrinks it: mmap + mremap + munmap; the task wake-up costs a
second epoll_wait) plus a ``readexactly`` per field, ``feed_data``, a future, a task step and ``drain``. This one makes
3 syscalls per request (epoll_wait, recv_into, send; libuv makes 4) and costs 12.5 us (5 user, 7.5 system); on the
polled listener a wake-up makes a second epoll_wait (its own epoll's), shared by every connection ready in it: a lone
client's ADD pays it (its latency unchanged within the noise, 35-53 us either way under load), a storm amortises it.

Measured (``bench/store_bench.py``, 2-CPU VM, vs torch 2.13's libuv server): p50 1.11-1.20x, throughput 0.80-0.96x.

At scale (``bench/store_storm.py``, ``bench/run.py --only store_scale``: N raw-protocol clients doing
``init_process_group``'s store traffic, torch 2.13's server alternating in the same runs, 2 CPUs shared with a load
average of 2-12): at 16,384 clients and somaxconn 4,096, no listen overflow in 14 runs of 15 (one under load:
3,085; torch's server 644-6,952 in all but one), none for either at somaxconn 65,535 (``--somaxconn``); the server
163-247 us of CPU per rank against torch's 112-171 (medians per run 1.37-1.58x: the issue's 1.5x is met in about
half the runs; with asyncio's transports 277-329), about 2 KiB per idle connection (torch's 1.2-2.0), the whole
sequence within the noise of torch's (medians 0.7-1.14x; single runs 9-30 s for both, as the machine's other load
came and went). Per connection it holds its
socket, its ``_Connection`` (its buffer) and its ``Polled``, no memoryview, future or dict more: at 16,384 connections
the garbage collector's full collections cost 22 us per rank with those, 8 without.

Wire summary: every request is a 1-byte query code followed by fixed fields (``u32``/``i64`` little-endian, strings
as ``u64`` length + bytes); replies have no header; errors are signalled by closing the connection. The codes, each
query's fields and reply, and the limits are ``workerstore.queries``' table, which the relays read too; the handlers
here (``_op_<query>``, one per row, dispatched by code) parse those fields by hand, for speed.

Deliberate differences from torch's libuv server (none visible to a correct client):

- a bad handshake (first query not VALIDATE, or a wrong magic) closes the connection,
  where libuv keeps the socket silently open;
- COMPARE_SET on a missing key with a non-empty ``expected`` wakes nobody (libuv wakes
  WAIT callers on that key spuriously, although the key is still missing);
- a second WAIT or BARRIER while one is still pending on the same connection is a
  protocol error (a torch client never does this: it blocks on the first reply);
- a BARRIER caller is released when the counter reaches *its own* ``world_size``, and
  any write that brings the counter key to that value releases it too;
- accepted sockets have ``SO_KEEPALIVE`` (set on the listening socket, inherited; torch sets it on neither side).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable
from typing import cast

from rankrun.listen import listen
from rankrun.workerstore.keyspace import Keyspace, NotAnInteger, Waiter
from rankrun.workerstore.queries import MAGIC, MAX_KEY_COUNT, MAX_KEY_LEN, MAX_VALUE_LEN, STOP_WAITING, WAIT_CANCELED, Query

__all__ = ["TCPStoreServer"]

logger = logging.getLogger(__name__)

_CHECK_READY = b"\x00"
_CHECK_NOT_READY = b"\x01"
_CLOSE_GRACE_S = 5.0

# Per connection, held while it is open: one per rank, 16,384 at once in a large job (16 KiB each was 19-20 KiB per
# idle connection, against libuv's ~2). torch's requests are tens of bytes, gloo's address blobs ~200; a larger request
# grows the buffer (to the size it announced, or doubling) and gives the memory back once it is done.
_BUFFER_SIZE = 1024
_MIN_FREE = 256  # grow or compact before a read would get less room than this
_FLUSH_AT = 64 * 1024  # a reply this large is written at once (flow control can then pause reading)
_FIRST_REQUESTS_MAX = 1 << 16  # connections whose first request is noted per attempt; a client looping on connect stops here

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_u64_at = _U64.unpack_from
_i64_at = _I64.unpack_from
_pack_i64 = _I64.pack
_pack_u64 = _U64.pack


class _ProtocolError(Exception):
    """The peer broke the protocol: close its connection (torch's only error signal)."""


def _span(mv: memoryview, at: int, end: int, limit: int, what: str) -> int:
    """End of the sized field whose ``u64`` length is at ``at`` (may lie beyond ``end``); -1 until the length is in."""
    if end - at < 8:
        return -1
    size: int = _u64_at(mv, at)[0]
    if size > limit:
        raise _ProtocolError(f"{what} of {size} bytes (limit {limit})")
    return at + 8 + size


def _packed(data: bytes) -> bytes:
    return _pack_u64(len(data)) + data


class _Resume:
    """Where the walk over an incomplete key list stopped: the items so far, the offset (from the request), how many left."""

    __slots__ = ("items", "left", "offset")

    def __init__(self, items: list[bytes], offset: int, left: int) -> None:
        self.items = items
        self.offset = offset
        self.left = left


class _Connection(asyncio.BufferedProtocol):
    """One client socket: decodes requests strictly in order from its buffer and writes their replies.

    Buffer invariant: ``_buf[_start:_end]`` holds bytes received but not yet consumed; ``_start`` is always the first
    byte of a request. ``_need`` is how many bytes from ``_start`` the request there needs before it is worth
    parsing again (0 = unknown). Handlers take the position of their query byte and return the position after the
    request, or -1 while it is incomplete.
    """

    __slots__ = ("_buf", "_busy", "_closed", "_end", "_gone", "_keyspace", "_lost", "_need", "_out", "_paused",
                 "_pending", "_resume", "_server", "_start", "_table", "_transport")

    def __init__(self, server: TCPStoreServer) -> None:
        self._server = server
        self._keyspace = server._keyspace
        self._transport: asyncio.Transport | None = None
        self._table = _HANDSHAKE
        # No memoryview kept: one per read and per parse instead (a kept one is two more objects per connection for the
        # garbage collector to walk, at 16,384 connections: 22 us of CPU per rank in full collections, measured)
        self._buf = bytearray(_BUFFER_SIZE)
        self._start = 0
        self._end = 0
        self._need = 0
        self._resume: _Resume | None = None
        self._out: list[bytes] = []
        self._busy = False
        self._pending: Waiter | None = None
        self._closed = False
        self._paused = False
        self._gone = False  # connection_lost came
        self._lost: asyncio.Future[None] | None = None  # made when someone waits for it (not per connection)

    # -- asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        server = self._server
        if server._closed:  # accepted just before close(): refuse, don't serve
            self._closed = True
            self._transport.abort()
            return
        self._keyspace = server._keyspace  # the attempt's keyspace when the connection is served, not accepted
        server._connections[self] = None

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002 - asyncio's signature
        self._closed = True
        self._forget_pending()
        self._server._connections.pop(self, None)
        self._resume = None
        self._gone = True
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:  # noqa: ARG002 - we size it ourselves
        end = self._end
        if not end:
            if self._need <= len(self._buf):
                return memoryview(self._buf)  # the common case, every byte consumed
        elif len(self._buf) - end >= _MIN_FREE and self._start + self._need <= len(self._buf):
            return memoryview(self._buf)[end:]
        self._make_room()
        return memoryview(self._buf)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        if self._end - self._start >= self._need and not self._paused and not self._closed:
            self._process()

    def feed(self, data: memoryview) -> None:
        """Bytes that came other than by this connection's own reads (another listener's first read, ``adopt``; a
        store relay's frame, ``workerstore.relayhost``), handled as the event loop's reads of them would be."""
        while data and not self._closed:
            buffer = self.get_buffer(len(data))
            size = min(len(buffer), len(data))
            buffer[:size] = data[:size]
            self.buffer_updated(size)
            data = data[size:]

    def eof_received(self) -> bool | None:
        return None  # the transport closes; a pending WAIT is forgotten in connection_lost

    def pause_writing(self) -> None:
        """The client does not read its replies: stop reading its requests until it does."""
        self._paused = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._paused = False
        if self._closed or self._transport is None:
            return
        self._transport.resume_reading()
        if self._start < self._end and self._end - self._start >= self._need:
            self._process()

    # -- lifecycle

    def lost(self) -> asyncio.Future[None] | None:
        """A future done once the connection is lost; None when it already is."""
        if self._gone:
            return None
        if self._lost is None:
            self._lost = asyncio.get_running_loop().create_future()
        return self._lost

    def abort(self) -> None:
        """Drop the connection now, discarding unparsed requests and unsent replies."""
        self._closed = True
        self._forget_pending()
        self._start = self._end = self._need = 0
        if self._transport is not None:
            self._transport.abort()

    def _fail(self, reason: object) -> None:
        """A protocol error: send the replies already due, then close (torch's only error signal)."""
        logger.debug("closing store connection %s: %s", self._peer(), reason)
        self._closed = True
        self._forget_pending()
        self._flush()
        if self._transport is not None:
            self._transport.close()

    def _peer(self) -> object:
        return None if self._transport is None else self._transport.get_extra_info("peername")

    # -- buffer

    def _make_room(self) -> None:
        """Before a read: compact the unconsumed bytes to the front, or move them to a larger buffer."""
        start, end = self._start, self._end
        live = end - start
        want = max(live, self._need) + _MIN_FREE
        if want <= len(self._buf):
            self._buf[0:live] = self._buf[start:end]  # same size: allowed while the old view is exported
        else:
            size = want if self._need else max(want, 2 * len(self._buf))
            bigger = bytearray(size)
            bigger[0:live] = memoryview(self._buf)[start:end]
            self._buf = bigger
        self._start, self._end = 0, live

    def _process(self) -> None:
        """Handle every complete request in the buffer; one write for all their replies."""
        mv, end, pos = memoryview(self._buf), self._end, self._start
        self._need = 0
        self._busy = True
        try:
            while pos < end:
                nxt = self._table[mv[pos]](self, mv, pos, end)
                if nxt < 0:
                    break
                pos = nxt
                if self._paused or self._closed:
                    break
        except (_ProtocolError, NotAnInteger) as exc:
            self._busy = False
            self._fail(exc)
            return
        except Exception:
            logger.exception("store connection %s failed", self._peer())
            self._busy = False
            self._fail("internal error")
            return
        self._busy = False
        out = self._out
        if out and self._transport is not None:  # _flush(), inlined: this is every request's path
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))
            out.clear()
        if pos == end:
            self._start = self._end = 0
            if len(self._buf) > _BUFFER_SIZE:  # a large request is done: give the memory back
                self._buf = bytearray(_BUFFER_SIZE)
        else:
            self._start = pos

    def _flush(self) -> None:
        out = self._out
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()

    def _send(self, data: bytes) -> None:
        """Queue a reply of variable size; a large one goes out at once, so flow control sees it."""
        self._out.append(data)
        if len(data) > _FLUSH_AT:
            self._flush()

    def _more(self, pos: int, needed_end: int) -> int:
        """The request at ``pos`` is incomplete and ends at ``needed_end`` at the earliest: parse again after that."""
        self._need = needed_end - pos
        return -1

    def _pair(self, mv: memoryview, pos: int, end: int) -> tuple[int, int]:
        """(end of the key, end of the value) of the key/value request at ``pos``; (-1, -1) while incomplete."""
        k = _span(mv, pos + 1, end, MAX_KEY_LEN, "key")
        if k < 0 or k > end:
            return -1, -1
        v = _span(mv, k, end, MAX_VALUE_LEN, "value")
        if v < 0:
            return -1, -1
        if v > end:
            return -1, self._more(pos, v)
        return k, v

    def _items(self, mv: memoryview, pos: int, end: int, per_entry: int) -> tuple[list[bytes], int] | None:
        """The key list (``per_entry`` 1) or key/value list (2) of the request at ``pos`` and where it ends.

        None while incomplete; the walk then resumes where it stopped when more bytes arrive, so a long list costs
        one pass however many reads it takes.
        """
        resume = self._resume
        if resume is None:
            if end - pos < 9:
                return None
            count: int = _u64_at(mv, pos + 1)[0]
            if count > MAX_KEY_COUNT:
                raise _ProtocolError(f"{count} keys in one request (limit {MAX_KEY_COUNT})")
            items: list[bytes] = []
            at, left = pos + 9, count * per_entry
        else:
            items, at, left = resume.items, pos + resume.offset, resume.left
        pairs = per_entry == 2
        while left:
            # in a key/value list the entries alternate, starting with a key: an odd count left means a value
            e = _span(mv, at, end, MAX_VALUE_LEN, "value") if pairs and left & 1 else _span(mv, at, end, MAX_KEY_LEN, "key")
            if e < 0 or e > end:
                self._resume = _Resume(items, at - pos, left)
                return None
            items.append(mv[at + 8 : e].tobytes())
            at, left = e, left - 1
        self._resume = None
        return items, at

    # -- blocking callers

    def _release(self) -> None:
        """The keyspace calls this when this connection's WAIT/BARRIER is satisfied."""
        self._pending = None
        if self._closed:
            return
        if self._busy:  # satisfied by a request of our own: keep the replies in order
            self._out.append(STOP_WAITING)
        elif self._transport is not None:
            self._transport.write(STOP_WAITING)

    def _park(self, waiter: Waiter | None) -> None:
        if waiter is None:
            self._out.append(STOP_WAITING)
        else:
            self._pending = waiter

    def _require_idle(self, what: str) -> None:
        if self._pending is not None:
            raise _ProtocolError(f"{what} while a WAIT or BARRIER is still pending")

    def _forget_pending(self) -> None:
        if self._pending is not None:
            self._keyspace.cancel(self._pending)
            self._pending = None

    # -- query handlers, one per code: (position of the query byte, end of data) -> position after it, or -1

    def _op_unknown(self, mv: memoryview, pos: int, end: int) -> int:  # noqa: ARG002 - the handler signature
        raise _ProtocolError(f"unknown query type {mv[pos]}")

    def _op_before_validate(self, mv: memoryview, pos: int, end: int) -> int:  # noqa: ARG002 - the handler signature
        raise _ProtocolError(f"first query is {mv[pos]}, not VALIDATE")

    def _op_validate(self, mv: memoryview, pos: int, end: int) -> int:
        """VALIDATE: u32 magic; no reply."""
        if end - pos < 5:
            return -1
        (magic,) = _U32.unpack_from(mv, pos + 1)
        if magic != MAGIC:
            raise _ProtocolError(f"bad magic {magic:#x}")
        self._table = _HANDLERS
        seen = self._server.first_requests
        if len(seen) < _FIRST_REQUESTS_MAX:
            seen.append(time.monotonic())
        return pos + 5

    def _op_set(self, mv: memoryview, pos: int, end: int) -> int:
        """SET: key, value; no reply."""
        k, v = self._pair(mv, pos, end)
        if k < 0:
            return -1
        self._keyspace.set(mv[pos + 9 : k].tobytes(), mv[k + 8 : v].tobytes())
        return v

    def _op_compare_set(self, mv: memoryview, pos: int, end: int) -> int:
        """COMPARE_SET: key, expected, desired; reply the resulting value (§3.4)."""
        k = _span(mv, pos + 1, end, MAX_KEY_LEN, "key")
        if k < 0 or k > end:
            return -1
        x = _span(mv, k, end, MAX_VALUE_LEN, "value")
        if x < 0:
            return -1
        if x > end:
            return self._more(pos, x)
        d = _span(mv, x, end, MAX_VALUE_LEN, "value")
        if d < 0:
            return -1
        if d > end:
            return self._more(pos, d)
        result = self._keyspace.compare_set(mv[pos + 9 : k].tobytes(), mv[k + 8 : x].tobytes(), mv[x + 8 : d].tobytes())
        self._send(_packed(result))
        return d

    def _op_get(self, mv: memoryview, pos: int, end: int) -> int:
        """GET: key; reply the value, empty when missing (never blocks)."""
        k = _span(mv, pos + 1, end, MAX_KEY_LEN, "key")
        if k < 0 or k > end:
            return -1
        self._send(_packed(self._keyspace.values.get(mv[pos + 9 : k].tobytes(), b"")))
        return k

    def _op_add(self, mv: memoryview, pos: int, end: int) -> int:
        """ADD: key, i64 delta; reply the new i64."""
        k = _span(mv, pos + 1, end, MAX_KEY_LEN, "key")
        if k < 0 or k + 8 > end:
            return -1
        self._out.append(_pack_i64(self._keyspace.add(mv[pos + 9 : k].tobytes(), _i64_at(mv, k)[0])))
        return k + 8

    def _op_check(self, mv: memoryview, pos: int, end: int) -> int:
        """CHECK: keylist; reply 00 if all exist, else 01."""
        got = self._items(mv, pos, end, 1)
        if got is None:
            return -1
        self._out.append(_CHECK_READY if self._keyspace.all_exist(got[0]) else _CHECK_NOT_READY)
        return got[1]

    def _op_wait(self, mv: memoryview, pos: int, end: int) -> int:
        """WAIT: keylist; reply 00 once all exist (possibly much later)."""
        got = self._items(mv, pos, end, 1)
        if got is None:
            return -1
        self._require_idle("WAIT")
        self._park(self._keyspace.wait(got[0], self._release))
        return got[1]

    def _op_getnumkeys(self, mv: memoryview, pos: int, end: int) -> int:  # noqa: ARG002 - the handler signature
        """GETNUMKEYS: reply the i64 number of plain keys (queues excluded)."""
        self._out.append(_pack_i64(len(self._keyspace.values)))
        return pos + 1

    def _op_delete_key(self, mv: memoryview, pos: int, end: int) -> int:
        """DELETE_KEY: key; reply i64 1 if it existed, else 0."""
        k = _span(mv, pos + 1, end, MAX_KEY_LEN, "key")
        if k < 0 or k > end:
            return -1
        self._out.append(_pack_i64(int(self._keyspace.delete(mv[pos + 9 : k].tobytes()))))
        return k

    def _op_append(self, mv: memoryview, pos: int, end: int) -> int:
        """APPEND: key, suffix; no reply."""
        k, v = self._pair(mv, pos, end)
        if k < 0:
            return -1
        self._keyspace.append(mv[pos + 9 : k].tobytes(), mv[k + 8 : v].tobytes())
        return v

    def _op_multi_get(self, mv: memoryview, pos: int, end: int) -> int:
        """MULTI_GET: keylist; reply one value per key, no count in front."""
        got = self._items(mv, pos, end, 1)
        if got is None:
            return -1
        values = self._keyspace.values
        self._send(b"".join(_packed(values.get(key, b"")) for key in got[0]))
        return got[1]

    def _op_multi_set(self, mv: memoryview, pos: int, end: int) -> int:
        """MULTI_SET: u64 n, n x (key, value); no reply; applied once fully read."""
        got = self._items(mv, pos, end, 2)
        if got is None:
            return -1
        items = got[0]
        for i in range(0, len(items), 2):
            self._keyspace.set(items[i], items[i + 1])
        return got[1]

    def _op_cancel_wait(self, mv: memoryview, pos: int, end: int) -> int:  # noqa: ARG002 - the handler signature
        """CANCEL_WAIT: forget the pending WAIT/BARRIER, if any; always reply 01."""
        self._forget_pending()
        self._out.append(WAIT_CANCELED)
        return pos + 1

    def _op_ping(self, mv: memoryview, pos: int, end: int) -> int:
        """PING: u32 nonce; reply the same four bytes."""
        if end - pos < 5:
            return -1
        self._out.append(mv[pos + 1 : pos + 5].tobytes())
        return pos + 5

    def _op_queue_push(self, mv: memoryview, pos: int, end: int) -> int:
        """QUEUE_PUSH: key, value; no reply; wakes one WAIT on the key."""
        k, v = self._pair(mv, pos, end)
        if k < 0:
            return -1
        self._keyspace.push(mv[pos + 9 : k].tobytes(), mv[k + 8 : v].tobytes())
        return v

    def _op_queue_pop(self, mv: memoryview, pos: int, end: int) -> int:
        """QUEUE_POP: key; reply i64 length before the pop, then the value if > 0."""
        k = _span(mv, pos + 1, end, MAX_KEY_LEN, "key")
        if k < 0 or k > end:
            return -1
        length, value = self._keyspace.pop(mv[pos + 9 : k].tobytes())
        reply = _pack_i64(length)
        self._send(reply if value is None else reply + _packed(value))
        return k

    def _op_queue_len(self, mv: memoryview, pos: int, end: int) -> int:
        """QUEUE_LEN: key; reply the i64 length."""
        k = _span(mv, pos + 1, end, MAX_KEY_LEN, "key")
        if k < 0 or k > end:
            return -1
        self._out.append(_pack_i64(self._keyspace.queue_len(mv[pos + 9 : k].tobytes())))
        return k

    def _op_list_keys(self, mv: memoryview, pos: int, end: int) -> int:  # noqa: ARG002 - the handler signature
        """LIST_KEYS: reply i64 n, then n keys (plain keyspace, arbitrary order)."""
        keys = list(self._keyspace.values)
        self._send(_pack_i64(len(keys)) + b"".join(_packed(key) for key in keys))
        return pos + 1

    def _op_barrier(self, mv: memoryview, pos: int, end: int) -> int:
        """BARRIER: key, i64 world_size; count an arrival, reply 00 once enough came."""
        k = _span(mv, pos + 1, end, MAX_KEY_LEN, "key")
        if k < 0 or k + 8 > end:
            return -1
        self._require_idle("BARRIER")
        self._park(self._keyspace.barrier(mv[pos + 9 : k].tobytes(), _i64_at(mv, k)[0], self._release))
        return k + 8


_Handler = Callable[[_Connection, memoryview, int, int], int]
# one handler per query of the table, named after it: a query the table gains without one fails at import
_BY_CODE: dict[int, _Handler] = {query: cast(_Handler, getattr(_Connection, f"_op_{query.name.lower()}")) for query in Query}
_HANDLERS: tuple[_Handler, ...] = tuple(_BY_CODE.get(code, _Connection._op_unknown) for code in range(256))
_HANDSHAKE: tuple[_Handler, ...] = (_Connection._op_validate,) + (_Connection._op_before_validate,) * 255


class TCPStoreServer:
    """Serves one keyspace on one listening socket, bound once and held until close().

    All methods must be called from the event loop that runs the server.
    """

    def __init__(self) -> None:
        self._keyspace = Keyspace()
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._closed = False
        self._connections: dict[_Connection, None] = {}
        self.first_requests: list[float] = []
        """When each connection served since the last ``reset`` made its first request (its VALIDATE), in
        ``time.monotonic()`` seconds, in order: the start-up timeline's store phase (``rankrun.agent.startup``)."""

    async def start(self, host: str, port: int) -> int:
        """Bind host:port (port 0 = let the OS pick), start serving; return the port.

        Raises ``StoreError("cannot listen on HOST:PORT: <os error>")`` on failure.
        """
        if self._server is not None or self._closed:
            raise RuntimeError("TCPStoreServer.start() runs once, before close()")
        self._server, self._port = await listen(host, port, self._connection, polled=True)
        return self._port

    @property
    def port(self) -> int:
        """The bound port; RuntimeError before start()."""
        if self._port is None:
            raise RuntimeError("TCPStoreServer.port read before start()")
        return self._port

    async def reset(self) -> None:
        """Fresh keyspace for a new attempt; the listening socket stays bound.

        Closes every client connection (so stragglers can't write stale keys), drops
        pending waiters, clears keys (including 'init/'), counters and queues.
        """
        connections, self._connections = list(self._connections), {}
        for connection in connections:
            connection.abort()  # unparsed requests are discarded, never applied
        self._keyspace = Keyspace()
        self.first_requests = []
        lost = [f for f in (c.lost() for c in connections) if f is not None and not f.done()]
        if lost:  # abort() closes the sockets on the loop's next turn
            await asyncio.wait(lost, timeout=_CLOSE_GRACE_S)

    async def close(self) -> None:
        """Close all connections and the listener. Idempotent."""
        self._closed = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self.reset()
        if server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), _CLOSE_GRACE_S)

    def snapshot(self) -> dict[bytes, bytes]:
        """Copy of the plain keyspace (for tests and diagnostics)."""
        return dict(self._keyspace.values)

    def _connection(self) -> _Connection:
        return _Connection(self)

    def adopt(self, transport: asyncio.Transport, data: bytes) -> None:
        """Serve a connection another listener accepted (``rendezvous.listener``), starting with ``data``."""
        connection = _Connection(self)
        transport.set_protocol(connection)
        connection.connection_made(transport)
        connection.feed(memoryview(data))
