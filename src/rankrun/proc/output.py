"""Read one worker output fd (a pipe, or a pseudo-terminal's master) on the event loop.

``OutputReader`` is an ``asyncio.Protocol`` for ``loop.connect_read_pipe``: chunks arrive as
the transport reads them and are handed out whole, without copies. It differs from
``asyncio.StreamReader`` where worker output needs it: a pty master reports the end of its
stream as ``EIO``, which here is an ordinary end of stream (StreamReader would raise and drop
what was still buffered), and ``read`` takes a timeout (for holding partial lines) without a
task per call. When more than ``limit`` bytes wait unread, the transport stops reading, so the
pipe fills and the worker blocks in ``write()``: backpressure, nothing dropped.

Tests feed it directly (``feed_data``/``feed_eof``) as the shipped fake of a worker stream.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol

LIMIT = 1 << 18


class StreamSource(Protocol):
    """What the log pumps read from."""

    async def read(self, timeout: float | None = None) -> bytes | None:
        """The next chunk; ``b""`` at the end of the stream; ``None`` if ``timeout`` passed first."""
        ...


class OutputReader(asyncio.Protocol):
    def __init__(self, limit: int = LIMIT) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0
        self._limit = limit
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.ReadTransport | None = None
        self._paused = False

    # -- protocol side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self.feed_data(data)
        if self._size > self._limit and self._transport is not None and not self._paused:
            self._paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool | None:
        self.feed_eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        del exc  # EOF, EIO (a pty whose last slave fd closed) and errors all end the stream
        self.feed_eof()

    # -- feeding (the transport, or a test)

    def feed_data(self, data: bytes) -> None:
        if data and not self._eof:
            self._chunks.append(data)
            self._size += len(data)
            self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- consumer side

    async def read(self, timeout: float | None = None) -> bytes | None:
        if not self._chunks and not self._eof:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
            try:
                await waiter
            finally:
                if timer is not None:
                    timer.cancel()
            if not self._chunks and not self._eof:
                return None  # timed out
        if not self._chunks:
            return b""
        chunk = self._chunks.popleft()
        self._size -= len(chunk)
        if self._paused and self._size <= self._limit // 2 and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return chunk

    def close(self) -> None:
        """Stop reading (the stream ends for the consumer once what was read is taken)."""
        if self._transport is not None:
            self._transport.close()
        self.feed_eof()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
