"""The rendezvous decisions, as pure functions of what the coordinator knows (no I/O, ``now`` is an argument).

One coordinator per job (the agent hosting the embedded store, or the one elected on etcd) turns the live node keys and the
round's results into the next step; every other node only reads its own assignment and the
small round key. ``place`` orders a round's members, ``next_step`` says what to do about the
round. Both are property-tested (ranks dense and unique, MIN/MAX respected, survivors keep their
ranks, the host is group rank 0).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rankrun.policy import Action, Failed, decide
from rankrun.ranks import NodeRanks, NodeSlots, assign_node_ranks

__all__ = ["NodeRanks", "NodeSlots", "assign_node_ranks"]  # re-exported: the rendezvous hands out these sums


@dataclass(frozen=True)
class NodeInfo:
    """One joined node, as its node key says (written once, when it joins)."""

    id: str
    joined: int  # the store revision that created its key: the join order, the same for every observer
    nproc: int
    role: str
    addr: str  # the address other nodes reach it on (MASTER_ADDR when it is group rank 0)
    host: str  # its hostname, for messages
    static_rank: int | None = None  # --node-rank in static mode
    is_host: bool = False  # it hosts the store: group rank 0 of every round (dynamic mode)


@dataclass(frozen=True)
class Settings:
    min_nodes: int
    max_nodes: int
    last_call_timeout: float
    max_restarts: int
    static: bool = False


class Phase(enum.Enum):
    FORMING = "forming"
    RUNNING = "running"
    ENDED = "ended"


@dataclass(frozen=True)
class Result:
    """A node's workers ended in a round."""

    ok: bool
    revision: int  # when the store got it: "first failure" is decided by the store, never by clocks
    summary: str = ""  # the failure in a few lines (rank, host, exit, exception)
    root: Mapping[str, object] | None = None  # the root cause's event keys (rank, host, exit_code, signal, exception)


@dataclass(frozen=True)
class View:
    """What the coordinator knows when it decides."""

    nodes: tuple[NodeInfo, ...]  # the live nodes (their leases hold)
    phase: Phase
    round: int
    members: tuple[str, ...]  # node ids of the current (or last) round, in group-rank order
    restarts: int  # restarts used by the whole job
    min_since: float | None = None  # when enough nodes (MIN) were first there in this forming phase
    results: Mapping[str, Result] | None = None
    leader: str | None = None  # the coordinator's own node (dynamic: group rank 0, it holds the worker store)
    gone: Mapping[str, tuple[str, str]] | None = None  # a node that left → (how to name it, why it went)
    alone_since: float | None = None  # when the coordinator's node was left alone by a round's loss (forming)


@dataclass(frozen=True)
class Placement:
    members: tuple[str, ...]  # group-rank order
    spares: tuple[str, ...]


# --- steps


@dataclass(frozen=True)
class Wait:
    until: float | None  # a deadline on the coordinator's clock, or None: until something changes


@dataclass(frozen=True)
class Start:
    placement: Placement


@dataclass(frozen=True)
class Regroup:
    """Stop the running round and form the next one; not counted against --max-restarts."""

    reason: str
    lost: tuple[str, ...] = field(default=(), compare=False)  # the nodes lost, as the reason names them (told, not decided)


@dataclass(frozen=True)
class Restart:
    """A worker failed somewhere: stop every node's workers, run the round again (counted once, for the job)."""

    reason: str
    lost: tuple[str, ...] = field(default=(), compare=False)  # the nodes lost, as the reason names them (told, not decided)


@dataclass(frozen=True)
class Finish:
    ok: bool
    reason: str
    stranded: bool = False  # not the workers' doing: too few nodes were left to go on (an infrastructure error)
    lost: tuple[str, ...] = field(default=(), compare=False)  # the nodes lost, as the reason names them (told, not decided)


Step = Wait | Start | Regroup | Restart | Finish


