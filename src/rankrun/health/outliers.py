"""The network check's outlier rule, as pure functions of the round's measurements (no I/O).

The round's nodes, in group-rank order, form a ring: pair ``i`` is node ``i`` and node ``i + 1`` (the last node's pair
wraps to node 0), measured by node ``i`` as a ``Link``: the round trip of small messages, and the throughput of a few
MiB each way. A sick node (a slow NIC, a bad cable, a CPU pinned elsewhere) makes both pairs that touch it slow, so:

- The round's **baseline** is the median of the pairs but the two worst (the two one sick node spoils): the plain
  median of a large ring, and still the healthy links' in a ring of 3 or 4 nodes, where the sick node's two pairs would
  be the median themselves. Throughput is a pair's slower direction.
- A pair is an **outlier** when its round trip is over ``max(3 * baseline, baseline + 10 ms)``, or its throughput under
  a third of the baseline's.
- A node both of whose pairs are outliers is a **suspect** (two sick neighbours make the node between them one too,
  hence the re-probe). The two nodes of a lone outlier pair are **ambiguous**: either of them, or the link between them.
- Each suspect and ambiguous node is probed once more against the nearest **known-good** node (neither suspect nor
  ambiguous, one with no outlier pair where there is one); ``confirm`` marks it unhealthy when that link is an outlier
  too. A lone pair whose two nodes both pass is the link's fault, and nobody is marked.

Two nodes cannot tell which of them is slow (every pair touches both), and a ring in which no node is known-good has
nothing to compare against: nobody is suspect there. An unreachable neighbour is measured as an infinite round trip and
no throughput.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import field

from rankrun.record import record

RTT_FACTOR = 3.0
RTT_MARGIN = 0.010  # seconds: on a fast network 3 * the median is still well within normal jitter
THROUGHPUT_FACTOR = 3.0
SPOILED = 2  # the pairs one sick node spoils: set aside from the baseline


@record
class Link:
    """One pair's measurements: ``rtt`` seconds (a round trip of a small message), and throughput in bytes/s from the
    measuring node to the other (``forward``) and back (``backward``)."""

    rtt: float
    forward: float
    backward: float

    @property
    def throughput(self) -> float:
        return min(self.forward, self.backward)


@record
class Baseline:
    """The round's typical pair: the medians the outliers are measured against."""

    rtt: float
    throughput: float


@record
class Suspects:
    """What the ring says: the baseline, the suspect and ambiguous nodes (ring positions, ascending), and for each of
    them the known-good node to probe it against once more."""

    baseline: Baseline
    suspects: tuple[int, ...] = ()
    ambiguous: tuple[int, ...] = ()
    partners: Mapping[int, int] = field(default_factory=dict)


def baseline(ring: Sequence[Link]) -> Baseline:
    """The round's medians, the ``SPOILED`` worst pairs set aside by each measure (pure; ``ring`` has 3 pairs or more)."""
    rtts = sorted(link.rtt for link in ring)[:len(ring) - SPOILED]
    rates = sorted((link.throughput for link in ring), reverse=True)[:len(ring) - SPOILED]
    import statistics  # noqa: PLC0415 - 3 ms of imports (random, decimal, fractions) every multinode launch would pay

    return Baseline(rtt=statistics.median(rtts), throughput=statistics.median(rates))


def slow_rtt(link: Link, base: Baseline) -> bool:
    return link.rtt > max(RTT_FACTOR * base.rtt, base.rtt + RTT_MARGIN)


def slow_throughput(link: Link, base: Baseline) -> bool:
    return link.throughput < base.throughput / THROUGHPUT_FACTOR


def is_outlier(link: Link, base: Baseline) -> bool:
    return slow_rtt(link, base) or slow_throughput(link, base)


def find_suspects(ring: Sequence[Link]) -> Suspects:
    """The ring's suspect and ambiguous nodes, and whom to re-probe each against (pure). ``ring[i]`` is the pair of
    node ``i`` and node ``i + 1`` (wrapping)."""
    n = len(ring)
    if n <= SPOILED:
        return Suspects(Baseline(rtt=math.nan, throughput=math.nan))
    base = baseline(ring)
    bad = [is_outlier(link, base) for link in ring]
    suspects = tuple(i for i in range(n) if bad[i - 1] and bad[i])  # ring[i - 1] is node i's pair with its predecessor
    ambiguous = tuple(sorted({node for i in range(n) if bad[i] and not bad[i - 1] and not bad[(i + 1) % n]
                              for node in (i, (i + 1) % n)}))
    judged = set(suspects) | set(ambiguous)
    clean = [i for i in range(n) if not bad[i - 1] and not bad[i]]
    good = clean or [i for i in range(n) if i not in judged]
    if not good or not judged:
        return Suspects(base)
    return Suspects(base, suspects, ambiguous, {node: _nearest(node, good, n) for node in sorted(judged)})


def _nearest(node: int, good: list[int], n: int) -> int:
    """The node of ``good`` closest to ``node`` around the ring (the one after it on a tie)."""
    return min(good, key=lambda other: (min((other - node) % n, (node - other) % n), (other - node) % n))


def confirm(found: Suspects, ring: Sequence[Link], reprobes: Mapping[int, Link | None]) -> dict[int, str]:
    """The nodes the network check marks unhealthy (pure), each with the figures its line gives: the suspect and
    ambiguous nodes whose re-probe against their known-good partner (``reprobes``: None when it got no answer) is an
    outlier too. A node not re-probed is not judged."""
    unhealthy: dict[int, str] = {}
    n = len(ring)
    for node in (*found.suspects, *found.ambiguous):
        if node not in reprobes:
            continue
        link = reprobes[node]
        if link is None:
            unhealthy[node] = "no answer to a known-good node"
            continue
        if not is_outlier(link, found.baseline):
            continue
        if node in found.suspects:
            reason = _describe([ring[node - 1], ring[node]], found.baseline, "its neighbours")
        else:
            pair = ring[node] if is_outlier(ring[node], found.baseline) else ring[(node - 1) % n]
            reason = _describe([pair, link], found.baseline, "its neighbour and a known-good node")
        unhealthy[node] = reason or _describe([link], found.baseline, "a known-good node") or ""
    return unhealthy


def _describe(links: Sequence[Link], base: Baseline, to: str) -> str | None:
    """The figures of ``links``, all slow in the same way, or None when they are not (the best of them: at least this
    slow)."""
    if all(slow_rtt(link, base) for link in links):
        rtt = min(link.rtt for link in links)
        if math.isinf(rtt):
            return f"no answer from {to}"
        return f"{_ms(rtt)} round trip to {to} (median {_ms(base.rtt)})"
    if all(slow_throughput(link, base) for link in links):
        rate = max(link.throughput for link in links)
        return f"{_rate(rate)} throughput with {to} (median {_rate(base.throughput)})"
    return None


def network_line(position: int, addr: str, reason: str) -> str:
    """The line that names a node the network check marked: ``node 3 (10.200.0.13): network check: 151 ms round trip
    to its neighbours (median 0.21 ms)``."""
    return f"node {position} ({addr}): network check: {reason}"


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.3g} ms"


def _rate(per_second: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if per_second >= size:
            return f"{per_second / size:.3g} {unit}"
    return f"{per_second:.3g} B/s"
