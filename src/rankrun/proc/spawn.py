"""Start worker processes: the only user of ``subprocess_exec`` but for the ``--health-check`` command's runner
(``rankrun.health.check``; ``tests/unit/test_claims.py`` checks it).

Each worker runs in its own session and process group (so a signal to the group reaches
everything it started that stayed in the group) with ``PR_SET_PDEATHSIG=SIGKILL`` (so it
cannot outlive the launcher's main thread). util-linux's ``setpriv --pdeathsig KILL`` sets it
and execs the worker (same pid), so the launcher can ``vfork``: a pre-exec hook forces a full
``fork`` of the launcher and costs about 3 ms of CPU a worker, while the other workers are
already competing for the cores. Where ``setpriv`` is missing (or too old for ``--pdeathsig``),
and for a worker on a pseudo-terminal (whose hook must also take the terminal), a pre-exec hook
does it. One difference: the hook kills the worker if the launcher died before ``prctl``; with
``setpriv`` a launcher killed in that sub-millisecond window leaves the worker to the watchdog's
registration, which follows the spawn. Its output reaches the agent one of three ways
(``Stdio``, chosen by ``rankrun.logs.routes.plan_stdio``):

- ``PIPES``: stdout and stderr on pipes of their own (they go to different places);
- ``MERGED``: one pipe for both, when both go to the same console destination anyway, so the
  order in which the worker wrote them is the order the agent reads them;
- ``TERMINAL``: a pseudo-terminal for stdin, stdout and stderr, which becomes the worker's
  controlling terminal: ``isatty()`` is true, line editing and window size work, and the
  launcher relays it to its own terminal (``rankrun.proc.terminal``).

stdin is inherited, as under torchrun, unless ``Command.stdin_null`` (the other ranks of an
interactive run, so that no two processes read the user's keystrokes).

``Command.cpus`` (``--numa-binding``) binds the worker to those CPUs in the pre-exec hook: after the fork the
child is one thread, so ``sched_setaffinity`` there covers the whole process, the exec keeps it, and every thread
the program starts inherits it; nothing of the program runs unbound. (Setting it on the pid after the spawn
returns races the program's first threads; setting the launcher's own thread's mask around the spawn races the
other spawns the event loop runs at the same time.) Such a worker is always started through the hook.

``Spawner`` is the seam: ``OsSpawner`` is the real one, tests drive the agent with a fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import fcntl
import functools
import os
import signal
import subprocess
import termios
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from rankrun import procfs
from rankrun.errors import SpawnError
from rankrun.fsutil import which
from rankrun.proc.output import OutputReader, StreamSource
from rankrun.record import record

_PR_SET_PDEATHSIG = 1
_PF_EXITING = 0x4  # the kernel's task flag (``/proc/<pid>/stat`` field 9) for a process in exit(): signals are moot


class Stdio(enum.Enum):
    PIPES = "pipes"
    MERGED = "merged"
    TERMINAL = "terminal"


class WorkerHandle(Protocol):
    """A started worker, as the agent sees it."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> StreamSource:
        """Its stdout, or everything it writes (``MERGED``, ``TERMINAL``)."""
        ...

    @property
    def stderr(self) -> StreamSource | None:
        """Its stderr, or ``None`` when it shares ``stdout``'s stream."""
        ...

    @property
    def terminal_fd(self) -> int | None:
        """The pseudo-terminal's master (``TERMINAL`` only): write here what the worker should read."""
        ...

    async def wait(self) -> int:
        """Exit status: the exit code, or ``-N`` when killed by signal N."""
        ...

    def signal_group(self, signum: int) -> None:
        """Send ``signum`` to the worker's whole process group; no error if it is gone."""
        ...

    def ended(self) -> bool:
        """Whether the worker has ended by itself already, or is ending (its exit under way), reaped or not: a signal
        sent now cannot be why it ends."""
        ...

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to the worker process alone (``0``: just check), unless it has been reaped (its pid
        may be another process's by then); False when it was not sent."""
        ...

    def signal_main(self, signum: int) -> bool:
        """``signal``, but to the worker's main thread alone (``main_thread_kill``): a stack dump's signal."""
        ...

    def close(self) -> None:
        """Stop reading its output (readers see EOF) and release OS resources. Idempotent."""
        ...

    @property
    def forked_in(self) -> float | None:
        """Seconds its fork from the preloading process took (``--preload``); ``None``: started cold, by exec."""
        ...


@record
class Command:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    stdio: Stdio = Stdio.PIPES
    stdin_null: bool = False
    attempt: int = 0  # which of this node's worker groups it belongs to (a tag, for logs and fakes)
    cpus: frozenset[int] | None = None  # bind the worker to these CPUs before it runs (--numa-binding); None: don't
    pass_fds: tuple[int, ...] = ()  # descriptors it inherits besides stdio (the preloading process's control socket)


class Spawner(Protocol):
    async def spawn(self, command: Command) -> WorkerHandle: ...


def _preexec_hook(*, controlling_tty: bool, cpus: frozenset[int] | None = None) -> Callable[[], None] | None:
    """A pre-exec hook with libc's prctl resolved now, in the parent (nothing to look up after fork).

    It runs after ``setsid()``; with ``controlling_tty`` it makes the terminal on fd 0 the
    new session's controlling terminal; with ``cpus`` it binds the child to them (see the module docstring).
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None
    if prctl is None and cpus is None:
        return None
    if prctl is not None:
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def hook() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:  # the launcher died between fork and prctl: follow it now
                os.kill(os.getpid(), signal.SIGKILL)
        if controlling_tty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return hook


def main_thread_kill(pid: int, signum: int) -> bool | None:
    """``signum`` to process ``pid``'s main thread alone (``tgkill``: the main thread's id is the pid), where ``kill``
    lets the kernel hand it to any thread that does not block it. True: sent; False: no such thread; None: this libc
    has no ``tgkill`` (before glibc 2.30), so the caller sends it to the process.

    A stack dump's signal goes this way (``rankrun.stacks.sampler``): the thread that takes it is the one whose stack
    is read, the one whose state the sampler looked at in ``/proc/<pid>/stat`` (the main thread's). Taken by another
    thread (one of gloo's), ``faulthandler`` read the main thread's frames while it ran on, which crashed workers: why,
    in the shim's docstring (``rankrun.stacks.shim.sitecustomize``).
    """
    tgkill = _tgkill()
    if tgkill is None:
        return None
    return tgkill(pid, pid, signum) == 0


@functools.cache
def _tgkill() -> Callable[[int, int, int], int] | None:
    try:
        tgkill = ctypes.CDLL(None, use_errno=True).tgkill
    except (OSError, AttributeError):
        return None
    tgkill.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    tgkill.restype = ctypes.c_int
    return tgkill


def pdeathsig_exec() -> tuple[str, ...]:
    """The ``setpriv`` prefix that gives the exec'd worker ``PR_SET_PDEATHSIG=SIGKILL``, or ``()``.

    ``--pdeathsig`` came with util-linux 2.33; an older binary does not contain the word, and is
    not used (reading it costs far less than running it once to ask).
    """
    path = which("setpriv")
    if path is None:
        return ()
    try:
        with open(path, "rb") as binary:
            known = b"pdeathsig" in binary.read(4 << 20)
    except OSError:
        return ()
    return (path, "--pdeathsig", "KILL", "--") if known else ()


def _exec_error(argv0: str, env: Mapping[str, str]) -> str | None:
    """Why ``execvp(argv0)`` would fail, checked before a wrapper execs it (its own error would come too late)."""
    if which(argv0, env) is not None:
        return None
    return "Permission denied" if os.sep in argv0 and os.path.exists(argv0) else "No such file or directory"


class _ExitProtocol(asyncio.SubprocessProtocol):
    """Reports the exit the moment the child is reaped (the output fds are not the transport's)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


class WorkerProcess:
    """What a worker's handle is whatever started it (``OsSpawner``'s exec, or ``proc.preload``'s fork): its pid,
    which is its process group's id, its output and terminal, its group's signal, and whether its exit is under way.
    A subclass says how it is waited for and signalled alone."""

    def __init__(self, pid: int, readers: tuple[OutputReader, OutputReader | None], terminal_fd: int | None) -> None:
        self._pid = pid
        self._readers = readers
        self._terminal_fd = terminal_fd

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def stdout(self) -> StreamSource:
        return self._readers[0]

    @property
    def stderr(self) -> StreamSource | None:
        return self._readers[1]

    @property
    def terminal_fd(self) -> int | None:
        return self._terminal_fd

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pid, signum)

    def signal(self, signum: int) -> bool:
        raise NotImplementedError

    def signal_main(self, signum: int) -> bool:
        if not self.signal(0):  # reaped: its pid may be another process's by now
            return False
        sent = main_thread_kill(self._pid, signum)
        return self.signal(signum) if sent is None else sent

    def _exiting(self) -> bool:
        """Not reaped yet (so the pid is still the worker's): whether it is a zombie, gone, or in exit()."""
        fields = procfs.stat(self._pid)
        return fields is None or fields[0] in "ZX" or bool(int(fields[6]) & _PF_EXITING)

    def _close_output(self) -> None:
        for reader in self._readers:
            if reader is not None:
                reader.close()
        if self._terminal_fd is not None:
            os.close(self._terminal_fd)
            self._terminal_fd = None


class _OsWorker(WorkerProcess):
    def __init__(
        self,
        transport: asyncio.SubprocessTransport,
        exited: asyncio.Future[None],
        readers: tuple[OutputReader, OutputReader | None],
        terminal_fd: int | None,
    ) -> None:
        super().__init__(transport.get_pid(), readers, terminal_fd)
        self._transport = transport
        self._exited = exited

    @property
    def forked_in(self) -> float | None:
        return None

    async def wait(self) -> int:
        await asyncio.shield(self._exited)
        code = self._transport.get_returncode()
        assert code is not None
        return code

    def ended(self) -> bool:
        return self._transport.get_returncode() is not None or self._exiting()

    def signal(self, signum: int) -> bool:
        if self._transport.get_returncode() is not None:
            return False
        try:
            os.kill(self._pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def close(self) -> None:
        self._close_output()
        self._transport.close()


class OsSpawner:
    """Real processes, each its own process group, bound to the launcher's lifetime."""

    def __init__(self, on_spawn: Callable[[int], None] | None = None, wrapper: tuple[str, ...] | None = None) -> None:
        """``wrapper``: the exec prefix that sets the death signal (default ``pdeathsig_exec()``; ``()``: a hook)."""
        self._hooks = {tty: _preexec_hook(controlling_tty=tty) for tty in (False, True)}
        self._wrapper = pdeathsig_exec() if wrapper is None else wrapper
        self.on_spawn = on_spawn
        self.spawning = 0  # spawns under way: a fresh worker's pid is not in ``live`` yet
        self.live: set[int] = set()  # workers not yet reaped by the event loop's child watcher

    @contextlib.contextmanager
    def foreign(self) -> Iterator[Callable[[int], None]]:
        """For a child started outside ``spawn`` (the ``--health-check`` command): a spawn under way until the block
        is told its pid, then in ``live`` until the block ends (by when the event loop has reaped it), so the stray
        reaper never takes the exit status the event loop waits for."""
        started: list[int] = []

        def told(pid: int) -> None:
            if not started:
                self.spawning -= 1
            started.append(pid)
            self.live.add(pid)

        self.spawning += 1
        try:
            yield told
        finally:
            if not started:
                self.spawning -= 1
            self.live.difference_update(started)

    async def spawn(self, command: Command) -> WorkerHandle:
        loop = asyncio.get_running_loop()
        argv, hook = self._how_to_start(command)
        fds = open_stdio(command.stdio)
        stdin: int | None = fds.child[0] if command.stdio is Stdio.TERMINAL else None
        if command.stdin_null:
            stdin = subprocess.DEVNULL
        self.spawning += 1
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitProtocol(loop),
                *argv,
                env=dict(command.env),
                stdin=stdin,
                stdout=fds.child[1],
                stderr=fds.child[2],
                start_new_session=True,
                preexec_fn=hook,
                pass_fds=command.pass_fds,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            fds.close_ours()
            raise _start_failed(command, exc) from exc
        finally:
            fds.close_child()  # the child has its copies; ours would keep the streams from ending
            self.spawning -= 1
        pid = transport.get_pid()
        self.live.add(pid)
        protocol.exited.add_done_callback(lambda _: self.live.discard(pid))  # reaped by the loop's child watcher
        if self.on_spawn is not None:
            self.on_spawn(pid)
        readers = [await output_reader(loop, fd) for fd in fds.read]
        return _OsWorker(transport, protocol.exited, (readers[0], readers[1] if len(readers) > 1 else None), fds.terminal)

    def _how_to_start(self, command: Command) -> tuple[tuple[str, ...], Callable[[], None] | None]:
        """What to exec and the pre-exec hook, if any. Under ``setpriv`` with no hook (the launcher can ``vfork``),
        unless the worker needs a hook anyway (a terminal to take, CPUs to bind) or there is no usable ``setpriv``.
        A worker exec'd by ``setpriv`` is looked for first: ``setpriv``'s own error would come after the spawn."""
        tty = command.stdio is Stdio.TERMINAL
        if tty or not self._wrapper or command.cpus is not None:
            hook = self._hooks[tty] if command.cpus is None else _preexec_hook(controlling_tty=tty, cpus=command.cpus)
            return command.argv, hook
        if why := _exec_error(command.argv[0], command.env):
            raise SpawnError(f"cannot start worker {_show(command.argv)}: {why}")
        return (*self._wrapper, *command.argv), None


def _start_failed(command: Command, exc: OSError | subprocess.SubprocessError) -> SpawnError:
    """Why the worker did not start: exec's error, or (``SubprocessError``) the hook's, which failed to bind the worker
    to its CPUs: they are not ours now."""
    if isinstance(exc, OSError):
        return SpawnError(f"cannot start worker {_show(command.argv)}: {exc.strerror or exc}")
    cpus = ",".join(str(cpu) for cpu in sorted(command.cpus or ()))
    return SpawnError(f"cannot start worker {_show(command.argv)}: cannot bind it to CPUs {cpus} (--numa-binding)")


@dataclass
class Fds:
    read: tuple[int, ...]  # our read ends: stdout (or everything), then stderr if separate
    child: tuple[int, int, int]  # the child's stdin (-1: inherit), stdout, stderr
    terminal: int | None = None  # our write end of the pseudo-terminal (the input relay's)

    def close_child(self) -> None:
        for fd in {fd for fd in self.child if fd >= 0}:
            os.close(fd)

    def close_ours(self) -> None:
        for fd in (*self.read, *([self.terminal] if self.terminal is not None else [])):
            os.close(fd)


def open_stdio(stdio: Stdio) -> Fds:
    """A worker's stdio: ours to read (and write, a terminal's), its own to pass it."""
    if stdio is Stdio.TERMINAL:
        master, slave = os.openpty()
        os.set_inheritable(master, False)
        _copy_terminal(0, slave)
        writer = os.dup(master)  # the input relay's own fd: the reader's transport owns ``master``
        os.set_blocking(writer, False)
        return Fds((master,), (slave, slave, slave), writer)
    if stdio is Stdio.MERGED:
        r, w = os.pipe2(os.O_CLOEXEC)
        return Fds((r,), (-1, w, w))
    r_out, w_out = os.pipe2(os.O_CLOEXEC)
    r_err, w_err = os.pipe2(os.O_CLOEXEC)
    return Fds((r_out, r_err), (-1, w_out, w_err))


def _copy_terminal(source: int, target: int) -> None:
    """Start the worker's terminal with the user's settings and window size (as ``script`` does)."""
    with contextlib.suppress(OSError, termios.error):
        termios.tcsetattr(target, termios.TCSANOW, termios.tcgetattr(source))
    with contextlib.suppress(OSError):
        fcntl.ioctl(target, termios.TIOCSWINSZ, fcntl.ioctl(source, termios.TIOCGWINSZ, b"\0" * 8))


async def output_reader(loop: asyncio.AbstractEventLoop, fd: int) -> OutputReader:
    pipe = open(fd, "rb", buffering=0)  # noqa: SIM115 - owned (and closed) by the transport
    _, reader = await loop.connect_read_pipe(OutputReader, pipe)
    return reader


def _show(argv: Sequence[str]) -> str:
    return " ".join(argv[:3]) + (" ..." if len(argv) > 3 else "")
