"""What ``python -m rankrun.health`` checks, and the pure rules that read the answers.

Each ``*_probe`` function returns the failures it found (one message each, empty when healthy). They are run by
``rankrun.health.isolate`` (which also runs ``nvidia-smi`` for them), each in a process of its own, because any of
them may block for ever: ``nvidia-smi`` on a wedged driver, a listing or ``statvfs`` on a hung NFS mount.
"""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Mapping
from pathlib import Path

from rankrun.fsutil import which
from rankrun.health.isolate import run_program
from rankrun.memroom import fits, format_size, read_here

# K, M, G, T are binary (powers of 1024), as ``df -h``, ``ulimit`` and ``free -h`` print them
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGT]?)(?:I?B)?")

# the open-files rule: a floor for the launcher's own descriptors (its listening sockets, the rendezvous store's
# connections, the events and log files) plus, per local worker, what the launcher holds for it (stdout/stderr
# pipes, its pidfd, its log files, its store connections: ~8) with room for the limit the worker inherits (its
# collective's per-peer sockets, a DataLoader's shared-memory descriptors)
NOFILE_BASE = 64
NOFILE_PER_WORKER = 32

# ``nvidia-smi -q`` values that ask for nothing: no action pending, or a driver that cannot tell
_NO_ACTION = frozenset({"", "none", "n/a", "[n/a]", "not supported", "[not supported]", "gpu_recovery_action_none",
                        "nvml_gpu_recovery_action_none", "requested functionality has been deprecated"})
_GPU_LINE = re.compile(r"GPU \d+:")
_GPU_SECTION = re.compile(r"\s*GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*")


def parse_size(text: str) -> int:
    """``20G`` -> 21474836480: a number (``1.5`` allowed) with an optional K/M/G/T suffix, binary, ``B``/``iB``
    optional, any case. Raises ValueError for anything else (a sign, an unknown unit, nothing)."""
    match = _SIZE.fullmatch(text.strip().upper())
    if match is None:
        raise ValueError(f"not a size: {text!r}")
    return int(float(match[1]) * _UNITS[match[2]])


def nofile_needed(local_world_size: int) -> int:
    """The open-files limit a node running ``local_world_size`` workers needs (see ``NOFILE_BASE``)."""
    return NOFILE_BASE + NOFILE_PER_WORKER * local_world_size


def listed_gpus(text: str) -> int:
    """The GPUs in ``nvidia-smi -L``'s output: its ``GPU <i>: <name> (UUID: ...)`` lines (a MIG device's indented
    ``MIG ... Device <j>:`` lines under its GPU are not GPUs)."""
    return sum(1 for line in text.splitlines() if _GPU_LINE.match(line))


def pending_recovery(text: str) -> list[str]:
    """What ``nvidia-smi -q`` says must be done before a GPU is used again, one message per GPU and field.

    NVML's ``GPU Recovery Action`` (None, Reset, Reboot, Drain P2P, Drain and Reset: recent drivers) anything but
    None; and the older drivers' ``GPU Reset Status`` fields ``Reset Required`` and ``Drain and Reset Recommended``
    when ``Yes``. Each GPU's section starts with its ``GPU <bus id>`` line, which the message names."""
    found: list[str] = []
    gpu = "?"
    for line in text.splitlines():
        if section := _GPU_SECTION.fullmatch(line):
            gpu = section[1]
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "GPU Recovery Action" and value.lower() not in _NO_ACTION:
            found.append(f"GPU {gpu}: recovery action {value} (nvidia-smi -q)")
        elif key in ("Reset Required", "Drain and Reset Recommended") and value == "Yes":
            found.append(f"GPU {gpu}: {key.lower()} (nvidia-smi -q)")
    return found


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"


def gpus_probe(wanted: int, proc_root: Path, env: Mapping[str, str]) -> list[str]:
    """At least ``wanted`` GPUs visible: by ``nvidia-smi -L`` where it is on ``env``'s PATH, else by the driver's
    ``<proc_root>/driver/nvidia/gpus`` entries (one per GPU, named by its PCI address)."""
    if which("nvidia-smi", env) is not None:
        code, out = run_program(["nvidia-smi", "-L"], env)
        seen, source = listed_gpus(out), "nvidia-smi -L"
        if seen < wanted and code != 0:
            source = f"nvidia-smi -L exited {code}: {_last_line(out)}"
    else:
        driver = proc_root / "driver" / "nvidia" / "gpus"
        try:
            seen, source = len(os.listdir(driver)), str(driver)
        except FileNotFoundError:
            return [f"no NVIDIA driver: nvidia-smi is not on PATH and {driver} does not exist ({wanted} GPUs asked)"]
    if seen < wanted:
        return [f"{seen} GPU{'s' if seen != 1 else ''} visible ({source}), {wanted} asked"]
    return []


def gpu_recovery_probe(env: Mapping[str, str]) -> list[str]:
    """No GPU waiting for a reset or a reboot, by ``nvidia-smi -q`` (nothing to check where it is not on ``env``'s
    PATH)."""
    if which("nvidia-smi", env) is None:
        return []
    code, out = run_program(["nvidia-smi", "-q"], env)
    found = pending_recovery(out)
    if code != 0 and not found:
        return [f"nvidia-smi -q exited {code}: {_last_line(out)}"]
    return found


def path_probe(path: str) -> list[str]:
    """``path`` is a directory that can be listed. Its first entry is read, not all of them: enough to reach the
    server behind a mount, without walking a directory of a million files."""
    try:
        with os.scandir(path) as entries:
            next(entries, None)
    except OSError as err:
        return [err.strerror or str(err)]
    return []


def free_space_probe(path: str, wanted: int, *, optional: bool = False) -> list[str]:
    """At least ``wanted`` bytes free for an unprivileged user in the filesystem holding ``path`` (which need not
    exist when ``optional``: /dev/shm on a system without it)."""
    try:
        stats = os.statvfs(path)
    except FileNotFoundError:
        return [] if optional else [f"{path}: does not exist"]
    except OSError as err:
        return [f"{path}: {err.strerror or err}"]
    free = user_free(stats)
    if free < wanted:
        return [f"{path}: {format_size(free)} free, {format_size(wanted)} asked"]
    return []


def user_free(stats: os.statvfs_result) -> int:
    """Bytes an unprivileged user may still write (pure): the blocks available to it, not the blocks free, which count
    the ones reserved for root (5 % of an ext4 filesystem by default), and the job's user is rarely root."""
    return stats.f_bavail * stats.f_frsize


def nofile_probe(needed: int, why: str) -> list[str]:
    """The open-files soft limit (``ulimit -n``), which the launcher and its workers inherit, is at least
    ``needed``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return []
    ceiling = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return [f"open-files limit {soft} (ulimit -n; hard limit {ceiling}), this node needs {needed} ({why})"]


def checkpoint_room_probe(asked: int, env: Mapping[str, str]) -> list[str]:
    """Kept progress (``rankrun.checkpoint``) can take ``asked`` more bytes of this node's memory: the rule the
    keeper judges each save by (``rankrun.memroom.fits``), on the same facts (``env``'s ``RANKRUN_MEMROOM_ROOT``,
    else this machine's ``/proc`` and memory cgroup), so the check and the saves agree."""
    try:
        why = fits(read_here(env), asked)
    except OSError as err:
        return [f"{err.filename}: {err.strerror or err}"]
    except ValueError as err:
        return [str(err)]
    return [] if why is None else [f"{why}, {format_size(asked)} asked"]
