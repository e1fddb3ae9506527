"""One node's keeper of its ranks' kept state: the memory the launcher owns, and the socket the ranks reach it by.

For each local rank the keeper makes three memory files (``memfd_create``): the header and two slots
(``checkpoint.slots``). They have no name in any filesystem, so nothing can be left behind: the kernel frees them with
the last descriptor and mapping, whatever killed the launcher. They live for the job: every attempt's worker of that
local rank is handed the same three, so a restarted rank finds what its predecessor kept.

A rank connects to ``@rankrun-<uid>-<pid>-ckpt-<hex>`` (``RANKRUN_CHECKPOINT``); the keeper answers only a process
that is one of the running attempt's workers (by the socket's peer pid), and hands it its files with ``SCM_RIGHTS``.
Room is judged before it is reserved (``memroom``) and reserved with ``posix_fallocate`` before a byte goes through a
mapping: past a memory cgroup's limit a write through a mapping is a ``SIGBUS``, and that may never be how a save
ends. A refused save is one line, and the previous step stays kept.

At each attempt's start the keeper settles which step the attempt resumes from (``plan.plan`` over every local rank's
complete slots and the disk's newest complete step; with several nodes, every node's, agreed through the store), so
every rank of the attempt loads the same one. A
rank's ``load`` gets a copy of the slot that never changes (its tensors are mapped from it, and may stay so in an
optimizer's state while the rank saves into that slot again). A step that every local rank has kept is copied the
same way for ``--checkpoint-dir``'s writer (``checkpoint.disk``) and the neighbour's copy (``checkpoint.peer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import socket
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rankrun.checkpoint import slots, wire
from rankrun.checkpoint.plan import Holding, Plan, Source, plan, summarize
from rankrun.memroom import format_size
from rankrun.ranges import range_string

NAME = "rankrun-ckpt"  # the memory files' names (seen in /proc/PID/maps as memfd:NAME-<launcher pid>-...)
PENDING = 64  # steps a step not yet whole is waited for, at most, behind the newest told (a rank that never saves it)
HELLO_WAIT = 30.0  # seconds a hello from a pid not (yet) known as a worker waits for the attempt's workers to be known
_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass
class Kept:
    """What the ranks said of one step (``kept`` messages), until every local rank kept it."""

    bytes: dict[int, int] = field(default_factory=dict)  # rank -> bytes
    seconds: dict[int, float] = field(default_factory=dict)


@dataclass
class Loaded:
    """The ranks that loaded the attempt's resume step."""

    ranks: set[int] = field(default_factory=set)
    bytes: int = 0
    seconds: float = 0.0
    told: bool = False  # the attempt's restore was told already


class Files:
    """One local rank's three memory files, and what the keeper reserved of each slot."""

    def __init__(self, local_rank: int) -> None:
        self.header = os.memfd_create(f"{NAME}-{os.getpid()}-{local_rank}-h", os.MFD_CLOEXEC)
        os.ftruncate(self.header, slots.HEADER)
        self.view = mmap.mmap(self.header, slots.HEADER)
        slots.init(self.view)
        self.slots = [os.memfd_create(f"{NAME}-{os.getpid()}-{local_rank}-{name}", os.MFD_CLOEXEC) for name in "ab"]
        self.capacity = [0, 0]

    def close(self) -> None:
        self.view.close()
        for fd in (self.header, *self.slots):
            os.close(fd)


def snapshot(fd: int, length: int) -> int:
    """A new memory file holding the first ``length`` bytes of ``fd``: a copy that never changes (blocking: run it
    off the event loop; the kernel copies, the GIL is released)."""
    copy = os.memfd_create(f"{NAME}-{os.getpid()}-copy", os.MFD_CLOEXEC)
    try:
        done = 0
        while done < length:
            n = os.copy_file_range(fd, copy, length - done, done, done)
            if n == 0:
                raise OSError(f"a kept slot ended after {done} of {length} bytes")
            done += n
    except BaseException:
        os.close(copy)
        raise
    return copy


