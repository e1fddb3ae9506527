"""What Linux's /proc says of a process, read in one place: its ``stat`` fields and its direct children.

Used by the stack sampler (a worker's state and CPU time, its children), by the launcher's reaping (who is a
zombie, who leads a session, who is its child) and by the owner stamps of its private temporary directories
(``logs.stale``: a process's start time, the boot, the pid namespace). No psutil: the launcher core is the standard
library only.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or None once the process is gone: ``[0]`` the
    state letter, ``[1]`` ppid, ``[2]`` process group, ``[3]`` session, ``[11]``/``[12]`` user/system CPU ticks.
    The name may hold spaces and parentheses, so the fields start after the last ``)``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def main_thread_stat(pid: int) -> list[str] | None:
    """``stat``'s fields for the process's main thread alone (``/proc/<pid>/task/<pid>/stat``): its own state and CPU
    ticks, where the process's ``stat`` counts every thread's CPU."""
    return stat(f"{pid}/task/{pid}")


def children(pid: int | str) -> list[int]:
    """The process's direct children, from each of its threads' ``children`` list (no walk of all of /proc)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                found.update(int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return sorted(found)


def starttime(pid: int | str) -> int | None:
    """When the process started, in clock ticks since boot (``stat`` field 22), or None once it is gone: with its pid,
    it names one process of this boot, a pid reused by a later process has another start time."""
    fields = stat(pid)
    return None if fields is None else int(fields[19])


def boot_id() -> str | None:
    """This boot's random id (a reboot gives another: a start time is ticks since *this* boot), or None unreadable."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def pid_namespace() -> str | None:
    """The caller's pid namespace (``pid:[<inode>]``), or None when this ``/proc`` does not show the caller under its
    own pid (a ``/proc`` mounted for another namespace: the pids it shows are not the caller's to judge)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
