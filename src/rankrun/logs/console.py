"""The only writers of the launcher's stdout and stderr once the job runs (``rankrun.main``).

Before that, ``rankrun.cli`` prints its own few lines (usage errors and notes on stderr, ``rankrun --stacks``'s answer
on stdout); nothing else in rankrun prints (``tests/unit/test_claims.py``), and Python's logging goes through the
console too (``rankrun.main``), as do the lines of ``--events /dev/stdout`` or ``/dev/stderr`` (``rankrun.events.log``,
through ``write_blocking``). ``rankrun.api.launch`` writes to its caller's streams, not the launcher's.

A *destination* is one place the console writes to: fd 1 and fd 2, or a single one when both
are the same file (a terminal, ``2>&1``), because then the order between the two streams is
visible and must be kept. Each destination has one FIFO queue and one writer thread that
writes with ``os.write``: one writer per destination keeps order and means bytes of two
sources are never interleaved within a write; threads mean a slow terminal or a full pipe
blocks only that thread, never the event loop that serves the worker store.

*Sources* (one per worker stream) hand raw worker bytes to ``write``. The console renders them
(``rankrun.logs.lines.render``: the rank prefix at each line start and after each ``\\r``)
and tracks, per destination, which source has a line open (its last byte was not a newline).
When another source (or rankrun itself) writes there, the open line is ended with a newline
first and continued later under its prefix: ranks are never spliced into one line, and
partial lines (progress bars, prompts) still show as they come.

Each queue is bounded: when it is full, producers wait (on an asyncio event the writer sets, no
executor threads), so the pipes back up into the workers and nothing is dropped. ``abandon()``
is the one exception, for a user who interrupts a launcher whose console stopped reading.
The *epilogue* (the failure report) is written by ``close()`` after every destination has
written everything queued before it, so it is always last.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import stat
import termios
import threading
from dataclasses import dataclass, field

from rankrun.logs.lines import LineState, render

DEPTH = 256
_POLL = 0.2  # how often a blocked close() looks at ``abandoned``


@dataclass(eq=False)
class _Flush:
    done: threading.Event = field(default_factory=threading.Event)


_STOP = _Flush()
_Item = bytes | _Flush


def same_destination(fd_a: int, fd_b: int) -> bool:
    """Whether two fds write to the same place (same file, pipe or terminal)."""
    try:
        a, b = os.fstat(fd_a), os.fstat(fd_b)
    except OSError:
        return False
    if stat.S_ISCHR(a.st_mode) and stat.S_ISCHR(b.st_mode):
        return a.st_rdev == b.st_rdev
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class Source:
    """One worker stream's view of the console: its prefix and where its line stands."""

    def __init__(self, console: Console, destination: _Destination, prefix: bytes) -> None:
        self.console = console
        self.destination = destination
        self.prefix = prefix
        self.state = LineState.FRESH
        destination.sources.add(self)

    @property
    def shared(self) -> bool:
        """Another live source writes to the same destination (so holding partial lines avoids splits)."""
        return len(self.destination.sources) > 1

    async def write(self, data: bytes) -> None:
        await self.console.write(self, data)

    def close(self) -> None:
        self.destination.sources.discard(self)


