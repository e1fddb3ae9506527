"""``--numa-binding``: each mode's CPU sets on fake machine layouts (files under tmp_path, read as sysfs), torch's
rules for numa_node -1 and for ``exclusive``/``core-complex`` sharing, and the GPUs CUDA_VISIBLE_DEVICES leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankrun.cli import spec_from_args
from rankrun.devices import Gpu, driver_gpus, parse_smi_gpus, visible_gpus
from rankrun.errors import UsageError
from rankrun.numa.binding import BindingError, Topology, cpus_for, parse_ranges, plan, ranges
from rankrun.numa.topology import read_topology
from sysfs import FakeGpu, FakeMachine, this_machine_split, two_sockets

EVERY_CPU = frozenset(range(64))


def _plan(root: Path, mode: str, nproc: int, allowed: frozenset[int] = EVERY_CPU, visible: str | None = None) -> list[str]:
    """The whole lookup, as the CLI runs it: GPUs from proc, visible ones, the layout from sys, the decision."""
    gpus = visible_gpus(driver_gpus(root), visible)
    return [ranges(cpus) for cpus in plan(mode, read_topology(root, mode, gpus, allowed), nproc, allowed)]


# 2 sockets x 2 NUMA nodes (node n: cores 4n..4n+3 and their siblings +16; nodes 0-1 on socket 0, 2-3 on socket 1);
# 4 GPUs: two on node 0, one on node 2, one on node 3. Node 1 has none.
TWO_SOCKETS = [
    ("node", ["0-3,16-19", "0-3,16-19", "8-11,24-27", "12-15,28-31"]),
    ("socket", ["0-7,16-23", "0-7,16-23", "8-15,24-31", "8-15,24-31"]),
    # node 0's 4 cores split between its 2 GPUs, both threads of a core together; GPUs alone on a node get it all
    ("exclusive", ["0-1,16-17", "2-3,18-19", "8-11,24-27", "12-15,28-31"]),
    # node 0 has two L3s: one each; node 2's first L3 (both are the same size: the lower one)
    ("core-complex", ["0-1,16-17", "2-3,18-19", "8-9,24-25", "12-13,28-29"]),
]


@pytest.mark.parametrize(("mode", "expected"), TWO_SOCKETS, ids=[m for m, _ in TWO_SOCKETS])
def test_two_sockets_two_nodes_each_four_gpus(tmp_path, mode, expected):
    root = two_sockets().write(tmp_path)
    assert _plan(root, mode, 4) == expected


# numa_node -1 is node 0 (torch: "there is obviously at least one numa node, 0"): GPU 3 joins node 0's two GPUs.
MINUS_ONE = [
    ("node", ["0-3,16-19", "0-3,16-19", "8-11,24-27", "0-3,16-19"]),
    ("socket", ["0-7,16-23", "0-7,16-23", "8-15,24-31", "0-7,16-23"]),
    # 4 cores for 3 GPUs: one each, the lowest GPU takes the one left over
    ("exclusive", ["0-1,16-17", "2,18", "8-11,24-27", "3,19"]),
    # 2 L3s for 3 GPUs: the third starts again at the first
    ("core-complex", ["0-1,16-17", "2-3,18-19", "8-9,24-25", "0-1,16-17"]),
]


@pytest.mark.parametrize(("mode", "expected"), MINUS_ONE, ids=[m for m, _ in MINUS_ONE])
def test_a_gpu_whose_numa_node_is_minus_one_is_on_node_0(tmp_path, mode, expected):
    root = two_sockets((0, 0, 2, -1)).write(tmp_path)
    assert _plan(root, mode, 4) == expected


SINGLE_NODE = [("node", ["0-7", "0-7"]), ("socket", ["0-7", "0-7"]), ("exclusive", ["0-3", "4-7"]),
               ("core-complex", ["0-7", "0-7"])]


@pytest.mark.parametrize(("mode", "expected"), SINGLE_NODE, ids=[m for m, _ in SINGLE_NODE])
def test_one_node_that_does_not_say_no_hyperthreads(tmp_path, mode, expected):
    """A workstation: one node, every GPU's numa_node -1, one L3, no sibling threads."""
    machine = FakeMachine({0: "0-7"}, [FakeGpu("0000:01:00.0", -1), FakeGpu("0000:02:00.0", -1)], l3=["0-7"])
    assert _plan(machine.write(tmp_path), mode, 2) == expected


