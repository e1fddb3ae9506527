"""The coordinator's CPU as a large round ends: ``python bench/round_end.py [--nodes N] [--batch B]``.

N nodes join an in-memory store (the hosting agent's) and the real ``Coordinator`` starts their round; then every
node's result arrives, B a turn of the loop (as the embedded server hands the coordinator one wake-up's worth of
reads), and the bench reports the coordinator process's CPU seconds from the first result to the round key saying the
job ended. No network and no simulated agents: this is the host's own decision work, which a round's end made
O(n²) before (a member check that scanned the round's tuple for every result, whole-round scans per decision).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from rankrun.rendezvous.coordinator import Coordinator
from rankrun.rendezvous.keys import Keys, node_value, result_value
from rankrun.rendezvous.round import NodeInfo, Settings
from rankrun.store.memory import MemoryStore

BOUND = 600.0  # seconds before the bench gives up on the round starting or ending


async def _phase_is(store: MemoryStore, key: str, phase: bytes) -> None:
    while True:
        entry = await store.get(key)
        if entry is not None and phase in entry.value:
            return
        await asyncio.sleep(0.001)


async def round_end(nodes: int, batch: int) -> float:
    """CPU seconds of this process from the first result to the job's end."""
    store = MemoryStore()
    keys = Keys.for_run("bench")

    async def nothing() -> None:
        return None

    coordinator = Coordinator(store, keys, Settings(nodes, nodes, 3600.0, 0), master=lambda: ("127.0.0.1", 1),
                              before_round=nothing)
    task = asyncio.create_task(coordinator.run())
    lease = await store.grant(3600.0)
    for i in range(nodes):
        info = NodeInfo(f"n{i:06d}", 0, 1, "default", "127.0.0.1", "bench", None, i == 0)
        await store.put(keys.node(info.id), node_value(info), lease=lease.id)
    await asyncio.wait_for(_phase_is(store, keys.round, b'"running"'), BOUND)
    ok = result_value(True)
    started = time.process_time()
    for at in range(0, nodes, batch):
        for i in range(at, min(nodes, at + batch)):
            await store.put(keys.result(1, f"n{i:06d}"), ok)
        await asyncio.sleep(0)  # the coordinator's turn: it decides on what arrived
        await asyncio.sleep(0)
    await asyncio.wait_for(_phase_is(store, keys.round, b'"ended"'), BOUND)
    spent = time.process_time() - started
    task.cancel()
    return spent


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=32768)
    parser.add_argument("--batch", type=int, default=32, help="results a turn of the loop")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    cpu = asyncio.run(round_end(args.nodes, args.batch))
    if args.json:
        print(json.dumps({"nodes": args.nodes, "batch": args.batch, "cpu_s": round(cpu, 3)}))
    else:
        print(f"{args.nodes} nodes' results, {args.batch} a turn: the coordinator spent {cpu:.3f} s of CPU to the round's end")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
