"""Private temporary directories left behind by a launcher that died with its watchdog: an owner stamp, and a sweep.

The watchdog removes the launcher's private directory (``rankrun_<run>_<random>`` in ``$TMPDIR``) when the
launcher is killed (``proc.watchdog``). A SIGKILL to every process of a cgroup kills the watchdog with it
(``scancel`` past Slurm's ``KillWait``, ``docker kill``, systemd's control-group kill, a pod past its grace
period: the watchdog's ``setsid`` takes it out of the launcher's session, not out of its cgroup), and the directory
stays. So:

- each private directory the launcher would remove at its end gets an owner stamp, ``<dir>/.owner`` =
  ``"<pid> <starttime> <boot_id> <pidns>\\n"`` (``stamp``): the launcher's pid and start time (``/proc`` stat
  field 22), which name one process of one boot, the boot's id, and the pid namespace the pid belongs to;
- each launch that makes a private directory first removes (``sweep``) the ``rankrun_*`` directories of the temp
  root that belong to this user and whose stamp names a process of this boot and this pid namespace that is not
  alive any more (``judge``).

Left alone: a directory of another user, without a stamp (an older rankrun; one kept on purpose: ``-r``/``-t``, or
Flight Recorder dumps, whose stamp goes at the end), with a stamp it cannot read (a partial write has no final
newline), from another boot or another pid namespace (a container sharing ``/tmp``: its pids are not ours to look
up), or whose owner still runs. The sweep costs one ``listdir`` of the temp root, and never fails a launch: any
error while reading or removing (another launcher removing the same directory first, a permission) leaves that
directory as it is.
"""

from __future__ import annotations

import contextlib
import enum
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from rankrun import procfs
from rankrun.fsutil import remove_tree

PREFIX = "rankrun_"  # every private directory's name starts so: rankrun_<run id>_<random>
STAMP = ".owner"
_STAMP_MAX = 256  # bytes read of a stamp: ours are under 100
_STAMP_TEXT = re.compile(r"([1-9][0-9]*) ([0-9]+) (\S+) (\S+)\n")


@dataclass(frozen=True)
class Owner:
    """One process of one boot, in one pid namespace: who made a private directory (or who is looking)."""

    pid: int
    starttime: int  # clock ticks since boot (/proc/<pid>/stat field 22)
    boot_id: str
    pidns: str  # "pid:[<inode>]", as /proc/self/ns/pid reads


class Verdict(enum.Enum):
    """What a stamp says of its directory, seen from another launch."""

    DEAD = "dead"  # its owner is gone: the only verdict that removes it
    ALIVE = "alive"
    OTHER_BOOT = "other boot"
    OTHER_PIDNS = "other pid namespace"
    UNPARSABLE = "unparsable"


def stamp_text(owner: Owner) -> str:
    """The stamp's content (pure). The final newline tells a whole stamp from one read while it was written."""
    return f"{owner.pid} {owner.starttime} {owner.boot_id} {owner.pidns}\n"


def parse_stamp(text: str) -> Owner | None:
    """The owner a stamp names, or None when it is not one whole stamp (pure)."""
    match = _STAMP_TEXT.fullmatch(text)
    if match is None:
        return None
    pid, starttime, boot_id, pidns = match.groups()
    return Owner(int(pid), int(starttime), boot_id, pidns)


def judge(owner: Owner | None, me: Owner, starttime_now: int | None) -> Verdict:
    """Whether a directory stamped by ``owner`` is a dead launcher's, seen by the launch ``me`` (pure).
    ``starttime_now``: the start time of the process that has ``owner.pid`` in ``me``'s ``/proc`` now (None:
    none has). Another boot's or pid namespace's pid says nothing of the process that has it here."""
    if owner is None:
        return Verdict.UNPARSABLE
    if owner.boot_id != me.boot_id:
        return Verdict.OTHER_BOOT
    if owner.pidns != me.pidns:
        return Verdict.OTHER_PIDNS
    return Verdict.ALIVE if starttime_now == owner.starttime else Verdict.DEAD


def here() -> Owner | None:
    """This process as a stamp names it, or None when ``/proc`` cannot say (then nothing is stamped nor swept)."""
    pid = os.getpid()
    starttime, boot_id, pidns = procfs.starttime(pid), procfs.boot_id(), procfs.pid_namespace()
    if starttime is None or boot_id is None or pidns is None:
        return None
    return Owner(pid, starttime, boot_id, pidns)


def stamp(directory: Path, owner: Owner) -> None:
    """Write ``directory``'s owner stamp. A stamp that cannot be written leaves the directory unstamped: as an older
    rankrun's, never swept, and the launch goes on."""
    with contextlib.suppress(OSError):
        (directory / STAMP).write_text(stamp_text(owner))


def unstamp(directory: Path) -> None:
    """The directory is kept on purpose now: no later launch may sweep it."""
    with contextlib.suppress(OSError):
        (directory / STAMP).unlink()


def sweep(root: Path, me: Owner, uid: int) -> list[Path]:
    """Remove the dead launchers' private directories under ``root`` (see the module's docstring); returns those
    removed."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    removed = []
    for name in names:
        path = root / name
        if name.startswith(PREFIX) and _verdict(path, me, uid) is Verdict.DEAD:
            try:  # another launcher removing it too: whatever is missing is fine already
                remove_tree(path)
            except OSError:  # e.g. a permission on the way: the launch goes on, that directory stays
                continue
            removed.append(path)
    return removed


def _verdict(path: Path, me: Owner, uid: int) -> Verdict | None:
    """The verdict on one entry: None when it is not a directory of ``uid``'s (a plain file, a symlink, another
    user's) or its stamp cannot be read."""
    try:
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
            return None
        owner = parse_stamp(_read_stamp(path / STAMP))
    except (OSError, UnicodeDecodeError):
        return None
    return judge(owner, me, None if owner is None else procfs.starttime(owner.pid))


def _read_stamp(path: Path) -> str:
    """A stamp's first bytes. Not following a symlink, not waiting on a FIFO: the directory is this user's, but
    whatever sits there is read by every later launch."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        return os.read(fd, _STAMP_MAX).decode("ascii")
    finally:
        os.close(fd)
