"""The only writers of the launcher's stdout and stderr.

Everything that reaches the console (worker lines, agent messages, the final report) goes
through one writer thread per fd, which writes whole-line blocks with ``os.write``. One
writer per fd means no line is ever spliced into another; threads mean a slow terminal or
a full pipe blocks only that thread, never the event loop that serves the worker store,
and a stalled stdout never holds back stderr (where the report goes).

Each queue is bounded: when it is full, producers wait (on an asyncio event the writer
sets, no executor threads), so the pipes back up into the workers and nothing is dropped.
The one exception is ``abandon()``, for a user who interrupts a launcher whose console
stopped reading: queued and future output is then discarded so the launcher can exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading

_STOP = b""
DEPTH = 256


class _Writer:
    def __init__(self, fd: int, console: Console) -> None:
        self.fd = fd
        self._console = console
        self.queue: queue.Queue[bytes] = queue.Queue(maxsize=DEPTH)
        self.thread = threading.Thread(target=self._run, name=f"rankrun-fd{fd}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        broken = False
        while True:
            data = self.queue.get()
            self._console.notify_space()
            if data is _STOP:
                return
            if broken or self._console.abandoned:
                continue  # keep draining so producers never block
            broken = not _write_all(self.fd, data)


def _write_all(fd: int, data: bytes) -> bool:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except InterruptedError:
            continue
        except OSError:
            return False  # console gone (closed pipe): the rest is discarded
    return True


class Console:
    def __init__(self, stdout_fd: int = 1, stderr_fd: int = 2) -> None:
        self.stdout_fd = stdout_fd
        self.stderr_fd = stderr_fd
        self.abandoned = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._space: asyncio.Event | None = None
        self._writers = {stdout_fd: _Writer(stdout_fd, self), stderr_fd: _Writer(stderr_fd, self)}

    def notify_space(self) -> None:
        """Called by a writer thread after taking an item: wake producers waiting for room."""
        loop, space = self._loop, self._space
        if loop is not None and space is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
                loop.call_soon_threadsafe(space.set)

    async def write(self, fd: int, data: bytes) -> None:
        """Queue ``data`` (whole lines) for ``fd``; waits, without blocking the loop, while the queue is full."""
        if not data or self.abandoned:
            return
        target = self._writers[fd].queue
        while not self.abandoned:
            if self._space is None or self._loop is not asyncio.get_running_loop():
                self._loop, self._space = asyncio.get_running_loop(), asyncio.Event()
            self._space.clear()  # before trying: a get after a failed put always wakes us
            try:
                target.put_nowait(data)
                return
            except queue.Full:
                await self._space.wait()

    def say(self, message: str) -> None:
        """An agent message on stderr (rare; may block briefly on a full stderr queue)."""
        self.write_blocking(self.stderr_fd, f"rankrun: {message}\n".encode())

    def write_blocking(self, fd: int, data: bytes) -> None:
        if data and not self.abandoned:
            self._writers[fd].queue.put(data)

    def abandon(self) -> None:
        """Stop waiting for a console that does not read: drop what is queued and what comes."""
        self.abandoned = True
        for writer in self._writers.values():
            while True:
                try:
                    writer.queue.get_nowait()
                except queue.Empty:
                    break
        self.notify_space()

    def close(self) -> None:
        """Flush everything queued, then stop the threads. Waits as long as the console keeps
        reading; returns early only once ``abandon()`` was called (e.g. by a signal handler)."""
        for writer in self._writers.values():
            while True:
                try:
                    writer.queue.put(_STOP, timeout=0.2)
                    break
                except queue.Full:
                    if self.abandoned:
                        break
        for writer in self._writers.values():
            while writer.thread.is_alive() and not self.abandoned:
                writer.thread.join(0.2)
