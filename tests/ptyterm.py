"""A launcher on a real pseudo-terminal, with a screen (pyte) to assert what a person would see.

The launcher is started as the leader of a new session whose controlling terminal is the
pty, so it is the terminal's foreground job, exactly as when typed at a shell prompt. A
reader thread feeds everything the terminal receives into a VT100 screen; tests wait
(bounded) for text on the screen or in the raw bytes and type keys into the master.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import re
import select
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pyte

_READ = {"x86_64": 0, "aarch64": 63}  # the read(2) syscall's number, as /proc/<pid>/syscall shows it


def reading(pid: int, fd: int = 0) -> bool:
    """Whether ``pid`` is blocked in ``read(fd, ...)`` now (``/proc/<pid>/syscall``: the number, then the arguments).

    A prompt on the screen is not yet a process reading: CPython's ``input()`` writes its prompt, then calls
    ``read``, and checks for signals only when that read is interrupted. A SIGINT that lands between the two
    (the writer preempted by whoever its prompt woke, on a loaded machine) sets Python's flag and interrupts
    nothing: the worker then waits for a line forever. Only a signal sent once the read has begun stops it.
    """
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return fields[:2] == [str(_READ[platform.machine()]), hex(fd)]


# select, poll, pselect6, ppoll: how readline waits for a key (CPython's readline module selects on stdin, then reads)
_WAIT = {"x86_64": {"23", "7", "270", "271"}, "aarch64": {"72", "73"}}


def awaiting_keys(pid: int) -> bool:
    """Whether ``pid`` waits for input: blocked in ``read(0, ...)`` (``input()``) or in select/poll (readline's
    wait, as pdb's prompt does, entered only once readline has put the terminal in its own mode)."""
    if reading(pid):
        return True
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:
        return False
    return bool(fields) and fields[0] in _WAIT[platform.machine()]


class PtyLauncher:
    def __init__(self, args: Sequence[str], env: dict[str, str], cwd: Path, rows: int = 30, cols: int = 100) -> None:
        self.master, self._slave = os.openpty()
        self.resize(rows, cols)
        self.initial_modes = termios.tcgetattr(self._slave)
        # setsid --ctty: a new session with the pty as its controlling terminal, then exec (same pid)
        self.proc = subprocess.Popen(
            ["setsid", "--ctty", *args], stdin=self._slave, stdout=self._slave, stderr=self._slave, env=env, cwd=cwd,
        )
        self.screen = pyte.Screen(cols, rows)
        self._stream = pyte.ByteStream(self.screen)
        self.raw = bytearray()
        self.arrivals: list[tuple[float, int]] = []  # (monotonic time, len(raw) after it)
        self._changed = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if not ready:
                continue
            with self._changed:  # read and record in one step: finish() never sees bytes in flight
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    return
                if not data:
                    return
                self.raw += data
                self.arrivals.append((time.monotonic(), len(self.raw)))
                self._stream.feed(data)
                self._changed.notify_all()

    def resize(self, rows: int, cols: int) -> None:
        """As a terminal window does: the kernel tells the foreground job with SIGWINCH."""
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def send(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def display(self) -> list[str]:
        with self._changed:
            return [line.rstrip() for line in self.screen.display]

    def cursor_line(self) -> str:
        with self._changed:
            return self.screen.display[self.screen.cursor.y].rstrip()

    def text(self) -> str:
        with self._changed:
            return self.raw.decode(errors="replace")

    def wait_until(self, what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not check():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what}; screen:\n" + "\n".join(self.screen.display))
                self._changed.wait(min(left, 0.1))

    def wait_screen(self, pattern: str, timeout: float = 30.0) -> None:
        """Until some line of the screen matches ``pattern``."""
        rx = re.compile(pattern)
        self.wait_until(f"{pattern!r} on the screen", lambda: any(rx.search(line.rstrip()) for line in self.screen.display), timeout)

    def wait_raw(self, pattern: bytes, timeout: float = 30.0, start: int = 0) -> int:
        """Until the bytes received after ``start`` match ``pattern``; returns where the match ends."""
        rx = re.compile(pattern)
        found: list[int] = []

        def check() -> bool:
            m = rx.search(self.raw, start)
            if m:
                found.append(m.end())
            return m is not None

        self.wait_until(f"{pattern!r} from the terminal", check, timeout)
        return found[0]

    def modes_now(self) -> list[object]:
        return termios.tcgetattr(self._slave)

    def finish(self, timeout: float = 60.0) -> int:
        rc = self.proc.wait(timeout=timeout)
        self.wait_until("the output to settle", lambda: not self._has_pending(), 10.0)
        return rc

    def _has_pending(self) -> bool:
        ready, _, _ = select.select([self.master], [], [], 0)
        return bool(ready)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            self.proc.wait(timeout=30)
        self._stop = True
        self._thread.join(10)
        for fd in (self.master, self._slave):
            with contextlib.suppress(OSError):
                os.close(fd)
