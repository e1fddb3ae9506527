"""Orphans re-parented to the launcher (a subreaper, or PID 1 of a container) are reaped as they exit, on real
processes: the children of this test process stand in for them. No root needed (the PID-namespace runs are in
``test_pid1.py``)."""

from __future__ import annotations

import asyncio
import subprocess
import time

from rankrun import procfs
from rankrun.proc.watchdog import reap_on_sigchld, reap_strays

BOUND = 30.0


def _zombie(*, own_session: bool) -> subprocess.Popen[bytes]:
    """A child that has exited and is not reaped yet (Popen reaps only when asked)."""
    child = subprocess.Popen(["true"], start_new_session=own_session)
    deadline = time.monotonic() + BOUND
    while (procfs.stat(child.pid) or ["?"])[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.005)  # no event says a child became a zombie without reaping it
    return child


def test_a_zombie_leading_its_own_session_waits_while_a_spawn_is_under_way():
    """Every worker leads its own session: such a zombie may be a worker the spawner has not recorded yet, whose
    reaping belongs to the event loop's child watcher; an orphan in a worker's session is reaped at once."""
    leader, orphan = _zombie(own_session=True), _zombie(own_session=False)
    others = set(procfs.children("self")) - {leader.pid, orphan.pid}  # this test process's other children
    reaped, later = reap_strays(others, spawning=True)
    assert (reaped, later) == ([orphan.pid], True)
    reaped, later = reap_strays(others, spawning=False)
    assert (reaped, later) == ([leader.pid], False)
    for child in (leader, orphan):
        child.wait(timeout=BOUND)  # already reaped: Popen takes ECHILD as gone


def test_an_orphan_left_for_later_while_workers_start_is_reaped_once_they_have_started():
    """An orphan leading its own session exits while a spawn is under way: left for later, it must be looked at
    again shortly (no further SIGCHLD may ever come), and reaped once no spawn is under way."""
    others = set(procfs.children("self"))  # this test process's other children: not orphans
    looks: list[bool] = []

    children: list[subprocess.Popen[bytes]] = []

    async def main() -> None:
        looked = asyncio.Event()

        def spawning() -> bool:
            looks.append(len(looks) == 0)  # a spawn under way at the first look only
            looked.set()
            return looks[-1]

        stop = reap_on_sigchld(lambda: others, spawning)
        try:
            children.append(subprocess.Popen(["true"], start_new_session=True))  # its exit is the SIGCHLD
            async with asyncio.timeout(BOUND):
                while len(looks) < 2:  # the look at SIGCHLD, then the one after STRAY_RETRY
                    looked.clear()
                    await looked.wait()
        finally:
            stop()

    try:
        asyncio.run(main())
        assert looks[:2] == [True, False]
        assert procfs.stat(children[0].pid) is None  # reaped by the second look: no zombie left
    finally:
        for child in children:
            child.wait(timeout=BOUND)  # reaps it if the watch did not (Popen takes ECHILD as gone)
