"""The consistent step (pure, standard library): which kept step a restarted job resumes from, and where each rank's
state of it is read.

A rank keeps its two newest saves (its node's two slots), a neighbour node may hold a copy, ``--checkpoint-dir`` may
hold others: each is a ``Held`` — a complete step, the world size of the job that saved it, and where it is. The job
resumes from the newest step ``S`` with a world ``W`` such that **every** rank ``0..W-1`` holds ``(S, W)`` somewhere.

Why that step exists whenever ranks synchronise between saves: rank i cannot begin save k+1 before every rank has
finished save k (the collective in between), so a rank killed inside save k+1 still holds k, and every other rank
holds k in its other slot — it could be writing k+2 only after that rank passed save k+1. A script that saves without
a collective between saves may leave no common step: ``consistent`` is then ``None`` and ``why_none`` says each
rank's newest step.

Choices, and why:
- The newest step wins whatever its world: a job that changed its world size and has not saved yet resumes from the
  old world's step (its script re-shards with ``load(rank=r)``); once the new world has saved a step newer than it,
  that one. Steps of different worlds are compared as numbers: a script counts its steps through a world change.
- Two worlds with the same newest step (a job that re-formed and saved that step again): the larger world's, the
  one with more of the job's state in it. An entry held by a rank ``>= W`` is no part of world ``W``'s answer.
- Each rank reads from the nearest copy: ``memory`` (its node's own), else ``neighbour``, else ``disk``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from rankrun.ranges import range_string

WHERE = ("memory", "neighbour", "disk")  # where a kept step can be read from, nearest first
RANKS_SHOWN = 40  # a range string longer than this is said as a count: a phrase stays a line at any scale


@dataclass(frozen=True)
class Held:
    """One complete kept step of one rank."""

    step: int
    world: int  # the world size of the job that saved it
    where: str  # "memory" | "neighbour" | "disk"

    def __post_init__(self) -> None:
        if self.world < 1:
            raise ValueError(f"a kept step's world has at least one rank: {self.world}")
        if self.where not in WHERE:
            raise ValueError(f"a kept step is in {', '.join(WHERE)}, not {self.where!r}")


@dataclass(frozen=True)
class Resume:
    """The step a job resumes from, the world that saved it, and where each of its ranks reads its state."""

    step: int
    world: int
    where: Mapping[int, str]  # rank -> where its state of that step is read from (memory, then neighbour, then disk)


def consistent(held: Mapping[int, Collection[Held]]) -> Resume | None:
    """The newest step S with a world W such that every rank 0..W-1 holds (S, W) somewhere; None when there is none.

    ``held`` maps a rank to what it holds (a rank holding nothing may be left out). Ties on S: the larger W. Cost:
    one pass over the entries, whatever the number of ranks."""
    holders: dict[tuple[int, int], set[int]] = defaultdict(set)
    for rank, entries in held.items():
        for entry in entries:
            if 0 <= rank < entry.world:
                holders[entry.step, entry.world].add(rank)
    covered = [key for key, ranks in holders.items() if len(ranks) == key[1]]
    if not covered:
        return None
    step, world = max(covered)
    return Resume(step, world, {rank: _nearest(held[rank], step, world) for rank in range(world)})


def _nearest(entries: Iterable[Held], step: int, world: int) -> str:
    """Where a rank reads ``(step, world)`` from: the first of ``WHERE`` that holds it."""
    return min((e.where for e in entries if (e.step, e.world) == (step, world)), key=WHERE.index)


def why_none(held: Mapping[int, Collection[Held]]) -> str | None:
    """When consistent() is None but something is held: one phrase for the user, each rank's newest step by world,
    e.g. ``no step is kept by every rank: ranks 0-3 kept step 12, ranks 4-7 kept step 10``; None when nothing is
    held, or when a step is kept by every rank (nothing to explain)."""
    if not any(held.values()) or consistent(held) is not None:
        return None
    worlds = sorted({e.world for entries in held.values() for e in entries}, reverse=True)
    if len(worlds) == 1:
        return f"no step is kept by every rank: {_world_phrase(held, worlds[0])}"
    return "no step is kept by every rank: " + "; ".join(f"world {w}: {_world_phrase(held, w)}" for w in worlds)


def _world_phrase(held: Mapping[int, Collection[Held]], world: int) -> str:
    """Ranks 0..world-1 grouped by their newest step of ``world``, newest first; those with none last."""
    newest: dict[int | None, list[int]] = defaultdict(list)
    for rank in range(world):
        steps = [e.step for e in held.get(rank, ()) if e.world == world]
        newest[max(steps) if steps else None].append(rank)
    ordered = sorted((s for s in newest if s is not None), reverse=True)
    said = [f"{_ranks(newest[s])} kept step {s}" for s in ordered]
    if None in newest:
        said.append(f"{_ranks(newest[None])} kept nothing")
    return ", ".join(said)


def _ranks(ranks: list[int]) -> str:
    """``rank 4``, ``ranks 0-3,8``, or ``4096 ranks`` when the range string would not fit a line."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    text = range_string(ranks)
    return f"ranks {text}" if len(text) <= RANKS_SHOWN else f"{len(ranks)} ranks"
