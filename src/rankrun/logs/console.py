"""The single writer of the launcher's stdout and stderr.

Everything that reaches the console (worker lines, agent messages, the final report) goes
through one thread that owns fds 1 and 2 and writes whole-line blocks with ``os.write``.
One writer means no line is ever spliced into another; a thread means a slow terminal or
a full pipe blocks only that thread, never the event loop that serves the worker store.
The queue is bounded: when it is full, producers wait, so the pipes back up into the
workers (they block in ``write``) and nothing is dropped.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading

_STOP = (-1, b"")


class Console:
    def __init__(self, stdout_fd: int = 1, stderr_fd: int = 2, depth: int = 512) -> None:
        self.stdout_fd = stdout_fd
        self.stderr_fd = stderr_fd
        self._queue: queue.Queue[tuple[int, bytes]] = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="rankrun-console", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            fd, data = self._queue.get()
            if fd < 0:
                return
            view = memoryview(data)
            while view:
                try:
                    written = os.write(fd, view)
                except InterruptedError:
                    continue
                except OSError:
                    break  # console gone (closed pipe): keep draining so producers never block
                view = view[written:]

    async def write(self, fd: int, data: bytes) -> None:
        """Queue ``data`` (whole lines) for ``fd``; waits, without blocking the loop, when the queue is full."""
        if not data:
            return
        try:
            self._queue.put_nowait((fd, data))
        except queue.Full:
            await asyncio.to_thread(self._queue.put, (fd, data))

    def say(self, message: str) -> None:
        """An agent message on stderr (rare: may block briefly on a full queue)."""
        self._queue.put((self.stderr_fd, f"rankrun: {message}\n".encode()))

    def write_blocking(self, fd: int, data: bytes) -> None:
        self._queue.put((fd, data))

    def close(self) -> None:
        """Flush everything queued, then stop the thread. Waits as long as the console keeps
        reading (nothing queued is dropped); a console that is gone (EPIPE) drains at once."""
        self._queue.put(_STOP)
        self._thread.join()