LIMITED = [
    ("node", ["1-3,17-19", "1-3,17-19"]),
    ("socket", ["1-7,17-23", "1-7,17-23"]),  # the socket of node 0's lowest CPU rankrun may use (1)
    ("exclusive", ["1-2,17-18", "3,19"]),  # 3 cores left on node 0 for its 2 GPUs
]


@pytest.mark.parametrize(("mode", "expected"), LIMITED, ids=[m for m, _ in LIMITED])
def test_only_the_cpus_the_launcher_may_use(tmp_path, mode, expected):
    """torch intersects each node with the launcher's own affinity (a job step given part of the machine)."""
    root = two_sockets().write(tmp_path)
    assert _plan(root, mode, 2, allowed=EVERY_CPU - {0, 16}) == expected


def test_core_complex_gives_the_largest_cache_group_first(tmp_path):
    """Where one L3 has more usable CPUs than another, the first GPU gets the bigger one (torch's order)."""
    machine = FakeMachine({0: "0-5"}, [FakeGpu("0000:01:00.0", 0), FakeGpu("0000:02:00.0", 0)], l3=["0-1", "2-5"])
    assert _plan(machine.write(tmp_path), "core-complex", 2) == ["2-5", "0-1"]


def test_exclusive_splits_between_the_visible_gpus_of_the_node_not_the_ranks(tmp_path):
    """As torch: one rank with both GPUs of node 0 visible gets half of it; with only GPU 1 visible, all of it."""
    root = two_sockets().write(tmp_path)
    assert _plan(root, "exclusive", 1) == ["0-1,16-17"]
    assert _plan(root, "exclusive", 1, visible="1") == ["0-3,16-19"]


def test_cuda_visible_devices_picks_and_orders_the_gpus(tmp_path):
    root = two_sockets().write(tmp_path)
    assert _plan(root, "node", 2, visible="3,2") == ["12-15,28-31", "8-11,24-27"]
    assert _plan(root, "node", 2, visible="GPU-3333,GPU-0000") == ["12-15,28-31", "0-3,16-19"]  # UUID prefixes


def test_a_memory_only_node_belongs_to_no_socket(tmp_path):
    """A node with no CPUs (a GH200's GPU memory) is skipped; torch fails on it (``min`` of nothing)."""
    machine = FakeMachine({0: "0-3", 1: "4-7", 2: ""}, [FakeGpu("0000:01:00.0", 0)], sockets={4: 1, 5: 1, 6: 1, 7: 1})
    assert _plan(machine.write(tmp_path), "socket", 1) == ["0-3"]


def test_socket_joins_only_the_nodes_of_the_same_package():
    topology = Topology({0: frozenset({0}), 1: frozenset({1}), 2: frozenset({2})}, (1,), {0: 0, 1: 5, 2: 5}, {}, {})
    assert cpus_for("socket", topology, 0, EVERY_CPU) == {1, 2}


@pytest.mark.parametrize(("machine", "mode", "nproc", "allowed", "message"), [
    (two_sockets(), "node", 5, EVERY_CPU, "local rank 4 has no GPU: 5 processes per node, 4 GPU(s) visible"),
    (two_sockets(), "node", 1, EVERY_CPU - parse_ranges("0-3,16-19"),
     "NUMA node 0 (a GPU's) has no CPU rankrun may use (its CPUs: 0-3,16-19; rankrun's: 4-15,20-63)"),
    (FakeMachine({0: "0-1"}, [FakeGpu(f"0000:0{i}:00.0", 0) for i in range(3)]), "exclusive", 3, EVERY_CPU,
     "NUMA node 0 has 2 physical core(s) rankrun may use for its 3 GPUs: exclusive needs one core per GPU at least"),
    (FakeMachine({0: "0-1"}, [FakeGpu("0000:01:00.0", 1)]), "node", 1, EVERY_CPU,
     "NUMA node 1 (a GPU's) is not among the machine's nodes (0)"),
], ids=["more-ranks-than-gpus", "node-not-ours", "fewer-cores-than-gpus", "unknown-node"])
def test_layouts_that_cannot_be_served(tmp_path, machine, mode, nproc, allowed, message):
    with pytest.raises(BindingError) as caught:
        _plan(machine.write(tmp_path), mode, nproc, allowed)
    assert str(caught.value).startswith(message)


