"""``--numa-binding``'s CPU sets are torch 2.13's own: torch's ``torch/numa/binding.py`` run on the same fake layouts.

torch reads absolute ``/sys/...`` paths and asks CUDA for each GPU's PCI address; here its reads of ``/sys`` go to the
fake tree and ``torch.cuda`` answers from the fake GPU list, so torch's own code (not a copy of it) decides, and
rankrun's decision for every mode and local rank must be the same set.
"""

from __future__ import annotations

import builtins
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from rankrun.devices import driver_gpus, visible_gpus
from rankrun.numa.binding import MODES, BindingError, parse_ranges, plan
from rankrun.numa.topology import read_topology
from sysfs import FakeGpu, FakeMachine, two_sockets

torch_binding = pytest.importorskip("torch.numa.binding")
torch = pytest.importorskip("torch")

LAYOUTS = {
    "two-sockets": two_sockets(),
    "minus-one": two_sockets((0, 0, 2, -1)),
    "three-on-a-node": two_sockets((1, 1, 1, 3)),
    "six-gpus": two_sockets((0, 0, 0, 2, 2, 3)),
    "workstation": FakeMachine({0: "0-7"}, [FakeGpu("0000:01:00.0", -1), FakeGpu("0000:02:00.0", -1)], l3=["0-7"]),
    "crowded": FakeMachine({0: "0-1", 1: "2-9"}, [FakeGpu(f"0000:0{i}:00.0", 0) for i in range(3)]),  # exclusive: refused
    "uneven-l3": FakeMachine({0: "0-5"}, [FakeGpu("0000:01:00.0", 0), FakeGpu("0000:02:00.0", 0)], l3=["0-1", "2-5"]),
}
ALLOWED = {"all": None, "some": "1-7,17-23,26-31"}


def _torch_sees(monkeypatch: pytest.MonkeyPatch, root: Path, machine: FakeMachine, allowed: frozenset[int]) -> None:
    real_open, real_listdir = builtins.open, os.listdir

    def moved(path: object) -> object:
        return str(root) + path if isinstance(path, str) and path.startswith("/sys/") else path

    monkeypatch.setattr(torch_binding, "open", lambda path, *a, **k: real_open(moved(path), *a, **k), raising=False)
    monkeypatch.setattr(os, "listdir", lambda path=".": real_listdir(moved(path)))
    monkeypatch.setattr(torch_binding, "_get_allowed_cpu_indices_for_current_thread", lambda: set(allowed))

    def properties(index: int) -> SimpleNamespace:
        domain, bus, rest = machine.gpus[index].address.split(":")
        return SimpleNamespace(pci_domain_id=int(domain, 16), pci_bus_id=int(bus, 16), pci_device_id=int(rest[:2], 16))

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(machine.gpus))


@pytest.mark.parametrize("allowed_name", sorted(ALLOWED))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("mode", MODES)
def test_every_rank_gets_the_cpus_torch_gives_it(tmp_path, monkeypatch, mode, layout, allowed_name):
    machine = LAYOUTS[layout]
    root = machine.write(tmp_path)
    every = frozenset(range(64))
    allowed = every if ALLOWED[allowed_name] is None else parse_ranges(ALLOWED[allowed_name])
    gpus = visible_gpus(driver_gpus(root), None)
    try:
        ours: tuple[frozenset[int], ...] | str = plan(mode, read_topology(root, mode, gpus, allowed), len(gpus), allowed)
    except BindingError:
        ours = "refused"
    _torch_sees(monkeypatch, root, machine, allowed)
    try:
        theirs: tuple[frozenset[int], ...] | str = tuple(
            frozenset(torch_binding._get_logical_cpus_to_bind_to(
                gpu_index=gpu, numa_options=torch_binding.NumaOptions(torch_binding.AffinityMode(mode))))
            for gpu in range(len(gpus)))
    except (RuntimeError, ValueError):
        theirs = "refused"
    theirs = "refused" if theirs != "refused" and not all(theirs) else theirs  # torch refuses an empty set later
    assert ours == theirs