def place(nodes: Sequence[NodeInfo], previous: Sequence[str], settings: Settings, leader: str | None = None) -> Placement:
    """The members of the next round in group-rank order, and the spares (pure).

    Static: ordered by node rank. Dynamic: the store host (or ``leader``, the elected coordinator
    on a shared store) is group rank 0; earlier members keep
    their ranks where they can (a node that left leaves its place to the first newcomer, in join
    order); remaining gaps close up; newcomers follow in join order; beyond MAX are spares.
    """
    if settings.static:
        ranked = sorted((n for n in nodes if n.static_rank is not None), key=lambda n: n.static_rank or 0)
        return Placement(tuple(n.id for n in ranked[: settings.max_nodes]), tuple(n.id for n in ranked[settings.max_nodes :]))
    alive = {n.id: n for n in nodes}
    newcomers = [n.id for n in sorted(nodes, key=lambda n: n.joined) if n.id not in previous]
    order: list[str] = []
    for member in previous:
        if member in alive:
            order.append(member)
        elif newcomers:
            order.append(newcomers.pop(0))  # the newcomer takes the leaver's place: the others keep theirs
    order += newcomers
    hosts = [leader] if leader in alive else [i for i in order if alive[i].is_host]
    if hosts:
        order.remove(hosts[0])
        order.insert(0, hosts[0])
    return Placement(tuple(order[: settings.max_nodes]), tuple(order[settings.max_nodes :]))


def next_step(view: View, settings: Settings, now: float) -> Step:
    """What the coordinator does now (pure)."""
    if view.phase is Phase.ENDED:
        return Wait(None)
    if view.phase is Phase.FORMING:
        return _forming(view, settings, now)
    return _running(view, settings)


def enough(view: View, settings: Settings) -> bool:
    """Whether a round could start with the live nodes (MIN dynamic; every node rank static)."""
    if settings.static:
        return {n.static_rank for n in view.nodes} >= set(range(settings.max_nodes))
    return len(view.nodes) >= settings.min_nodes


def _forming(view: View, settings: Settings, now: float) -> Step:
    if not enough(view, settings):
        return _short(view, settings, now)
    placement = place(view.nodes, view.members, settings, view.leader)
    if settings.static or len(view.nodes) >= settings.max_nodes:
        return Start(placement)
    deadline = (view.min_since if view.min_since is not None else now) + settings.last_call_timeout
    return Start(placement) if now >= deadline else Wait(deadline)


def _short(view: View, settings: Settings, now: float) -> Step:
    """Too few nodes to form a round. Before the first round: wait (join_timeout bounds the members). After a round
    whose loss left the coordinator alone — most likely its own network failed, not everyone else's — wait
    ``last_call_timeout`` for nodes to come back, then end the job rather than hold it for join_timeout."""
    if view.round == 0 or view.alone_since is None:
        return Wait(None)
    deadline = view.alone_since + settings.last_call_timeout
    if now < deadline:
        return Wait(deadline)
    wanted = f"min {settings.min_nodes}" if not settings.static else f"{settings.max_nodes} (static)"
    return Finish(False, f"every other node was lost and none came back within last_call_timeout "
                         f"({settings.last_call_timeout:g} s): 1 node left, {wanted} needed", stranded=True)


def _lost(view: View, lost: list[str]) -> str:
    name, why = (view.gone or {}).get(lost[0], (lost[0], ""))
    more = f" (and {len(lost) - 1} more)" if len(lost) > 1 else ""
    return f"node {name} was lost{more}" + (f": {why}" if why else "")


def _names(view: View, lost: list[str]) -> tuple[str, ...]:
    """The lost nodes as the reasons name them (``id at addr``)."""
    return tuple((view.gone or {}).get(node, (node, ""))[0] for node in lost)


def _running(view: View, settings: Settings) -> Step:
    alive = {n.id for n in view.nodes}
    results = view.results or {}
    lost = [m for m in view.members if m not in alive and m not in results]
    failures = sorted((r.revision, m) for m, r in results.items() if not r.ok)
    if failures or (lost and settings.static):
        why = f"node {failures[0][1]} reported a worker failure" if failures else _lost(view, lost)
        if decide(Failed(), view.restarts, settings.max_restarts) is Action.RESTART:  # the one budget rule, as one node's
            return Restart(why, _names(view, lost))
        return Finish(False, why, lost=_names(view, lost))
    if lost:
        return Regroup(_lost(view, lost), _names(view, lost))
    if all(m in results for m in view.members):
        return Finish(True, "every node's workers succeeded")
    members = set(view.members)
    joined = [n for n in view.nodes if n.id not in members]
    if joined and len(view.members) < settings.max_nodes and not settings.static:
        return Regroup(f"node {joined[0].id} joined")
    return Wait(None)
