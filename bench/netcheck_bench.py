"""What the network check's parts cost (``rankrun.health.probe``, ``rankrun.health.outliers``).

``python bench/netcheck_bench.py [--reps 21] [--nodes 512]``. Three parts:

- **one node's measure**: ``measure()`` with its defaults (10 round trips, 4 MiB each way) against a ``ProbeServer`` on
  127.0.0.1, in one process: wall and CPU (of both sides: the process's) per measure, median of ``reps``. What each
  agent of a round spends; each measures one link, so this does not grow with the job.
- **a ring on loopback**: 8 endpoints in one process, each measuring the next at once, as a round's agents do: wall
  until the last is done (the 2 cores shared by all 8, so an upper bound for 8 machines).
- **the rule at N simulated nodes**: ``find_suspects`` + ``confirm`` over a ring of N links with jitter (round trips
  0.2 ms ± 20 %, throughput 1 GB/s ± 20 %), with one node 150 ms slow and with none; milliseconds, median of ``reps``.
  What the coordinator adds to a round; checked to name exactly the slow node, and nobody in the clean ring.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))

from rankrun.health.outliers import Link, confirm, find_suspects  # noqa: E402
from rankrun.health.probe import ProbeServer, measure  # noqa: E402

SECRET = b"bench-secret"
RING = 8


@dataclass
class Result:
    measure_wall: list[float]  # seconds, one measure each
    measure_cpu: list[float]
    ring_wall: list[float]  # seconds, RING endpoints measuring at once
    nodes: int
    rule_slow: list[float]  # seconds, find_suspects + confirm with one slow node
    rule_clean: list[float]


async def _measures(reps: int) -> tuple[list[float], list[float]]:
    server = ProbeServer("127.0.0.1", SECRET)
    port = await server.start()
    walls, cpus = [], []
    try:
        await measure("127.0.0.1", port, SECRET)  # warm
        for _ in range(reps):
            wall, cpu = time.perf_counter(), time.process_time()
            await measure("127.0.0.1", port, SECRET)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    finally:
        await server.close()
    return walls, cpus


async def _ring(reps: int) -> list[float]:
    servers = [ProbeServer("127.0.0.1", SECRET) for _ in range(RING)]
    ports = [await s.start() for s in servers]
    walls = []
    try:
        for _ in range(reps):
            start = time.perf_counter()
            await asyncio.gather(*(measure("127.0.0.1", ports[(i + 1) % RING], SECRET) for i in range(RING)))
            walls.append(time.perf_counter() - start)
    finally:
        for s in servers:
            await s.close()
    return walls


def _link(rng: random.Random, slow: bool) -> Link:
    rtt = 0.0002 * rng.uniform(0.8, 1.2) + (0.150 if slow else 0.0)
    return Link(rtt=rtt, forward=1e9 * rng.uniform(0.8, 1.2), backward=1e9 * rng.uniform(0.8, 1.2))


def rule_once(nodes: int, slow: int | None, rng: random.Random) -> tuple[float, dict[int, str]]:
    """One round's judgement over ``nodes`` simulated links (node ``slow`` 150 ms slow): seconds, and who it marks."""
    ring = [_link(rng, slow is not None and slow in (i, (i + 1) % nodes)) for i in range(nodes)]
    start = time.perf_counter()
    found = find_suspects(ring)
    reprobes = {node: _link(rng, node == slow) for node in found.partners}  # each suspect against its partner
    marked = confirm(found, ring, reprobes)
    return time.perf_counter() - start, marked


def run(reps: int, nodes: int) -> Result:
    walls, cpus = asyncio.run(_measures(reps))
    ring = asyncio.run(_ring(reps))
    rng = random.Random(23)
    slow, clean = [], []
    for _ in range(reps):
        took, marked = rule_once(nodes, nodes // 3, rng)
        assert list(marked) == [nodes // 3], marked
        slow.append(took)
        took, marked = rule_once(nodes, None, rng)
        assert marked == {}, marked
        clean.append(took)
    return Result(walls, cpus, ring, nodes, slow, clean)


def details(r: Result) -> list[str]:
    ms = lambda values: f"{statistics.median(values) * 1000:.2f} ms"  # noqa: E731
    return [
        f"network check: one node's measure on loopback (10 round trips, 4 MiB each way): {ms(r.measure_wall)} wall, "
        f"{ms(r.measure_cpu)} CPU (both sides), median of {len(r.measure_wall)}",
        f"network check: {RING} endpoints on loopback in one process, each measuring the next at once: "
        f"{ms(r.ring_wall)} until the last, median of {len(r.ring_wall)}",
        f"network check: find_suspects + confirm at {r.nodes} simulated nodes: {ms(r.rule_slow)} with one 150 ms node "
        f"(named), {ms(r.rule_clean)} with none (nobody named), median of {len(r.rule_slow)}",
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--nodes", type=int, default=512)
    args = parser.parse_args(argv)
    for line in details(run(args.reps, args.nodes)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
