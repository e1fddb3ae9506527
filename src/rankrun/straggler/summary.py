"""One node's window as the host judges the whole job from it (pure): a few hundred bytes through the store.

Several nodes: each agent watches its own workers (``agent.stragglers.watch``) and, every window, writes what it saw: per
local rank its stack-sample counts and /proc figures (``verdict.RankWindow``), and the arrivals of a sample of the
collectives its ranks completed, already on the host's clock (``clock``). The host merges every node's summaries
(``Merge``), judges the job (``verdict.judge``) and publishes the verdict, which every node prints once.

Which collectives: at most ``KEEP`` of a window's per group, those whose sequence number is a multiple of a power
of two (``stride``). Nodes count their windows' collectives apart, so their strides may differ by a factor of two;
the multiples of a larger power of two are among those of a smaller one, so every node's sample holds the
coarsest one, and the host judges the collectives every rank's node sent. The share of collectives a rank was late
on is estimated from the sample, and said of the window's whole count (``total``).

The encoding: JSON, times as whole tenths of a millisecond after the summary's ``base`` (a lag is judged to 5 ms).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from rankrun.straggler.verdict import Arrivals, RankWindow, Straggler

KEEP = 16  # collectives a window of each group, at most
TICK = 1e-4  # seconds: the resolution of the times sent
STALE = 3  # windows a collective waits at the host for the other nodes' arrivals before it is dropped


@dataclass(frozen=True)
class NodeWindow:
    """One node's window: its ranks' figures, a sample of its completed collectives' arrivals (host clock, seconds),
    and how many collectives it completed in all."""

    node: str
    number: int  # the node's own window count, from 1
    ranks: tuple[RankWindow, ...]
    arrivals: Mapping[tuple[str, int], Mapping[int, float]]
    total: int
    length: float  # seconds the window lasted


def stride(count: int, keep: int = KEEP) -> int:
    """The power of two whose multiples keep at most ``keep`` of ``count`` consecutive sequence numbers (pure)."""
    step = 1
    while count // step > keep:
        step *= 2
    return step


def pick(arrivals: Arrivals, keep: int = KEEP) -> dict[tuple[str, int], Mapping[int, float]]:
    """The collectives a summary sends: per group, those whose number is a multiple of its ``stride`` (pure)."""
    per_group: defaultdict[str, int] = defaultdict(int)
    for group, _ in arrivals:
        per_group[group] += 1
    steps = {group: stride(count, keep) for group, count in per_group.items()}
    return {key: when for key, when in arrivals.items() if key[1] % steps[key[0]] == 0}


def encode(w: NodeWindow) -> bytes:
    times = [t for when in w.arrivals.values() for t in when.values()]
    base = min(times) if times else 0.0
    return json.dumps({
        "node": w.node, "n": w.number, "total": w.total, "len": round(w.length, 3), "base": base,
        "ranks": [[r.rank, r.where, r.samples, r.waiting, None if r.cpu is None else round(r.cpu, 3), r.state]
                  for r in w.ranks],
        "arr": [[g, s, {str(rank): round((t - base) / TICK) for rank, t in when.items()}]
                for (g, s), when in sorted(w.arrivals.items())],
    }, separators=(",", ":")).encode()


def decode(value: bytes) -> NodeWindow:
    """``encode``'s bytes read back; ``ValueError`` for anything else (a node of another version)."""
    try:
        d = json.loads(value)
        base = float(d["base"])
        ranks = tuple(RankWindow(int(r), str(where), int(n), int(wait), None if cpu is None else float(cpu), str(st))
                      for r, where, n, wait, cpu, st in d["ranks"])
        arrivals = {(str(g), int(s)): {int(rank): base + int(t) * TICK for rank, t in when.items()}
                    for g, s, when in d["arr"]}
        return NodeWindow(str(d["node"]), int(d["n"]), ranks, arrivals, int(d["total"]), float(d["len"]))
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a straggler summary: {exc}") from None


class Merge:
    """The host's view of the job: every node's latest window, and the sampled collectives until every rank that
    records their group has sent its arrival (or ``STALE`` rounds of summaries went by)."""

    def __init__(self) -> None:
        self.latest: dict[str, NodeWindow] = {}
        self._pending: dict[tuple[str, int], dict[int, float]] = {}
        self._age: dict[tuple[str, int], int] = {}
        self._ranks: defaultdict[str, set[int]] = defaultdict(set)  # group → every rank seen in it

    def add(self, w: NodeWindow) -> None:
        self.latest[w.node] = w
        for key, when in w.arrivals.items():
            self._pending.setdefault(key, {}).update(when)
            self._age.setdefault(key, 0)
            self._ranks[key[0]].update(when)

    def take(self) -> tuple[list[RankWindow], dict[tuple[str, int], dict[int, float]], float, int]:
        """What to judge now: every node's ranks, the collectives every rank of their group sent, the window's
        length, and the collectives completed (the largest count a node gave); the rest waits, older ones dropped."""
        ready = {}
        for key in list(self._pending):
            when = self._pending[key]
            if set(when) >= self._ranks[key[0]]:
                ready[key] = self._pending.pop(key)
                del self._age[key]
            else:
                self._age[key] += 1
                if self._age[key] > STALE:
                    del self._pending[key], self._age[key]
        ranks = [r for w in self.latest.values() for r in w.ranks]
        length = max((w.length for w in self.latest.values()), default=0.0)
        total = max((w.total for w in self.latest.values()), default=0)
        return ranks, ready, length, total



def verdict_value(found: Sequence[Straggler]) -> bytes:
    """The host's verdict: the job's stragglers now, with their figures (each node says what changed)."""
    return json.dumps([asdict(s) for s in found], separators=(",", ":")).encode()


def verdict_from(value: bytes) -> list[Straggler]:
    """``verdict_value``'s bytes read back; ``ValueError`` for anything else."""
    try:
        return [Straggler(**d) for d in json.loads(value)]
    except (TypeError, ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a straggler verdict: {exc}") from None


def time_value(count: int, now: float) -> bytes:
    """The host's answer to a node's clock question ``count``: its clock as it answered."""
    return json.dumps({"n": count, "t": now}).encode()


def time_from(value: bytes) -> tuple[int, float]:
    """``time_value``'s bytes read back; ``ValueError`` for anything else."""
    try:
        d = json.loads(value)
        return int(d["n"]), float(d["t"])
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"not a clock answer: {exc}") from None
