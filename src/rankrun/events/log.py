"""``--events PATH``: the job's events as JSON lines, appended to a file, a FIFO or ``/dev/stderr``.

Each event is one line written by one ``write`` (so writers appending to the same file never mix their lines), flushed
by that write itself (no buffer is kept). ``on_event`` never waits on PATH itself: the loop's thread encodes the line
and hands it on, to the console, to the log's thread, or to a pipe that takes it at once or drops it. What PATH is
decides the rest:

- ``/dev/stdout`` and ``/dev/stderr`` are the launcher's own, which only its console writes
  (``rankrun.logs.console``): the lines go through the console's writer (``console``), in order with the console's own
  lines, and fare as they do (a pipe's reader that stops reading holds them as it holds the workers' output);
- a regular file is created if missing and appended to (``O_APPEND``), never truncated. It is written by a thread of
  the log's own, in order, as the console writes its destinations, so a slow disk never holds the job's loop; the
  thread's queue has no bound, as a job's events are few (a handful an attempt);
- a pipe (a FIFO) is written without ever blocking the job. A line goes whole or not at all: a line of at most
  ``PIPE_BUF`` bytes is all-or-nothing in a non-blocking write, so a line the pipe has no room for (its reader does
  not keep up), or a longer line, is dropped and counted. A FIFO with no reader (opening it says ENXIO) is opened
  again at each event: lines are dropped until a reader opens it, and from then on they flow. A reader that goes away
  (EPIPE) makes the log close the FIFO and wait for the next the same way; the pipe, and whatever the last reader left
  unread in it, goes with it, so the next reader starts at a line's start. The launcher ignores SIGPIPE, as every
  CPython program does from start-up on (and rankrun never restores it), so a reader going away is an EPIPE here,
  never a signal;
- a terminal or a character device (``/dev/null``) named by its path is written as a file is, by the log's thread,
  blocking there as the console does on its own.

Nothing here raises once the log is open: an event that could not be written is counted, and ``close`` (which waits
for the thread to write what it was given) says how many in one line (``say``). A PATH that cannot be opened at all is
the user's: ``UsageError`` naming it. Without a ``console`` (a caller that has none), ``/dev/stdout`` and
``/dev/stderr`` are opened as any other path.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import queue
import select
import stat
import threading
from collections.abc import Callable

from rankrun.errors import UsageError
from rankrun.events.records import Record, as_json

FLAG = "--events"
_STD = {"/dev/stdout": 1, "/dev/stderr": 2}


# JSON's escapes: the quote, the backslash and the control characters; everything else goes as UTF-8
_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", **{c: f"\\u{c:04x}" for c in range(0x20)},
            ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", ord("\b"): "\\b", ord("\f"): "\\f"}


def _json(value: object) -> str:  # noqa: PLR0911 - one return per JSON type
    """An event's value as compact JSON (``json.dumps(..., separators=(",", ":"), ensure_ascii=False,
    allow_nan=False)`` gives the same text): the values a record holds, without importing ``json`` (a launch with
    ``--events`` pays it otherwise, ~2 ms). A NaN or an infinity is a ``ValueError``, as JSON has no word for them."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("Out of range float values are not JSON compliant")
        return repr(value)
    if isinstance(value, str):
        return '"' + value.translate(_ESCAPES) + '"'
    if isinstance(value, list | tuple):
        return "[" + ",".join(_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(_json(str(k)) + ":" + _json(v) for k, v in value.items()) + "}"
    raise ValueError(f"not JSON: {type(value).__name__}")


def encode(event: Record) -> bytes:
    """One event as its JSON line: compact, UTF-8, ending in a newline."""
    return _json(as_json(event)).encode() + b"\n"


class EventLog:
    """The ``--events`` consumer of one job's ``EventStream`` (``on_event``); ``close`` once the job has ended."""

    def __init__(self, path: str, fd: int, pipe: bool, say: Callable[[str], None],
                 console: Callable[[bytes], None] | None = None) -> None:
        """``fd``: PATH opened (-1: a FIFO with no reader yet, or the ``console``, which writes the lines instead);
        ``pipe``: written without blocking on the loop's thread, where anything else but the console gets a thread."""
        self.path, self._fd, self._pipe, self._say, self._console = path, fd, pipe, say, console
        self.written = 0
        self.unread = 0  # lines a pipe had no reader for, or no room for
        self.failed = 0  # events that could not be written at all (the device's error, or not JSON)
        self._error = ""  # why the last of those was not
        self._closed = False
        self._failing = threading.Lock()  # the loop's thread and the writer's both count failures
        self._queue: queue.SimpleQueue[bytes | None] | None = None
        self._thread: threading.Thread | None = None
        if fd >= 0 and not pipe:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._drain, name="rankrun-events", daemon=True)
            self._thread.start()

    @classmethod
    def open(cls, path: str, say: Callable[[str], None],
             console: Callable[[int, bytes], None] | None = None) -> EventLog:
        """The log for PATH (see the module docstring); ``UsageError`` if PATH cannot be written at all.
        ``console(fd, line)``: the console's writer of the launcher's stdout (1) and stderr (2)."""
        if path in _STD and console is not None:
            fd = _STD[path]
            try:
                os.fstat(fd)  # a launcher started with it closed: nothing would ever show
            except OSError as exc:
                raise UsageError(FLAG, path, exc.strerror or str(exc)) from None
            return cls(path, -1, False, say, lambda line: console(fd, line))
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o666)
        except OSError as exc:
            if exc.errno == errno.ENXIO and _is_fifo(path):
                return cls(path, -1, True, say)  # a FIFO nobody reads yet: opened again at each event
            raise UsageError(FLAG, path, exc.strerror or str(exc)) from None
        pipe = stat.S_ISFIFO(os.fstat(fd).st_mode)  # a folder never gets here: O_WRONLY on it is EISDIR
        return cls(path, fd if pipe else _blocking(fd), pipe, say)

    def on_event(self, event: Record) -> None:
        try:
            line = encode(event)
        except ValueError as exc:  # a NaN or an infinity, which JSON has no word for: the job goes on without it
            self._fail(f"{type(event).__name__}: {exc}")
            return
        self.write(line)

    def write(self, line: bytes) -> None:
        """Append one whole line (ending in a newline), or count it dropped; a file's is queued for the log's thread."""
        if self._closed:
            return
        if self._console is not None:
            self._console(line)
            self.written += 1
            return
        if self._queue is not None:
            self._queue.put(line)
            return
        if self._fd < 0 and not self._reopen():
            self.unread += 1
            return
        if self._pipe and len(line) > select.PIPE_BUF:
            self.unread += 1  # a non-blocking write of more could be cut short: a line never is
            return
        try:
            os.write(self._fd, line)  # all or nothing: a line of at most PIPE_BUF bytes, without blocking
        except BlockingIOError:
            self.unread += 1  # the pipe is full: its reader does not keep up
        except BrokenPipeError:
            os.close(self._fd)  # the reader went away: the next one gets a new pipe, not the rest of this one's
            self._fd = -1
            self.unread += 1
        except OSError as exc:
            self._fail(exc.strerror or str(exc))
        else:
            self.written += 1

    def _drain(self) -> None:
        """The log's thread: write a file's (or a terminal's) lines in order, blocking where the device does."""
        assert self._queue is not None
        while (line := self._queue.get()) is not None:
            try:
                done = os.write(self._fd, line)
                while done < len(line):  # a file or a terminal, which block, may write part of a line
                    done += os.write(self._fd, line[done:])
            except OSError as exc:
                self._fail(exc.strerror or str(exc))
            else:
                self.written += 1

    def close(self) -> None:
        """Wait for the log's thread to write what it was given, close PATH, and say in one line how many events could
        not be written, if any. Blocks while a file or a terminal does: call it off the loop's thread."""
        if self._closed:
            return
        self._closed = True
        if self._queue is not None and self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        parts = []
        if self.unread:
            parts.append(f"{self.unread} event{_s(self.unread)} dropped (no reader, or it does not keep up)")
        if self.failed:
            parts.append(f"{self.failed} event{_s(self.failed)} not written: {self._error}")
        if parts:
            self._say(f"rankrun: {FLAG} {self.path}: {'; '.join(parts)}")

    @property
    def dropped(self) -> int:
        """Events not written, for whatever reason."""
        return self.unread + self.failed

    def _reopen(self) -> bool:
        """Open the FIFO again, if a reader has come (ENXIO while none has)."""
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        return True

    def _fail(self, error: str) -> None:
        with self._failing:
            self.failed += 1
            self._error = error


def _is_fifo(path: str) -> bool:
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def _blocking(fd: int) -> int:
    """``fd`` with O_NONBLOCK cleared: a file, a terminal or a socket is written as the console is."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def _s(n: int) -> str:
    return "" if n == 1 else "s"
