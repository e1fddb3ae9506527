"""Bind worker lifetime to the launcher, even across ``kill -9``.

Three layers, cheapest first:

1. Each worker gets ``PR_SET_PDEATHSIG=SIGKILL`` (``setpriv`` or a pre-exec hook, see ``spawn``):
   it dies with the launcher's main thread. Grandchildren do not inherit it, hence:
2. A *watchdog*: a process forked from the launcher before any thread exists. It holds the
   read end of a pipe; the launcher registers each worker's process group on it. When the
   launcher dies for any reason the kernel closes the write end, the watchdog reads EOF and
   SIGKILLs every registered process group (the worker and everything it started that kept
   its process group), puts the user's terminal modes back if an interactive run had them
   changed, removes the launcher's private temp directory (and a ``rankrun.launch`` caller's, which died first) and
   the files it registered (the DCGM job-mapping files: each only while it still holds what the launcher wrote),
   then exits. A clean
   launcher exit says ``exit`` first, so nothing is killed twice.
3. The launcher is a child subreaper (``PR_SET_CHILD_SUBREAPER``): descendants orphaned by a
   worker are re-parented to it, so at the end of each attempt it can kill and reap them
   even if they left the worker's process group (``reap_orphans``). While the job runs, each one
   that exits is reaped as its SIGCHLD arrives (``reap_strays``): as PID 1 of a container no
   zombie waits for the attempt's end.

Forking (not spawning a fresh interpreter) keeps the cost to about a millisecond.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankrun import procfs

_PR_SET_CHILD_SUBREAPER = 36


class Watchdog:
    """Launcher side of the watchdog pipe."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self._fd = fd

    @classmethod
    def start(cls) -> Watchdog:
        """Fork the watchdog. Call before any thread is started."""
        read_fd, write_fd = os.pipe()
        tty_fd = _dup_terminal()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the forked child
            os.close(write_fd)
            _watch(read_fd, tty_fd)
        os.close(read_fd)
        if tty_fd >= 0:
            os.close(tty_fd)
        os.set_inheritable(write_fd, False)
        return cls(pid, write_fd)

    def _send(self, line: str) -> None:
        with contextlib.suppress(OSError):
            os.write(self._fd, line.encode() + b"\n")

    def register(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def unregister(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def terminal_modes(self, attrs: list[Any] | None) -> None:
        """The user's terminal modes to put back if the launcher dies while it holds them changed (None: restored)."""
        if attrs is None:
            self._send("T")
            return
        cc = [c[0] if isinstance(c, bytes) else int(c) for c in attrs[6]]
        self._send("t" + ",".join(str(int(v)) for v in [*attrs[:6], *cc]))

    def own_dir(self, path: str) -> None:
        """A private directory to remove if the launcher dies without cleaning up."""
        self._send(f"d{path}")

    def own_file(self, path: str, content: str) -> None:
        """A file to remove if the launcher dies without cleaning up, only while it still holds ``content`` (whoever
        wrote it since, another job given the same GPU, keeps it). Hex: a path or content may hold any character,
        a newline too (json would cost every launch its import)."""
        self._send(f"f{path.encode().hex()} {content.encode().hex()}")

    def disown_file(self, path: str) -> None:
        """The launcher removed ``path`` itself (or left it to its new owner): nothing to do for it at death."""
        self._send(f"F{path.encode().hex()}")

    def close(self) -> None:
        """Normal exit: tell the watchdog there is nothing to kill, then reap it."""
        if self._fd < 0:
            return
        self._send("exit")
        os.close(self._fd)
        self._fd = -1
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _dup_terminal() -> int:
    """A copy of the launcher's terminal (stdin) for the watchdog, or -1."""
    try:
        return os.dup(0) if os.isatty(0) else -1
    except OSError:
        return -1


class _State:
    def __init__(self) -> None:
        self.groups: set[int] = set()
        self.dirs: list[str] = []
        self.files: dict[str, str] = {}  # path -> the content that makes it still ours
        self.modes: list[Any] | None = None  # the user's terminal modes while the launcher has them changed
        self.clean = False


def _watch(read_fd: int, tty_fd: int) -> None:  # pragma: no cover - runs in the forked child
    """The watchdog's whole life: collect process groups until EOF, then kill them."""
    try:
        os.setsid()  # out of the launcher's session: terminal signals must not reach us
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_IGN)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        for low, high in _gaps(sorted({read_fd, tty_fd})):
            os.closerange(low, high)
        state = _State()
        buffer = b""
        while chunk := os.read(read_fd, 4096):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                _apply(line.decode(), state)
        if not state.clean:
            _clean_up(state, tty_fd)
    finally:
        os._exit(0)


def _gaps(keep: list[int]) -> list[tuple[int, int]]:
    """fd ranges from 3 up that hold none of ``keep`` (``-1`` entries ignored)."""
    ranges, low = [], 3
    for fd in (k for k in keep if k >= 3):
        ranges.append((low, fd))
        low = fd + 1
    return [*ranges, (low, 65536)]


def _clean_up(state: _State, tty_fd: int) -> None:  # pragma: no cover - runs in the forked child
    for pgid in state.groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    if state.modes is not None and tty_fd >= 0:
        import termios  # noqa: PLC0415 - only on this rare path

        with contextlib.suppress(OSError, termios.error):
            termios.tcsetattr(tty_fd, termios.TCSANOW, state.modes)
    from rankrun.fsutil import remove_tree  # noqa: PLC0415 - only on this rare path

    for path in state.dirs:
        remove_tree(Path(path))
    for path, content in state.files.items():
        _remove_if_holds(path, content)


def _remove_if_holds(path: str, content: str) -> None:  # pragma: no cover - runs in the forked child
    """Remove ``path`` if it holds exactly ``content``. Another writer replacing it between the read and the unlink
    loses its file: a window of microseconds, against one of a whole job for a file nobody removes."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            if fh.read(len(content) + 1) != content:
                return
        os.unlink(path)
    except OSError:
        pass


def _apply(line: str, state: _State) -> None:  # pragma: no cover - runs in the forked child
    kind, rest = line[:1], line[1:]
    if line == "exit":
        state.clean = True
    elif kind == "+":
        state.groups.add(int(rest))
    elif kind == "-":
        state.groups.discard(int(rest))
    elif kind == "d":
        state.dirs.append(rest)
    elif kind == "f":
        path, _, content = rest.partition(" ")
        state.files[bytes.fromhex(path).decode()] = bytes.fromhex(content).decode()
    elif kind == "F":
        state.files.pop(bytes.fromhex(rest).decode(), None)
    elif kind == "t":
        values = [int(v) for v in rest.split(",")]
        state.modes = [*values[:6], values[6:]]
    elif kind == "T":
        state.modes = None


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process; False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def reap_strays(exclude: set[int], *, spawning: bool) -> tuple[list[int], bool]:
    """Reap the children that have exited and are not ``exclude`` (the watchdog, the workers the event loop
    reaps itself, children the launcher had before): orphans re-parented to the launcher. Returns those reaped,
    and whether one was left for later: a session leader (as every worker is) while a spawn is under way may be
    a worker not in ``exclude`` yet."""
    reaped, later = [], False
    for pid in procfs.children("self"):
        if pid in exclude:
            continue
        fields = procfs.stat(pid)
        if fields is None or fields[0] != "Z":
            continue
        if spawning and int(fields[3]) == pid:  # its session is its own
            later = True
            continue
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0]:
                reaped.append(pid)
    return reaped, later


STRAY_RETRY = 0.05  # seconds before looking again at a zombie that may be a worker still being recorded


def reap_on_sigchld(exclude: Callable[[], set[int]], spawning: Callable[[], bool]) -> Callable[[], None]:
    """On the running loop: at each SIGCHLD, ``reap_strays`` (coalesced, and once more shortly when a zombie had
    to wait for a spawn under way). Returns what stops it."""
    loop = asyncio.get_running_loop()
    pending: list[asyncio.Handle] = []

    def sweep() -> None:
        pending.clear()
        _, later = reap_strays(exclude(), spawning=spawning())
        if later:
            pending.append(loop.call_later(STRAY_RETRY, sweep))

    def on_sigchld() -> None:
        if not pending:
            pending.append(loop.call_soon(sweep))

    loop.add_signal_handler(signal.SIGCHLD, on_sigchld)

    def stop() -> None:
        loop.remove_signal_handler(signal.SIGCHLD)
        for handle in pending:
            handle.cancel()

    return stop


def reap_orphans(exclude: set[int], max_rounds: int = 64, patience: float = 2.0) -> list[int]:
    """SIGKILL and reap every child of this process not in ``exclude`` (orphaned descendants).

    Killing an orphan re-parents *its* children to us, so repeat until no such child is left
    (bounded: each round removes one generation). A child that does not die within
    ``patience`` seconds (stuck in uninterruptible sleep) is left alone rather than waited for.
    """
    killed: list[int] = []
    stuck: set[int] = set()
    deadline = time.monotonic() + patience
    for _ in range(max_rounds):
        victims = [pid for pid in procfs.children("self") if pid not in exclude and pid not in stuck]
        if not victims:
            break
        for pid in victims:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        stuck |= _reap(victims, deadline)
        killed += victims
    return killed


def _reap(pids: list[int], deadline: float) -> set[int]:
    """``waitpid`` each of ``pids`` without blocking past ``deadline``; returns those not reaped."""
    left = set(pids)
    while left:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                left.discard(pid)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.001)  # SIGKILLed processes vanish within microseconds to milliseconds
    return left
