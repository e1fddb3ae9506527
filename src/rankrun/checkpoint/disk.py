"""``--checkpoint-dir``: one node's writer of its ranks' kept steps to disk, in the background (standard library only).

The keeper offers each step once every local rank of it is kept, as read-only snapshots (an fd whose bytes never
change, and its length); the writer owns those fds from then on and closes them when the step is written, abandoned
or dropped. It writes one step at a time, in the loop's default executor, so nothing on the loop and nothing on a
worker's path waits for a disk:

- each rank's file as ``.rank_R.pt.<hex>.tmp`` in the step's folder, by ``os.sendfile`` from the snapshot in 64 MiB
  chunks, then ``fsync``, ``rename`` to ``rank_R.pt`` and an ``fsync`` of the folder; the node's manifest the same way,
  last (``manifest``: what makes a step complete). A reader never sees a half-written file or step.
- **Newest wins**: a newer offer abandons the step being written (its tmp files and the files it renamed are removed,
  the fds closed) and drops one offered but not begun: the disk gets the newest step soonest.
- **Preemption** (``flush``): from then on nothing is abandoned; the step being written is finished, then the newest
  offered one, until a deadline; past it the write stops at the next chunk, its tmp files are removed, its manifest
  is never written (the step on disk before it stays the newest complete one), and one line says what was lost.
- **Keep two**: once a step is complete, this node removes its own files of the steps older than the two newest
  complete ones (and of never-completed steps older than those), then the step's folder when it is empty (another
  node's files keep it). A node looks after each step it completes, and once more at ``close``: on several nodes,
  the node that completed a step before the others keeps its files of one more step until then.

A write that fails (a full disk, an I/O error) is one line; the step is abandoned and the next one is tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from rankrun.checkpoint import manifest

Snapshot = tuple[int, int]  # (fd, length): an fd the writer owns (closes it when done or abandoned); its bytes never change
Written = Callable[[int, str, int, float, str], None]  # (step, the step's folder, bytes, seconds, complete|abandoned)

CHUNK = 64 << 20  # bytes per sendfile: the most a newer offer or a deadline waits before the write stops


class _Cut(Exception):
    """The write stopped at a chunk boundary: abandoned for a newer step, or past the flush's deadline."""


class _Job:
    """One offered step of this node: the fds it owns, and how far its write got (the writing thread counts, the loop
    reads)."""

    def __init__(self, step: int, world: int, files: Mapping[int, Snapshot]) -> None:
        self.step = step
        self.world = world
        self.files = dict(sorted(files.items()))
        self.total = sum(length for _, length in self.files.values())
        self.written = 0
        self.stop = threading.Event()  # set: stop at the next chunk
        self.complete: bool | None = None  # once written: whether the step is on disk
        self.path = ""  # the step's folder, once the writer has named it
        self._open = [fd for fd, _ in self.files.values()]

    def close(self) -> None:
        """Close the fds, once: a number closed twice may be another file's by then."""
        fds, self._open = self._open, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


