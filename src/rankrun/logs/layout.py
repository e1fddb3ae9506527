"""The per-run log directory, in torchrun's layout::

    <log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout,stderr}.log, error.json
    <log_dir>/<run_id>_<random>/attempt_<n>/filtered_{stdout,stderr}.log

and ``<local_rank>/stacks.txt`` only for a rank whose stacks were taken (a stall report, ``rankrun --stacks``):
the dumps, whole (the stack channel's file, removed at the attempt's end when it holds none); and with
``--straggler-window`` on, ``attempt_<n>/straggler/rank_<rank>.fr`` for each Python worker whose torch recorded a
collective (the arrivals, ``rankrun.stacks.channel``), named by the rank in the job.

Without ``--log-dir`` the same tree lives in a private temporary directory (it still holds
the workers' error files) and is removed when the job ends, unless ``-r``/``-t`` asked for
files, in which case it is kept and its path announced. ``--log-dir /dev/null`` means no
files at all and ``TORCHELASTIC_ERROR_FILE=""``. A private directory to be removed at the end carries its owner stamp
(``.owner``), and making one first sweeps the temp root of those whose launcher died with its watchdog
(``logs.stale``).
"""

from __future__ import annotations

import os
from pathlib import Path

from rankrun.errors import LauncherError
from rankrun.fsutil import make_unique_dir, remove_tree, temp_root
from rankrun.logs import stale
from rankrun.spec import LogSpec

ARRIVALS_FOLDER = "straggler"


class RunLogs:
    def __init__(self, spec: LogSpec, run_id: str) -> None:
        self.spec = spec
        self.base: Path | None = None
        self.temporary = spec.log_dir is None
        if spec.discard_files:
            return
        try:
            if spec.log_dir is None:
                self.base = self._private(run_id)
            else:
                spec.log_dir.mkdir(parents=True, exist_ok=True)
                self.base = make_unique_dir(spec.log_dir, f"{run_id}_")
        except OSError as exc:
            raise LauncherError(f"cannot create log directory under {spec.log_dir or temp_root()}: {exc}") from exc

    def _private(self, run_id: str) -> Path:
        """The private directory in the temp root, after the sweep of dead launchers' ones; stamped with its owner
        when it is to be removed at the end (one kept on purpose is never swept)."""
        me = stale.here()
        if me is not None:
            stale.sweep(temp_root(), me, os.getuid())
        base = make_unique_dir(temp_root(), f"{stale.PREFIX}{run_id}_")
        if me is not None and not self.keep:
            stale.stamp(base, me)
        return base

    @property
    def keep(self) -> bool:
        return not self.temporary or self.spec.wants_files()

    def attempt_dir(self, attempt: int, nproc: int) -> Path | None:
        """Create (fresh) ``attempt_<n>/<local_rank>/`` for every local rank."""
        if self.base is None:
            return None
        path = self.base / f"attempt_{attempt}"
        remove_tree(path)
        for local_rank in range(nproc):
            (path / str(local_rank)).mkdir(parents=True)
        return path

    @staticmethod
    def error_file(attempt_dir: Path | None, local_rank: int) -> str:
        return "" if attempt_dir is None else str(attempt_dir / str(local_rank) / "error.json")

    @staticmethod
    def stacks_file(attempt_dir: Path | None, local_rank: int) -> Path | None:
        """Where the worker writes its stack dumps when asked (``rankrun.stacks.channel``), beside its error file."""
        return None if attempt_dir is None else attempt_dir / str(local_rank) / "stacks.txt"

    @staticmethod
    def arrivals_file(attempt_dir: Path | None, rank: int) -> Path | None:
        """Where the worker of ``rank`` (in the job) appends its collectives' arrivals (``rankrun.stacks.channel``)."""
        return None if attempt_dir is None else attempt_dir / ARRIVALS_FOLDER / f"rank_{rank}.fr"

    def finish(self, *, keep: bool = False) -> Path | None:
        """Remove a private directory nobody asked to keep (``keep``: something in it must stay, e.g. the Flight
        Recorder's dumps); return the kept base (if any)."""
        if self.base is None:
            return None
        if not self.keep and not keep:
            remove_tree(self.base)
            return None
        if self.temporary:
            stale.unstamp(self.base)  # kept on purpose after all: no later launch's sweep may take it
        return self.base
