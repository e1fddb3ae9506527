"""Relay the launcher's terminal to one worker's pseudo-terminal (interactive runs).

While the relay runs, the user's terminal is in raw *input* mode (no echo, no line editing, no
signal keys: the worker's own terminal does all of that, so pdb's line editing and history and
``input()`` behave as on a real terminal) with output processing left on (rankrun's and other
ranks' lines still end in ``\\r\\n``). Keystrokes go to the pty's master; its output reaches the
console through the agent like any worker's (``OsSpawner`` reads the master).

Signal keys are the launcher's business, as if the terminal had sent them: when the worker's
terminal has ``ISIG`` set, its ``VINTR``/``VQUIT`` characters become SIGINT/SIGQUIT to the
launcher itself (then handled, forwarded and reported like any signal, or acted on by the
disposition rankrun inherited), and ``VSUSP`` suspends the job (every worker, then the
launcher, with the terminal restored) when a job-control shell can resume it; on SIGCONT the
workers go on, and the terminal is taken back only if the job is in the foreground again. A
window-size change is passed on, and the kernel tells the worker with SIGWINCH. ``stop()``
restores the terminal exactly; should the launcher be killed first, the lifetime watchdog does
(``guard``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import termios
from collections.abc import Callable, Sequence
from typing import Any

_Attrs = list[Any]  # what termios.tcgetattr returns: 6 ints and the control characters
_LFLAG = 3
_CC = 6
_MAX_PENDING = 1 << 16  # keystrokes the worker has not read yet; beyond this they are dropped
_FOREGROUND_CHECK = 0.2  # seconds, while a suspended-then-backgrounded job waits to be in front again


def raw_mode(attrs: _Attrs) -> _Attrs:
    """``attrs`` (from ``tcgetattr``) made raw, input and output (pure).

    The worker's own terminal does all the processing (echo, line editing, ``\\n`` → ``\\r\\n``
    unless the worker turned it off), so the user's terminal must add nothing; rankrun's own
    lines are translated by the console while it is so (``Console.write_blocking``).
    """
    iflag, oflag, cflag, lflag, ispeed, ospeed, cc = attrs
    iflag &= ~(termios.BRKINT | termios.ICRNL | termios.INPCK | termios.ISTRIP | termios.IXON)
    oflag &= ~termios.OPOST
    lflag &= ~(termios.ECHO | termios.ICANON | termios.IEXTEN | termios.ISIG)
    cc = list(cc)
    cc[termios.VMIN], cc[termios.VTIME] = 1, 0
    return [iflag, oflag, cflag, lflag, ispeed, ospeed, cc]


def signal_keys(attrs: _Attrs) -> dict[int, int]:
    """Byte → signal for the worker terminal's signal keys, empty when its ``ISIG`` is off (pure)."""
    lflag, cc = attrs[_LFLAG], attrs[_CC]
    if not lflag & termios.ISIG:
        return {}
    keys: dict[int, int] = {}
    for index, signum in ((termios.VINTR, signal.SIGINT), (termios.VQUIT, signal.SIGQUIT), (termios.VSUSP, signal.SIGTSTP)):
        char = cc[index]
        code = char[0] if isinstance(char, bytes) and char else char
        if isinstance(code, int) and code != 0:  # _POSIX_VDISABLE
            keys[code] = signum
    return keys


def is_foreground_terminal(fd: int) -> bool:
    """``fd`` is a terminal and this process group is its foreground job (so it may own its modes)."""
    try:
        return os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False


def under_job_control() -> bool:
    """A shell with job control is our parent (same session, another process group), so ``fg`` can resume us.

    Otherwise our process group is orphaned and, as the kernel does for SIGTSTP, Ctrl-Z must not stop it.
    """
    parent = os.getppid()
    try:
        return os.getsid(parent) == os.getsid(0) and os.getpgid(parent) != os.getpgrp()
    except OSError:
        return False


