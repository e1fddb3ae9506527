"""Room for kept memory on this node: does a kept state that grows by so many bytes still fit (``fits``, pure), and
the facts it is judged on (``read_room``: ``/proc/meminfo`` and the memory cgroup, thin readers over two roots).

The checkpoint keeper asks it before it reserves a slot's memory, and ``python -m rankrun.health --checkpoint-room``
asks it the same question before a job: one rule, so the check and the save agree. It must be asked first because
kept memory is shared memory charged to the keeper's cgroup: past the cgroup's limit the kernel reclaims, then its
OOM killer picks the biggest task (a rank), and a page touched through a mapping with no room behind it is a SIGBUS.
Neither may be what a save costs.

The room is the smaller of the machine's ``MemAvailable`` and, for each memory cgroup from this process's up to the
mount's root, its limit less its usage (v2 ``memory.max``/``memory.current``, v1 ``memory.limit_in_bytes``/
``memory.usage_in_bytes``; the cgroup named by ``/proc/self/cgroup``). The usage counts what the kernel would not
give back: the inactive file cache (``memory.stat``) is taken off it, as the kubelet's working set does, because the
kernel drops that cache before it counts the cgroup full. Less a margin that stays free (``MARGIN_*``).

Standard library and light: ``python -m rankrun.health`` imports it at start, without ``dataclasses``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

# what stays free whatever is kept: the workers grow after a save (activations, the optimizer's first step, a
# DataLoader's prefetch, the allocator's caches) and the kept state must never be what pushes them into the OOM
# killer. A tenth of the memory the job may use, and at least 1 GiB on a small node.
MARGIN_FRACTION = 0.10
MARGIN_FLOOR = 1 << 30

# cgroup v1 says "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB pages): anything this large is
# no limit (2^60 bytes is an exabyte)
UNLIMITED = 1 << 60

# RANKRUN_MEMROOM_ROOT: a directory holding proc/ and sys/fs/cgroup/ copies, read instead of the real ones (a test
# hands a launcher it starts a node of the size it wants)
ROOT_ENV = "RANKRUN_MEMROOM_ROOT"

_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


class Cgroup(NamedTuple):
    """The memory cgroup whose room is the tightest: its limit file's name, its limit and its usage, in bytes."""

    name: str  # "memory.max" (v2) | "memory.limit_in_bytes" (v1)
    limit: int
    used: int  # the usage less the inactive file cache


class Room(NamedTuple):
    """What the room on this node is judged by, in bytes."""

    total: int  # MemTotal
    available: int  # MemAvailable
    cgroup: Cgroup | None  # None: no memory cgroup limits this process


def format_size(size: int) -> str:
    """Bytes as a person reads them, binary as ``free -h`` prints them: ``1.5 GiB``, ``512 B``."""
    for unit, name in _UNITS:
        if size >= unit:
            return f"{size / unit:.1f} {name}"
    return f"{size} B"


def margin(facts: Room) -> int:
    """The bytes that stay free (``MARGIN_FRACTION`` of the memory the job may use, at least ``MARGIN_FLOOR``)."""
    ceiling = facts.total if facts.cgroup is None else min(facts.total, facts.cgroup.limit)
    return max(MARGIN_FLOOR, int(ceiling * MARGIN_FRACTION))


def room(facts: Room) -> int:
    """The bytes this node can still take (before the margin): the smaller of MemAvailable and the cgroup's room."""
    if facts.cgroup is None:
        return facts.available
    return min(facts.available, facts.cgroup.limit - facts.cgroup.used)


def fits(facts: Room, growth: int) -> str | None:
    """None when ``growth`` more bytes fit in ``facts``' room with the margin left free (nothing, or less, always
    fits); else why not, one phrase: ``this node has 1.1 GiB of room (cgroup memory.max 64.0 GiB, 58.7 GiB used;
    6.4 GiB stays free for the workers' own growth)``."""
    free, keep = room(facts), margin(facts)
    if growth <= 0 or growth <= free - keep:
        return None
    if facts.cgroup is not None and free < facts.available:
        source = f"cgroup {facts.cgroup.name} {format_size(facts.cgroup.limit)}, {format_size(facts.cgroup.used)} used"
    else:
        source = f"MemAvailable, MemTotal {format_size(facts.total)}"
    return (f"this node has {format_size(max(free, 0))} of room ({source}; {format_size(keep)} stays free for the "
            "workers' own growth)")


