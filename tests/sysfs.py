"""Fake machine layouts as ``--numa-binding`` reads them: the ``sys/`` and ``proc/driver/nvidia/gpus`` files under
a test's folder (the root ``rankrun.numa.topology`` reads from; ``RANKRUN_SYSFS_ROOT`` for a whole launcher); and a
node's memory as ``rankrun.memroom`` reads it (``FakeMemory``: ``proc/meminfo``, ``proc/self/cgroup`` and the memory
cgroup's files; ``RANKRUN_MEMROOM_ROOT`` for a whole launcher or health check)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rankrun.numa.binding import parse_ranges, ranges


@dataclass
class FakeGpu:
    address: str  # 0000:1b:00.0
    numa_node: int  # as sysfs says it: -1 for "does not say"
    uuid: str = ""


@dataclass
class FakeMachine:
    nodes: Mapping[int, str]  # node → its cpulist ("" for a memory-only node)
    gpus: Sequence[FakeGpu]
    sockets: Mapping[int, int] = field(default_factory=dict)  # CPU → package; missing: 0
    siblings: Sequence[str] = ()  # hyper-thread sibling lists ("0,16"); a CPU in none is its own core
    l3: Sequence[str] = ()  # CPU lists sharing one L3; a CPU in none has its own

    def write(self, root: Path) -> Path:
        """Lay the files out under ``root`` (created); returns ``root``."""
        node_dir = root / "sys/devices/system/node"
        for node, cpulist in self.nodes.items():
            _put(node_dir / f"node{node}" / "cpulist", cpulist + "\n")
        _put(node_dir / "possible", ranges(self.nodes) + "\n")
        every = sorted(cpu for cpulist in self.nodes.values() for cpu in parse_ranges(cpulist))
        sibling_of = {cpu: group for group in self.siblings for cpu in parse_ranges(group)}
        l3_of = {cpu: group for group in self.l3 for cpu in parse_ranges(group)}
        for cpu in every:
            cpu_dir = root / f"sys/devices/system/cpu/cpu{cpu}"
            _put(cpu_dir / "topology/physical_package_id", f"{self.sockets.get(cpu, 0)}\n")
            _put(cpu_dir / "topology/thread_siblings_list", sibling_of.get(cpu, str(cpu)) + "\n")
            # torch's pick is the highest-level data or unified cache: an instruction cache of a higher level
            # (made up) must be passed over, and L1d/L2 are lower than the L3
            caches = [("Data", 1, str(cpu)), ("Instruction", 1, str(cpu)), ("Unified", 2, sibling_of.get(cpu, str(cpu))),
                      ("Unified", 3, l3_of.get(cpu, str(cpu))), ("Instruction", 4, ranges(every))]
            for index, (kind, level, shared) in enumerate(caches):
                _put(cpu_dir / f"cache/index{index}/type", kind + "\n")
                _put(cpu_dir / f"cache/index{index}/level", f"{level}\n")
                _put(cpu_dir / f"cache/index{index}/shared_cpu_list", shared + "\n")
        for gpu in self.gpus:
            _put(root / "sys/bus/pci/devices" / gpu.address / "numa_node", f"{gpu.numa_node}\n")
            info = f"Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t {gpu.uuid}\nBus Location: \t {gpu.address}\n"
            _put(root / "proc/driver/nvidia/gpus" / gpu.address / "information", info)
        (root / "sys").mkdir(parents=True, exist_ok=True)
        return root


def _put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def two_sockets(gpu_nodes: Sequence[int] = (0, 0, 2, 3)) -> FakeMachine:
    """2 sockets x 2 NUMA nodes, 16 cores with two threads each (CPU c and c+16), two L3s of two cores per node;
    one GPU per entry of ``gpu_nodes`` (its numa_node), in PCI order."""
    nodes = {n: f"{4 * n}-{4 * n + 3},{16 + 4 * n}-{16 + 4 * n + 3}" for n in range(4)}
    sockets = {cpu: (cpu % 16) // 8 for cpu in range(32)}
    siblings = [f"{c},{c + 16}" for c in range(16)]
    l3 = [f"{c}-{c + 1},{c + 16}-{c + 17}" for c in range(0, 16, 2)]
    addresses = ["0000:1b:00.0", "0000:3b:00.0", "0000:8b:00.0", "0000:bb:00.0", "0000:cb:00.0", "0000:db:00.0"]
    gpus = [FakeGpu(addresses[i], node, f"GPU-{i}{i}{i}{i}aaaa-0000") for i, node in enumerate(gpu_nodes)]
    return FakeMachine(nodes, gpus, sockets, siblings, l3)


def this_machine_split() -> FakeMachine:
    """Two NUMA nodes made of the CPUs this process may use (the lowest one; the others), a GPU on each: a launcher
    can bind its workers to them for real. With a single CPU both nodes are that CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    first, rest = cpus[:1], cpus[1:] or cpus[:1]
    return FakeMachine({0: ranges(first), 1: ranges(rest)}, [FakeGpu("0000:1b:00.0", 0), FakeGpu("0000:3b:00.0", 1)])


@dataclass
class FakeLevel:
    """One memory cgroup's files: ``limit`` None is no limit (v2 ``max``, v1 PAGE_COUNTER_MAX pages)."""

    limit: int | None
    usage: int
    inactive_file: int = 0


V1_NO_LIMIT = 9223372036854771712  # what cgroup v1 says for no limit, with 4 KiB pages


@dataclass
class FakeMemory:
    total: int  # bytes; written in kB as the kernel does
    available: int
    version: int | None = 2  # the memory controller's hierarchy; None: no memory cgroup in /proc/self/cgroup
    path: str = "/"  # this process's cgroup, as /proc/self/cgroup names it
    levels: Mapping[str, FakeLevel] = field(default_factory=dict)  # a cgroup's path under the mount → its files

    def write(self, root: Path) -> Path:
        """Lay ``proc/`` and ``sys/fs/cgroup/`` out under ``root`` (created); returns ``root``."""
        _put(root / "proc/meminfo", f"MemTotal:       {self.total // 1024} kB\nMemFree:        1024 kB\n"
                                    f"MemAvailable:   {self.available // 1024} kB\nBuffers:          512 kB\n")
        lines = {None: "0::/\n", 2: f"0::{self.path}\n",
                 1: f"12:pids:/\n4:memory:{self.path}\n3:cpu,cpuacct:/\n1:name=systemd:/\n0::/\n"}
        _put(root / "proc/self/cgroup", lines[self.version])
        mount = root / "sys/fs/cgroup" / ("memory" if self.version == 1 else "")
        names = (("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file") if self.version == 1
                 else ("memory.max", "memory.current", "inactive_file"))
        for path, level in self.levels.items():
            folder = mount / path.strip("/")
            no_limit = str(V1_NO_LIMIT) if self.version == 1 else "max"
            _put(folder / names[0], f"{no_limit if level.limit is None else level.limit}\n")
            _put(folder / names[1], f"{level.usage}\n")
            # v1's memory.stat has the cgroup's own inactive_file and the hierarchy's total_: the total counts
            local = "inactive_file 4096\n" if self.version == 1 else ""
            _put(folder / "memory.stat", f"anon 4096\n{local}{names[2]} {level.inactive_file}\nactive_file 0\n")
        mount.mkdir(parents=True, exist_ok=True)
        return root
