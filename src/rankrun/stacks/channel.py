"""The dump channel's set-up: what a worker is given so that it can answer with its stacks (pure).

The shim folder goes first on the worker's ``PYTHONPATH``, and two variables say where and on which signal to
write: ``rankrun.stacks.shim.sitecustomize`` registers ``faulthandler`` there and then cleans up. The file is the
worker's ``stacks.txt`` beside its ``error.json`` in the attempt directory, so with ``--log-dir`` every dump
taken stays there, whole. Asking and reading is ``rankrun.stacks.sampler``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path

SHIM_DIR = str(Path(__file__).parent / "shim")
# A real-time signal: SIGUSR1/SIGUSR2 belong to the job (Lightning and submitit requeue on them). Its default
# action ends a process, so it is sent only to a worker that catches it (see the sampler).
DUMP_SIGNAL = signal.SIGRTMIN + 4


def channel_env(env: Mapping[str, str], dump_file: str) -> dict[str, str]:
    """``env`` with the shim first on ``PYTHONPATH`` and the dump file and signal named for it (pure)."""
    out = dict(env)
    user = env.get("PYTHONPATH")
    out["PYTHONPATH"] = SHIM_DIR + (os.pathsep + user if user else "")
    if user is not None:
        out["RANKRUN_USER_PYTHONPATH"] = user  # put back by the shim; absent: PYTHONPATH was not set
    out["RANKRUN_STACKS_FILE"] = dump_file
    out["RANKRUN_STACKS_SIGNAL"] = str(int(DUMP_SIGNAL))
    return out
