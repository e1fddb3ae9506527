"""Run the ``--health-check`` command once and judge the node by it: exit 0 is healthy, anything else is not.

The command runs as ``/bin/sh -c CMD`` in a session and process group of its own, stdin ``/dev/null``, its stdout
and stderr on one pipe that the launcher reads. Only the last ``TAIL_BYTES`` of that output are kept (a chatty check
cannot eat the launcher's memory): the reason of an unhealthy verdict is the output's last non-empty line, cut to
``REASON_CHARS`` characters, or how the shell ended when it printed nothing.

Nothing of the check outlives ``run_check``: once the shell has ended (or its ``timeout`` has passed, or the caller
cancelled), its whole process group is SIGKILLed first, and only then is the pipe drained, for at most ``DRAIN_BOUND``
seconds, so a grandchild that kept the pipe open cannot hold the verdict back. A process that left the group
(``setsid``) is out of reach here: the launcher's subreaper kills it with the attempt's other orphans.

This module and ``rankrun.proc`` are the launcher's only users of ``subprocess_exec`` and ``os.killpg``
(``tests/unit/test_claims.py``): ``rankrun.health`` sits below the agent and cannot use its spawner.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping

from rankrun.record import record

TAIL_BYTES = 64 * 1024  # the output kept: enough for the last line of any check, bounded for a chatty one
READ_CHUNK = 64 * 1024  # bytes read at a time: a pipe's default capacity
REASON_CHARS = 200
DRAIN_BOUND = 2.0  # seconds to read what the killed group still had in the pipe


@record
class CheckResult:
    """One run of the check: its verdict, why (empty when healthy), how long it took, the shell's exit code (None
    when it was killed at its timeout)."""

    healthy: bool
    reason: str
    seconds: float
    exit_code: int | None


def check_env(base: Mapping[str, str], local_world_size: int, run_id: str) -> dict[str, str]:
    """The check's environment (pure): the launcher's ``base`` plus what tells it the node's share of the job."""
    return {**base, "LOCAL_WORLD_SIZE": str(local_world_size), "TORCHELASTIC_RUN_ID": run_id}


def reason_from(output: bytes, exit_code: int) -> str:
    """Why a check that ended with ``exit_code`` (negative: killed by that signal) failed (pure): the last non-empty
    line of its ``output``, non-printable characters blanked, cut to ``REASON_CHARS``; else how it ended."""
    for line in reversed(output.decode("utf-8", errors="replace").splitlines()):
        text = "".join(c if c.isprintable() else " " for c in line).strip()
        if text:
            return text[:REASON_CHARS]
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exited {exit_code}"


class _Tail:
    """The pipe's read end on the event loop, keeping the last ``TAIL_BYTES`` read; ``eof`` is set at end of file."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.data = bytearray()
        self.eof = asyncio.Event()
        os.set_blocking(fd, False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._loop.remove_reader(self._fd)
            self.eof.set()
            return
        self.data += chunk
        if len(self.data) > TAIL_BYTES:
            del self.data[:-TAIL_BYTES]

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        os.close(self._fd)


async def run_check(cmd: str, env: Mapping[str, str], timeout: float, *,
                    on_spawn: Callable[[int], None] | None = None) -> CheckResult:
    """Run ``cmd`` with ``/bin/sh -c`` and ``env``; unhealthy if it exits non-zero or still runs after ``timeout``
    seconds. ``on_spawn`` is told the shell's pid, which is also its process group's id (for the caller's watchdog).
    Cancelled, it kills the check's group and reaps the shell before the cancellation goes on."""
    start = time.monotonic()
    proc, tail = await _start(cmd, env)
    waiter = asyncio.ensure_future(proc.wait())
    try:
        if on_spawn is not None:
            on_spawn(proc.pid)
        done, _ = await asyncio.wait([waiter], timeout=timeout)
        # ended or not, nothing it started stays: kill first, then drain. The shell may be reaped already: its pid,
        # the group's id, goes to no new process while the group has members, and to reuse it once the group is empty
        # the pid space would have to wrap in the microseconds since
        _kill_group(proc.pid)
        await _bounded(asyncio.shield(waiter), DRAIN_BOUND)  # a shell in uninterruptible sleep is not waited for
        await _bounded(tail.eof.wait(), DRAIN_BOUND)
    except BaseException:  # cancelled (the launcher is stopping): leave nothing running
        _kill_group(proc.pid)
        await _bounded(asyncio.shield(waiter), DRAIN_BOUND)
        raise
    finally:
        tail.close()
    return verdict(waiter.result() if done else None, bytes(tail.data), timeout, time.monotonic() - start)


def verdict(exit_code: int | None, output: bytes, timeout: float, seconds: float) -> CheckResult:
    """The check's result (pure) from how its shell ended: ``exit_code`` None when it still ran at ``timeout``
    (unhealthy, timed out), 0 healthy, anything else unhealthy for the reason its ``output`` gives."""
    if exit_code is None:
        return CheckResult(healthy=False, reason=f"timed out after {timeout:g} s", seconds=seconds, exit_code=None)
    if exit_code == 0:
        return CheckResult(healthy=True, reason="", seconds=seconds, exit_code=0)
    return CheckResult(healthy=False, reason=reason_from(output, exit_code), seconds=seconds, exit_code=exit_code)


async def _start(cmd: str, env: Mapping[str, str]) -> tuple[asyncio.subprocess.Process, _Tail]:
    """The shell running ``cmd`` in a session of its own, and the tail of its output (stdout and stderr, one pipe)."""
    read_fd, write_fd = os.pipe()  # both close-on-exec: only the shell's stdout and stderr hold the write end
    try:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", cmd, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd, env=dict(env),
            start_new_session=True)
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return proc, _Tail(read_fd)


async def _bounded(awaitable: Awaitable[object], seconds: float) -> None:
    """Wait for ``awaitable`` at most ``seconds``; past them, stop waiting and cancel it."""
    task = asyncio.ensure_future(awaitable)
    await asyncio.wait([task], timeout=seconds)
    task.cancel()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
