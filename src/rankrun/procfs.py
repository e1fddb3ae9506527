"""What Linux's /proc says of a process, read in one place: its ``stat`` fields and its direct children.

Used by the stack sampler (a worker's state and CPU time, its children) and by the launcher's reaping (who is a
zombie, who leads a session, who is its child). No psutil: the launcher core is the standard library only.
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


def children(pid: int | str) -> list[int]:
    """The process's direct children, from each of its threads' ``children`` list (no walk of all of /proc)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                found.update(int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return sorted(found)
