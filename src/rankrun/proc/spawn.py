"""Start worker processes: the only user of ``asyncio.create_subprocess_exec`` and ``os.killpg``.

Each worker runs in its own session and process group (so a signal to the group reaches
everything it started that stayed in the group) with ``PR_SET_PDEATHSIG=SIGKILL`` (so it
cannot outlive the launcher's main thread). stdout and stderr are pipes read by the agent;
stdin is inherited, as under torchrun.

``Spawner`` is the seam: ``OsSpawner`` is the real one, tests drive the agent with a fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from rankrun.errors import SpawnError

_PR_SET_PDEATHSIG = 1
CHUNK_LIMIT = 1 << 16


class StreamSource(Protocol):
    """What the log pumps read from (``asyncio.StreamReader`` fits)."""

    async def read(self, n: int = -1) -> bytes: ...


class WorkerHandle(Protocol):
    """A started worker, as the agent sees it."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> StreamSource: ...

    @property
    def stderr(self) -> StreamSource: ...

    async def wait(self) -> int:
        """Exit status: the exit code, or ``-N`` when killed by signal N."""
        ...

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the worker's whole process group; no error if it is gone."""
        ...

    def close(self) -> None:
        """Close the output pipes (readers see EOF) and release OS resources. Idempotent."""
        ...


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    env: Mapping[str, str]


class Spawner(Protocol):
    async def spawn(self, command: Command) -> WorkerHandle: ...


def _pdeathsig_hook() -> Callable[[], None] | None:
    """A pre-exec hook with libc's prctl resolved now, in the parent (nothing to look up after fork)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the launcher died between fork and prctl: follow it now
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


class _ExitAwareProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's ``Process.wait()`` also waits for the pipes to close, which a grandchild holding
    them can delay forever; this protocol reports the exit itself, the moment it is reaped."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=CHUNK_LIMIT, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


class _OsWorker:
    def __init__(
        self, proc: asyncio.subprocess.Process, transport: asyncio.SubprocessTransport, exited: asyncio.Future[None]
    ) -> None:
        self._proc = proc
        self._transport = transport
        self._exited = exited

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def stdout(self) -> StreamSource:
        assert self._proc.stdout is not None
        return self._proc.stdout

    @property
    def stderr(self) -> StreamSource:
        assert self._proc.stderr is not None
        return self._proc.stderr

    async def wait(self) -> int:
        await asyncio.shield(self._exited)
        code = self._proc.returncode
        assert code is not None
        return code

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, signum)

    def close(self) -> None:
        self._transport.close()


class OsSpawner:
    """Real processes, each its own process group, bound to the launcher's lifetime."""

    def __init__(self, on_spawn: Callable[[int], None] | None = None) -> None:
        self._hook = _pdeathsig_hook()
        self._on_spawn = on_spawn

    async def spawn(self, command: Command) -> WorkerHandle:
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitAwareProtocol(loop),
                *command.argv,
                env=dict(command.env),
                stdin=None,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                preexec_fn=self._hook,
            )
        except OSError as exc:
            raise SpawnError(f"cannot start worker {_show(command.argv)}: {exc.strerror or exc}") from exc
        proc = asyncio.subprocess.Process(transport, protocol, loop)
        if self._on_spawn is not None:
            self._on_spawn(proc.pid)
        return _OsWorker(proc, transport, protocol.exited)


def _show(argv: Sequence[str]) -> str:
    return " ".join(argv[:3]) + (" ..." if len(argv) > 3 else "")
