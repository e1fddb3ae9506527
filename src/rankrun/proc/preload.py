"""The launcher's side of warm starts (``--preload MODULES``): the preloading process, and workers forked from it.

``PreloadSpawner`` is an ``OsSpawner`` that starts a worker by asking the node's preloading process to fork it
(``rankrun.preload``) where it can, and cold (``OsSpawner``'s exec) where it cannot: a worker that is not the workers'
interpreter running a script or module (``preload.wire.forkable``), a process that was found unsafe to fork or has
died (said once, through ``Preloader.on_change``), a request too large for one message. The preloading process itself
is started through ``OsSpawner.spawn``, like a worker: its own session, the death signal, the watchdog, reaped by the
event loop's child watcher.

A forked worker is the launcher's child (the preloading process double-forks it, and the launcher is a subreaper), so
``ForkedWorker`` waits for it on a pidfd (``waitpid`` once it is readable: the exact status, ``-N`` for a signal, as a
cold worker's), signals it by that pidfd (never a recycled pid), and signals its group by its pid, which is its
process group's id. The launcher makes its descriptors as ``OsSpawner`` does (pipes, or a pseudo-terminal) and
passes the child's ends with the request, then closes its copies, so its output ends when the worker's does. The
worker waits on a pipe for the launcher's go, which comes once the launcher holds its pidfd and the watchdog knows its
group. An attempt's requests go out together; the process answers each once its worker is the launcher's child.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rankrun.errors import SpawnError
from rankrun.preload import wire
from rankrun.proc.output import OutputReader
from rankrun.proc.spawn import Command, OsSpawner, Stdio, WorkerHandle, WorkerProcess, open_stdio, output_reader
from rankrun.record import record

_PF_EXITING = 0x4
# Started by its file, not as ``-m rankrun.preload``: runpy and rankrun's package (typing, __future__) would be loaded
# before the user's modules, so every forked worker would keep them, and runpy's frames under its code.
BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(wire.__file__)), "__main__.py")
CLOSE_TIMEOUT = 5.0  # seconds the preloading process has to leave once the socket is closed, before SIGKILL


@record
class Ready:
    """How the import went: ``seconds`` it took; ``error``: the module that failed and the error's last line;
    ``unsafe``: why the process may not fork (its workers start cold)."""

    seconds: float = 0.0
    error: tuple[str, str] | None = None
    unsafe: str | None = None


class Preloader:
    """One node's preloading process: started once (``start``), asked to ``fork`` each worker, closed at the end."""

    def __init__(self, spawner: OsSpawner) -> None:
        self._spawner = spawner
        self._sock: socket.socket | None = None
        self._first: asyncio.Future[tuple[str, dict[str, Any]]] | None = None  # ready, unsafe or error
        self._waiting: dict[int, asyncio.Future[tuple[str, dict[str, Any]]]] = {}  # each fork request's answer, by id
        self._gone = False  # the process closed its end: every answer from now on is "eof"
        self._asked = 0
        self.handle: WorkerHandle | None = None  # the process, for its output and its exit
        self.python = ""
        self.usable = False  # ready and safe: workers are forked
        self.on_change: Callable[[str, str], None] = lambda _state, _why: None  # "unsafe"/"ended", why: said once

    @property
    def pid(self) -> int | None:
        return self.handle.pid if self.handle is not None else None

    async def start(self, modules: Sequence[str], python: str, env: Mapping[str, str],
                    argv: Sequence[str]) -> WorkerHandle:
        """Start the process, which imports ``modules`` (``ready`` tells how it went). ``argv``: the first worker's
        cold command line (its interpreter, ``sys.path[0]`` and ``sys.argv`` are the process's too)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for sock in (ours, theirs):
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, option, wire.LIMIT)
        self.python = python
        path0 = wire.path0(argv, os.getcwd())
        shown = ["-m", *argv[4:]] if argv[2] == "-m" else list(argv[2:])
        command = Command((python, "-u", BOOTSTRAP, str(theirs.fileno()), path0, ",".join(modules),
                           *shown), env, Stdio.MERGED, stdin_null=True, pass_fds=(theirs.fileno(),))
        try:
            self.handle = await self._spawner.spawn(command)
        except SpawnError as exc:  # the workers' interpreter cannot be run: say which process it was
            ours.close()
            raise SpawnError(str(exc).replace("cannot start worker", "cannot start the preloading process", 1)) from None
        finally:
            theirs.close()
        self._sock = ours
        ours.setblocking(False)
        loop = asyncio.get_running_loop()
        self._first = loop.create_future()
        loop.add_reader(ours.fileno(), self._readable)
        return self.handle

    async def ready(self) -> Ready:
        """Once the process has imported the modules, or failed to."""
        assert self._first is not None
        kind, body = await self._first
        if kind == "error":
            return Ready(error=(str(body.get("module", "")), str(body.get("line", ""))))
        if kind == "unsafe":
            return Ready(float(body.get("seconds", 0.0)), unsafe=str(body.get("why", "")))
        if kind != "ready":
            return Ready(unsafe=await self._ended_words())
        self.usable = True
        return Ready(float(body.get("seconds", 0.0)))

    async def fork(self, command: Command) -> ForkedWorker | None:
        """The worker ``command`` describes, forked; ``None``: start it cold (and, but for a too large request,
        every later one: ``on_change`` was told why)."""
        if not self.usable or self._sock is None:
            return None
        self._asked += 1
        data = _request(self._asked, command)
        if data is None:
            return None  # this worker alone starts cold
        return await self._fork(self._sock, command, self._asked, data)

    async def _fork(self, sock: socket.socket, command: Command, ident: int, data: bytes) -> ForkedWorker | None:
        loop = asyncio.get_running_loop()
        fds = open_stdio(command.stdio)
        go_read, go = os.pipe2(os.O_CLOEXEC)
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC) if command.stdin_null else None
        stdin = fds.child[0] if command.stdio is Stdio.TERMINAL else devnull if devnull is not None else 0
        answer = self._waiting[ident] = loop.create_future()
        asked = time.monotonic()
        self._spawner.spawning += 1  # until its pid is in ``live``: the stray reaper leaves it alone
        try:
            try:
                await _send(sock, data, [stdin, fds.child[1], fds.child[2], go_read])
            except OSError as exc:
                self._waiting.pop(ident, None)
                fds.close_ours()
                os.close(go)
                await self._unsent(exc)
                return None
            finally:
                fds.close_child()
                os.close(go_read)
                if devnull is not None:
                    os.close(devnull)
            if self._gone and not answer.done():
                answer.set_result(("eof", {}))
            pid, pidfd = await self._answered(*await answer)
            if pidfd is None:
                fds.close_ours()
                os.close(go)  # the worker, if any, reads no go and exits 1; the stray reaper reaps it
                return None
            self._spawner.live.add(pid)
        finally:
            self._spawner.spawning -= 1
        forked_in = time.monotonic() - asked
        readers = [await output_reader(loop, fd) for fd in fds.read]
        worker = ForkedWorker(pid, pidfd, self._spawner.live, (readers[0], readers[1] if len(readers) > 1 else None),
                              terminal_fd=fds.terminal, forked_in=forked_in)
        if self._spawner.on_spawn is not None:
            self._spawner.on_spawn(pid)
        os.write(go, b"g")
        os.close(go)
        return worker

    async def _answered(self, kind: str, body: dict[str, Any]) -> tuple[int, int | None]:
        """The forked worker's pid and pidfd; no pidfd: it starts cold, and so does every later one (said once)."""
        pid = int(body.get("pid", 0)) if kind == "forked" else 0
        pidfd = _pidfd(pid)
        if pidfd is not None:
            return pid, pidfd
        if kind == "refused":
            self._lost(str(body.get("why", "")), state="unsafe")
        elif kind == "forked":
            self._lost("the launcher cannot open a pidfd for a forked worker")
        else:
            self._lost(await self._ended_words())
        return pid, None

    def _readable(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                data = sock.recv(wire.LIMIT)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                asyncio.get_running_loop().remove_reader(sock.fileno())
                self._gone = True
                for waiting in [self._first, *self._waiting.values()]:
                    if waiting is not None and not waiting.done():
                        waiting.set_result(("eof", {}))
                self._waiting.clear()
                return
            try:
                kind, body = wire.decode(data)
            except ValueError:
                continue
            ident = body.get("id")
            waiting = self._waiting.pop(ident, None) if isinstance(ident, int) and kind in ("forked", "refused") \
                else self._first if kind not in ("forked", "refused") else None
            if waiting is not None and not waiting.done():
                waiting.set_result((kind, body))

    async def _unsent(self, exc: OSError) -> None:
        if exc.errno in (errno.EMSGSIZE, errno.ENOBUFS):  # larger than the socket's buffer, or the kernel's
            return  # this worker's request is too large for one message: it alone starts cold
        if exc.errno in (errno.EPIPE, errno.ECONNRESET):  # it has closed its end: it died, say how
            self._lost(await self._ended_words())
        else:
            self._lost(f"the preloading process cannot be reached ({exc.strerror})")

    def _lost(self, why: str, *, state: str = "ended") -> None:
        if self.usable:
            self.usable = False
            self.on_change(state, why)

    async def _ended_words(self) -> str:
        handle = self.handle
        if handle is None:
            return "the preloading process ended"
        try:
            status = await asyncio.wait_for(handle.wait(), CLOSE_TIMEOUT)
        except TimeoutError:
            return "the preloading process stopped answering"
        how = f"exit code {status}" if status >= 0 else f"signal {signal.Signals(-status).name}"
        return f"the preloading process ended ({how})"

    def stop(self) -> None:
        """Kill the process now (a stop came while it imports): ``close`` then reaps it at once."""
        self.usable = False
        if self.handle is not None:
            self.handle.signal_group(signal.SIGKILL)

    async def close(self) -> None:
        """Close the socket (the process leaves), wait for it (bounded: then SIGKILL), and reap it."""
        self.usable = False
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        handle = self.handle
        if handle is None:
            return
        try:
            await asyncio.wait_for(handle.wait(), CLOSE_TIMEOUT)
        except TimeoutError:
            handle.signal_group(signal.SIGKILL)
            await handle.wait()


def _request(ident: int, command: Command) -> bytes | None:
    """The fork request; ``None`` past ``wire.LIMIT``, what the process reads at once: it would get it cut short and
    not answer (a large environment: the socket's buffer may take more than that)."""
    request = {"id": ident, "argv": list(command.argv), "env": dict(command.env), "cwd": os.getcwd(),
               "tty": command.stdio is Stdio.TERMINAL, "launcher": os.getpid(),
               "cpus": sorted(command.cpus) if command.cpus is not None else None}
    data = wire.encode("fork", request)
    return data if len(data) <= wire.LIMIT else None


async def _send(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """One message with its descriptors, waiting while the socket's buffer is full (requests of one attempt's workers
    go out together: the process forks one while the last one's intermediate forks its worker)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            socket.send_fds(sock, [data], fds)
            return
        except BlockingIOError:
            await _writable(loop, sock)


async def _writable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    room: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not room.done():
            room.set_result(None)

    loop.add_writer(sock.fileno(), ready)
    try:
        await room
    finally:
        loop.remove_writer(sock.fileno())


def _pidfd(pid: int) -> int | None:
    if pid <= 0:
        return None
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


class ForkedWorker(WorkerProcess):
    """A worker forked from the preloading process: the launcher's child, watched through a pidfd."""

    def __init__(self, pid: int, pidfd: int, live: set[int], readers: tuple[OutputReader, OutputReader | None], *,
                 terminal_fd: int | None, forked_in: float) -> None:
        super().__init__(pid, readers, terminal_fd)
        self._pidfd: int | None = pidfd
        self._live = live
        self._forked_in = forked_in
        self._code: int | None = None
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._loop.add_reader(pidfd, self._reap)

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self._pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: the status is lost
            pid, status = self._pid, None
        if pid == 0:
            return
        self._code = os.waitstatus_to_exitcode(status) if status is not None else -signal.SIGKILL
        self._live.discard(self._pid)
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        if not self._exited.done():
            self._exited.set_result(self._code)

    @property
    def forked_in(self) -> float | None:
        return self._forked_in

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    def ended(self) -> bool:
        return self._code is not None or self._exiting()

    def signal(self, signum: int) -> bool:
        if self._pidfd is None:
            return False
        try:
            signal.pidfd_send_signal(self._pidfd, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def close(self) -> None:
        self._close_output()


class PreloadSpawner(OsSpawner):
    """``OsSpawner``, forking each worker it can from the node's preloading process (``preloader``)."""

    def __init__(self, on_spawn: Callable[[int], None] | None = None, wrapper: tuple[str, ...] | None = None) -> None:
        super().__init__(on_spawn, wrapper)
        self.preloader = Preloader(self)

    async def spawn(self, command: Command) -> WorkerHandle:
        preloader = self.preloader
        if preloader.usable and wire.forkable(command.argv, preloader.python):
            forked = await preloader.fork(command)
            if forked is not None:
                return forked
        return await super().spawn(command)
