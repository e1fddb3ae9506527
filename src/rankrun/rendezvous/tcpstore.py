"""An asyncio server for torch's c10d TCPStore wire protocol (torch >= 2.4).

Owns: the keyspace that workers reach through ``init_process_group(init_method="env://")``
with ``TORCHELASTIC_USE_AGENT_STORE=True``: plain keys, queues, blocked WAIT/BARRIER
callers, and the listening socket, which stays bound from ``start()`` to ``close()`` so
restarts never race for the port. ``reset()`` gives each new attempt a clean keyspace
and drops the previous attempt's connections (the stale-key restart bug of torchrun).

Must not depend on: torch, threads, blocking calls on the event loop, or anything in
rankrun except ``rankrun.errors``. The byte layouts follow
``reference/tcpstore-protocol.md`` (written from observation, not from torch's code).

Wire summary: every request is a 1-byte query code followed by fixed fields
(``u32``/``i64`` little-endian, strings as ``u64`` length + bytes); replies have no
header; errors are signalled by closing the connection. Codes::

    0 VALIDATE  1 SET  2 COMPARE_SET  3 GET  4 ADD  5 CHECK  6 WAIT  7 GETNUMKEYS
    8 DELETE_KEY  9 APPEND  10 MULTI_GET  11 MULTI_SET  12 CANCEL_WAIT  13 PING
    14 QUEUE_PUSH  15 QUEUE_POP  16 QUEUE_LEN  17 LIST_KEYS  18 BARRIER

Deliberate differences from torch's libuv server (none visible to a correct client):

- a bad handshake (first query not VALIDATE, or a wrong magic) closes the connection,
  where libuv keeps the socket silently open;
- COMPARE_SET on a missing key with a non-empty ``expected`` wakes nobody (libuv wakes
  WAIT callers on that key spuriously, although the key is still missing);
- a second WAIT or BARRIER while one is still pending on the same connection is a
  protocol error (a torch client never does this: it blocks on the first reply);
- a BARRIER caller is released when the counter reaches *its own* ``world_size``, and
  any write that brings the counter key to that value releases it too;
- ``SO_KEEPALIVE`` is set on accepted sockets (torch sets it on neither side).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import re
import socket
import struct
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TypeVar

from rankrun.errors import StoreError

__all__ = ["MAGIC", "MAX_KEY_COUNT", "MAX_KEY_LEN", "MAX_VALUE_LEN", "TCPStoreServer"]

logger = logging.getLogger(__name__)

MAGIC = 0x3C85F7CE
"""The ``u32`` a client sends with VALIDATE as its very first query."""
MAX_KEY_LEN = 8192
"""Longest key accepted (bytes), as torch's libuv server."""
MAX_VALUE_LEN = 8 * 1024 * 1024
"""Longest value accepted (bytes), as torch's libuv server."""
MAX_KEY_COUNT = 128 * 1024
"""Most keys accepted in one key list or MULTI_SET, as torch's libuv server."""

_STOP_WAITING = b"\x00"
_WAIT_CANCELED = b"\x01"
_CHECK_READY = b"\x00"
_CHECK_NOT_READY = b"\x01"
_CLOSE_GRACE_S = 5.0

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
# strtoll(base 10): C-locale blanks, optional sign, digits; the rest is ignored.
_LEADING_INT = re.compile(rb"[ \t\n\r\x0b\x0c]*([+-]?[0-9]+)")


class _Query(enum.IntEnum):
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


class _ProtocolError(Exception):
    """The peer broke the protocol: close its connection (torch's only error signal)."""


def _parse_int(value: bytes) -> int | None:
    """Read ``value`` the way C ``strtoll`` does; None if no digits or outside int64."""
    match = _LEADING_INT.match(value)
    if match is None:
        return None
    number = int(match.group(1))
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def _wrap_int64(number: int) -> int:
    """Two's-complement wrap-around, as the C++ server's int64 addition."""
    return (number - _INT64_MIN) % 2**64 + _INT64_MIN


