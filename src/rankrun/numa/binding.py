"""Which CPUs each local rank is bound to under ``--numa-binding``: a pure function of the machine's layout.

The rules are torch 2.13's (``torch/numa/binding.py``), rank by rank: local rank *i* uses the *i*-th visible GPU;
that GPU's NUMA node is the ``numa_node`` of its PCI device, where -1 (a machine that does not say, often one with a
single node) means node 0; a node's CPUs are its ``cpulist`` less those the launcher itself may not use.

- ``node``: every CPU of the GPU's node.
- ``socket``: every CPU of every node on the socket (``physical_package_id`` of the node's lowest CPU) of the GPU's
  node.
- ``exclusive``: the node's physical cores (CPUs that are hyper-thread siblings count once), split in order between
  the visible GPUs on that node, the lowest GPUs taking one more core each when they do not divide evenly; fewer cores
  than GPUs is an error.
- ``core-complex``: the node's CPUs grouped by the largest cache they share (the L3 on today's x86), largest group
  first (then lowest CPU); the *k*-th GPU of the node gets group *k* modulo the number of groups.

One difference: torch fails on a node without CPUs it may use (a memory-only node, such as a GH200's GPU memory)
when it looks for the nodes of a socket; here such a node belongs to no socket and is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rankrun.ranges import range_string as ranges  # CPU lists in Cpus_allowed_list's form
from rankrun.record import record

MODES = ("node", "socket", "exclusive", "core-complex")


class BindingError(ValueError):
    """The layout cannot give a rank the CPUs its mode asks for; the message says why, in one line."""


@record
class Topology:
    """The parts of the machine's layout the modes read (``rankrun.numa.topology`` reads them from sysfs)."""

    nodes: Mapping[int, frozenset[int]]  # NUMA node → its CPUs (the node's cpulist)
    gpu_nodes: tuple[int, ...]  # each visible GPU's numa_node as sysfs gives it (-1 kept), in CUDA's order
    sockets: Mapping[int, int]  # CPU → its physical_package_id (socket)
    cores: Mapping[int, int]  # CPU → the lowest CPU of its physical core (thread_siblings_list)
    caches: Mapping[int, int]  # CPU → the lowest CPU sharing its largest cache (core-complex)


def gpu_node(topology: Topology, gpu: int) -> int:
    """The NUMA node of GPU ``gpu``: -1 (the machine does not say) is node 0, as torch takes it."""
    return max(topology.gpu_nodes[gpu], 0)


def plan(mode: str, topology: Topology, nproc: int, allowed: frozenset[int]) -> tuple[frozenset[int], ...]:
    """The CPUs of each local rank 0..nproc-1 (rank *i* on GPU *i*); ``allowed``: the CPUs the launcher may use."""
    visible = len(topology.gpu_nodes)
    if nproc > visible:
        raise BindingError(f"local rank {visible} has no GPU: {nproc} processes per node, {visible} GPU(s) visible"
                           " (each local rank is bound near the GPU of its number)")
    return tuple(cpus_for(mode, topology, gpu, allowed) for gpu in range(nproc))


def cpus_for(mode: str, topology: Topology, gpu: int, allowed: frozenset[int]) -> frozenset[int]:
    """The CPUs the worker of GPU ``gpu`` is bound to under ``mode``; never empty (``BindingError`` instead)."""
    node = gpu_node(topology, gpu)
    if mode == "node":
        return _node_cpus(topology, node, allowed, need=True)
    if mode == "socket":
        return _socket_cpus(topology, node, allowed)
    if mode == "exclusive":
        return _exclusive_cpus(topology, node, gpu, allowed)
    if mode == "core-complex":
        return _core_complex_cpus(topology, node, gpu, allowed)
    raise BindingError(f"unknown mode: expected one of {', '.join(MODES)}")


def _node_cpus(topology: Topology, node: int, allowed: frozenset[int], *, need: bool) -> frozenset[int]:
    """The node's CPUs the launcher may use; with ``need``, an error when there are none."""
    if node not in topology.nodes:
        raise BindingError(f"NUMA node {node} (a GPU's) is not among the machine's nodes ({_list(topology.nodes)})")
    cpus = topology.nodes[node] & allowed
    if need and not cpus:
        listed = ranges(topology.nodes[node]) or "none"
        raise BindingError(f"NUMA node {node} (a GPU's) has no CPU rankrun may use (its CPUs: {listed}; "
                           f"rankrun's: {ranges(allowed)})")
    return cpus


def _socket_cpus(topology: Topology, node: int, allowed: frozenset[int]) -> frozenset[int]:
    socket = topology.sockets[min(_node_cpus(topology, node, allowed, need=True))]
    cpus: set[int] = set()
    for other in sorted(topology.nodes):
        other_cpus = _node_cpus(topology, other, allowed, need=False)
        if other_cpus and topology.sockets[min(other_cpus)] == socket:
            cpus |= other_cpus
    return frozenset(cpus)


def _peers(topology: Topology, node: int) -> list[int]:
    """The visible GPUs on ``node``, in order."""
    return [g for g in range(len(topology.gpu_nodes)) if gpu_node(topology, g) == node]


def _exclusive_cpus(topology: Topology, node: int, gpu: int, allowed: frozenset[int]) -> frozenset[int]:
    peers = _peers(topology, node)
    cores = _group(_node_cpus(topology, node, allowed, need=True), topology.cores)
    ordered = [cores[key] for key in sorted(cores)]
    each, extra = divmod(len(ordered), len(peers))
    if each < 1:
        raise BindingError(f"NUMA node {node} has {len(ordered)} physical core(s) rankrun may use for its "
                           f"{len(peers)} GPUs: exclusive needs one core per GPU at least")
    index = peers.index(gpu)
    start = index * each + min(index, extra)
    end = start + each + (1 if index < extra else 0)
    return frozenset(cpu for core in ordered[start:end] for cpu in core)


def _core_complex_cpus(topology: Topology, node: int, gpu: int, allowed: frozenset[int]) -> frozenset[int]:
    peers = _peers(topology, node)
    groups = _group(_node_cpus(topology, node, allowed, need=True), topology.caches)
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    return ordered[peers.index(gpu) % len(ordered)][1]


def _group(cpus: Iterable[int], key: Mapping[int, int]) -> dict[int, frozenset[int]]:
    groups: dict[int, set[int]] = {}
    for cpu in cpus:
        groups.setdefault(key[cpu], set()).add(cpu)
    return {k: frozenset(v) for k, v in groups.items()}


def _list(nodes: Iterable[int]) -> str:
    return ", ".join(str(n) for n in sorted(nodes)) or "none"


def parse_ranges(text: str) -> frozenset[int]:
    """A sysfs CPU list (``0-3,8,10-11``) as a set; an empty list is an empty set."""
    cpus: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


