"""The job's account of its nodes, pure (no store, no clock: the coordinator writes what it decides, at the time it
says): how many failures each node was blamed for, which are excluded and why, the job's blocklist, and the nodes that
said they are unhealthy but are not excluded yet.

The coordinator holds one and feeds it what it learns (a node joined, a node said it is unhealthy, a round's step
excluded or blamed nodes, a node straggled); it answers with what the coordinator must write: a blocklisted node's
refusal, an excluded node's blocklist record, a straggler's line or its report as unhealthy. ``round.next_step`` reads
``blame`` and ``unhealthy`` in the ``View``; ``eligible`` leaves the excluded nodes out of it.

The blame counts live here only: a coordinator taking over on etcd starts them from zero (carrying them in the round
key would make every node read them every round); the exclusions it rebuilds from the blocklist, which lives in the
store as long as the job's keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rankrun.rendezvous.keys import Blocked
from rankrun.rendezvous.round import Exclusion, NodeInfo, Settings


@dataclass(frozen=True)
class Warned:
    """A straggler was blamed, and stays: this line says so (it is not over its limit, or the job needs it)."""

    line: str


@dataclass(frozen=True)
class Reported:
    """A straggler reached its ``--max-node-failures``: it is reported unhealthy (its ``unhealthy/`` key, as the
    network check does), so the round re-forms without it."""

    reason: str


class Account:
    """The job's account of its nodes (see the module's docstring); ``run_id`` is the job's, on its blocklist records."""

    def __init__(self, run_id: str, settings: Settings) -> None:
        self._run_id = run_id
        self._settings = settings
        self.blame: dict[str, int] = {}  # node id → failures (and stragglers) it was blamed for in the job
        self.excluded: dict[str, str] = {}  # node id → why
        self.blocked: dict[str, Blocked] = {}  # "host@addr" → its blocklist record
        self.unhealthy: dict[str, str] = {}  # node id → why it says it is unhealthy (not excluded yet)
        # every exclusion of the job, (name, why), in every round word: a node that skipped a round (a round that
        # failed at once, while it still stopped its workers) hears of them all the same; a handful, not a list of nodes
        self.exclusions: list[tuple[str, str]] = []

    def blocklisted(self, entries: Iterable[tuple[str, Blocked]]) -> None:
        """The job's blocklist as the store has it (``host@addr`` and its record), read as the coordinator begins."""
        self.blocked.update(entries)

    def joined(self, info: NodeInfo) -> Blocked | None:
        """A node's key appeared: its blocklist record if it is on the job's blocklist (it raced past ``Member.join``'s
        check: it is excluded, to be told so, and never counted), else None. A node whose own check failed before it
        joined is unhealthy from the start, so that no decision counts it."""
        blocked = self.blocked.get(f"{info.host}@{info.addr}") if info.id not in self.excluded else None
        if blocked is not None:
            self.excluded[info.id] = blocked.reason
        if info.unhealthy is not None:
            self.said_unhealthy(info.id, info.unhealthy)
        return blocked

    def said_unhealthy(self, node_id: str, reason: str) -> None:
        """``node_id`` says it is unhealthy (its ``unhealthy/`` key, or its join): the next decision excludes it."""
        if node_id not in self.excluded:
            self.unhealthy[node_id] = reason

    def eligible(self, nodes: Mapping[str, NodeInfo]) -> Mapping[str, NodeInfo]:
        """The live ``nodes`` that are not excluded (``nodes`` themselves while nobody is: O(1) then)."""
        if not self.excluded:
            return nodes
        return {i: n for i, n in nodes.items() if i not in self.excluded}

    def exclude(self, exclusion: Exclusion, info: NodeInfo | None, at: float) -> Blocked | None:
        """Leave ``exclusion.node`` out for good (``info``: its node key, None if it is gone already); the record to
        put on the job's blocklist for its host and address, None for a node that is gone (nothing names it)."""
        node_id, reason = exclusion.node, exclusion.reason
        self.excluded[node_id] = reason
        self.unhealthy.pop(node_id, None)
        if info is None:
            self.exclusions.append((node_id, reason))
            return None
        self.exclusions.append((info.name, reason))
        record = self.blocked[f"{info.host}@{info.addr}"] = Blocked(self._run_id, reason, at)
        return record

    def blamed(self, node: str | None) -> None:
        """``node`` was held to account for a round (``round.blamed``; None: nobody was)."""
        if node is not None:
            self.blame[node] = self.blame.get(node, 0) + 1

    def straggler(self, node_id: str, name: str, why: str, *, members: int, spares: bool) -> Warned | Reported | None:
        """``--straggler-action exclude``: ``node_id`` (a member of the running round of ``members`` nodes, named
        ``name``) held a rank the others waited for, window after window; that counts as one blame. At its
        ``--max-node-failures``-th it is reported, but only when the job can go on without it (enough nodes stay, or a
        spare waits): a slow node is better than no job. None for a node already excluded."""
        if node_id in self.excluded:
            return None
        self.blamed(node_id)
        count, limit, least = self.blame[node_id], self._settings.max_node_failures, self._settings.min_nodes
        if limit <= 0 or count < limit:
            return Warned(f"rendezvous: node {name} blamed for a straggler ({count} of --max-node-failures {limit}): {why}")
        if members - 1 < least and not spares:
            return Warned(f"rendezvous: node {name} is a straggler again ({why}), but the job cannot go on without it "
                          f"({members} nodes, at least {least}, no spare): it stays")
        return Reported(f"blamed for {count} stragglers (--max-node-failures {limit}); the last: {why}")