class TerminalRelay:
    def __init__(
        self,
        master_fd: int,
        groups: Callable[[], Sequence[int]],
        tty_fd: int = 0,
        raise_signal: Callable[[int], None] = lambda signum: os.kill(os.getpid(), signum),
        guard: Callable[[_Attrs | None], None] | None = None,
    ) -> None:
        self._master = master_fd
        self._groups = groups  # every worker's process group (Ctrl-Z stops the whole job)
        self._tty = tty_fd
        self._raise = raise_signal
        self._guard = guard  # told the modes to restore should the launcher die (the watchdog), then None
        self._saved: _Attrs | None = None
        self._raw = False
        self._watch: asyncio.TimerHandle | None = None
        self._pending = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self._saved = termios.tcgetattr(self._tty)
        except termios.error:
            return
        self._loop.add_signal_handler(signal.SIGWINCH, self._resize)
        self._loop.add_signal_handler(signal.SIGCONT, self._on_continue)
        self._take()

    def stop(self) -> None:
        if self._loop is None or self._saved is None:
            return
        self._loop.remove_writer(self._master)
        self._loop.remove_signal_handler(signal.SIGWINCH)
        self._loop.remove_signal_handler(signal.SIGCONT)
        if self._watch is not None:
            self._watch.cancel()
        self._release()
        self._saved = None

    def _take(self) -> None:
        """In the foreground: raw mode and keystrokes to the worker. In the background: hands off (no SIGTTIN/SIGTTOU)."""
        assert self._loop is not None
        assert self._saved is not None
        self._watch = None
        if self._raw:
            return
        if not is_foreground_terminal(self._tty):
            # No event says "you are in the foreground again": a shell's `fg` sends SIGCONT only to a stopped
            # job, and reading the terminal to find out would stop us (SIGTTIN) and steal the shell's input.
            # So a backgrounded job looks, a few times a second, only while it is in the background.
            self._watch = self._loop.call_later(_FOREGROUND_CHECK, self._take)
            return
        if self._guard is not None:
            self._guard(self._saved)
        with contextlib.suppress(termios.error):
            termios.tcsetattr(self._tty, termios.TCSANOW, raw_mode(self._saved))
        self._raw = True
        self._loop.add_reader(self._tty, self._on_input)
        self._resize()

    def _release(self) -> None:
        """The terminal back as the user had it; stop reading it."""
        assert self._loop is not None
        self._loop.remove_reader(self._tty)
        if not self._raw or self._saved is None:
            return
        self._raw = False
        with contextlib.suppress(termios.error):
            termios.tcsetattr(self._tty, termios.TCSADRAIN, self._saved)
        if self._guard is not None:
            self._guard(None)

    def _resize(self) -> None:
        with contextlib.suppress(OSError):
            size = fcntl.ioctl(self._tty, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(self._master, termios.TIOCSWINSZ, size)

    def _on_input(self) -> None:
        try:
            data = os.read(self._tty, 4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the terminal went away: nothing more to relay
            assert self._loop is not None
            self._loop.remove_reader(self._tty)
            return
        try:
            keys = signal_keys(termios.tcgetattr(self._master))
        except termios.error:
            keys = {}
        start = 0
        for i, byte in enumerate(data):
            signum = keys.get(byte)
            if signum is None:
                continue
            self._send(data[start:i])
            start = i + 1
            if signum == signal.SIGTSTP:
                self._suspend()
            else:
                self._raise(signum)
        self._send(data[start:])

    def _suspend(self) -> None:
        """Ctrl-Z: stop every worker and then ourselves, the terminal as the user had it, until ``fg``/``bg``."""
        if not under_job_control():
            return  # nobody could resume us: the kernel discards SIGTSTP in this case too
        self._signal_workers(signal.SIGTSTP)  # for programs that tidy up on it
        # the workers' groups are orphaned (their sessions are their own), so the kernel discards a
        # stop by SIGTSTP: SIGSTOP is what actually stops them
        self._signal_workers(signal.SIGSTOP)
        self._release()
        os.kill(os.getpid(), signal.SIGSTOP)  # returns once the shell continues us
        self._on_continue()

    def _on_continue(self) -> None:
        """SIGCONT (``fg``, ``bg``, ``kill %1``): the workers go on too; the terminal is ours again only in the foreground."""
        self._signal_workers(signal.SIGCONT)
        if self._saved is not None and self._watch is None:
            self._take()

    def _signal_workers(self, signum: int) -> None:
        for group in self._groups():
            with contextlib.suppress(OSError):
                os.killpg(group, signum)

    def _send(self, data: bytes) -> None:
        if not data:
            return
        if len(self._pending) + len(data) <= _MAX_PENDING:
            self._pending += data
        self._flush()

    def _flush(self) -> None:
        assert self._loop is not None
        while self._pending:
            try:
                sent = os.write(self._master, self._pending)
            except (BlockingIOError, InterruptedError):
                self._loop.add_writer(self._master, self._flush)
                return
            except OSError:
                self._pending.clear()  # the worker's terminal is gone
                break
            del self._pending[:sent]
        self._loop.remove_writer(self._master)
