"""Count accelerators without importing torch.

The NVIDIA driver says how many GPUs exist (``/proc/driver/nvidia/gpus``, else
``nvidia-smi -L``); ``CUDA_VISIBLE_DEVICES`` can only narrow that down. No driver means no
GPU, whatever the variable says (torch answers "Cuda is not available" there too). Reads
only; the only caller is ``rankrun.cli`` when ``--nproc-per-node`` is ``gpu`` or ``auto``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping

from rankrun.fsutil import which

_PROC_GPUS = "/proc/driver/nvidia/gpus"


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