class _Destination:
    def __init__(self, fd: int, console: Console) -> None:
        self.fd = fd
        self.owner: Source | None = None  # the source whose line is open here
        self.sources: set[Source] = set()
        self.queue: queue.Queue[_Item] = queue.Queue(maxsize=DEPTH)
        self.space: asyncio.Event | None = None
        self.waiting = False  # a producer waits for room
        self._console = console
        self.thread = threading.Thread(target=self._run, name=f"rankrun-fd{fd}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        broken = False
        while True:
            item = self.queue.get()
            if self.waiting:
                self.waiting = False
                self._console.notify_space(self)
            if isinstance(item, _Flush):
                item.done.set()
                if item is _STOP:
                    return
                continue
            if broken or self._console.abandoned:
                continue  # keep draining so producers never block
            broken = not _write_all(self.fd, item)

    def end_open_line(self) -> bytes:
        """The newline that ends another source's open line here, if one is open."""
        owner, self.owner = self.owner, None
        if owner is None or not owner.state.open:
            return b""
        owner.state = LineState.ENDED
        return b"\n"


def _raw_terminal(fd: int) -> bool:
    """A terminal with output processing off (an interactive worker's relay): rankrun's own lines need \\r\\n."""
    try:
        return os.isatty(fd) and not termios.tcgetattr(fd)[1] & termios.OPOST
    except (OSError, termios.error):
        return False


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
    def __init__(self, stdout_fd: int = 1, stderr_fd: int = 2, *, merged: bool | None = None) -> None:
        self.stdout_fd = stdout_fd
        self.stderr_fd = stderr_fd
        self.merged = same_destination(stdout_fd, stderr_fd) if merged is None else merged
        self.abandoned = False
        self._lock = threading.Lock()  # render + enqueue are one step (agent messages may come from other threads)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._epilogue = b""
        out = _Destination(stdout_fd, self)
        self._destinations = {stdout_fd: out, stderr_fd: out if self.merged else _Destination(stderr_fd, self)}

    def source(self, fd: int, prefix: bytes) -> Source:
        """A new source writing to ``fd`` (the launcher's stdout or stderr) with ``prefix``."""
        return Source(self, self._destinations[fd], prefix)

    def notify_space(self, destination: _Destination) -> None:
        """Called by a writer thread after taking an item: wake producers waiting for room."""
        loop, space = self._loop, destination.space
        if loop is not None and space is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
                loop.call_soon_threadsafe(space.set)

    async def write(self, source: Source, data: bytes) -> None:
        """Render and queue raw worker bytes; waits, without blocking the loop, while the queue is full."""
        if not data or self.abandoned:
            return
        dest = source.destination
        await self._room(dest)  # first: render and enqueue must be one step, or two sources could swap places
        if self.abandoned:
            return
        with self._lock:
            head = dest.end_open_line() if dest.owner is not source else b""
            dest.owner = source
            shown, source.state = render(data, source.prefix, source.state)
            if not source.state.open:
                dest.owner = None
            if head or shown:
                dest.queue.put(head + shown)  # room was checked with no await since; only say() could take it

    async def _room(self, dest: _Destination) -> None:
        loop = asyncio.get_running_loop()
        while dest.queue.full() and not self.abandoned:
            if dest.space is None or self._loop is not loop:
                self._loop, dest.space = loop, asyncio.Event()
            dest.space.clear()
            dest.waiting = True  # from here on, every get wakes us: look once more, then wait
            if dest.queue.full():
                await dest.space.wait()

    def say(self, message: str) -> None:
        """An agent message on stderr (rare; may block briefly on a full stderr queue)."""
        self.write_blocking(self.stderr_fd, f"rankrun: {message}\n".encode())

    def write_blocking(self, fd: int, data: bytes) -> None:
        """rankrun's own whole lines: an open worker line there is ended first."""
        if not data or self.abandoned:
            return
        dest = self._destinations[fd]
        with self._lock:
            text = dest.end_open_line() + data
            dest.queue.put(text.replace(b"\n", b"\r\n") if _raw_terminal(dest.fd) else text)

    async def written(self) -> None:
        """Until everything queued so far has reached its destination, or the console is abandoned. The wait runs in
        a thread, so the loop goes on serving the stores meanwhile."""
        await asyncio.to_thread(self._flush, list(dict.fromkeys(self._destinations.values())))

    def set_epilogue(self, data: bytes) -> None:
        """Text for stderr that ``close()`` writes after everything else (the failure report)."""
        self._epilogue = data

    def abandon(self) -> None:
        """Stop waiting for a console that does not read: drop what is queued and what comes."""
        self.abandoned = True
        for dest in set(self._destinations.values()):
            while True:
                try:
                    item = dest.queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Flush):
                    item.done.set()
            self.notify_space(dest)

    def close(self) -> None:
        """End open prefixed lines, flush every destination, write the epilogue, stop the threads.

        Waits as long as the console keeps reading; returns early only once ``abandon()`` was
        called (e.g. by a signal handler).
        """
        destinations = list(dict.fromkeys(self._destinations.values()))
        with self._lock:
            for dest in destinations:
                if dest.owner is not None and dest.owner.prefix:
                    self._put_blocking(dest, dest.end_open_line())  # rankrun's own format: lines end
        self._flush(destinations)
        if self._epilogue:
            self.write_blocking(self.stderr_fd, self._epilogue)
        for dest in destinations:
            self._put_blocking(dest, _STOP)
        for dest in destinations:
            while dest.thread.is_alive() and not self.abandoned:
                dest.thread.join(_POLL)

    def _flush(self, destinations: list[_Destination]) -> None:
        marks = [_Flush() for _ in destinations]
        for dest, mark in zip(destinations, marks, strict=True):
            self._put_blocking(dest, mark)
        for mark in marks:
            while not self.abandoned and not mark.done.wait(_POLL):  # abandoned: at once, not a _POLL per mark
                pass

    def _put_blocking(self, dest: _Destination, item: _Item) -> None:
        if isinstance(item, bytes) and not item:
            return
        while not self.abandoned or item is _STOP:
            try:
                dest.queue.put(item, timeout=_POLL)
                return
            except queue.Full:
                if self.abandoned:
                    return
