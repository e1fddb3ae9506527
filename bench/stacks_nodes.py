"""The whole job's stack report through the embedded store, for M simulated nodes of 8 ranks (``bench/stacks.py --nodes M``).

Processes: one host serving the embedded store (``StoreServer`` over a ``MemoryStore`` on 127.0.0.1, port 0, as a
rankrun host does), ``PROCS`` processes of simulated agents (nodes 1..M-1, each its own ``StoreClient`` connection
and its own ``Exchange`` serving the round), and this process as node 0, the asker. Every agent's sampling is canned
(8 ranks: in a collective, but one rank of one node elsewhere, each with a pin-memory thread): what this measures is
the exchange (the ask, every node's grouped answer, collecting, rendering, the report written back and printed by
every node), not sampling, which ``bench/stacks.py --ranks`` measures on real workers.

Figures per repetition: a stall, from the ask to the last node having the report ("every node printed"); a
``--stacks`` request, from the ask to the rendered lines; bytes each node sends (its answer) and reads (the report).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))

from rankrun.ranks import NodeRanks  # noqa: E402 - after the path above, run as a script too
from rankrun.rendezvous.keys import Assignment, Keys  # noqa: E402
from rankrun.stacks.dump import Dump, Frame, ThreadStack  # noqa: E402
from rankrun.stacks.exchange import Exchange  # noqa: E402
from rankrun.stacks.report import ProcState, RankSample  # noqa: E402
from rankrun.store.embedded.client import StoreClient  # noqa: E402
from rankrun.store.embedded.server import StoreServer  # noqa: E402
from rankrun.store.memory import MemoryStore  # noqa: E402
from rendezvous import end_process  # noqa: E402
from report import Row, Target  # noqa: E402

SECRET = b"bench-secret"
NPROC = 8
PROCS = 4  # processes of simulated agents: the asker's own loop is not the one serving every other connection
TORCH = "/home/user/venv/lib/python3.11/site-packages/torch"
ODD_NODE = 17
TARGET_S = 2.0  # the whole job's report, 2,048 ranks on 256 nodes
TARGET_BYTES = 4096  # a node's answer with <= 4 distinct stacks
TRAIN = tuple(Frame("/home/user/project/train.py", 100 + i, f"level_{i}") for i in range(6))
COLLECTIVE = (*TRAIN, Frame(f"{TORCH}/distributed/c10d_logger.py", 81, "wrapper"),
              Frame(f"{TORCH}/distributed/distributed_c10d.py", 2501, "all_reduce"))
PIN = (Frame("/usr/lib/python3.11/threading.py", 1002, "_bootstrap"),
       Frame(f"{TORCH}/utils/data/_utils/pin_memory.py", 54, "_pin_memory_loop"),
       Frame("/usr/lib/python3.11/queue.py", 180, "get"))


def _samples(node: int, host: str, asked: int) -> list[RankSample]:
    """Node ``node``'s 8 ranks in a collective, but rank 3 of node 17 waiting on its DataLoader."""
    loader = (*TRAIN, Frame(f"{TORCH}/utils/data/dataloader.py", 631 + asked, "__next__"),  # a new stall each ask
              Frame(f"{TORCH}/utils/data/dataloader.py", 1329, "_next_data"),
              Frame("/usr/lib/python3.11/multiprocessing/queues.py", 113, "get"))
    out = []
    for rank in range(node * NPROC, (node + 1) * NPROC):
        main = loader if node == ODD_NODE and rank == node * NPROC + 3 else COLLECTIVE
        out.append(RankSample(rank, host, Dump((ThreadStack(1, True, main), ThreadStack(2, False, PIN))), ProcState("S", 0.0)))
    return out


def _exchange(client: StoreClient, node: int, nodes: int, show: Callable[[Sequence[str]], None]) -> Exchange:
    place = Assignment(0, node, nodes, NodeRanks(node * NPROC, nodes * NPROC, node * NPROC, nodes * NPROC), "127.0.0.1",
                       29500, 0)
    host = f"node{node:03d}/10.0.{node // 250}.{node % 250 + 1}"
    asked = [0]

    async def sample(why: str) -> list[RankSample]:
        del why
        asked[0] += 1
        return _samples(node, host, asked[0])

    return Exchange(client, Keys.for_run("bench"), f"n{node}", place, host=host, run_id="bench", sample=sample, show=show)