def _pack_bytes(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


@dataclass(eq=False)
class _KeyWaiter:
    """A blocked WAIT: replies once every key in ``missing`` has appeared."""

    on_ready: Callable[[], None]
    missing: set[bytes]


@dataclass(eq=False)
class _BarrierWaiter:
    """A blocked BARRIER: replies once the counter at ``key`` reaches ``world_size``."""

    on_ready: Callable[[], None]
    key: bytes
    world_size: int


_Waiter = _KeyWaiter | _BarrierWaiter
_W = TypeVar("_W", _KeyWaiter, _BarrierWaiter)


class _Keyspace:
    """Keys, queues and blocked callers: pure state, no I/O (wake-ups are callbacks)."""

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self._queues: dict[bytes, deque[bytes]] = {}
        # dicts used as insertion-ordered sets: FIFO wake-one and O(1) removal.
        self._key_waiters: dict[bytes, dict[_KeyWaiter, None]] = {}
        self._barrier_waiters: dict[bytes, dict[_BarrierWaiter, None]] = {}

    def exists(self, key: bytes) -> bool:
        """A key exists if it holds a value or names a non-empty queue."""
        return key in self.values or bool(self._queues.get(key))

    def set(self, key: bytes, value: bytes) -> None:
        self.values[key] = value
        self._changed(key)

    def append(self, key: bytes, suffix: bytes) -> None:
        self.values[key] = self.values.get(key, b"") + suffix
        self._changed(key)

    def compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        """Replace when the current value (missing = empty) equals ``expected``."""
        current = self.values.get(key)
        if current is None:
            if expected:
                return expected  # torch's documented quirk: report success-looking data
            self.set(key, desired)
            return desired
        if current == expected:
            self.set(key, desired)
            return desired
        return current

    def add(self, key: bytes, delta: int) -> int:
        """Add to the decimal text at ``key`` (missing = 0); non-integers are errors."""
        current = self.values.get(key)
        base = 0 if current is None else _parse_int(current)
        if base is None:
            raise _ProtocolError(f"ADD on non-integer value under {key!r}")
        total = _wrap_int64(base + delta)
        self.set(key, str(total).encode("ascii"))
        return total

    def delete(self, key: bytes) -> bool:
        """Remove a plain key; wakes nobody."""
        return self.values.pop(key, None) is not None

    def push(self, key: bytes, value: bytes) -> None:
        self._queues.setdefault(key, deque()).append(value)
        self._wake_one(key)

    def pop(self, key: bytes) -> tuple[int, bytes | None]:
        """Return (queue length before the pop, popped value or None); never blocks."""
        queue = self._queues.get(key)
        if not queue:
            return 0, None
        length = len(queue)
        value = queue.popleft()
        if not queue:
            del self._queues[key]
        return length, value

    def queue_len(self, key: bytes) -> int:
        return len(self._queues.get(key, ()))

    def wait(self, keys: Iterable[bytes], on_ready: Callable[[], None]) -> _KeyWaiter | None:
        """Register a WAIT; None when every key already exists (reply at once)."""
        missing = {key for key in keys if not self.exists(key)}
        if not missing:
            return None
        waiter = _KeyWaiter(on_ready, missing)
        for key in missing:
            self._key_waiters.setdefault(key, {})[waiter] = None
        return waiter

    def barrier(self, key: bytes, world_size: int, on_ready: Callable[[], None]) -> _BarrierWaiter | None:
        """Count one arrival; None once the counter reached ``world_size`` (reply)."""
        if self.add(key, 1) >= world_size:
            return None
        waiter = _BarrierWaiter(on_ready, key, world_size)
        self._barrier_waiters.setdefault(key, {})[waiter] = None
        return waiter

    def cancel(self, waiter: _Waiter) -> None:
        """Forget a blocked caller; a no-op if it was already released or cleared."""
        if isinstance(waiter, _BarrierWaiter):
            _discard(self._barrier_waiters, waiter.key, waiter)
            return
        for key in waiter.missing:
            _discard(self._key_waiters, key, waiter)

    def _changed(self, key: bytes) -> None:
        """``key`` now holds a value: release WAITs and BARRIERs it satisfies."""
        for waiter in self._key_waiters.pop(key, {}):
            waiter.missing.discard(key)
            if not waiter.missing:
                waiter.on_ready()
        self._release_barriers(key)

    def _wake_one(self, key: bytes) -> None:
        """A queue push satisfies only the oldest WAIT on ``key``."""
        waiters = self._key_waiters.get(key)
        if not waiters:
            return
        waiter = next(iter(waiters))
        _discard(self._key_waiters, key, waiter)
        waiter.missing.discard(key)
        if not waiter.missing:
            waiter.on_ready()

    def _release_barriers(self, key: bytes) -> None:
        waiters = self._barrier_waiters.get(key)
        if not waiters:
            return
        count = _parse_int(self.values.get(key, b""))
        if count is None:
            return
        for waiter in [w for w in waiters if count >= w.world_size]:
            _discard(self._barrier_waiters, key, waiter)
            waiter.on_ready()


def _discard(index: dict[bytes, dict[_W, None]], key: bytes, waiter: _W) -> None:
    """Remove ``waiter`` from ``index[key]``, dropping the entry when it empties."""
    waiters = index.get(key)
    if waiters is None:
        return
    waiters.pop(waiter, None)
    if not waiters:
        del index[key]


class _Connection:
    """One client socket: parses requests strictly in order and writes their replies."""

    def __init__(
        self,
        keyspace: _Keyspace,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self._keyspace = keyspace
        self._reader = reader
        self._writer = writer
        self._validated = False
        self._pending: _Waiter | None = None

    async def serve(self) -> None:
        """Handle requests until EOF or a protocol error, then close the socket."""
        try:
            while True:
                await self._handle_one()
        except (asyncio.IncompleteReadError, OSError):
            pass  # the peer went away or reset the connection
        except _ProtocolError as exc:
            logger.debug("closing store connection %s: %s", self._peer(), exc)
        except Exception:
            logger.exception("store connection %s failed", self._peer())
        finally:
            self._forget_pending()
            self._writer.close()

    def abort(self) -> None:
        """Drop the connection now, discarding unread requests and unsent replies."""
        self._forget_pending()
        self._writer.transport.abort()
        self._reader.set_exception(ConnectionAbortedError("dropped by the store"))

    async def _handle_one(self) -> None:
        code = (await self._reader.readexactly(1))[0]
        handler = _HANDLERS.get(code)
        if handler is None:
            raise _ProtocolError(f"unknown query type {code}")
        if not self._validated and code != _Query.VALIDATE:
            raise _ProtocolError(f"first query is {code}, not VALIDATE")
        await handler(self)
        await self._writer.drain()

    def _peer(self) -> object:
        return self._writer.get_extra_info("peername")

    # -- field readers

    async def _read_i64(self) -> int:
        value: int = _I64.unpack(await self._reader.readexactly(_I64.size))[0]
        return value

    async def _read_count(self) -> int:
        count: int = _U64.unpack(await self._reader.readexactly(_U64.size))[0]
        if count > MAX_KEY_COUNT:
            raise _ProtocolError(f"{count} keys in one request (limit {MAX_KEY_COUNT})")
        return count

    async def _read_sized(self, limit: int, what: str) -> bytes:
        size: int = _U64.unpack(await self._reader.readexactly(_U64.size))[0]
        if size > limit:
            raise _ProtocolError(f"{what} of {size} bytes (limit {limit})")
        return await self._reader.readexactly(size)

    async def _read_key(self) -> bytes:
        return await self._read_sized(MAX_KEY_LEN, "key")

    async def _read_value(self) -> bytes:
        return await self._read_sized(MAX_VALUE_LEN, "value")

    async def _read_keys(self) -> list[bytes]:
        count = await self._read_count()
        return [await self._read_key() for _ in range(count)]

    # -- blocking callers

    def _release(self) -> None:
        """The keyspace calls this when this connection's WAIT/BARRIER is satisfied."""
        self._pending = None
        if not self._writer.transport.is_closing():
            self._writer.write(_STOP_WAITING)

    def _park(self, waiter: _Waiter | None) -> None:
        if waiter is None:
            self._writer.write(_STOP_WAITING)
        else:
            self._pending = waiter

    def _require_idle(self, what: str) -> None:
        if self._pending is not None:
            raise _ProtocolError(f"{what} while a WAIT or BARRIER is still pending")

    def _forget_pending(self) -> None:
        if self._pending is not None:
            self._keyspace.cancel(self._pending)
            self._pending = None

    # -- query handlers, one per code

    async def op_validate(self) -> None:
        """VALIDATE: u32 magic; no reply."""
        (magic,) = _U32.unpack(await self._reader.readexactly(_U32.size))
        if magic != MAGIC:
            raise _ProtocolError(f"bad magic {magic:#x}")
        self._validated = True

    async def op_set(self) -> None:
        """SET: key, value; no reply."""
        key = await self._read_key()
        self._keyspace.set(key, await self._read_value())

    async def op_compare_set(self) -> None:
        """COMPARE_SET: key, expected, desired; reply the resulting value (§3.4)."""
        key = await self._read_key()
        expected = await self._read_value()
        desired = await self._read_value()
        self._writer.write(_pack_bytes(self._keyspace.compare_set(key, expected, desired)))

    async def op_get(self) -> None:
        """GET: key; reply the value, empty when missing (never blocks)."""
        key = await self._read_key()
        self._writer.write(_pack_bytes(self._keyspace.values.get(key, b"")))

    async def op_add(self) -> None:
        """ADD: key, i64 delta; reply the new i64."""
        key = await self._read_key()
        delta = await self._read_i64()
        self._writer.write(_I64.pack(self._keyspace.add(key, delta)))

    async def op_check(self) -> None:
        """CHECK: keylist; reply 00 if all exist, else 01."""
        keys = await self._read_keys()
        ready = all(self._keyspace.exists(key) for key in keys)
        self._writer.write(_CHECK_READY if ready else _CHECK_NOT_READY)

    async def op_wait(self) -> None:
        """WAIT: keylist; reply 00 once all exist (possibly much later)."""
        keys = await self._read_keys()
        self._require_idle("WAIT")
        self._park(self._keyspace.wait(keys, self._release))

    async def op_getnumkeys(self) -> None:
        """GETNUMKEYS: reply the i64 number of plain keys (queues excluded)."""
        self._writer.write(_I64.pack(len(self._keyspace.values)))

    async def op_delete_key(self) -> None:
        """DELETE_KEY: key; reply i64 1 if it existed, else 0."""
        key = await self._read_key()
        self._writer.write(_I64.pack(int(self._keyspace.delete(key))))

    async def op_append(self) -> None:
        """APPEND: key, suffix; no reply."""
        key = await self._read_key()
        self._keyspace.append(key, await self._read_value())

    async def op_multi_get(self) -> None:
        """MULTI_GET: keylist; reply one value per key, no count in front."""
        keys = await self._read_keys()
        values = self._keyspace.values
        self._writer.write(b"".join(_pack_bytes(values.get(key, b"")) for key in keys))

    async def op_multi_set(self) -> None:
        """MULTI_SET: u64 n, n x (key, value); no reply; applied once fully read."""
        count = await self._read_count()
        pairs = [(await self._read_key(), await self._read_value()) for _ in range(count)]
        for key, value in pairs:
            self._keyspace.set(key, value)

    async def op_cancel_wait(self) -> None:
        """CANCEL_WAIT: forget the pending WAIT/BARRIER, if any; always reply 01."""
        self._forget_pending()
        self._writer.write(_WAIT_CANCELED)

    async def op_ping(self) -> None:
        """PING: u32 nonce; reply the same four bytes."""
        self._writer.write(await self._reader.readexactly(_U32.size))

    async def op_queue_push(self) -> None:
        """QUEUE_PUSH: key, value; no reply; wakes one WAIT on the key."""
        key = await self._read_key()
        self._keyspace.push(key, await self._read_value())

    async def op_queue_pop(self) -> None:
        """QUEUE_POP: key; reply i64 length before the pop, then the value if > 0."""
        length, value = self._keyspace.pop(await self._read_key())
        reply = _I64.pack(length)
        self._writer.write(reply if value is None else reply + _pack_bytes(value))

    async def op_queue_len(self) -> None:
        """QUEUE_LEN: key; reply the i64 length."""
        self._writer.write(_I64.pack(self._keyspace.queue_len(await self._read_key())))

    async def op_list_keys(self) -> None:
        """LIST_KEYS: reply i64 n, then n keys (plain keyspace, arbitrary order)."""
        keys = list(self._keyspace.values)
        self._writer.write(_I64.pack(len(keys)) + b"".join(_pack_bytes(key) for key in keys))

    async def op_barrier(self) -> None:
        """BARRIER: key, i64 world_size; count an arrival, reply 00 once enough came."""
        key = await self._read_key()
        world_size = await self._read_i64()
        self._require_idle("BARRIER")
        self._park(self._keyspace.barrier(key, world_size, self._release))


_Handler = Callable[[_Connection], Coroutine[None, None, None]]
_HANDLERS: dict[int, _Handler] = {
    _Query.VALIDATE: _Connection.op_validate,
    _Query.SET: _Connection.op_set,
    _Query.COMPARE_SET: _Connection.op_compare_set,
    _Query.GET: _Connection.op_get,
    _Query.ADD: _Connection.op_add,
    _Query.CHECK: _Connection.op_check,
    _Query.WAIT: _Connection.op_wait,
    _Query.GETNUMKEYS: _Connection.op_getnumkeys,
    _Query.DELETE_KEY: _Connection.op_delete_key,
    _Query.APPEND: _Connection.op_append,
    _Query.MULTI_GET: _Connection.op_multi_get,
    _Query.MULTI_SET: _Connection.op_multi_set,
    _Query.CANCEL_WAIT: _Connection.op_cancel_wait,
    _Query.PING: _Connection.op_ping,
    _Query.QUEUE_PUSH: _Connection.op_queue_push,
    _Query.QUEUE_POP: _Connection.op_queue_pop,
    _Query.QUEUE_LEN: _Connection.op_queue_len,
    _Query.LIST_KEYS: _Connection.op_list_keys,
    _Query.BARRIER: _Connection.op_barrier,
}


def _tune_socket(writer: asyncio.StreamWriter) -> None:
    """TCP_NODELAY (tiny latency-bound replies), SO_KEEPALIVE (idle NAT paths)."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


class TCPStoreServer:
    """Serves one keyspace on one listening socket, bound once and held until close().

    All methods must be called from the event loop that runs the server.
    """

    def __init__(self) -> None:
        self._keyspace = _Keyspace()
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._closed = False
        self._connections: dict[_Connection, asyncio.Task[object]] = {}

    async def start(self, host: str, port: int) -> int:
        """Bind host:port (port 0 = let the OS pick), start serving; return the port.

        Raises ``StoreError("cannot listen on HOST:PORT: <os error>")`` on failure.
        """
        if self._server is not None or self._closed:
            raise RuntimeError("TCPStoreServer.start() runs once, before close()")
        try:
            self._server = await self._listen(host, port)
        except OSError as exc:
            raise StoreError(f"cannot listen on {host}:{port}: {exc}") from exc
        self._port = int(self._server.sockets[0].getsockname()[1])
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
        tasks = self._abort_connections()
        # A fresh object rather than clear(): a dropped handler may still parse a request
        # that was already buffered, and it must land in the orphaned keyspace.
        self._keyspace = _Keyspace()
        await _settle(tasks)

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

    async def _listen(self, host: str, port: int) -> asyncio.Server:
        server = await asyncio.start_server(self._on_connect, host, port, reuse_address=True)
        ports = [sock.getsockname()[1] for sock in server.sockets]
        if len(set(ports)) <= 1:
            return server
        # Port 0 on a name with several addresses gave each socket its own port;
        # workers get one MASTER_PORT, so rebind every address on the first one.
        server.close()
        await server.wait_closed()
        return await asyncio.start_server(self._on_connect, host, ports[0], reuse_address=True)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed:  # accepted just before close(): refuse, don't serve
            writer.transport.abort()
            return
        _tune_socket(writer)
        connection = _Connection(self._keyspace, reader, writer)
        task = asyncio.current_task()
        if task is not None:
            self._connections[connection] = task
        try:
            await connection.serve()
        finally:
            self._connections.pop(connection, None)

    def _abort_connections(self) -> list[asyncio.Task[object]]:
        """Abort every connection; return the handler tasks, which now end on their own.

        The tasks are not cancelled: Python 3.11's stream callback logs a cancelled
        client_connected_cb task as an error.
        """
        connections, self._connections = self._connections, {}
        for connection in connections:
            connection.abort()
        return list(connections.values())


async def _settle(tasks: list[asyncio.Task[object]]) -> None:
    """Let aborted handlers unwind (their next read fails at once), bounded."""
    if tasks:
        await asyncio.wait(tasks, timeout=_CLOSE_GRACE_S)
