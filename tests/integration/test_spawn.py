"""``OsSpawner`` on real processes: both ways of giving a worker its death signal, and a program that is not there."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from rankrun.errors import SpawnError
from rankrun.proc import spawn
from rankrun.proc.spawn import Command, OsSpawner, main_thread_kill, pdeathsig_exec

# The worker reports its pid and PR_GET_PDEATHSIG (2), as the kernel sees them after the last exec.
_REPORT = (
    "import ctypes, os, sys\n"
    "sig = ctypes.c_int(-1)\n"
    "ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(sig), 0, 0, 0)\n"
    "open(sys.argv[1], 'w').write(f'{os.getpid()} {sig.value}')\n"
)

WRAPPER = pdeathsig_exec()
MODES = [
    pytest.param(WRAPPER, id="setpriv", marks=pytest.mark.skipif(not WRAPPER, reason="no setpriv with --pdeathsig here")),
    pytest.param((), id="pre-exec-hook"),
]


async def _run_worker(spawner: OsSpawner, command: Command) -> tuple[int, int]:
    handle = await spawner.spawn(command)
    try:
        status = await asyncio.wait_for(handle.wait(), 30)
    finally:
        handle.close()
    return handle.pid, status


@pytest.mark.parametrize("wrapper", MODES)
def test_the_worker_itself_has_the_death_signal_and_the_pid_we_were_given(tmp_path: Path, wrapper: tuple[str, ...]) -> None:
    out = tmp_path / "report"
    command = Command((sys.executable, "-c", _REPORT, str(out)), dict(os.environ))
    pid, status = asyncio.run(_run_worker(OsSpawner(wrapper=wrapper), command))
    assert status == 0
    seen_pid, pdeathsig = map(int, out.read_text().split())
    assert seen_pid == pid  # setpriv exec'd the worker in place: the pid we watch is the worker's
    assert pdeathsig == 9  # SIGKILL


@pytest.mark.parametrize("wrapper", MODES)
def test_a_program_that_is_not_there_is_a_spawn_error(tmp_path: Path, wrapper: tuple[str, ...]) -> None:
    command = Command((str(tmp_path / "missing"),), dict(os.environ))
    with pytest.raises(SpawnError, match=r"cannot start worker .*missing: No such file or directory"):
        asyncio.run(_run_worker(OsSpawner(wrapper=wrapper), command))


@pytest.mark.parametrize("wrapper", MODES)
def test_a_bound_worker_has_its_cpus_and_still_its_death_signal(tmp_path: Path, wrapper: tuple[str, ...]) -> None:
    """``Command.cpus`` goes through the pre-exec hook even where setpriv is there: the hook gives both."""
    out = tmp_path / "report"
    cpus = frozenset([min(os.sched_getaffinity(0))])
    report = _REPORT.replace("{sig.value}'", "{sig.value} ' + ','.join(map(str, sorted(os.sched_getaffinity(0))))")
    command = Command((sys.executable, "-c", report, str(out)), dict(os.environ), cpus=cpus)
    pid, status = asyncio.run(_run_worker(OsSpawner(wrapper=wrapper), command))
    assert status == 0
    seen_pid, pdeathsig, bound = out.read_text().split()
    assert (int(seen_pid), int(pdeathsig), bound) == (pid, 9, str(min(cpus)))


def test_cpus_that_cannot_be_bound_to_are_a_spawn_error(tmp_path: Path) -> None:
    """A CPU the kernel does not have (the hook's ``sched_setaffinity`` fails in the child): one line, no worker."""
    command = Command(("true",), dict(os.environ), cpus=frozenset([1 << 20]))
    with pytest.raises(SpawnError, match=r"^cannot start worker true: cannot bind it to CPUs 1048576 \(--numa-binding\)$"):
        asyncio.run(_run_worker(OsSpawner(), command))


def test_setpriv_is_used_only_when_it_knows_pdeathsig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert pdeathsig_exec() == ()  # none on PATH
    fake = tmp_path / "setpriv"
    fake.write_bytes(b"#!/bin/sh\necho setpriv from util-linux 2.32 --reuid --init-groups\n")
    fake.chmod(0o755)
    assert pdeathsig_exec() == ()  # too old: no --pdeathsig
    fake.write_bytes(b"#!/bin/sh\n# --pdeathsig keep|clear|<signal>\n")
    assert pdeathsig_exec() == (str(fake), "--pdeathsig", "KILL", "--")


def test_a_worker_is_signalled_only_until_it_is_reaped() -> None:
    """After the launcher reaped a worker its pid may be another process's: ``signal`` sends nothing then."""

    async def scenario() -> tuple[bool, bool, bool]:
        handle = await OsSpawner().spawn(Command((sys.executable, "-c", "import sys; sys.stdin.read()"), dict(os.environ)))
        try:
            alive = handle.signal(0)
            assert handle.signal(15)  # SIGTERM: it ends
            await asyncio.wait_for(handle.wait(), 30)
            return alive, handle.signal(0), handle.signal(15)
        finally:
            handle.close()

    assert asyncio.run(scenario()) == (True, False, False)


def test_ended_tells_a_worker_that_exited_by_itself_from_one_that_runs(tmp_path: Path) -> None:
    """What the group asks each worker as it begins a stop: an exit already made (not yet heard of, or reaped) is the
    worker's own; a running worker is not ended."""

    async def main() -> tuple[bool, bool, bool]:
        spawner = OsSpawner()
        done = await spawner.spawn(Command(("sh", "-c", "exit 2"), dict(os.environ)))
        running = await spawner.spawn(Command(("sleep", "60"), dict(os.environ)))
        try:
            deadline = time.monotonic() + 30
            # no await: the loop cannot hear of it (a zombie, or reaped by 3.11's watcher thread, its news not read yet)
            while _state(done.pid) not in ("Z", "gone") and time.monotonic() < deadline:
                time.sleep(0.005)
            unheard = done.ended()
            assert await asyncio.wait_for(done.wait(), 30) == 2
            return unheard, done.ended(), running.ended()
        finally:
            running.signal_group(signal.SIGKILL)
            await asyncio.wait_for(running.wait(), 30)
            done.close()
            running.close()

    assert asyncio.run(main()) == (True, True, False)


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped before the open, or between the open and the read (ESRCH)
        return "gone"
    return stat[stat.rfind(")") + 2]


# The main thread blocks SIGUSR1 with another thread beside it that does not: a signal sent to the process goes to
# that thread (and Python's handler then runs in the main thread, as it always does), one sent to the main thread
# waits there, pending. The worker writes down which it saw (bounded: 10 s).
_MAIN_ONLY = (
    "import signal, sys, threading, time\n"
    "took = []\n"
    "signal.signal(signal.SIGUSR1, lambda *_: took.append(1))\n"
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})\n"
    "open(sys.argv[1] + '.ready', 'w').close()\n"
    "deadline = time.monotonic() + 10\n"
    "while signal.SIGUSR1 not in signal.sigpending() and not took and time.monotonic() < deadline:\n"
    "    time.sleep(0.005)\n"
    "open(sys.argv[1], 'w').write('main' if signal.SIGUSR1 in signal.sigpending() else 'elsewhere')\n"
)


