"""rankrun: a torch-free, drop-in replacement for torchrun; ``rankrun.launch(fn, ...)`` runs one from Python."""

from __future__ import annotations

from typing import Any

from rankrun.errors import LauncherError, RankrunError, WorkerError

__version__ = "0.1.0"
__all__ = ["LauncherError", "RankrunError", "WorkerError", "__version__", "launch"]


def launch(fn: Any, *args: Any, nproc_per_node: int | str = 1, **options: Any) -> dict[int, Any]:
    """Run ``fn(*args)`` in every worker of the job the CLI's options describe; each rank's value, by rank.

    See ``rankrun.api.launch`` (and docs/python-api.md). The workers' failure raises ``WorkerError``; the
    launcher's own (a rendezvous that timed out, a value that could not be read) ``LauncherError``; both are
    ``RankrunError``s.
    """
    from rankrun.api.launch import launch as run  # noqa: PLC0415 - the CLI never pays for the API

    return run(fn, *args, nproc_per_node=nproc_per_node, **options)
