"""The optional NCCL layer: torch's Flight Recorder, its dumps pointed into the run's directory and taken at a stall.

Only where the user turned the recorder on (``TORCH_NCCL_TRACE_BUFFER_SIZE`` or ``TORCH_FR_BUFFER_SIZE`` above
0): rankrun then sets, unless the user set them, where each rank's dump goes and the prefix of the named pipe
through which torch takes a dump on request (``ProcessGroupNCCL`` creates ``<prefix><rank>.pipe`` and dumps
when anything is written to it)::

    TORCH_NCCL_DEBUG_INFO_TEMP_FILE = TORCH_FR_DUMP_TEMP_FILE = <attempt dir>/flight_recorder/rank_
    TORCH_NCCL_DEBUG_INFO_PIPE_FILE = <attempt dir>/flight_recorder/pipe_

When a stall is detected, ``trigger`` writes one byte to every pipe of this node that has a reader, and the
report says where the dumps go and how to read them (torch's analyzer,
``python -m torch.distributed.flight_recorder.fr_trace DIR -p rank_``). The dumps are torch's: written by the
recorder's own thread; a rank whose recorder is wedged writes none, which the stack report covers. A private
run directory (no ``--log-dir``) that holds dumps is kept at the end, and its path said.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from rankrun.stacks.report import who

BUFFER_SIZES = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
DUMP_FILES = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")
PIPE_FILE = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
FOLDER = "flight_recorder"
DUMP_PREFIX = "rank_"
PIPE_PREFIX = "pipe_"
_PIPE = re.compile(r"(\d+)\.pipe$")


def enabled(env: Mapping[str, str]) -> bool:
    """Whether the user turned torch's Flight Recorder on (a buffer of more than 0 entries)."""
    for name in BUFFER_SIZES:
        with contextlib.suppress(ValueError):
            if int(env.get(name, "0").strip() or "0") > 0:
                return True
    return False


def flight_env(env: dict[str, str], attempt_dir: Path | None) -> dict[str, str]:
    """``env`` with the recorder's dump file and pipe in the attempt's directory (pure); ``env`` itself when the
    recorder is off or there is no run directory. What the user set stays as the user set it."""
    if attempt_dir is None or not enabled(env):
        return env
    folder = attempt_dir / FOLDER
    dump = where(env) or str(folder / DUMP_PREFIX)
    out = dict(env)
    for name in DUMP_FILES:
        out.setdefault(name, dump)
    out.setdefault(PIPE_FILE, str(folder / PIPE_PREFIX))
    return out


def pipe_prefix(env: Mapping[str, str]) -> str:
    """Where the ranks' pipes are, as the workers were told."""
    return env.get(PIPE_FILE, "")


def trigger(prefix: str) -> list[int]:
    """Ask every rank whose recorder listens on ``<prefix><rank>.pipe`` for a dump; the ranks asked, sorted.
    Never blocks: a pipe nobody reads (the rank is gone, or has no NCCL group) is left alone."""
    if not prefix:
        return []
    folder, stem = Path(prefix).parent, Path(prefix).name
    asked = []
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    for name in names:
        m = _PIPE.match(name[len(stem):]) if name.startswith(stem) else None
        if m is None:
            continue
        try:
            fd = os.open(folder / name, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno not in (errno.ENXIO, errno.ENOENT, errno.EACCES):
                raise
            continue  # ENXIO: no reader
        try:
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(fd, b"1")
                asked.append(int(m.group(1)))
        finally:
            os.close(fd)
    return sorted(asked)


def where(env: Mapping[str, str]) -> str:
    """The dumps' prefix, as the workers were told (the user's own, or the run directory's)."""
    return next((env[name] for name in DUMP_FILES if env.get(name)), "")


def has_dumps(base: Path) -> bool:
    """Whether any attempt under a run directory holds a recorder dump (not only its pipes)."""
    return any(not p.name.endswith(".pipe") for p in base.glob(f"attempt_*/{FOLDER}/*"))


class Recorder:
    """One attempt's recorder dumps: where the pipes and the dumps are, and how to tell the user (``show``)."""

    def __init__(self, env: Mapping[str, str], show: Callable[[str], None]) -> None:
        self.pipes, self.dumps, self._show = pipe_prefix(env), where(env), show

    def take(self) -> list[int]:
        """Ask every rank of this node for its dump, and say where they go (or that none listened)."""
        asked = trigger(self.pipes)
        folder, stem = Path(self.dumps).parent, Path(self.dumps).name
        if asked:
            self._show(f"rankrun: Flight Recorder dumps asked of {who(asked)}: {self.dumps}<rank> (read them with: "
                       f"python -m torch.distributed.flight_recorder.fr_trace {folder} -p {stem})")
        else:
            self._show(f"rankrun: Flight Recorder is on, but no rank listens on {self.pipes}<rank>.pipe "
                       "(no NCCL process group yet, or its recorder is stuck): no dumps asked")
        return asked
