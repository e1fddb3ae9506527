"""The health command's processes: probes run at once, each in a forked process leading its own process group,
under one deadline; and the programs a probe runs (``nvidia-smi``).

A probe that blocks (``nvidia-smi`` on a wedged driver, a listing on a hung NFS mount) cannot be interrupted from
inside the process that blocks, so each runs in a child of its own; at the deadline its whole group is killed (the
programs it started too) and it is reported as timed out. Nothing is left behind in the other ways the command can
end: a SIGTERM, SIGINT or SIGHUP kills every probe's group and ends ``run_probes`` with ``Stopped``; and each probe
arms a timer at twice the timeout (at least a second past it) that kills its own group, for when the command was
killed outright (SIGKILL, as a launcher's ``--health-check-timeout`` does) and nobody else will (a probe itself
waiting in the kernel, on a hung NFS server, runs that timer's handler only once the wait ends). A probe's stdin,
stdout and stderr are /dev/null (its answer goes through a pipe of its own), so an orphaned probe holds none of the
launcher's pipes open. Forking is safe here: the command has no threads.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import NamedTuple, NoReturn

BACKSTOP_S = 1.0  # an orphaned probe's own timer kills its group at twice the timeout, and at least this long after
REAP_S = 1.0  # how long a killed probe may take to exit (one stuck in the kernel may never): then it is left
_STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Probe(NamedTuple):
    """One check: ``name`` (as failures are reported) and the function that returns its failures."""

    name: str
    run: Callable[[], list[str]]


class Stopped(Exception):
    """A stop signal arrived while probes ran; their groups are killed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Running:
    """A started probe (no dataclass: ``dataclasses`` imports ``inspect``, 5 ms of this command's start)."""

    def __init__(self, probe: Probe, pid: int, fd: int) -> None:
        self.probe, self.pid, self.fd = probe, pid, fd
        self.output: list[bytes] = []
        self.done = False  # its pipe reached end of file: it has exited (the pipe's write end is its only one)
        self.status: int | None = None  # its wait status, once reaped


def run_probes(probes: Sequence[Probe], timeout: float) -> list[tuple[str, str]]:
    """Run every probe at once; return ``(probe name, failure)`` pairs in the probes' order (the same order
    whichever finishes first). Raises ``Stopped`` when a stop signal ends it first."""
    running: list[_Running] = []
    saved = {sig: signal.signal(sig, _stopper(running)) for sig in _STOPS}
    try:
        deadline = time.monotonic() + timeout
        for probe in probes:
            _start(probe, timeout, running)
        _collect(running, deadline)
        for run in running:
            if not run.done:  # still running at the deadline: its whole group goes
                with contextlib.suppress(OSError):
                    os.killpg(run.pid, signal.SIGKILL)
        _reap_all(running)
        failures: list[tuple[str, str]] = []
        for run in running:
            failures.extend((run.probe.name, message) for message in _outcome(run, timeout))
        return failures
    except Stopped:
        _reap_all(running)
        raise
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _start(probe: Probe, timeout: float, running: list[_Running]) -> None:
    read_end, write_end = os.pipe()
    # no stop signal between the fork and the probe being listed as leading its own group: the handler would miss it
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _child(probe, write_end, timeout)
        with contextlib.suppress(OSError):  # the child does it too: whichever runs first
            os.setpgid(pid, pid)
        os.close(write_end)
        running.append(_Running(probe, pid, read_end))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _child(probe: Probe, out: int, timeout: float) -> NoReturn:
    """The probe's process: its own group, the stop signals' defaults, the backstop timer; its failures written
    to ``out`` as lines, all at once, at the end."""
    try:
        os.setpgid(0, 0)
        # not the command's stdio: a probe orphaned by a kill must not hold the launcher's pipes open until it ends
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        for sig in _STOPS:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGALRM, _kill_own_group)
        signal.setitimer(signal.ITIMER_REAL, timeout + max(timeout, BACKSTOP_S))
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        text = "\n".join(probe.run())
    except BaseException as err:  # whatever went wrong is the probe's failure, never a traceback
        text = f"probe failed: {type(err).__name__}: {err}"
    with contextlib.suppress(OSError):
        data = text.encode(errors="replace")
        while data:
            data = data[os.write(out, data):]
    os._exit(0)


def _kill_own_group(_signum: int, _frame: FrameType | None) -> None:
    os.killpg(0, signal.SIGKILL)


def _stopper(running: list[_Running]) -> Callable[[int, FrameType | None], None]:
    def stop(signum: int, _frame: FrameType | None) -> None:
        for run in running:
            with contextlib.suppress(OSError):
                os.killpg(run.pid, signal.SIGKILL)
        raise Stopped(signum)
    return stop


def _collect(running: list[_Running], deadline: float) -> None:
    """Read every probe's output until each has ended or the deadline passes."""
    waiting = {run.fd: run for run in running}
    while waiting and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select(list(waiting), [], [], left)
        for fd in ready:
            run = waiting[fd]
            chunk = os.read(fd, 65536)
            if chunk:
                run.output.append(chunk)
            else:
                run.done = True
                del waiting[fd]
    for run in running:
        os.close(run.fd)
        run.fd = -1


def _reap_all(running: list[_Running]) -> None:
    """Wait for every probe's process to exit (the killed ones too), REAP_S at most for them all: one stuck in the
    kernel (a hung NFS server) may not exit even killed, and is left to whoever inherits it."""
    end = time.monotonic() + REAP_S
    left = list(running)
    while left:
        for run in list(left):
            try:
                done, status = os.waitpid(run.pid, os.WNOHANG)
            except ChildProcessError:
                done, status = run.pid, None  # reaped already (a stop that came while reaping)
            if done:
                run.status = status
                left.remove(run)
        if not left or time.monotonic() >= end:
            return
        time.sleep(0.005)


def _outcome(run: _Running, timeout: float) -> list[str]:
    """The probe's failures: its lines, or its timeout, or the signal that ended it before it answered."""
    if not run.done:
        return [f"timed out after {timeout:g} s"]
    text = b"".join(run.output).decode(errors="replace")
    if not text and run.status is not None and os.WIFSIGNALED(run.status):
        return [f"ended by signal {os.WTERMSIG(run.status)} before it answered"]
    return [line for line in text.splitlines() if line.strip()]


def run_program(argv: list[str], env: Mapping[str, str]) -> tuple[int, str]:
    """Run ``argv`` (looked up on ``env``'s PATH) to its end: its exit status (-N for signal N) and its stdout and
    stderr together.

    No ``subprocess`` (it imports threading, selectors...): a pipe and ``posix_spawnp``. The program stays in the
    probe's process group, so the kill at the probe's timeout ends it too."""
    read_end, write_end = os.pipe()
    try:
        pid = os.posix_spawnp(argv[0], argv, env, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_DUP2, write_end, 1), (os.POSIX_SPAWN_DUP2, write_end, 2)])
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    chunks = []
    with open(read_end, "rb") as out:
        while chunk := out.read(65536):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode(errors="replace")
