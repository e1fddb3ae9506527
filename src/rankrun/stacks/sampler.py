"""Asking workers for their stacks and reading the answers, with what /proc says of each.

``Sampler.sample``: read ``/proc/<pid>/stat`` (state, CPU time), the file's header (written by the
shim once ``faulthandler`` is registered) and the process's caught signals: a worker without the handler is
never sent the signal, whose default action would end it. Then note the answer file's size, send the signal to the
worker's main thread (``Target.signal_main``; why not to the process: ``rankrun.proc.spawn.main_thread_kill``), and
read what is appended once it stops growing. Which signal follows the main thread's state (``/proc/<pid>/stat`` is
the main thread's; why it matters: the shim's docstring):

- not running (``S``, ``D``: blocked in a call): ``DUMP_SIGNAL``, ``faulthandler``'s dump of that thread;
- running (``R``): ``RUNNING_SIGNAL``, the shim's Python handler, every thread, into ``running_file``. No answer within
  ``RUNNING_WAIT`` though the thread ran meanwhile (``RAN`` of its own CPU): it holds the GIL in C, and
  ``faulthandler`` is asked as above. No answer, and it did not run (every core busy): Python's answer is awaited
  until the sample's timeout, since the thread may have stopped in the middle of Python. The Python answer still
  comes when that call returns, once however often it was asked meanwhile (Python runs a handler once for all the
  signals that came before it could), and lands before a later sample notes where its answer will start.

A worker that is stopped, or in the kernel with the signal blocked, does not answer in time; one that is not Python
(or runs with ``-S``/``-I``) has no header: both are reported with their /proc state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rankrun import procfs
from rankrun.record import record
from rankrun.stacks.channel import DUMP_SIGNAL, RUNNING_SIGNAL, running_file
from rankrun.stacks.dump import main_thread, parse
from rankrun.stacks.report import Child, ProcState, RankSample

POLL = 0.005  # seconds between looks at the dump files while waiting for the answers
# Seconds a running worker has to answer from Python. Python runs a handler within a few bytecodes; one that has not
# answered by then holds the GIL in C, where faulthandler is asked instead.
RUNNING_WAIT = 0.2
RAN = 0.02  # CPU seconds: two clock ticks
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@record
class Target:
    """One worker to sample. ``signal`` is its handle's (``WorkerHandle.signal``): it sends nothing once the
    launcher has reaped the worker, whose pid may be another process's by then; ``0`` only asks whether it is.
    ``signal_main``, the handle's ``signal_main``, sends the dump's signal to the main thread alone; None: ``signal``."""

    rank: int
    host: str
    pid: int
    dump_file: Path | None
    signal: Callable[[int], bool]
    signal_main: Callable[[int], bool] | None = None


def proc_stat(pid: int) -> tuple[str, float] | None:
    """The process's state letter and CPU seconds (user + system), or None when it is gone."""
    fields = procfs.stat(pid)
    return None if fields is None else (fields[0], _cpu_seconds(fields))


def _cpu_seconds(fields: list[str]) -> float:
    """User + system CPU seconds from ``procfs.stat``'s fields (a process's or a thread's)."""
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _wchan(pid: int) -> str:
    try:
        value = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return ""
    return "" if value == "0" else value


def children(pid: int) -> tuple[Child, ...]:
    """The worker's own children (a DataLoader's workers), with their names and states."""
    found = []
    for child in procfs.children(pid):
        stat = proc_stat(child)
        if stat is not None:
            found.append(Child(child, _comm(child), stat[0]))
    return tuple(found)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for ``signum`` now (``SigCgt`` in /proc/<pid>/status): a worker that
    exec'd another program since its shim ran has lost it, and the signal's default action would end it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _header(dump_file: Path | None) -> int | None:
    if dump_file is None:
        return None
    try:
        with dump_file.open("rb") as fh:
            return main_thread(fh.readline().decode(errors="replace"))
    except OSError:
        return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


