"""Read the machine's layout for ``--numa-binding`` from sysfs: reads only, under one root directory.

The root is ``/`` on a real run; tests (and ``RANKRUN_SYSFS_ROOT``, see ``rankrun.cli``) give a folder holding a
fake ``sys/`` (and ``proc/driver/nvidia/gpus``) instead. What is read, each only when the mode needs it:

- ``sys/bus/pci/devices/<address>/numa_node``: each visible GPU's NUMA node;
- ``sys/devices/system/node/node<N>/cpulist``: each node's CPUs;
- ``sys/devices/system/cpu/cpu<N>/topology/physical_package_id`` (``socket``), ``.../thread_siblings_list``
  (``exclusive``), ``.../cache/index<K>/{type,level,shared_cpu_list}`` (``core-complex``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from rankrun.devices import Gpu
from rankrun.numa.binding import BindingError, Topology, gpu_node, parse_ranges

_NODE = re.compile(r"node(\d+)")
_INDEX = re.compile(r"index\d+")


def read_topology(root: Path, mode: str, gpus: Sequence[Gpu], allowed: frozenset[int]) -> Topology:
    """What ``rankrun.numa.binding`` needs under ``mode`` for ``gpus`` (the visible ones, in order); ``allowed``:
    the launcher's CPUs (only theirs are looked up). ``BindingError`` names a file that cannot be read."""
    sys_dir = root / "sys"
    gpu_nodes = tuple(_int(sys_dir / "bus/pci/devices" / gpu.address / "numa_node", f"GPU {i}'s NUMA node")
                      for i, gpu in enumerate(gpus))
    nodes = _nodes(sys_dir / "devices/system/node")
    cpu_dir = sys_dir / "devices/system/cpu"
    topology = Topology(nodes, gpu_nodes, {}, {}, {})
    gpu_cpus = sorted({cpu for g in range(len(gpus)) for cpu in nodes.get(gpu_node(topology, g), frozenset()) & allowed})
    sockets, cores, caches = {}, {}, {}
    if mode == "socket":
        lowest = (min(cpus & allowed) for cpus in nodes.values() if cpus & allowed)
        sockets = {cpu: _int(cpu_dir / f"cpu{cpu}/topology/physical_package_id", f"CPU {cpu}'s socket")
                   for cpu in lowest}
    if mode == "exclusive":
        cores = {cpu: min(_cpus(cpu_dir / f"cpu{cpu}/topology/thread_siblings_list", cpu)) for cpu in gpu_cpus}
    if mode == "core-complex":
        caches = {cpu: min(_largest_cache(cpu_dir / f"cpu{cpu}/cache", cpu)) for cpu in gpu_cpus}
    return Topology(nodes, gpu_nodes, sockets, cores, caches)


def _nodes(folder: Path) -> dict[int, frozenset[int]]:
    try:
        names = os.listdir(folder)
    except OSError:
        return {}  # a kernel without NUMA: no node at all, which binding reports
    return {int(match.group(1)): _ranges(folder / name / "cpulist")
            for name in names if (match := _NODE.fullmatch(name))}


def _largest_cache(folder: Path, cpu: int) -> frozenset[int]:
    """The CPUs sharing ``cpu``'s highest-level data or unified cache (the L3 on today's x86), as torch picks it."""
    level, shared = -1, frozenset[int]()
    try:
        names = sorted(name for name in os.listdir(folder) if _INDEX.fullmatch(name))
    except OSError as exc:
        raise BindingError(f"cannot read {folder}: {exc.strerror}") from None
    for name in names:
        if _text(folder / name / "type").strip() not in ("Unified", "Data"):
            continue
        this = _int(folder / name / "level", f"CPU {cpu}'s cache level")
        if this > level:
            level, shared = this, _cpus(folder / name / "shared_cpu_list", cpu)
    if not shared:
        raise BindingError(f"{folder} lists no data cache for CPU {cpu}: core-complex cannot group it")
    return shared


def _cpus(path: Path, cpu: int) -> frozenset[int]:
    return _ranges(path) | {cpu}  # a CPU shares its core and caches with itself, whatever an odd file says


def _ranges(path: Path) -> frozenset[int]:
    text = _text(path)
    try:
        return parse_ranges(text)
    except ValueError:
        raise BindingError(f"{path} holds {text.strip()!r}, not a CPU list") from None


def _int(path: Path, what: str) -> int:
    text = _text(path)
    try:
        return int(text.strip())
    except ValueError:
        raise BindingError(f"{path} ({what}) holds {text.strip()!r}, not a number") from None


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise BindingError(f"cannot read {path}: {exc.strerror}") from None
