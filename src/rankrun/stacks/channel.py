"""The dump channel's set-up: what a worker is given so that it can answer with its stacks (pure).

The shim folder goes first on the worker's ``PYTHONPATH``, and two variables say where and on which signal to
write: ``rankrun.stacks.shim.sitecustomize`` registers ``faulthandler`` there and then cleans up. The file is the
worker's ``stacks.txt`` beside its ``error.json`` in the attempt directory, so with ``--log-dir`` every dump
taken stays there, whole; a file that holds no dump (only the shim's header line) is removed when the attempt
ends (``drop_if_unused``), so a log folder has ``stacks.txt`` only where stacks were taken. Asking and reading
is ``rankrun.stacks.sampler``.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from rankrun.stacks.dump import HEADER

SHIM_DIR = str(Path(__file__).parent / "shim")
# A real-time signal: SIGUSR1/SIGUSR2 belong to the job (Lightning and submitit requeue on them). Its default
# action ends a process, so it is sent only to a worker that catches it (see the sampler).
DUMP_SIGNAL = signal.SIGRTMIN + 4
_HEADER_MAX = 128  # bytes: "rankrun-stacks main=0x<16 hex digits> pid=<pid> up=<seconds>\n" is under 90; a dump is longer


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


def drop_if_unused(dump_file: Path) -> None:
    """Remove ``dump_file`` when no dump was ever written to it: nothing but the shim's header line (or nothing)."""
    with contextlib.suppress(OSError):
        with dump_file.open("rb") as fh:
            head = fh.read(_HEADER_MAX + 1)
        if len(head) <= _HEADER_MAX and all(line.startswith(HEADER) for line in head.decode(errors="replace").splitlines()):
            dump_file.unlink()
