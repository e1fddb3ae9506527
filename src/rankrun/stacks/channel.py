"""The dump channel's set-up: what a worker is given so that it can answer with its stacks (pure).

The shim folder goes first on the worker's ``PYTHONPATH``, and three variables say where and on which signals to
write: ``rankrun.stacks.shim.sitecustomize`` registers ``faulthandler`` on ``DUMP_SIGNAL`` (a worker blocked in a
call) and a Python handler on ``RUNNING_SIGNAL`` (a worker running: why two, in the shim's docstring), then cleans
up. The files are the worker's ``stacks.txt`` beside its ``error.json`` in the attempt directory and, for the Python
handler's dumps, ``stacks.running.txt`` beside it (``running_file``), so with ``--log-dir`` every dump taken stays
there, whole; a file that holds no dump (only the shim's header line, or nothing) is removed when the attempt ends
(``drop_if_unused``), so a log folder has them only where stacks were taken. Asking and reading is
``rankrun.stacks.sampler``.

The same shim writes the collectives' arrivals for the straggler watch (``--straggler-window``, see the shim's
docstring), where ``arrivals_env`` names its file and period: each rank's ``straggler/rank_<rank>.fr`` in the
attempt directory (``RunLogs.arrivals_file``), read by ``rankrun.straggler.frfile``. Torch records collectives only
with a Flight Recorder buffer: rankrun sets ``TORCH_FR_BUFFER_SIZE`` (a small one, ``arrivals_buffer``) only where
the user configured neither buffer variable, and after ``stacks.flight.flight_env`` has decided from the user's own
settings whether the recorder's dumps and pipes go into the run directory (a buffer rankrun adds turns none on).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from rankrun.stacks.dump import HEADER
from rankrun.stacks.flight import BUFFER_SIZES

SHIM_DIR = str(Path(__file__).parent / "shim")
# A real-time signal: SIGUSR1/SIGUSR2 belong to the job (Lightning and submitit requeue on them). Its default
# action ends a process, so it is sent only to a worker that catches it (see the sampler).
DUMP_SIGNAL = signal.SIGRTMIN + 4
RUNNING_SIGNAL = signal.SIGRTMIN + 5
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
    out["RANKRUN_STACKS_RUNNING"] = f"{int(RUNNING_SIGNAL)} {running_file(Path(dump_file))}"
    return out


def running_file(dump_file: Path) -> Path:
    """Where the worker whose dumps go to ``dump_file`` writes those of its Python handler (pure)."""
    return dump_file.with_suffix(".running" + dump_file.suffix)


ARRIVALS_PER_WINDOW = 6  # dumps a window: the verdict sees the window's arrivals at most window/6 s late
# The Flight Recorder's buffer, in entries a second of the period between dumps, within bounds. A dump and its parse
# cost the worker about 30 us of CPU per entry held (torch 2.13, gloo; most of it with the GIL held), every period,
# however few are new: 30 a second is ~0.1 % of a core (0.3 % at the floor, with a 1 s period). A job with more
# collectives than that between two dumps is sampled: each dump holds the last ones before it.
ARRIVALS_RATE = 30
ARRIVALS_BUFFER = (100, 2000)


def arrivals_every(window: float) -> float:
    """Seconds between a worker's dumps of its arrivals, for a straggler window of ``window`` s (at least 1 s)."""
    return max(1.0, window / ARRIVALS_PER_WINDOW)


def arrivals_buffer(every: float) -> int:
    """The Flight Recorder's buffer (entries) for dumps every ``every`` s: ``ARRIVALS_RATE`` a second, bounded."""
    low, high = ARRIVALS_BUFFER
    return min(high, max(low, round(ARRIVALS_RATE * every)))


def arrivals_env(env: Mapping[str, str], arrivals_file: str, every: float) -> dict[str, str]:
    """``env`` with the arrivals' file and period named for the shim, and a Flight Recorder buffer unless the user
    configured one (either variable set, even to 0: their choice stands) (pure)."""
    out = dict(env)
    out["RANKRUN_FR_FILE"] = arrivals_file
    out["RANKRUN_FR_EVERY"] = repr(every)
    if not any(env.get(name, "").strip() for name in BUFFER_SIZES):
        out["TORCH_FR_BUFFER_SIZE"] = str(arrivals_buffer(every))
    return out


def drop_if_unused(dump_file: Path) -> None:
    """Remove ``dump_file`` when no dump was ever written to it: nothing but the shim's header line (or nothing);
    and its ``running_file`` when that is empty (its dumps all taken back)."""
    with contextlib.suppress(OSError):
        running = running_file(dump_file)
        if running.stat().st_size == 0:
            running.unlink()
    with contextlib.suppress(OSError):
        with dump_file.open("rb") as fh:
            head = fh.read(_HEADER_MAX + 1)
        if len(head) <= _HEADER_MAX and all(line.startswith(HEADER) for line in head.decode(errors="replace").splitlines()):
            dump_file.unlink()
