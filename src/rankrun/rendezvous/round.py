"""The rendezvous decisions, as pure functions of what the coordinator knows (no I/O, ``now`` is an argument).

One coordinator per job (the agent hosting the embedded store, or the one elected on etcd) turns the live node keys and the
round's results into the next step; every other node only reads its own assignment and the
small round key. ``place`` orders a round's members, ``next_step`` says what to do about the
round. Both are property-tested (ranks dense and unique, MIN/MAX respected, survivors keep their
ranks, the host is group rank 0).

Blame and exclusion are decided here too: ``blamed`` names the node held to account for a failed round (the first
failure the store got, or for a stall the node its stack report names), ``over_limit`` excludes it on its
``max_node_failures``-th blame, and a node that says it is unhealthy (``View.unhealthy``) is excluded at once. The
steps carry the exclusions (``Restart``, ``Regroup``, ``Finish``, or ``Exclude`` alone); the coordinator leaves an
excluded node out of every later ``View``, so the placement never sees it again: a spare takes its place, or the job
ends at once when too few nodes are left.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from rankrun.policy import Action, Failed, decide
from rankrun.ranks import NodeRanks, NodeSlots, assign_node_ranks
from rankrun.told import failure_line

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
    # its own --health-check failed before it joined (why): said in the same write as its join, so that the coordinator
    # never counts it in a round, whatever it decides before another write of the node's could reach it
    unhealthy: str | None = None

    @property
    def name(self) -> str:
        """The node as every reason and event names it: ``id at addr`` (the id alone without an address)."""
        return f"{self.id} at {self.addr}" if self.addr else self.id


@dataclass(frozen=True)
class Settings:
    min_nodes: int
    max_nodes: int
    last_call_timeout: float
    max_restarts: int
    static: bool = False
    max_node_failures: int = 0  # a node blamed for this many failures is excluded from the job (0: never)
    network_check: bool = False  # --network-check: every round of 3 nodes or more is checked before its workers start
    health_timeout: float | None = None  # --health-check-timeout with a --health-check (members run it before the above)
    join_timeout: float | None = None  # before the first round, the job ends this long after the coordinator began


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
    stall: str | None = None  # the workers stalled (--hang-action fail): the stall's cause, one line; no root then
    blame: str | None = None  # a stall's: the node holding its outliers, as the job's stack report names it


@dataclass(frozen=True)
class View:
    """What the coordinator knows when it decides."""

    # the live nodes (their leases hold); the coordinator's own, not a copy: it decides after each turn's events, and a
    # copy of 32,768 nodes each time was 2 s of the host's CPU while they joined (len() is all a forming round needs)
    nodes: Collection[NodeInfo]
    phase: Phase
    round: int
    members: tuple[str, ...]  # node ids of the current (or last) round, in group-rank order
    restarts: int  # restarts used by the whole job
    min_since: float | None = None  # when enough nodes (MIN) were first there in this forming phase
    results: Mapping[str, Result] | None = None
    leader: str | None = None  # the coordinator's own node (dynamic: group rank 0, it holds the worker store)
    gone: Mapping[str, tuple[str, str]] | None = None  # a node that left → (how to name it, why it went)
    alone_since: float | None = None  # when the coordinator's node was left alone by a round's loss (forming)
    # Exclusion's inputs. ``nodes`` holds only the nodes still eligible: an excluded one is left out by the coordinator.
    blame: Mapping[str, int] | None = None  # node id → failures it was blamed for in the job's earlier rounds
    unhealthy: Mapping[str, str] | None = None  # node id → why it says it is unhealthy (``Member.report_unhealthy``)
    began: float | None = None  # when the coordinator began (before the first round, join_timeout counts from it)


@dataclass(frozen=True)
class Exclusion:
    """A node left out of the job for good, and why (in words for every node's line and event)."""

    node: str
    reason: str


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
    excluded: tuple[Exclusion, ...] = ()  # left out of every later round (an unhealthy member)


@dataclass(frozen=True)
class Restart:
    """A worker failed somewhere: stop every node's workers, run the round again (counted once, for the job)."""

    reason: str
    lost: tuple[str, ...] = field(default=(), compare=False)  # the nodes lost, as the reason names them (told, not decided)
    excluded: tuple[Exclusion, ...] = ()  # left out of every later round (blamed too often, or unhealthy)
    blamed: str | None = field(default=None, compare=False)  # the node held to account for the failure (``blamed``)


@dataclass(frozen=True)
class Finish:
    ok: bool
    reason: str
    stranded: bool = False  # not the workers' doing: too few nodes were left to go on (an infrastructure error)
    lost: tuple[str, ...] = field(default=(), compare=False)  # the nodes lost, as the reason names them (told, not decided)
    excluded: tuple[Exclusion, ...] = ()
    blamed: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Exclude:
    """Leave these nodes out of the job, nothing else changing (a spare or a forming round's node said it is unhealthy)."""

    excluded: tuple[Exclusion, ...]


Step = Wait | Start | Regroup | Restart | Finish | Exclude


def place(nodes: Collection[NodeInfo], previous: Sequence[str], settings: Settings, leader: str | None = None) -> Placement:
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
    was = set(previous)  # not ``in previous``: a tuple of every member, for every node (O(n²) as a round re-forms)
    newcomers = deque(n.id for n in sorted(nodes, key=lambda n: n.joined) if n.id not in was)
    order: list[str] = []
    for member in previous:
        if member in alive:
            order.append(member)
        elif newcomers:
            order.append(newcomers.popleft())  # the newcomer takes the leaver's place: the others keep theirs
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
    out = _sick(view)
    if out:
        # Before the first round more nodes may still come (join_timeout bounds the wait); once the job has run, or
        # in a static job, whose node ranks nobody else can fill, a round that cannot form without it ends now.
        if (view.round > 0 or settings.static) and not _goes_on(view, settings, out):
            return _stranded(view, settings, out)
        return Exclude(out)
    if not enough(view, settings):
        return _short(view, settings, now)
    placement = place(view.nodes, view.members, settings, view.leader)
    if settings.static or len(view.nodes) >= settings.max_nodes:
        return Start(placement)
    deadline = (view.min_since if view.min_since is not None else now) + settings.last_call_timeout
    return Start(placement) if now >= deadline else Wait(deadline)


def _first_wait(view: View, settings: Settings, now: float) -> Step:
    """Too few nodes for the first round: wait for more until ``join_timeout`` after the coordinator began, then end
    the job for every node. (Each node's own join_timeout would end only that node: the others waited on, up to their
    own, and the host for them, so a job asked to give up after 8 s took as much longer as its nodes' starts differ.)"""
    timeout = settings.join_timeout
    if timeout is None or view.began is None:
        return Wait(None)
    deadline = view.began + timeout
    if now < deadline:
        return Wait(deadline)
    return Finish(False, join_timed_out(view, settings, timeout), stranded=True)


def join_timed_out(view: View, settings: Settings, timeout: float) -> str:
    """``timed out after 8 s (join_timeout) waiting for the other nodes: 1 of 2 joined`` (static: and the node ranks
    never seen), as a node that times out by itself says it."""
    wanted = str(settings.min_nodes) if settings.min_nodes == settings.max_nodes else f"{settings.min_nodes}-{settings.max_nodes}"
    text = (f"timed out after {timeout:.0f} s (join_timeout) waiting for the other nodes: "
            f"{len(view.nodes)} of {wanted} joined")
    if settings.static:
        missing = sorted(set(range(settings.max_nodes)) - {n.static_rank for n in view.nodes})
        text += f"; node ranks never seen: {', '.join(map(str, missing))}"
    return text


def _short(view: View, settings: Settings, now: float) -> Step:
    """Too few nodes to form a round. Before the first round: wait (join_timeout bounds the members). After a round
    whose loss left the coordinator alone — most likely its own network failed, not everyone else's — wait
    ``last_call_timeout`` for nodes to come back, then end the job rather than hold it for join_timeout."""
    if view.round == 0:
        return _first_wait(view, settings, now)
    if view.alone_since is None:
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
    # decided after each turn's results as a round ends (thousands of turns at 32,768 nodes): each whole-round scan
    # only where its answer can matter (the same steps). With the coordinator's member set, the host's CPU for a
    # 32,768-node round's end went from 16-19 s to 4-6 s (32 results a turn), 6-7.5 s to 1.1-1.4 s (256):
    # bench/round_end.py
    alive = {n.id for n in view.nodes}
    results = view.results or {}
    lost = [m for m in view.members if m not in alive and m not in results]
    failures = sorted((r.revision, m) for m, r in results.items() if not r.ok)
    culprit = blamed(results, view.members) if failures else None  # no failure, nobody to blame
    out = _sick(view)
    limit = over_limit(view, settings, culprit)
    if limit is not None and all(e.node != limit.node for e in out):
        out += (limit,)
    if failures or (lost and settings.static):
        why = _reported(failures[0][1], results[failures[0][1]]) if failures else _lost(view, lost)
        return _failed(view, settings, why, lost, out, culprit)
    if lost or out:
        return _without(view, settings, lost, out, set(view.members))
    if len(results) >= len(view.members) and all(m in results for m in view.members):  # fewer: someone has not
        return Finish(True, "every node's workers succeeded")
    if len(view.members) < settings.max_nodes and not settings.static:  # room for a newcomer
        members = set(view.members)
        joined = next((n for n in view.nodes if n.id not in members), None)
        if joined is not None:
            return Regroup(f"node {joined.id} joined")
    return Wait(None)


def _without(view: View, settings: Settings, lost: list[str], out: tuple[Exclusion, ...], members: set[str]) -> Step:
    """Nodes lost, or excluded, in a round that did not fail: re-form without them (without a restart), or, where
    only spares were excluded, go on as it is."""
    if not lost and all(e.node not in members for e in out):
        return Exclude(out)
    if out and not _goes_on(view, settings, out):
        return _stranded(view, settings, out, _names(view, lost))
    why = _lost(view, lost) if lost else f"node {_name(view, out[0].node)} was excluded: {out[0].reason}"
    return Regroup(why, _names(view, lost), excluded=out)


def _failed(view: View, settings: Settings, why: str, lost: list[str], out: tuple[Exclusion, ...],  # noqa: PLR0917
            culprit: str | None) -> Step:
    """The round failed: restart it (without the excluded nodes) while the budget lasts, else end the job."""
    if decide(Failed(), view.restarts, settings.max_restarts) is not Action.RESTART:  # the one budget rule, as one node's
        return Finish(False, why, lost=_names(view, lost), excluded=out, blamed=culprit)
    if out and not _goes_on(view, settings, out):
        return _stranded(view, settings, out, _names(view, lost), culprit)
    return Restart(why, _names(view, lost), excluded=out, blamed=culprit)


# --- blame and exclusion


def _reported(node: str, result: Result) -> str:
    """Why the round failed, as the coordinator says it: who reported the first failure, and a stall's cause."""
    return f"node {node} reported a stall: {result.stall}" if result.stall is not None else \
        f"node {node} reported a worker failure"


def first_failure(results: Collection[Result]) -> Result | None:
    """The round's first failure: the failed result the store got first (its revision), never by anyone's clock. Its
    ``summary`` is the job's cause in the end's word, its ``root`` the failure every node's restart line names."""
    return min((r for r in results if not r.ok), key=lambda r: r.revision, default=None)


def blamed(results: Mapping[str, Result], members: Sequence[str] | None = None) -> str | None:
    """The node held to account for a round (pure), once; ``members``: the round's (a stall's blame outside them,
    a damaged or stale name, is no one's).

    A worker failed first (the store's first failed result, by revision): its node. The nodes whose workers failed
    after it most likely failed because of it. A stall first (``--hang-action fail``): every node whose workers were
    silent fails its round, whichever hears of it first, so the node that reported first is no more to blame than
    another; the node the job's stack report names (``Result.blame``: the one holding the smallest group of stacks,
    the outliers) is, from the first stall result that names one. A stall that names none (no single node holds the
    outliers: every rank waits in the same place, a tie, outliers on several nodes, or a node's stacks were missing)
    blames nobody: arbitrary blame would exclude a healthy node, and the stall still spends a restart. A result
    without the stall key (an older launcher's) counts as a worker failure. A round stopped for a signal, a lost node
    or a regroup has no failed result, hence nobody to blame."""
    failures = sorted(((r.revision, node) for node, r in results.items() if not r.ok))
    if not failures:
        return None
    first = failures[0][1]
    if results[first].stall is None:
        return first
    named = (results[node].blame for _, node in failures if results[node].stall is not None)
    return next((b for b in named if b is not None and (members is None or b in members)), None)


def over_limit(view: View, settings: Settings, culprit: str | None) -> Exclusion | None:
    """``culprit``'s exclusion when this failure is its ``--max-node-failures``-th (pure); None below, or with 0."""
    limit = settings.max_node_failures
    if culprit is None or limit <= 0:
        return None
    count = (view.blame or {}).get(culprit, 0) + 1
    if count < limit:
        return None
    result = _evidence(view.results or {}, culprit)
    last = _said(result) if result is not None else "its workers failed"
    return Exclusion(culprit, f"blamed for {count} failures of the job (--max-node-failures {limit}); the last: {last}")


def _evidence(results: Mapping[str, Result], culprit: str) -> Result | None:
    """The result that blamed ``culprit``: the first stall result naming it (its own node may have reported nothing:
    its workers were not silent, or the round moved on first), else its own."""
    named = sorted((r.revision, node) for node, r in results.items() if not r.ok and r.stall is not None and r.blame == culprit)
    return results[named[0][1]] if named else results.get(culprit)


def _said(result: Result) -> str:
    """A failure in one line, from its root cause's keys where its node gave them (as every node's restart line says
    it: ``rank 5 on HOST exited 1: Type: message``), a stall's cause (``the job stalled: no output for 5 s; rank 3 on
    HOST (the smallest group of stacks) at FRAME``), else its summary's first line."""
    if result.stall is not None:
        return f"the job stalled: {result.stall}"
    root = result.root or {}
    rank, host, code, sig, exc = (root.get(k) for k in ("rank", "host", "exit_code", "signal", "exception"))
    if not isinstance(rank, int):
        return result.summary.split("\n")[0] or "its workers failed"
    return failure_line(rank, host if isinstance(host, str) else None, code if isinstance(code, int) else None,
                        sig if isinstance(sig, str) else None, exc if isinstance(exc, str) else None)


def _sick(view: View) -> tuple[Exclusion, ...]:
    """The eligible nodes that said they are unhealthy, in join order."""
    unhealthy = view.unhealthy or {}
    if not unhealthy:
        return ()
    return tuple(Exclusion(n.id, f"unhealthy: {unhealthy[n.id]}") for n in sorted(view.nodes, key=lambda n: n.joined)
                 if n.id in unhealthy)


def _goes_on(view: View, settings: Settings, out: tuple[Exclusion, ...]) -> bool:
    """Whether a round can form without ``out`` from the live nodes (a spare takes an excluded member's place)."""
    gone = {e.node for e in out}
    return enough(replace(view, nodes=tuple(n for n in view.nodes if n.id not in gone)), settings)


def _name(view: View, node: str) -> str:
    """A node as the reasons name it (``id at addr``, as a lost node is named)."""
    info = next((n for n in view.nodes if n.id == node), None)
    return info.name if info is not None else node


def _stranded(view: View, settings: Settings, out: tuple[Exclusion, ...], lost: tuple[str, ...] = (),
              culprit: str | None = None) -> Finish:
    """Excluding ``out`` leaves too few nodes, and no spare: every node ends now, not at join_timeout."""
    left = len(view.nodes) - len({e.node for e in out})
    first = out[0]
    more = f" (and {len(out) - 1} more)" if len(out) > 1 else ""
    needed = (f"{left} node(s) left, min {settings.min_nodes} needed" if not settings.static
              else f"a static job (--nnodes {settings.max_nodes}) cannot go on without it")
    return Finish(False, f"node {_name(view, first.node)} was excluded{more} ({first.reason}): {needed}", stranded=True,
                  lost=lost, excluded=out, blamed=culprit)