class DiskWriter:
    """One node's background writer of its kept steps to the run's folder (``manifest.run_folder``). Called from the
    loop's thread only."""

    def __init__(self, folder: Path, node: str, *, say: Callable[[str], None], on_written: Written | None = None,
                 chunk_delay: float = 0.0) -> None:
        self._folder = folder
        self._node = node
        self._say = say  # a line, without the "rankrun: " the console adds
        self._on_written = on_written
        self._chunk_delay = chunk_delay  # test seam: seconds each chunk waits (in the executor), to throttle a write
        self._pending: _Job | None = None  # the newest step offered, not begun
        self._current: _Job | None = None  # the step being written
        self._task: asyncio.Task[None] | None = None
        self._io: asyncio.Future[tuple[bool, str]] | None = None  # the executor's write of _current (outlives a cancelled _task)
        self._last: bool | None = None  # whether the last step written is on disk (None: none written yet)
        self._flushing = False
        self._closed = False
        self._ranks: set[int] = set()  # this node's ranks in the last step it completed (keep two's "own files")

    @property
    def writing(self) -> tuple[int, int, int] | None:
        """The step being written, its bytes written so far and in all; None when idle."""
        job = self._current
        return None if job is None else (job.step, job.written, job.total)

    def offer(self, step: int, world: int, files: Mapping[int, Snapshot]) -> None:
        """This node's ranks' bytes of one complete step (every local rank). Never blocks. Newest wins: a newer offer
        abandons the one being written (tmp files removed, fds closed) — except during ``flush()``."""
        job = _Job(step, world, files)
        if self._closed:
            job.close()
            return
        if self._pending is not None:
            self._pending.close()  # never begun: dropped for the newer one
        self._pending = job
        if self._current is not None and not self._flushing:
            self._current.stop.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="rankrun-checkpoint-disk")

    async def flush(self, deadline: float, *, grace: float | None = None) -> bool:
        """Preemption: finish the step being written, then the newest offered one, never abandoning; ``deadline`` is
        ``loop.time()``'s. Past it: tmp files removed, the manifest not written, one line (``grace``: the seconds it
        names as ``--shutdown-timeout``, by default those left at this call). Whether everything offered is on disk."""
        loop = asyncio.get_running_loop()
        grace = round(deadline - loop.time(), 1) if grace is None else grace
        self._flushing = True
        task = self._task
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
            if not done:
                return await self._cut(task, grace)
        return self._last is not False and self._pending is None

    async def close(self) -> None:
        """Stop: abandon what is in progress (tmp removed), close every fd held."""
        self._closed = True
        if self._pending is not None:
            self._pending.close()
            self._pending = None
        if self._current is not None:
            self._current.stop.set()
        running = {f for f in (self._task, self._io) if f is not None}
        if running:
            await asyncio.wait(running)
        if self._ranks:  # a step this node completed may have become complete on every node only since
            await asyncio.get_running_loop().run_in_executor(None, self._keep_two, self._ranks)

    async def _cut(self, task: asyncio.Task[None], grace: float) -> bool:
        """Past the flush's deadline: stop the write at its next chunk, drop what was to follow, say what was lost;
        whether the newest step got on disk all the same (its last chunk was written as the deadline passed)."""
        self._closed = True  # an offer from here on is closed at once: the launcher is leaving
        newest = self._pending or self._current
        if self._pending is not None:
            self._pending.close()
            self._pending = None
        if self._current is not None:
            self._current.stop.set()
        await asyncio.wait({task})
        if newest is None or newest.complete:  # the write ended between the deadline and here
            return True
        on_disk = await asyncio.get_running_loop().run_in_executor(None, manifest.newest_complete, self._folder)
        self._say(cut_line(newest.step, self._folder, grace, written=newest.written, total=newest.total,
                           on_disk=None if on_disk is None else on_disk.step))
        return False

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (job := self._pending) is not None:
                self._pending, self._current = None, job
                started = time.monotonic()
                self._io = loop.run_in_executor(None, self._write_step, job)
                try:
                    complete, why = await asyncio.shield(self._io)  # a cancelled writer task leaves the thread to finish
                except asyncio.CancelledError:
                    job.stop.set()
                    raise
                except Exception as exc:  # a writer that fails says so; the launcher goes on
                    complete, why = False, str(exc) or type(exc).__name__
                if why:
                    self._say(f"checkpoint: step {job.step} was not written to {self._folder}: {why}")
                self._current, self._io, self._last, job.complete = None, None, complete, complete
                self._report(job, time.monotonic() - started)
        finally:
            self._task = None

    def _report(self, job: _Job, seconds: float) -> None:
        if self._on_written is not None:
            state = "complete" if job.complete else "abandoned"
            self._on_written(job.step, job.path, job.written, seconds, state)

    # ------------------------------------------------------------------ in the executor

    def _write_step(self, job: _Job) -> tuple[bool, str]:
        """Write ``job``'s files, then its manifest: whether the step is on disk, and why not when it failed (not when
        it was abandoned). Closes its fds."""
        made: list[Path] = []  # the files renamed into place so far: removed again if the step is not completed
        try:
            path = self._folder / manifest.step_name(job.step)
            job.path = str(path)
            _make_folder(path)
            _unlink(path / manifest.manifest_name(self._node))  # a step written again: incomplete while it changes
            for rank, (fd, length) in job.files.items():
                made.append(self._write_file(job, fd, length, path / manifest.rank_name(rank)))
            if job.stop.is_set():
                raise _Cut
            record = manifest.NodeManifest(job.step, job.world, tuple(job.files), job.total, time.time())
            _write_whole(path / manifest.manifest_name(self._node), manifest.encode(record))
        except _Cut:
            _remove(path, made)
            return False, ""
        except OSError as exc:
            _remove(path, made)
            return False, exc.strerror or str(exc)
        finally:
            job.close()
        self._ranks = set(job.files)
        self._keep_two(self._ranks)
        return True, ""

    def _write_file(self, job: _Job, fd: int, length: int, final: Path) -> Path:
        """``length`` bytes of ``fd`` as ``final``: a tmp file by ``sendfile``, fsynced, renamed, the folder fsynced."""
        tmp = final.with_name(manifest.tmp_name(final.name, os.urandom(4).hex()))
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            offset = 0
            while offset < length:
                if job.stop.is_set():
                    raise _Cut
                sent = os.sendfile(out, fd, offset, min(CHUNK, length - offset))
                if sent == 0:
                    raise OSError(errno.EIO, f"the kept copy ends at byte {offset} of {length}")
                offset += sent
                job.written += sent
                if self._chunk_delay and job.stop.wait(self._chunk_delay):
                    raise _Cut
            os.fsync(out)
        except BaseException:
            os.close(out)
            _unlink(tmp)
            raise
        os.close(out)
        os.rename(tmp, final)
        _fsync_folder(final.parent)
        return final

    def _keep_two(self, ranks: set[int]) -> None:
        """This node's files of the stale steps (``manifest.stale``) removed, each folder too once it is empty."""
        steps = manifest.step_folders(self._folder)
        complete = [found.step for found in manifest.complete_steps(self._folder)]
        for step in manifest.stale(complete, present=steps):
            self._remove_own(steps[step], ranks)

    def _remove_own(self, path: Path, ranks: set[int]) -> None:
        """This node's files in one step's folder: its manifest first (no reader takes the step from then on), the
        ranks it names and this node's ranks now, their tmp files; then the folder, unless another node's files are
        still in it."""
        own = path / manifest.manifest_name(self._node)
        named = manifest.read_manifest(own)
        mine = [manifest.rank_name(rank) for rank in sorted(ranks | set(named.ranks if named else ()))]
        _unlink(own)
        for name in mine:
            _unlink(path / name)
        try:
            left = os.listdir(path)
        except OSError:
            return
        for name in left:
            if any(manifest.is_tmp_of(name, final) for final in (*mine, own.name)):
                _unlink(path / name)
        with contextlib.suppress(OSError):  # another node's files: the last node to leave removes it
            path.rmdir()