class Sampler:
    """Takes samples of a group of workers; remembers each one's CPU time, so a sample says what was used since."""

    def __init__(self) -> None:
        self._cpu: dict[int, float] = {}

    async def sample(self, targets: Sequence[Target], timeout: float = 1.0, *, keep: bool = True) -> list[RankSample]:
        """Every target's stack now, with /proc. ``keep=False``: each dump's bytes are taken back out of its file
        once read (a watch that samples every few seconds for days must not fill the disk); samples of one process
        take turns, so one sampler's dump is never cut from under another's."""
        async with _turn():
            return await self._sample(targets, timeout, keep)

    async def _sample(self, targets: Sequence[Target], timeout: float, keep: bool) -> list[RankSample]:
        asked: dict[int, _Asked] = {}  # rank -> what faulthandler was asked
        running: dict[int, _Asked] = {}  # rank -> what the Python handler was asked (the main thread runs)
        samples: list[RankSample] = []
        for t in targets:
            stat = proc_stat(t.pid) if t.signal(0) else None
            if stat is None:
                samples.append(RankSample(t.rank, t.host, None, None))
                continue
            state, cpu = stat
            main = _header(t.dump_file)
            if main is None or t.dump_file is None or not catches(t.pid, DUMP_SIGNAL):
                samples.append(RankSample(t.rank, t.host, None, self._proc(t.pid, state, cpu, wchan=True),
                                          children=children(t.pid)))
                continue
            if state == "R" and catches(t.pid, RUNNING_SIGNAL):
                ask = _ask(t, running_file(t.dump_file), RUNNING_SIGNAL, main=main, cpu=cpu, state=state,
                           ran=_main_thread_cpu(t.pid))
            else:
                ask = _ask(t, t.dump_file, DUMP_SIGNAL, main=main, cpu=cpu, state=state)
            if ask is None:  # reaped meanwhile
                samples.append(RankSample(t.rank, t.host, None, None))
                continue
            (running if ask.signum == RUNNING_SIGNAL else asked)[t.rank] = ask
        answers = await _answers({rank: (a.path, a.offset) for rank, a in running.items()}, min(timeout, RUNNING_WAIT))
        for rank, a in running.items():
            if rank in answers or not _ran_since(a):  # answered; or not on a core since: Python answers when it runs
                asked[rank] = a
                continue
            t = a.target  # ran, and never reached a bytecode: in C, the GIL held (Python answers once that call returns)
            assert t.dump_file is not None
            ask = _ask(t, t.dump_file, DUMP_SIGNAL, main=a.main, cpu=a.cpu, state=a.state)
            if ask is None:
                samples.append(RankSample(t.rank, t.host, None, None))
            else:
                asked[rank] = ask
        pending = {rank: (a.path, a.offset) for rank, a in asked.items() if rank not in answers}
        answers |= await _answers(pending, timeout)
        for rank, a in asked.items():
            text, end = answers.get(rank, (None, 0))
            if not keep and text is not None:
                _take_back(a.path, a.offset, end)
            proc = self._proc(a.target.pid, a.state, a.cpu, wchan=text is None)
            dump = parse(text, a.main) if text else None
            samples.append(RankSample(rank, a.target.host, dump, proc, answered=dump is not None and bool(dump.threads),
                                      children=children(a.target.pid)))
        return sorted(samples, key=lambda s: s.rank)

    def prime(self, targets: Sequence[Target]) -> None:
        """Note every worker's CPU time now (from /proc, nothing sent), so the next sample says what was used since."""
        for t in targets:
            stat = proc_stat(t.pid) if t.signal(0) else None
            if stat is not None:
                self._cpu[t.pid] = stat[1]

    def _proc(self, pid: int, state: str, cpu: float, *, wchan: bool) -> ProcState:
        before = self._cpu.get(pid)
        self._cpu[pid] = cpu
        return ProcState(state, None if before is None else max(0.0, cpu - before), _wchan(pid) if wchan else "")


@record
class _Asked:
    """One worker asked for its stack: by which signal, the file its answer goes to and where it starts."""

    target: Target
    path: Path
    offset: int
    signum: int
    main: int
    cpu: float
    state: str
    ran: float | None  # the main thread's own CPU seconds when asked from Python (None: not so asked, or gone)


def _ask(t: Target, path: Path, signum: int, *, main: int, cpu: float, state: str,
         ran: float | None = None) -> _Asked | None:
    """Note where ``path`` ends, then send ``signum`` to the worker's main thread; None when it was reaped meanwhile."""
    offset = max(0, _size(path))
    if not (t.signal_main or t.signal)(signum):
        return None
    return _Asked(t, path, offset, signum, main, cpu, state, ran)


def _main_thread_cpu(pid: int) -> float | None:
    fields = procfs.main_thread_stat(pid)
    return None if fields is None else _cpu_seconds(fields)


def _ran_since(a: _Asked) -> bool:
    """Whether the main thread used ``RAN`` of CPU since it was asked from Python: then it ran without reaching a
    bytecode, in C. Less, on a machine whose cores are all busy, it may just not have had its turn yet, perhaps in
    the middle of Python: ``faulthandler`` must not read it then."""
    now = _main_thread_cpu(a.target.pid)
    return a.ran is not None and now is not None and now - a.ran >= RAN


def _turn() -> asyncio.Lock:
    """The running loop's one lock over samples (a lock is bound to the loop it first waits in)."""
    loop = asyncio.get_running_loop()
    lock = _TURNS.get(loop)
    if lock is None:
        lock = _TURNS[loop] = asyncio.Lock()
    return lock


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


def _take_back(path: Path, offset: int, end: int) -> None:
    """Cut the file back to ``offset``, where it still ends at ``end`` (nothing written since the dump was read)."""
    with contextlib.suppress(OSError):
        if _size(path) == end:
            os.truncate(path, offset)


async def _answers(files: Mapping[int, tuple[Path, int]], timeout: float) -> dict[int, tuple[str, int]]:
    """Wait until each file has grown past its offset and then stopped growing for one poll, or the timeout: each
    answer, and the file's size after it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = {rank: offset for rank, (_, offset) in files.items()}
    done: dict[int, tuple[str, int]] = {}
    while len(done) < len(files) and loop.time() < deadline:
        await asyncio.sleep(POLL)
        for rank, (path, offset) in files.items():
            if rank in done:
                continue
            size = _size(path)
            if size > offset and size == last[rank]:
                with path.open("rb") as fh:
                    fh.seek(offset)
                    done[rank] = fh.read(size - offset).decode(errors="replace"), size
            last[rank] = size
    return done