def _where_it_went(tmp_path: Path) -> tuple[str, bool, bool | None]:
    """Where a ``signal_main`` went (the worker's word), whether one is sent after the reap, and ``main_thread_kill``
    on that pid then."""
    said = tmp_path / "said"

    async def scenario() -> tuple[str, bool, bool | None]:
        handle = await OsSpawner().spawn(Command((sys.executable, "-c", _MAIN_ONLY, str(said)), dict(os.environ)))
        try:
            deadline = time.monotonic() + 30
            while not Path(f"{said}.ready").exists():
                assert time.monotonic() < deadline, "the worker did not get ready"
                await asyncio.sleep(0.01)
            assert handle.signal_main(signal.SIGUSR1)
            assert await asyncio.wait_for(handle.wait(), 30) == 0
            return said.read_text(), handle.signal_main(signal.SIGUSR1), main_thread_kill(handle.pid, 0)
        finally:
            handle.close()

    return asyncio.run(scenario())


def test_signal_main_reaches_the_main_thread_alone_and_nothing_once_reaped(tmp_path: Path) -> None:
    assert _where_it_went(tmp_path) == ("main", False, False)  # reaped, and no such thread any more


def test_without_tgkill_signal_main_signals_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawn, "_tgkill", lambda: None)  # a libc before glibc 2.30
    assert _where_it_went(tmp_path) == ("elsewhere", False, None)
