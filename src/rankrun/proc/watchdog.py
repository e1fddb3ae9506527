"""Bind worker lifetime to the launcher, even across ``kill -9``.

Three layers, cheapest first:

1. Each worker gets ``PR_SET_PDEATHSIG=SIGKILL`` (see ``spawn``): it dies with the launcher's
   main thread. Grandchildren do not inherit it, hence:
2. A *watchdog*: a process forked from the launcher before any thread exists. It holds the
   read end of a pipe; the launcher registers each worker's process group on it. When the
   launcher dies for any reason the kernel closes the write end, the watchdog reads EOF and
   SIGKILLs every registered process group (the worker and everything it started that kept
   its process group), removes the launcher's private temp directory, then exits. A clean
   launcher exit says ``exit`` first, so nothing is killed twice.
3. The launcher is a child subreaper (``PR_SET_CHILD_SUBREAPER``): descendants orphaned by a
   worker are re-parented to it, so at the end of each attempt it can kill and reap them
   even if they left the worker's process group (``reap_orphans``).

Forking (not spawning a fresh interpreter) keeps the cost to about a millisecond.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from pathlib import Path

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
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the forked child
            os.close(write_fd)
            _watch(read_fd)
        os.close(read_fd)
        os.set_inheritable(write_fd, False)
        return cls(pid, write_fd)

    def _send(self, line: str) -> None:
        with contextlib.suppress(OSError):
            os.write(self._fd, line.encode() + b"\n")

    def register(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def unregister(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def own_dir(self, path: str) -> None:
        """A private directory to remove if the launcher dies without cleaning up."""
        self._send(f"d{path}")

    def close(self) -> None:
        """Normal exit: tell the watchdog there is nothing to kill, then reap it."""
        if self._fd < 0:
            return
        self._send("exit")
        os.close(self._fd)
        self._fd = -1
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _watch(read_fd: int) -> None:  # pragma: no cover - runs in the forked child
    """The watchdog's whole life: collect process groups until EOF, then kill them."""
    try:
        os.setsid()  # out of the launcher's session: terminal signals must not reach us
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_IGN)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, read_fd)
        os.closerange(read_fd + 1, 65536)
        groups: set[int] = set()
        dirs: list[str] = []
        clean = False
        buffer = b""
        while chunk := os.read(read_fd, 4096):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                clean = _apply(line.decode(), groups, dirs) or clean
        if not clean:
            for pgid in groups:
                with contextlib.suppress(OSError):
                    os.killpg(pgid, signal.SIGKILL)
            from rankrun.fsutil import remove_tree  # noqa: PLC0415 - only on this rare path

            for path in dirs:
                remove_tree(Path(path))
    finally:
        os._exit(0)


def _apply(line: str, groups: set[int], dirs: list[str]) -> bool:  # pragma: no cover - runs in the forked child
    if line == "exit":
        return True
    if line[:1] == "+":
        groups.add(int(line[1:]))
    elif line[:1] == "-":
        groups.discard(int(line[1:]))
    elif line[:1] == "d":
        dirs.append(line[1:])
    return False


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process; False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def child_pids(parent: int) -> list[int]:
    """Direct children of ``parent``, from /proc (no psutil at run time)."""
    found: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: parse after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry.name))
    return found


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
        victims = [pid for pid in child_pids(os.getpid()) if pid not in exclude and pid not in stuck]
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