# --------------------------------------------------------------------------- the processes


async def _host() -> None:
    memory = MemoryStore()
    server = StoreServer(memory, SECRET)
    port = await server.start("127.0.0.1", 0)
    print(f"READY {port}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin
    await server.close()
    await memory.close()


async def _agents(port: int, first: int, count: int, nodes: int) -> None:
    printed: list[float] = []
    clients, exchanges, tasks = [], [], []
    for node in range(first, first + count):
        client = await StoreClient.connect("127.0.0.1", port, SECRET)
        exchange = _exchange(client, node, nodes, lambda _lines: printed.append(time.monotonic()))
        tasks.append(asyncio.create_task(exchange.serve()))
        await exchange.serving.wait()
        clients.append(client)
        exchanges.append(exchange)
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "report":
        print(json.dumps({"printed": printed, "sent": [e.sent for e in exchanges]}), flush=True)
        printed.clear()
    for task in tasks:
        task.cancel()
    for client in clients:
        with contextlib.suppress(Exception):
            await client.close()


@dataclass
class Asked:
    stalls: list[tuple[float, float]]  # (ask, report written), monotonic
    requests: list[float]  # seconds
    lines: int
    report_bytes: int
    sent: int


async def _asker(port: int, nodes: int, reps: int) -> Asked:
    client = await StoreClient.connect("127.0.0.1", port, SECRET)
    exchange = _exchange(client, 0, nodes, lambda _lines: None)
    serving = asyncio.create_task(exchange.serve())
    await exchange.serving.wait()
    asked = Asked([], [], 0, 0, 0)
    for rep in range(reps):
        start = time.monotonic()
        report = await exchange.stall(f"{300 + rep}", asyncio.get_running_loop().time())
        asked.stalls.append((start, time.monotonic()))
        asked.report_bytes, asked.lines = len(report.value()), len(report.lines)
        start = time.monotonic()
        await exchange.request()
        asked.requests.append(time.monotonic() - start)
    asked.sent = exchange.sent
    serving.cancel()
    await client.close()
    return asked


# --------------------------------------------------------------------------- the measurement


@dataclass
class NodesResult:
    nodes: int
    stall_ms: list[float]  # ask → report written, per repetition
    everyone_ms: list[float]  # ask → the last node printed it
    request_ms: list[float]
    lines: int
    sent: list[int]  # bytes of each node's answer
    report_bytes: int

    @property
    def ranks(self) -> int:
        return self.nodes * NPROC


def _arrivals(stalls: list[tuple[float, float]], printed: list[float], others: int) -> list[float]:
    """Per repetition: from its ask to the last other node printing its report (nan when one never did)."""
    out = []
    for i, (start, _) in enumerate(stalls):
        end = stalls[i + 1][0] if i + 1 < len(stalls) else float("inf")
        arrivals = [t for t in printed if start <= t < end]
        out.append((max(arrivals) - start) * 1000 if len(arrivals) == others else float("nan"))
    return out


def measure(nodes: int, reps: int) -> NodesResult:
    """M simulated nodes through one embedded store, ``reps`` stalls and requests."""
    py = sys.executable
    host = subprocess.Popen([py, __file__, "--role", "host"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    children: list[subprocess.Popen[str]] = []
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline().split()[1])
        others = list(range(1, nodes))  # node 0 is this process; the rest in PROCS contiguous blocks
        size = max(1, -(-len(others) // PROCS))
        for block in (others[i:i + size] for i in range(0, len(others), size)):
            children.append(subprocess.Popen([py, __file__, "--role", "agents", "--port", str(port), "--first", str(block[0]),
                                              "--count", str(len(block)), "--nodes", str(nodes)],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "READY"
        asked = asyncio.run(_asker(port, nodes, reps))
        printed: list[float] = []
        sent = [asked.sent]
        for child in children:
            assert child.stdin is not None
            assert child.stdout is not None
            child.stdin.write("report\n")
            child.stdin.flush()
            got = json.loads(child.stdout.readline())
            printed += got["printed"]
            sent += got["sent"]
        return NodesResult(nodes, [(b - a) * 1000 for a, b in asked.stalls], _arrivals(asked.stalls, printed, nodes - 1),
                           [r * 1000 for r in asked.requests], asked.lines, sent, asked.report_bytes)
    finally:
        for proc in (*children, host):
            end_process(proc)


def run(nodes: Sequence[int], reps: int) -> list[NodesResult]:
    return [measure(n, reps) for n in nodes]


# --------------------------------------------------------------------------- report

HEADER = [
    "| nodes x ranks | stall: ask → report written (median ms) | stall: ask → every node has it (median ms) "
    "| --stacks request (median ms) | report lines | bytes a node sends (median / max) | report bytes each node reads "
    "| samples: every node has it (ms) |",
    "|---|---|---|---|---|---|---|---|",
]


def table_row(r: NodesResult) -> str:
    return (f"| {r.nodes} x {NPROC} = {r.ranks:,} | {statistics.median(r.stall_ms):,.0f} "
            f"| {statistics.median(r.everyone_ms):,.0f} | {statistics.median(r.request_ms):,.0f} | {r.lines} "
            f"| {statistics.median(r.sent):,.0f} / {max(r.sent):,} | {r.report_bytes:,} "
            f"| {', '.join(f'{x:.0f}' for x in r.everyone_ms)} |")


def rows(results: Sequence[NodesResult]) -> list[Row]:
    fast = Target(f"≤ {TARGET_S:g} s", lambda row: row.rankrun <= TARGET_S * 1000)
    small = Target(f"≤ {TARGET_BYTES // 1024} KB", lambda row: row.rankrun <= TARGET_BYTES)
    out = []
    for r in results:
        label = f"{r.nodes} nodes x {NPROC} ranks"
        out.append(Row(f"stack report of the whole job, {label} (embedded store): ask → every node has it", "ms",
                       rankrun=statistics.median(r.everyone_ms), torchrun=float("nan"), target=fast, compare=False))
        out.append(Row(f"stack report of the whole job, {label}: bytes a node sends (max)", "bytes",
                       rankrun=float(max(r.sent)), torchrun=float("nan"), target=small, compare=False))
    return out


def details(results: Sequence[NodesResult], reps: int) -> list[str]:
    nodes = ",".join(str(r.nodes) for r in results)
    return [
        "### Stack report (the whole job, several nodes)",
        "",
        f"`python bench/stacks.py --ranks 0 --nodes {nodes} --reps {reps}` (`bench/stacks_nodes.py` says how): one "
        f"process serves the embedded store, {PROCS} processes run the simulated agents (each its own connection and "
        "its own `Exchange`), this process is node 0 and asks. Each node's 8 ranks are canned samples (a collective, "
        "one rank of node 17 elsewhere, a pin-memory thread each): this measures the exchange, not sampling (the table "
        "above does). *stall*: node 0's `Exchange.stall`, from the ask to the report written back; *every node has it*: "
        "to the last node printing it; *request*: `rankrun --stacks`'s path. Bytes: a node's answer (deflated JSON, "
        "each distinct stack once) and the report it reads. torchrun has nothing to compare. Targets: the whole job's "
        f"report within {TARGET_S:g} s for 2,048 ranks on 256 nodes, {TARGET_BYTES // 1024} KB a node at most.",
        "",
        *HEADER,
        *(table_row(r) for r in results),
        "",
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=("host", "agents"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.role == "host":
        asyncio.run(_host())
    elif args.role == "agents":
        asyncio.run(_agents(args.port, args.first, args.count, args.nodes))
    else:
        for line in HEADER:
            print(line)
        print(table_row(measure(args.nodes, args.reps)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
