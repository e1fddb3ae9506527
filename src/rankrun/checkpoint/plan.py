"""Which step a round of several nodes resumes from, and where each old rank's state of it is read: pure, with the
records the nodes exchange for it (compact JSON, never pickle).

Each node says what it holds as a few ``Holding``s: a run of old ranks (a range string), the ``(step, world)`` pairs
every one of them holds complete, where (``memory``: its own ranks' slots; ``neighbour``: a copy it holds for another
node; ``disk``: ``--checkpoint-dir``), and how another node reaches it (its peer endpoint). ``plan`` turns every node's
holdings into the round's ``Plan`` with ``rule.consistent`` (the newest step every old rank holds somewhere), each run
of ranks read from the nearest holder: memory, then a neighbour's copy, then the disk.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rankrun.checkpoint.rule import Held, consistent, why_none
from rankrun.ranges import parse_ranges, range_string

_ORDER = {"memory": 0, "neighbour": 1, "disk": 2}


@dataclass(frozen=True)
class Holding:
    """A run of old ranks one node holds."""

    ranks: str
    held: tuple[tuple[int, int], ...]  # (step, world) pairs every one of these ranks holds complete
    where: str  # "memory" | "neighbour" | "disk"
    node: str  # the holder's node id
    peer: tuple[str, int] | None = None  # where the holder serves copies to other nodes


@dataclass(frozen=True)
class Source:
    """Where a run of old ranks' state of the plan's step is read."""

    ranks: str
    where: str
    node: str
    peer: tuple[str, int] | None = None


@dataclass(frozen=True)
class Plan:
    """The round's resume: ``step`` of a ``world``-rank job, each rank's state from its ``Source``."""

    step: int
    world: int
    sources: tuple[Source, ...]

    def source(self, rank: int) -> Source | None:
        return next((s for s in self.sources if rank in parse_ranges(s.ranks)), None)


def summarize(held: Mapping[int, Iterable[tuple[int, int]]], where: str, node: str,
              peer: tuple[str, int] | None) -> list[Holding]:
    """One node's ranks (rank -> the (step, world) pairs it holds) as holdings: ranks that hold the same pairs share
    one (ranks that save in step hold the same: a node of 8 ranks says one or two)."""
    groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for rank, pairs in held.items():
        key = tuple(sorted(set(pairs), reverse=True))
        if key:
            groups.setdefault(key, []).append(rank)
    return [Holding(range_string(ranks), key, where, node, peer) for key, ranks in sorted(groups.items(),
                                                                                          key=lambda kv: min(kv[1]))]


def plan(holdings: Sequence[Holding]) -> Plan | str:
    """The round's plan; the reason (one phrase) when no step is held by every old rank, ``""`` when nothing is held."""
    held: dict[int, list[Held]] = {}
    for h in holdings:
        for rank in parse_ranges(h.ranks):
            held.setdefault(rank, []).extend(Held(step, world, h.where) for step, world in h.held)
    resume = consistent(held)
    if resume is None:
        return why_none(held) or ""
    best: dict[int, Holding] = {}
    for h in sorted(holdings, key=lambda h: (_ORDER.get(h.where, 3), h.node)):
        if (resume.step, resume.world) not in h.held:
            continue
        for rank in parse_ranges(h.ranks):
            if rank < resume.world:
                best.setdefault(rank, h)
    runs: dict[tuple[str, str, tuple[str, int] | None], list[int]] = {}
    for rank in range(resume.world):
        h = best[rank]
        runs.setdefault((h.where, h.node, h.peer), []).append(rank)
    sources = [Source(range_string(ranks), where, node, peer) for (where, node, peer), ranks in runs.items()]
    return Plan(resume.step, resume.world, tuple(sorted(sources, key=lambda s: parse_ranges(s.ranks)[0])))


def holdings_value(holdings: Sequence[Holding]) -> bytes:
    import json  # noqa: PLC0415 - the records travel between nodes only: one node never loads it

    return json.dumps([{"ranks": h.ranks, "held": [list(p) for p in h.held], "where": h.where, "node": h.node,
                        "peer": list(h.peer) if h.peer else None} for h in holdings], separators=(",", ":")).encode()


def holdings_from(value: bytes) -> list[Holding]:
    """A node's holdings; ``ValueError`` for anything else."""
    import json  # noqa: PLC0415 - see holdings_value()

    try:
        return [Holding(str(d["ranks"]), tuple((int(s), int(w)) for s, w in d["held"]), str(d["where"]), str(d["node"]),
                        _peer(d.get("peer"))) for d in json.loads(value)]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a node's kept holdings: {exc}") from None


def plan_value(result: Plan | str) -> bytes:
    import json  # noqa: PLC0415 - the records travel between nodes only: one node never loads it

    if isinstance(result, str):
        return json.dumps({"none": result}, separators=(",", ":")).encode()
    return json.dumps({"step": result.step, "world": result.world,
                       "from": [{"ranks": s.ranks, "where": s.where, "node": s.node, "peer": list(s.peer) if s.peer else None}
                                for s in result.sources]}, separators=(",", ":")).encode()


def plan_from(value: bytes) -> Plan | str:
    """The round's plan, or why there is none; ``ValueError`` for anything else."""
    import json  # noqa: PLC0415 - see holdings_value()

    try:
        d = json.loads(value)
        if "none" in d:
            return str(d["none"])
        return Plan(int(d["step"]), int(d["world"]), tuple(Source(str(s["ranks"]), str(s["where"]), str(s["node"]),
                                                                  _peer(s.get("peer"))) for s in d["from"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a round's kept plan: {exc}") from None


def _peer(value: object) -> tuple[str, int] | None:
    if not value:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise TypeError(f"a peer endpoint is [address, port], not {value!r}")
    return str(value[0]), int(value[1])


__all__ = ["Holding", "Plan", "Source", "holdings_from", "holdings_value", "plan", "plan_from", "plan_value",
           "summarize"]
