"""The worker store's state: keys, queues and blocked callers, with torch's libuv semantics. Pure: no I/O, no asyncio.

Owns: the plain keyspace (``bytes`` keys to ``bytes`` values; ADD counters are decimal text, as in torch), the queues of
QUEUE_PUSH/QUEUE_POP, and the callers blocked in WAIT or BARRIER. A blocked caller is released through the ``on_ready``
callback it registered (the server writes its one-byte reply from there), so this module never touches a socket.
Semantics follow ``reference/tcpstore-protocol.md`` §3; the deliberate differences from torch are listed in
``tcpstore.py``.

Must not depend on: asyncio, sockets, torch, or anything else in rankrun.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["BarrierWaiter", "KeyWaiter", "Keyspace", "NotAnInteger", "Waiter", "parse_int"]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_INT64_DIGITS = 18  # any run of at most 18 decimal digits fits in an int64
# strtoll(base 10): C-locale blanks, optional sign, digits; the rest is ignored.
_LEADING_INT = re.compile(rb"[ \t\n\r\x0b\x0c]*([+-]?[0-9]+)")


class NotAnInteger(ValueError):
    """ADD or BARRIER on a value that does not start with a decimal int64 (torch closes the connection)."""


def parse_int(value: bytes) -> int | None:
    """Read ``value`` the way C ``strtoll`` does; None if no digits or outside int64."""
    if value.isdigit() and len(value) <= _INT64_DIGITS:  # what ADD itself writes: the fast path
        return int(value)
    match = _LEADING_INT.match(value)
    if match is None:
        return None
    number = int(match.group(1))
    return number if _INT64_MIN <= number <= _INT64_MAX else None


def _wrap_int64(number: int) -> int:
    """Two's-complement wrap-around, as the C++ server's int64 addition."""
    return (number - _INT64_MIN) % 2**64 + _INT64_MIN


class KeyWaiter:
    """A blocked WAIT: ``on_ready()`` once every key in ``missing`` has appeared; ``seq``: its arrival (``Keyspace.stamp``)."""

    __slots__ = ("missing", "on_ready", "seq")

    def __init__(self, on_ready: Callable[[], None], missing: set[bytes], seq: int = 0) -> None:
        self.on_ready = on_ready
        self.missing = missing
        self.seq = seq


class BarrierWaiter:
    """A blocked BARRIER: ``on_ready()`` once the counter at ``key`` reaches ``world_size``."""

    __slots__ = ("key", "on_ready", "world_size")

    def __init__(self, on_ready: Callable[[], None], key: bytes, world_size: int) -> None:
        self.on_ready = on_ready
        self.key = key
        self.world_size = world_size


Waiter = KeyWaiter | BarrierWaiter
_W = TypeVar("_W", KeyWaiter, BarrierWaiter)


class Keyspace:
    """Keys, queues and blocked callers of one attempt."""

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self._queues: dict[bytes, deque[bytes]] = {}
        # dicts used as insertion-ordered sets: FIFO wake-one and O(1) removal.
        self._key_waiters: dict[bytes, dict[KeyWaiter, None]] = {}
        self._barrier_waiters: dict[bytes, dict[BarrierWaiter, None]] = {}
        self._arrivals = 0

    def stamp(self) -> int:
        """The next arrival number: every WAIT gets one, in order; a store relay's shared wait takes one per waiter."""
        self._arrivals += 1
        return self._arrivals

    def enqueue(self, key: bytes, waiter: KeyWaiter) -> None:
        """Register a one-key ``waiter`` at the place its arrival number gives it among the key's waiters (a relayed
        waiter that stood behind its shared wait's first one: a queue push releases the oldest WAIT)."""
        waiters = self._key_waiters.setdefault(key, {})
        waiters[waiter] = None
        if any(w.seq > waiter.seq for w in waiters):  # behind later ones: the key's waiters again in arrival order
            self._key_waiters[key] = dict.fromkeys(sorted(waiters, key=lambda w: w.seq))

    def exists(self, key: bytes) -> bool:
        """A key exists if it holds a value or names a non-empty queue."""
        return key in self.values or bool(self._queues.get(key))

    def all_exist(self, keys: Iterable[bytes]) -> bool:
        values, queues = self.values, self._queues
        return all(key in values or queues.get(key) for key in keys)

    def set(self, key: bytes, value: bytes) -> None:
        self.values[key] = value
        if self._key_waiters or self._barrier_waiters:
            self._changed(key)

    def append(self, key: bytes, suffix: bytes) -> None:
        self.set(key, self.values.get(key, b"") + suffix)

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
        """Add to the decimal text at ``key`` (missing = 0); NotAnInteger otherwise."""
        current = self.values.get(key)
        base = 0 if current is None else parse_int(current)
        if base is None:
            raise NotAnInteger(f"ADD on non-integer value under {key!r}")
        total = base + delta
        if not _INT64_MIN <= total <= _INT64_MAX:
            total = _wrap_int64(total)
        self.set(key, b"%d" % total)
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

    def wait(self, keys: Iterable[bytes], on_ready: Callable[[], None]) -> KeyWaiter | None:
        """Register a WAIT; None when every key already exists (reply at once)."""
        values, queues = self.values, self._queues
        missing = {key for key in keys if key not in values and not queues.get(key)}
        if not missing:
            return None
        waiter = KeyWaiter(on_ready, missing, self.stamp())
        for key in missing:
            self._key_waiters.setdefault(key, {})[waiter] = None
        return waiter

    def barrier(self, key: bytes, world_size: int, on_ready: Callable[[], None]) -> BarrierWaiter | None:
        """Count one arrival; None once the counter reached ``world_size`` (reply)."""
        if self.add(key, 1) >= world_size:
            return None
        waiter = BarrierWaiter(on_ready, key, world_size)
        self._barrier_waiters.setdefault(key, {})[waiter] = None
        return waiter

    def cancel(self, waiter: Waiter) -> None:
        """Forget a blocked caller; a no-op if it was already released or cleared."""
        if isinstance(waiter, BarrierWaiter):
            _discard(self._barrier_waiters, waiter.key, waiter)
            return
        for key in waiter.missing:
            _discard(self._key_waiters, key, waiter)

    def _changed(self, key: bytes) -> None:
        """``key`` now holds a value: release WAITs and BARRIERs it satisfies."""
        waiters = self._key_waiters.pop(key, None)
        if waiters is not None:
            for waiter in waiters:
                waiter.missing.discard(key)
                if not waiter.missing:
                    waiter.on_ready()
        if key in self._barrier_waiters:
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
        waiters = self._barrier_waiters[key]
        count = parse_int(self.values.get(key, b""))
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