def cut_line(step: int, folder: Path, grace: float, *, written: int, total: int, on_disk: int | None) -> str:
    """The line for a step the flush could not finish (pure)."""
    newest = f"the newest step on disk is {on_disk}" if on_disk is not None else "there is no complete step on disk"
    return (f"checkpoint: step {step} was not written to {folder} within --shutdown-timeout {grace:g} s "
            f"({amount(written, total)}); {newest}")


def amount(part: int, whole: int) -> str:
    """``3.1 of 4.2 GB`` (MB below a GB, so a small state does not read ``0.0 of 0.0 GB``) (pure)."""
    unit, size = ("GB", 1e9) if whole >= 1e9 else ("MB", 1e6)
    return f"{part / size:.1f} of {whole / size:.1f} {unit}"


def _make_folder(path: Path) -> None:
    """The step's folder, and its entry in the run's folder made durable when it is new."""
    new = not path.is_dir()
    path.mkdir(parents=True, exist_ok=True)
    if new:
        _fsync_folder(path.parent)


def _write_whole(final: Path, data: bytes) -> None:
    """``data`` as ``final``: a tmp file, fsynced, renamed, the folder fsynced."""
    tmp = final.with_name(manifest.tmp_name(final.name, os.urandom(4).hex()))
    try:
        with open(tmp, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.rename(tmp, final)
    except BaseException:
        _unlink(tmp)
        raise
    _fsync_folder(final.parent)


def _fsync_folder(path: Path) -> None:
    """A rename survives a crash only once its folder is on disk too."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path, made: list[Path]) -> None:
    """An unfinished step's files renamed into place, and its folder when nothing else is in it."""
    for final in made:
        _unlink(final)
    with contextlib.suppress(OSError):  # something else is in it
        path.rmdir()


def _unlink(path: Path) -> None:
    """Clean-up: a file already gone, or one that cannot go, is not worth a failed write."""
    with contextlib.suppress(OSError):
        path.unlink()
