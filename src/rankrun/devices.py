"""Count and locate accelerators without importing torch.

The NVIDIA driver says which GPUs exist (``/proc/driver/nvidia/gpus``, one folder per GPU named by its PCI
address, else ``nvidia-smi``); ``CUDA_VISIBLE_DEVICES`` can only narrow that down and reorder it. No driver means
no GPU, whatever the variable says (torch answers "Cuda is not available" there too). Reads only; the only
caller is ``rankrun.cli`` (``numa.topology`` takes only the ``Gpu`` record): the count when
``--nproc-per-node`` is ``gpu`` or ``auto``, the visible GPUs' PCI addresses for ``--numa-binding``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from rankrun.fsutil import which
from rankrun.record import record

_PROC_GPUS = "/proc/driver/nvidia/gpus"


@record
class Gpu:
    address: str  # its PCI address as sysfs spells it: 0000:1b:00.0
    uuid: str  # GPU-8d5f...: what CUDA_VISIBLE_DEVICES may name it by ("" when the driver did not say)


def visible_devices(value: str) -> int:
    """Number of usable entries in a ``CUDA_VISIBLE_DEVICES`` string (CUDA stops at the first invalid one)."""
    count = 0
    for raw in value.split(","):
        item = raw.strip()
        if not item or item.startswith("-"):
            break
        count += 1
    return count


def gpu_count(env: Mapping[str, str]) -> int:
    """How many NVIDIA GPUs this process may use; 0 when there are none."""
    present = driver_gpu_count()
    if "CUDA_VISIBLE_DEVICES" in env:
        return min(present, visible_devices(env["CUDA_VISIBLE_DEVICES"]))
    return present


def driver_gpu_count() -> int:
    """GPUs the NVIDIA driver knows about."""
    try:
        return len(os.listdir(_PROC_GPUS))
    except OSError:
        pass
    smi = which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))


def driver_gpus(root: Path = Path("/")) -> tuple[Gpu, ...]:
    """The GPUs the NVIDIA driver knows, in PCI bus order (nvidia-smi's, and CUDA's for identical GPUs).

    ``root``: where ``/proc`` is looked for (a test's fake tree); ``nvidia-smi`` is asked only on the real one.
    """
    folder = root / _PROC_GPUS.lstrip("/")
    try:
        names = sorted(name.lower() for name in os.listdir(folder))
    except OSError:
        return _smi_gpus() if root == Path("/") else ()
    return tuple(Gpu(name, _information_uuid(folder / name / "information")) for name in names)


def _information_uuid(path: Path) -> str:
    try:
        text = path.read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "GPU UUID":
            return value.strip()
    return ""


def _smi_gpus() -> tuple[Gpu, ...]:
    smi = which("nvidia-smi")
    if smi is None:
        return ()
    try:
        out = subprocess.run([smi, "--query-gpu=pci.bus_id,uuid", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return parse_smi_gpus(out.stdout)


def parse_smi_gpus(text: str) -> tuple[Gpu, ...]:
    """``nvidia-smi --query-gpu=pci.bus_id,uuid --format=csv,noheader`` (``00000000:1B:00.0, GPU-...``), sorted."""
    gpus = []
    for line in text.splitlines():
        bus_id, _, uuid = line.partition(",")
        domain, _, rest = bus_id.strip().partition(":")
        try:
            gpus.append(Gpu(f"{int(domain, 16):04x}:{rest.lower()}", uuid.strip()))
        except ValueError:
            continue
    return tuple(sorted(gpus, key=lambda gpu: gpu.address))


def visible_gpus(gpus: Sequence[Gpu], value: str | None) -> tuple[Gpu, ...]:
    """The GPUs a process sees, in CUDA's order, given ``CUDA_VISIBLE_DEVICES`` (``None``: unset, every GPU).

    Entries are indices into ``gpus`` or (prefixes of) GPU UUIDs; as CUDA does, the list ends at the first entry
    that names no GPU, or one already named. ``ValueError`` for a MIG instance (``MIG-...``): which GPU holds it
    is known to NVML, not to the files read here.
    """
    if value is None:
        return tuple(gpus)
    seen: list[Gpu] = []
    for raw in value.split(","):
        item = raw.strip()
        if item.startswith("MIG-"):
            raise ValueError(f"CUDA_VISIBLE_DEVICES={value}: a MIG instance ({item}) does not say which GPU holds it")
        found = _named(gpus, item)
        if found is None or found in seen:
            break
        seen.append(found)
    return tuple(seen)


def _named(gpus: Sequence[Gpu], item: str) -> Gpu | None:
    if item.isdigit():
        return gpus[int(item)] if int(item) < len(gpus) else None
    if item.startswith("GPU-"):
        matches = [gpu for gpu in gpus if gpu.uuid and gpu.uuid.startswith(item)]
        return matches[0] if len(matches) == 1 else None
    return None
