"""Blame and exclusion, as pure functions of what the coordinator knows after a round (no I/O).

A node is a ``NodeId``: its hostname and the address it advertises (``--local-addr`` or the resolved one). Not the
rendezvous's node id, which is new each time a launcher starts: a launcher that a scheduler starts again on the same
host is the same node, so its failures still count and the job's blocklist still refuses it.

``judge`` takes a round's end: the node holding the job's root cause (the first failing rank's node, or the stalled
outlier under ``--hang-action fail``), or None when nobody is to blame (a stop, a signal, a lost node, a regroup);
the failures counted so far; ``--max-node-failures`` K (0: blame never excludes); and the round's verdicts of the health
and network checks. It returns the new counts and the nodes to exclude now, each with the reason its line gives.
``after_exclusion`` then says what the job does without them: go on, let spares take their places, or end now
because fewer than MIN nodes are left and no spare waits, rather than wait for ``join_timeout``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rankrun.record import record


@record
class NodeId:
    """A node as the blocklist knows it: its hostname and its advertised address."""

    host: str
    addr: str

    def __str__(self) -> str:
        return self.addr if self.host == self.addr else f"{self.host} ({self.addr})"


@record
class Failure:
    """A round's failure, as blame sees it: the node holding the root cause and the root cause in one line
    (``rank 5 exited 1: uncorrectable ECC error``)."""

    node: NodeId
    what: str


@record
class Judgement:
    """After a round: the failures counted against each node, and the nodes to exclude now (node → reason)."""

    counts: Mapping[NodeId, int]
    excluded: Mapping[NodeId, str]


def judge(failure: Failure | None, counts: Mapping[NodeId, int], max_node_failures: int,
          health: Mapping[NodeId, str], network: Mapping[NodeId, str] | None = None) -> Judgement:
    """The round's blame and exclusions (pure). ``failure`` is None when the round ended without blame; ``health``
    and ``network`` map each node found unhealthy this round to its check's reason. A node is excluded when its check
    says so, or when the failures blamed on it reach ``max_node_failures`` (never when that is 0); a node excluded
    for several of these has them all in its reason, the checks first."""
    if max_node_failures < 0:
        raise ValueError(f"max_node_failures must be 0 or more, not {max_node_failures}")
    new_counts = dict(counts)
    reasons: dict[NodeId, list[str]] = {}
    for node, reason in health.items():
        reasons.setdefault(node, []).append(f"health check: {reason}")
    for node, reason in (network or {}).items():
        reasons.setdefault(node, []).append(f"network check: {reason}")
    if failure is not None:
        blamed = new_counts[failure.node] = new_counts.get(failure.node, 0) + 1
        if max_node_failures and blamed >= max_node_failures:
            times = "1 failure" if blamed == 1 else f"{blamed} failures"
            reasons.setdefault(failure.node, []).append(f"blamed for {times}, the last: {failure.what}")
    return Judgement(counts=new_counts, excluded={node: "; ".join(why) for node, why in reasons.items()})


@record
class GoOn:
    """The job re-forms on the nodes that remain: at least MIN, no spare waiting."""


@record
class Replace:
    """Spares waiting take the excluded nodes' places (as many as were excluded, up to MAX)."""

    spares: tuple[NodeId, ...]


@record
class CannotGoOn:
    """Fewer than MIN nodes are left and not enough spares wait: every node ends now, with this line."""

    line: str


AfterExclusion = GoOn | Replace | CannotGoOn


def after_exclusion(remaining: Sequence[NodeId], spares: Sequence[NodeId], excluded: Mapping[NodeId, str],
                    min_nodes: int, max_nodes: int) -> AfterExclusion:
    """What the job does once ``excluded`` are out (pure): ``remaining`` are the round's other members, ``spares``
    the nodes waiting outside the round, in the order they would be taken."""
    room = max(0, max_nodes - len(remaining))
    taken = tuple(spares[:min(len(excluded), room)])
    if len(remaining) + len(taken) >= min_nodes:
        return Replace(taken) if taken else GoOn()
    named = "".join(f"node {node} is excluded: {reason}; " for node, reason in excluded.items())
    left = len(remaining) + len(taken)
    waiting = "no spare waits" if not spares else f"only {_count(len(spares), 'spare')} {'waits' if len(spares) == 1 else 'wait'}"
    nodes = f"{_count(left, 'node')} {'remains' if left == 1 else 'remain'}"
    return CannotGoOn(f"the job cannot go on: {named}{nodes} and {waiting}, fewer than MIN = {min_nodes}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
