"""``--checkpoint-dir``'s layout and what makes a step complete there: names and rules (pure), and the thin readers
that apply them to a folder.

::

    DIR/<run id>/                      run_folder: DIR itself when the run id is "none" (a static job that names none)
        step_000000120/                step_name: zero-padded so that a listing sorts; any width is read
            rank_0.pt ... rank_7.pt    rank_name: exactly the bytes torch.save wrote: a plain torch.load reads one
            node_<node>.json           manifest_name: {"v":1,"step","world","ranks":"0-7","bytes","saved"}
            .rank_3.pt.<hex>.tmp       tmp_name: a file being written (renamed to its name once whole)

Each node writes its own ranks' files, then its manifest, last: a step is complete when the ranks its node manifests
name cover ``0..world-1`` (every manifest of the step saying the same world) and every file they name is there. So a
half-written step is never read, and a reader needs nothing but the folder: no lock, no store. Anything else in a
step folder (a ``.tmp`` file, a torn or foreign JSON, a stray name) is ignored; so is a step folder that is not one.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from rankrun.ranges import parse_ranges, range_string
from rankrun.record import record

VERSION = 1
NO_RUN_ID = "none"  # torchrun's --rdzv-id default (spec.DEFAULT_RUN_ID): every static job that names none has it
STEP_WIDTH = 9  # step_000000120: sorts in a listing up to a billion steps; wider numbers are still read
KEEP = 2  # complete steps kept on disk: the newest, and the one before in case the newest is torn on some disk

_STEP = re.compile(r"step_([0-9]+)")
_RANK = re.compile(r"rank_([0-9]+)\.pt")
_MANIFEST = re.compile(r"node_(.+)\.json")
_UNSAFE = re.compile(r"[^A-Za-z0-9._@+-]")


@record
class NodeManifest:
    """One node's word that its ranks' files of one step are whole (``node_<node>.json``)."""

    step: int
    world: int
    ranks: tuple[int, ...]  # sorted, each below ``world``
    bytes: int  # the ranks' files together
    saved: float  # unix time the node finished writing them


@record
class DiskStep:
    """A complete step on disk: every rank's file of a world of ``world`` ranks."""

    step: int
    world: int
    files: dict[int, Path]  # rank → its file, for every rank 0..world-1


def run_folder(dir: Path, run_id: str) -> Path:
    """Where a job's steps go: ``DIR/<run id>``, so that jobs sharing a dir keep apart and a job that runs again with
    the same ``--rdzv-id`` finds its steps; ``DIR`` itself for the run id ``none``, which every static job that names
    no id has (a folder of that name would hold every such job's steps alike, and read as if named). What a folder
    name cannot hold (``/``, blanks, a leading dot) becomes ``_``."""
    if run_id == NO_RUN_ID:
        return dir
    return dir / _safe(run_id)


def _safe(name: str) -> str:
    """``name`` as one plain file name: never a path, never hidden, never ``.``/``..``."""
    safe = _UNSAFE.sub("_", name)
    return f"_{safe}" if not safe or safe.startswith(".") else safe


def step_name(step: int) -> str:
    if step < 0:
        raise ValueError(f"a step is never negative: {step}")
    return f"step_{step:0{STEP_WIDTH}d}"


def parse_step_name(name: str) -> int | None:
    """``step_000000120`` (or any width) → 120; None for any other name."""
    found = _STEP.fullmatch(name)
    return int(found.group(1)) if found and found.group(1).isascii() else None


def rank_name(rank: int) -> str:
    if rank < 0:
        raise ValueError(f"a rank is never negative: {rank}")
    return f"rank_{rank}.pt"


def parse_rank_name(name: str) -> int | None:
    found = _RANK.fullmatch(name)
    return int(found.group(1)) if found and found.group(1).isascii() else None


def manifest_name(node: str) -> str:
    """``node_<node>.json``, with what a file name cannot hold (``/``, blanks, ...) as ``_``."""
    return f"node_{_UNSAFE.sub('_', node) or '_'}.json"


def is_manifest_name(name: str) -> bool:
    return _MANIFEST.fullmatch(name) is not None


def tmp_name(final: str, token: str) -> str:
    """The name a file is written under before it is renamed to ``final``: hidden, and never a name a reader takes."""
    return f".{final}.{token}.tmp"


def is_tmp_of(name: str, final: str) -> bool:
    """Whether ``name`` is a file being written (or left by a writer that died) that was to become ``final``."""
    return name.startswith(f".{final}.") and name.endswith(".tmp")