def test_a_file_that_is_not_there_is_named(tmp_path):
    root = two_sockets().write(tmp_path)
    (root / "sys/bus/pci/devices/0000:3b:00.0/numa_node").unlink()
    with pytest.raises(BindingError, match=r"cannot read .*/sys/bus/pci/devices/0000:3b:00.0/numa_node: No such file"):
        _plan(root, "node", 2)


def test_the_driver_lists_gpus_by_pci_address_with_their_uuids(tmp_path):
    root = two_sockets((3, 0)).write(tmp_path)
    assert driver_gpus(root) == (Gpu("0000:1b:00.0", "GPU-0000aaaa-0000"), Gpu("0000:3b:00.0", "GPU-1111aaaa-0000"))
    assert driver_gpus(tmp_path / "nothing") == ()  # no driver, and nvidia-smi is asked only on the real root


def test_nvidia_smi_bus_ids_become_sysfs_addresses():
    text = "00000000:DB:00.0, GPU-b\n00000000:1B:00.0, GPU-a\nNo devices were found\n"
    assert parse_smi_gpus(text) == (Gpu("0000:1b:00.0", "GPU-a"), Gpu("0000:db:00.0", "GPU-b"))


GPUS = (Gpu("0000:1b:00.0", "GPU-aa11"), Gpu("0000:3b:00.0", "GPU-ab22"), Gpu("0000:8b:00.0", "GPU-cc33"))


@pytest.mark.parametrize(("value", "expected"), [
    (None, [0, 1, 2]),
    ("", []),
    ("2,0", [2, 0]),
    (" 1 , 2", [1, 2]),
    ("0,5,1", [0]),  # CUDA stops at the first entry that names no GPU
    ("1,-1,0", [1]),
    ("0,0,1", [0]),  # ... or one already named
    ("GPU-cc,GPU-aa1", [2, 0]),  # UUID prefixes
    ("GPU-a,2", []),  # ambiguous: two UUIDs start so
])
def test_visible_gpus(value, expected):
    assert visible_gpus(GPUS, value) == tuple(GPUS[i] for i in expected)


def test_a_mig_instance_cannot_be_placed():
    with pytest.raises(ValueError, match="a MIG instance"):
        visible_gpus(GPUS, "MIG-1c9d8a3e-0000")


@pytest.mark.parametrize(("text", "cpus"), [("0-2,4,6-7\n", {0, 1, 2, 4, 6, 7}), ("\n", set()), ("5", {5})])
def test_cpu_lists_both_ways(text, cpus):
    assert parse_ranges(text) == cpus
    assert ranges(cpus) == text.strip()


# ----------------------------------------------------------------------------------------------- the command line


def _spec(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    (tmp_path / "t.py").write_text("")
    return spec_from_args([*args, str(tmp_path / "t.py")], env or {})


def test_the_flag_gives_each_local_rank_its_cpus(tmp_path):
    machine = this_machine_split()
    root = machine.write(tmp_path / "machine")
    spec = _spec(tmp_path, "--numa-binding", "node", "--nproc-per-node", "2", env={"RANKRUN_SYSFS_ROOT": str(root)})
    assert spec.worker.cpus == (parse_ranges(machine.nodes[0]), parse_ranges(machine.nodes[1]))
    assert _spec(tmp_path).worker.cpus == ()  # without the flag: no binding


def test_no_gpu_is_one_usage_error_naming_the_flag(tmp_path):
    with pytest.raises(UsageError) as caught:
        _spec(tmp_path, "--numa-binding", "socket", env={"RANKRUN_SYSFS_ROOT": str(tmp_path)})
    assert str(caught.value) == ("--numa-binding 'socket': no NVIDIA GPU found (CUDA_VISIBLE_DEVICES, "
                                 "/proc/driver/nvidia, nvidia-smi): binding puts each local rank near its GPU")


def test_cuda_visible_devices_can_hide_every_gpu(tmp_path):
    root = two_sockets().write(tmp_path / "machine")
    with pytest.raises(UsageError, match="no NVIDIA GPU found"):
        _spec(tmp_path, "--numa-binding", "node", env={"RANKRUN_SYSFS_ROOT": str(root), "CUDA_VISIBLE_DEVICES": ""})