Told = Callable[[str, dict[str, Any]], None]  # what the keeper saw ("kept", "refused", "restored"), for the agent
OnDisk = tuple[int, int, Mapping[int, Path]]  # --checkpoint-dir's newest complete step: step, world, rank -> file
Remote = Callable[[Source, int, int], Awaitable[int]]  # (where, rank, step) -> a descriptor of another node's copy


class Neighbours(Protocol):
    """The copies this node holds for other nodes (``peer.PeerServer``)."""

    def steps(self) -> dict[str, dict[int, list[tuple[int, int]]]]: ...

    def find(self, rank: int, step: int) -> Any: ...  # a peer.Copy (fd, world, length) or None


class Keeper:
    """The node's keeper (from ``start``), for the job's length; ``close`` frees everything."""

    def __init__(self, nproc: int, *, say: Callable[[str], None], told: Told, room: Callable[[int], str | None],
                 disk: Callable[[], OnDisk | None] | None = None, node: str = "") -> None:
        self._nproc, self._say, self._told, self._room, self.node = nproc, say, told, room, node
        self._disk = disk  # the disk's newest complete step (--checkpoint-dir), read at each attempt's start
        self._on_disk: OnDisk | None = None
        self.remote: Remote | None = None  # several nodes: a rank's state from another node
        self.neighbours: Neighbours | None = None  # several nodes: the copies this node holds for another (peer.py)
        self._files: list[Files] = []
        self._server: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._conns: set[socket.socket] = set()
        self._workers: dict[int, tuple[int, int]] = {}  # pid -> (rank, local rank), the running attempt's
        self._known = asyncio.Event()
        self.attempt, self.world = 0, 0
        self.plan: Plan | str = ""  # the step the running attempt resumes from, or why none ("": nothing kept)
        self._said_none = ""
        self._kept: dict[int, Kept] = {}
        self._latest: dict[int, int] = {}  # each local rank's newest step told kept, this attempt
        self._loaded = Loaded()
        self._refused_said: set[int] = set()  # the sizes (in powers of two) already said: one line each
        # who takes a copy of each step every local rank kept (the disk's writer, the neighbour's sender): each gets
        # descriptors of its own, to close
        self.on_step: list[Callable[[int, int, dict[int, tuple[int, int]]], None]] = []
        self.name = ""

    async def start(self) -> str:
        """Listens; the value of ``RANKRUN_CHECKPOINT`` for the workers."""
        self.name = f"@rankrun-{os.getuid()}-{os.getpid()}-ckpt-{os.urandom(4).hex()}"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        server.bind("\0" + self.name[1:])
        server.listen(max(64, self._nproc))
        self._server = server
        self._files = [Files(local) for local in range(self._nproc)]
        self._spawn(self._accept())
        return wire.env_value(self.name)

    # -- the attempt -------------------------------------------------------------------------------------------------

    def holdings(self, peer: tuple[str, int] | None = None) -> list[Holding]:
        """What this node holds now: its ranks' complete steps (memory), and the disk's newest complete step."""
        held: dict[int, list[tuple[int, int]]] = {}
        for files in self._files:
            for _, desc in slots.complete(files.view):
                held.setdefault(desc.rank, []).append((desc.step, desc.world))
        found = summarize(held, "memory", self.node, peer)
        if self.neighbours is not None:
            for copies in self.neighbours.steps().values():
                found += summarize(copies, "neighbour", self.node, peer)
        self._on_disk = self._disk() if self._disk is not None else None
        if self._on_disk is not None:
            step, world, paths = self._on_disk
            found.append(Holding(range_string(paths), ((step, world),), "disk", self.node, None))
        return found

    def attempt_starts(self, attempt: int, world: int, agreed: Plan | str | None = None) -> Plan | str:
        """A new attempt of ``world`` ranks: which step it resumes from, settled now for all of its ranks: ``agreed``
        by every node (several nodes), else from what this node holds."""
        self.attempt, self.world = attempt, world
        self._workers, self._known = {}, asyncio.Event()
        self._kept, self._latest = {}, {}
        self._loaded = Loaded()
        self.plan = agreed if agreed is not None else plan(self.holdings())
        if isinstance(self.plan, str) and self.plan and self.plan != self._said_none:  # something kept, no step whole
            self._said_none = self.plan
            self._say(f"checkpoint: attempt {attempt} has no step to resume from ({self.plan}); without "
                      "--checkpoint-dir holding one, its ranks start from the beginning")
        return self.plan

    def workers(self, pids: Mapping[int, tuple[int, int]]) -> None:
        """The attempt's workers as they started: pid -> (rank, local rank)."""
        self._workers = dict(pids)
        self._known.set()

    def _on_loaded(self, rank: int, nbytes: int, seconds: float) -> None:
        """A rank loaded the attempt's step: told once every local rank has (or at the attempt's end)."""
        loaded = self._loaded
        if rank in loaded.ranks:
            return  # a rank's second load (another rank's state, DCP's reads) is not a second restore
        loaded.ranks.add(rank)
        loaded.bytes += nbytes
        loaded.seconds = max(loaded.seconds, seconds)
        if loaded.ranks >= {r for r, _ in self._workers.values()}:
            self._restored()

    def _restored(self) -> None:
        loaded, self._loaded = self._loaded, Loaded(told=True)
        if loaded.ranks and not loaded.told and isinstance(self.plan, Plan):
            self._tell_restored(loaded, self.plan)

    def attempt_ended(self) -> None:
        """The attempt's workers are gone: what they loaded is told, if it was not yet."""
        self._restored()
        self._workers = {}

    def _tell_restored(self, loaded: Loaded, resume: Plan) -> None:
        wheres = {source.where for rank in loaded.ranks if (source := resume.source(rank)) is not None}
        farthest = max(wheres or {"memory"}, key=("memory", "neighbour", "disk").index)
        self._told("restored", {"attempt": self.attempt, "step": resume.step, "ranks": sorted(loaded.ranks),
                                "bytes": loaded.bytes, "seconds": loaded.seconds, "source": farthest})

    # -- serving the ranks -------------------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._server is not None
        while True:
            conn, _ = await loop.sock_accept(self._server)
            self._conns.add(conn)
            self._spawn(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            pid = _CRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))[0]
            who = await self._who(pid, await loop.sock_recv(conn, wire.LIMIT))
            if who is None:
                _send(conn, wire.encode("refused", why=f"only a rank's own process keeps state, and process {pid} is "
                                                       "not one of this attempt's workers (a DataLoader worker, or a "
                                                       "subprocess of a rank?)"))
                return
            rank, local = who
            files = self._files[local]
            _send(conn, wire.encode("slots", rank=rank, local_rank=local, world=self.world, attempt=self.attempt,
                                    capacity=files.capacity), [files.header, *files.slots])
            while data := await loop.sock_recv(conn, wire.LIMIT):
                await self._answer(conn, wire.decode(data), rank, files)
        except (OSError, ValueError):
            pass  # a rank that died mid-message, or sent something else: its connection ends
        finally:
            self._conns.discard(conn)
            conn.close()

    async def _who(self, pid: int, data: bytes) -> tuple[int, int] | None:
        """The (rank, local rank) of a hello's sender; ``None`` (after answering why) when it is not a worker."""
        if not data or wire.decode(data)["kind"] != "hello":
            return None
        if pid not in self._workers and not self._known.is_set():
            known = self._known
            with contextlib.suppress(TimeoutError):  # a forked worker may say hello before its spawn has returned
                async with asyncio.timeout(HELLO_WAIT):
                    await known.wait()
        return self._workers.get(pid)

    async def _answer(self, conn: socket.socket, msg: dict[str, Any], rank: int, files: Files) -> None:
        kind = msg["kind"]
        if kind == "room":
            await self._reserve(conn, files, int(msg["slot"]), int(msg["bytes"]), (rank, int(msg.get("step", -1))))
        elif kind == "kept":
            self._on_kept(rank, int(msg["step"]), int(msg["bytes"]), float(msg["seconds"]))
            self._spawn(self._ahead(files, 1 - int(msg["slot"]) % 2))
        elif kind == "fetch":
            await self._fetch(conn, rank if msg.get("rank") is None else int(msg["rank"]), msg.get("rank") is None)
        elif kind == "loaded":
            self._on_loaded(rank, int(msg["bytes"]), float(msg["seconds"]))

    async def _reserve(self, conn: socket.socket, files: Files, index: int, need: int, who: tuple[int, int]) -> None:
        """Room for ``need`` bytes in slot ``index``, for ``who``: (rank, the step it saves, -1 when unknown)."""
        growth = need - files.capacity[index]
        why = self._room(growth) if growth > 0 else None
        if why is None:
            try:
                await asyncio.to_thread(_fallocate, files.slots[index], need)
            except OSError as exc:
                why = f"reserving {need} bytes failed: {exc.strerror or exc}"
        if why is not None:
            self._refused(who, need, why, files)
            _send(conn, wire.encode("refused", why=why))
            return
        files.capacity[index] = max(files.capacity[index], need)
        _send(conn, wire.encode("ok", capacity=files.capacity[index]))

    async def _ahead(self, files: Files, index: int) -> None:
        """The other slot reserved as large as this one, in the background: the rank's next save then finds its pages
        there (a first touch of memory costs more than the copy). Quietly skipped without room: that save asks, and
        is refused with its line."""
        need = files.capacity[1 - index]
        if files.capacity[index] >= need or self._room(need - files.capacity[index]) is not None:
            return
        with contextlib.suppress(OSError):
            await asyncio.to_thread(_fallocate, files.slots[index], need)
            files.capacity[index] = max(files.capacity[index], need)

    def _refused(self, who: tuple[int, int], need: int, why: str, files: Files) -> None:
        rank, step = who
        top = slots.newest(files.view)
        kept = f"step {top[1].step} stays kept" if top is not None else "nothing was kept before"
        self._told("refused", {"rank": rank, "step": step, "bytes": need, "why": why})
        if need.bit_length() not in self._refused_said:  # one line per size class: later refusals are counted
            self._refused_said.add(need.bit_length())
            saved = f"rank {rank}'s step {step}" if step >= 0 else f"rank {rank}'s state"
            self._say(f"checkpoint: {saved} ({format_size(need)}) is not kept: {why}; {kept}")

    def _on_kept(self, rank: int, step: int, nbytes: int, seconds: float) -> None:
        kept = self._kept.setdefault(step, Kept())
        kept.bytes[rank], kept.seconds[rank] = nbytes, seconds
        self._latest[rank] = max(self._latest.get(rank, step), step)
        local = {r for r, _ in self._workers.values()}
        # a step every local rank has gone past and that is not whole never will be (one of them skipped it); each
        # rank's messages come in order on its own socket, but the ranks' sockets are read in any order: under load a
        # rank's next steps may be read before another's older one, which must still complete then
        horizon = min((self._latest.get(r, -1) for r in local), default=-1)
        for old in [s for s in self._kept if s < horizon or s < step - PENDING]:
            del self._kept[old]
        if local and local <= set(kept.bytes):
            del self._kept[step]
            self._told("kept", {"step": step, "ranks": sorted(kept.bytes), "bytes": sum(kept.bytes.values()),
                                "seconds": max(kept.seconds.values())})
            if self.on_step:
                self._spawn(self._copy_step(step))

    async def _copy_step(self, step: int) -> None:
        """Copies of this node's ranks' ``step`` for the disk's writer and the neighbour (``on_step``): each slot copied, then its
        descriptor read again: a rank that began its next save into that slot meanwhile spoils the copy, and the step
        is skipped (a newer one follows)."""
        copies: dict[int, tuple[int, int]] = {}
        world = 0
        try:
            for files in self._files:
                found = [(i, d) for i, d in slots.complete(files.view) if d.step == step]
                if not found:
                    continue
                index, desc = found[0]
                fd = await asyncio.to_thread(snapshot, files.slots[index], desc.length)
                copies[desc.rank] = (fd, desc.length)
                if slots.read(files.view, index) != desc:
                    raise OSError("overwritten while copied")
                world = desc.world
        except OSError:
            for fd, _ in copies.values():
                os.close(fd)
            return
        takers = list(self.on_step)
        for i, take in enumerate(takers):
            take(step, world, copies if i == len(takers) - 1 else {r: (os.dup(fd), n) for r, (fd, n) in copies.items()})
        if not takers:
            for fd, _ in copies.values():
                os.close(fd)

    async def _fetch(self, conn: socket.socket, rank: int, own: bool) -> None:
        resume = self.plan
        if not isinstance(resume, Plan):
            _send(conn, wire.encode("none", why=resume or "nothing is kept"))
            return
        if own and self.world != resume.world:
            _send(conn, wire.encode("refused", why=f"the world changed from {resume.world} to {self.world} ranks: "
                                                   "load(rank=r) names which old rank's state"))
            return
        source = resume.source(rank)
        if source is None:
            _send(conn, wire.encode("refused", why=f"rank {rank} is not one of the {resume.world} ranks that saved "
                                                   f"step {resume.step}"))
            return
        try:
            fd = await self._open(rank, resume.step, resume.world, source)
        except OSError as exc:
            _send(conn, wire.encode("none", why=f"rank {rank}'s state of step {resume.step} could not be read from "
                                                f"{source.where} ({exc})"))
            return
        try:
            _send(conn, wire.encode("state", step=resume.step, world=resume.world, rank=rank,
                                    bytes=os.fstat(fd).st_size, source=source.where), [fd])
        finally:
            os.close(fd)

    async def _open(self, rank: int, step: int, world: int, source: Source) -> int:
        """A descriptor of ``rank``'s state of ``step`` that never changes: a copy of this node's slot or of a copy it
        holds for another node, the disk's file, or another node's copy; ``OSError`` when it cannot be had."""
        if source.where == "disk" and self._on_disk is not None and rank in self._on_disk[2]:
            return os.open(self._on_disk[2][rank], os.O_RDONLY | os.O_CLOEXEC)
        if source.node == self.node:
            mine = await self.copy_of(rank, step)
            if mine is not None and mine[1] == world:
                return mine[0]
            if mine is not None:
                os.close(mine[0])
        elif self.remote is not None:
            return await self.remote(source, rank, step)
        raise OSError(f"not held on this node ({self.node or 'one node'})")

    async def copy_of(self, rank: int, step: int) -> tuple[int, int, int] | None:
        """A descriptor of ``rank``'s ``step`` held on this node (its own slots, else a neighbour's copy), that never
        changes and is the caller's to close, with the step's world and bytes; ``None`` when it holds none."""
        for files in self._files:
            for index, desc in slots.complete(files.view):
                if (desc.rank, desc.step) == (rank, step):
                    return await asyncio.to_thread(snapshot, files.slots[index], desc.length), desc.world, desc.length
        copy = self.neighbours.find(rank, step) if self.neighbours is not None else None
        return None if copy is None else (os.dup(copy.fd), copy.world, copy.length)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in list(self._conns):
            conn.close()
        if self._server is not None:
            self._server.close()
            self._server = None
        for files in self._files:
            files.close()
        self._files = []


def _fallocate(fd: int, size: int) -> None:
    os.posix_fallocate(fd, 0, size)  # the pages exist before a byte goes through a mapping (else SIGBUS past a limit)


def _send(conn: socket.socket, data: bytes, fds: Sequence[int] = ()) -> None:
    if fds:
        socket.send_fds(conn, [data], list(fds))
    else:
        conn.send(data)


__all__ = ["HELLO_WAIT", "Files", "Keeper", "snapshot"]