def encode(manifest: NodeManifest) -> bytes:
    return json.dumps({"v": VERSION, "step": manifest.step, "world": manifest.world,
                       "ranks": range_string(manifest.ranks), "bytes": manifest.bytes,
                       "saved": manifest.saved}).encode()


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def decode(data: bytes) -> NodeManifest | None:
    """A manifest's bytes → its content; None for anything that is not a whole, valid version-1 manifest (torn,
    another version, a rank outside the world, no ranks)."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(raw, dict) or raw.get("v") != VERSION:
        return None
    step, world, size, saved = _count(raw.get("step")), _count(raw.get("world")), _count(raw.get("bytes")), raw.get("saved")
    ranks = _ranks(raw.get("ranks"))
    if step is None or not world or size is None or not ranks or ranks[-1] >= world:
        return None
    if not isinstance(saved, (int, float)) or isinstance(saved, bool):
        return None
    return NodeManifest(step, world, ranks, size, float(saved))


def _ranks(text: object) -> tuple[int, ...]:
    """A range string's ranks, sorted; () for anything else."""
    try:
        return tuple(parse_ranges(text)) if isinstance(text, str) else ()
    except ValueError:
        return ()


def complete_world(step: int, manifests: Iterable[NodeManifest], present: Iterable[int]) -> int | None:
    """The world of ``step`` when its node ``manifests`` make it complete: every one of them is of this step and says
    the same world, the ranks they name cover ``0..world-1``, and each named rank's file is ``present``. None
    otherwise: a step two worlds wrote parts of is no one world's (pure)."""
    found = list(manifests)
    worlds = {m.world for m in found}
    if len(worlds) != 1 or any(m.step != step for m in found):
        return None
    (world,) = worlds
    named = {rank for m in found for rank in m.ranks}
    if named != set(range(world)) or not named <= set(present):
        return None
    return world


def stale(complete_steps: Iterable[int], keep: int = KEEP, *, present: Iterable[int] = ()) -> list[int]:
    """The steps to remove, oldest first: every complete step but the ``keep`` newest, and every other ``present``
    step (one never completed: torn by a stop, abandoned) older than the oldest kept, which no writer goes back to.
    Nothing while fewer than ``keep`` steps are complete: an incomplete step may be the one still being written (pure).
    """
    complete = sorted(set(complete_steps), reverse=True)
    if keep < 1:
        raise ValueError(f"keep at least one step: {keep}")
    if len(complete) < keep:
        return []
    oldest_kept = complete[keep - 1]
    return sorted({s for s in [*complete, *present] if s < oldest_kept})


# --------------------------------------------------------------------------- readers (a folder, as it is now)


def read_manifest(path: Path) -> NodeManifest | None:
    try:
        return decode(path.read_bytes())
    except OSError:  # gone meanwhile (a node's keep-two), unreadable: not a manifest
        return None


def step_folders(folder: Path) -> dict[int, Path]:
    """The step folders in ``folder`` by step; a run folder not there yet has none."""
    try:
        with os.scandir(folder) as listing:  # closed even when a read fails half-way (no ResourceWarning)
            entries = list(listing)
    except OSError:
        return {}
    found: dict[int, Path] = {}
    for entry in entries:
        step = parse_step_name(entry.name)
        if step is not None and entry.is_dir():
            found[step] = Path(entry.path)
    return found


def read_step(path: Path, step: int) -> DiskStep | None:
    """``path`` (the folder of ``step``) as a complete step, or None."""
    try:
        names = os.listdir(path)
    except OSError:
        return None
    manifests = [m for name in names if is_manifest_name(name) if (m := read_manifest(path / name)) is not None]
    ranks = {rank: path / name for name in names if (rank := parse_rank_name(name)) is not None}
    world = complete_world(step, manifests, ranks)
    if world is None:
        return None
    return DiskStep(step, world, {rank: ranks[rank] for rank in range(world)})


def complete_steps(folder: Path) -> list[DiskStep]:
    """Every complete step in the run ``folder``, newest first."""
    steps = step_folders(folder)
    return [found for step in sorted(steps, reverse=True) if (found := read_step(steps[step], step)) is not None]


def newest_complete(folder: Path) -> DiskStep | None:
    """The newest complete step in the run ``folder``, or None (no folder, no step, none complete)."""
    steps = step_folders(folder)
    for step in sorted(steps, reverse=True):
        found = read_step(steps[step], step)
        if found is not None:
            return found
    return None