def read_here(env: Mapping[str, str] | None = None) -> Room:
    """The room of this node, or of the copies under ``env``'s (default: this process's environment) ROOT_ENV."""
    base = (os.environ if env is None else env).get(ROOT_ENV)
    if not base:
        return read_room()
    return read_room(Path(base, "proc"), Path(base, "sys/fs/cgroup"))


def read_room(proc_root: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> Room:
    """The facts from ``proc_root``'s ``meminfo`` and ``self/cgroup`` and the cgroup files under ``cgroup_root``.
    An unreadable ``meminfo`` is an ``OSError``; a cgroup that cannot be read limits nothing (no cgroup mounted)."""
    total, available = meminfo((proc_root / "meminfo").read_text())
    try:
        found = memory_cgroup((proc_root / "self" / "cgroup").read_text())
    except OSError:
        found = None
    cgroup = None if found is None else tightest(_levels(cgroup_root, *found))
    return Room(total, available, cgroup)


def meminfo(text: str) -> tuple[int, int]:
    """``/proc/meminfo``'s MemTotal and MemAvailable in bytes (pure); a kernel without MemAvailable (before 3.14):
    MemFree. A text without them is a ``ValueError``."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("MemTotal", "MemAvailable", "MemFree"):
            number, *unit = value.split()
            fields[key] = int(number) * (1024 if unit == ["kB"] else 1)
    available = fields.get("MemAvailable", fields.get("MemFree"))
    if "MemTotal" not in fields or available is None:
        raise ValueError(f"/proc/meminfo says no {'MemTotal' if 'MemTotal' not in fields else 'MemAvailable'}")
    return fields["MemTotal"], available


def memory_cgroup(text: str) -> tuple[int, str] | None:
    """From ``/proc/self/cgroup`` (pure): the memory controller's hierarchy, 1 or 2, and this process's path in it;
    None when neither has it. A v1 line naming ``memory`` wins over the v2 line: on a hybrid system the controller
    is on v1 and the unified hierarchy has no memory files."""
    unified = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            return 1, path
        if hierarchy == "0" and controllers == "":
            unified = 2, path
    return unified


def tightest(levels: Iterator[Cgroup]) -> Cgroup | None:
    """The level with the least room (limit less usage); None when no level has a limit."""
    return min(levels, key=lambda level: level.limit - level.used, default=None)


def _levels(cgroup_root: Path, version: int, path: str) -> Iterator[Cgroup]:
    """Each limited level from this process's cgroup up to the mount's root. Levels missing from the mount are passed
    over: where the process's cgroup is not under ``cgroup_root`` (a container's own cgroup mounted as the root,
    without a cgroup namespace), the mount's root is the container's cgroup and is read."""
    base = cgroup_root / "memory" if version == 1 else cgroup_root
    limit_file, usage_file, inactive = (("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
                                        if version == 1 else ("memory.max", "memory.current", "inactive_file"))
    parts = [part for part in path.split("/") if part]
    for depth in range(len(parts), -1, -1):
        folder = base.joinpath(*parts[:depth])
        try:
            limit = int((folder / limit_file).read_text())
            usage = int((folder / usage_file).read_text())
        except (OSError, ValueError):  # v2's "max" is no number: no limit at this level, as no file is
            continue  # not this deep in the mount, or the root cgroup (v2 has no memory.max there)
        if limit < UNLIMITED:
            yield Cgroup(limit_file, limit, max(usage - _stat(folder / "memory.stat", inactive), 0))


def _stat(path: Path, key: str) -> int:
    """One counter of a cgroup's ``memory.stat`` (0 when it cannot be read)."""
    try:
        text = path.read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0
