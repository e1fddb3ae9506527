"""The ``netcheck`` metric of bench/run.py: what ``--network-check`` costs a round, its parts and at scale.

``python bench/netcheck_bench.py [--reps 21] [--nodes 512] [--round-reps 3] [--real-reps 3]``. The parts:

- **one node's measure**: ``measure()`` with the check's own settings (``netcheck.SIZE`` each way, ``netcheck.PINGS``
  round trips) against a ``ProbeServer`` on 127.0.0.1, in one process: wall and CPU (of both sides: the process's) per
  measure, median of ``reps``. What each agent of a round spends; each measures one link, so this does not grow with
  the job.
- **a ring on loopback**: 8 endpoints in one process, each measuring the next at once, as a round's agents do: wall
  until the last is done (the 2 cores shared by all 8, so an upper bound for 8 machines).
- **the rule at N simulated nodes**: ``find_suspects`` + ``confirm`` over a ring of N links with jitter (round trips
  0.2 ms ± 20 %, throughput 1 GB/s ± 20 %), with one node 150 ms slow and with none; milliseconds, median of ``reps``.
  What the coordinator adds to a round; checked to name exactly the slow node, and nobody in the clean ring.

And the whole check:

- **a round of N simulated nodes** (``--round-reps``): the real protocol, ``netcheck.take_part`` for each of N members
  (in one process, each with its own connection to the real embedded store, served by a host process) and
  ``netcheck.judge`` for the coordinator (in the host, on the store it serves, as the hosting agent does), followed by
  the coordinator's own writes (each unhealthy node's ``unhealthy/`` key, then the verdict); only the measure is
  simulated (the jittered links above, returned at once: a real node adds its one measure, the first part). Seconds from
  "go" to every member holding the verdict, with one node 150 ms slow and with none, checked to name exactly that node
  and nobody; and CPU of both processes.
- **8 real agents in network namespaces** (``--real-reps``; root and iproute2): 8 ``rankrun`` launchers, each on its
  own host of a switch the bench makes and removes (``tests/netns.py``: a bridge, veth pairs, 10.x addresses inside the
  namespaces only), ``--nnodes 8 --nproc-per-node 1 --no-python true``, the store on host 0; with and without
  ``--network-check``, interleaved. The check's seconds are the coordinator's line ("network check of 8 nodes in X
  s"); the job's wall runs from the first launcher's start to the last one's exit. Where namespaces cannot be made,
  this part is skipped and says why.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))
sys.path.insert(0, str(BENCH.parent / "tests"))  # netns: the tests' namespace hosts, one piece of code for both

from harness import PYTHON, BenchError, cpu_mark, finish, foreign_load, log, start, stop  # noqa: E402
from rankrun.health.outliers import Link, confirm, find_suspects  # noqa: E402
from rankrun.health.probe import ProbeServer, measure  # noqa: E402
from rankrun.rendezvous import netcheck  # noqa: E402
from report import Row, Target, fmt_samples  # noqa: E402

SECRET = b"bench-secret"
RING = 8
ROUND_NODES = 512  # simulated members of the whole check's round
ROUND_TARGET = 5.0  # seconds: the bound for a check at 512 simulated nodes
ROUND = 1  # the round the simulated check belongs to
BASE_PORT = 20000  # a simulated member's "endpoint" port is BASE_PORT + its group rank: nothing listens there
REAL_NODES = 8  # real agents, one a namespace host
REAL_TARGET = 2.0  # seconds: the bound for the check at 8 nodes
REAL_BOUND = 120.0  # seconds a real job may take
CHECKED = re.compile(r"network check of (\d+) nodes in ([\d.]+) s: (.*)$")
VARIANTS = ("slow", "clean")  # the simulated round: one node 150 ms slow, or none


@dataclass
class RoundRun:
    """One simulated round's check: seconds from "go" to every member's verdict, the coordinator's own span (go →
    verdict written), CPU of both processes, who the verdict named."""

    seconds: float
    judge: float
    cpu: float
    named: list[int]


@dataclass
class RealRun:
    """One job of real agents in namespaces: its wall (seconds) and the coordinator's check line (None without)."""

    wall: float
    check: float | None = None
    found: str = ""


@dataclass
class Result:
    measure_wall: list[float]  # seconds, one measure each
    measure_cpu: list[float]
    ring_wall: list[float]  # seconds, RING endpoints measuring at once
    nodes: int
    rule_slow: list[float]  # seconds, find_suspects + confirm with one slow node
    rule_clean: list[float]
    round_reps: int = 0
    rounds: dict[str, list[RoundRun]] = field(default_factory=dict)  # VARIANTS → runs
    round_load: tuple[float, float] = (0.0, 0.0)
    real_reps: int = 0
    real: dict[str, list[RealRun]] = field(default_factory=dict)  # "plain" / "check" → runs
    real_skipped: str = ""  # why the namespaces part did not run
    real_load: tuple[float, float] = (0.0, 0.0)


# --------------------------------------------------------------------------- the parts


async def _measures(reps: int) -> tuple[list[float], list[float]]:
    server = ProbeServer("127.0.0.1", SECRET)
    port = await server.start()
    walls, cpus = [], []

    async def once() -> None:
        await measure("127.0.0.1", port, SECRET, size=netcheck.SIZE, pings=netcheck.PINGS, timeout=netcheck.MEASURE_TIMEOUT)

    try:
        await once()  # warm
        for _ in range(reps):
            wall, cpu = time.perf_counter(), time.process_time()
            await once()
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
            start_ = time.perf_counter()
            await asyncio.gather(*(measure("127.0.0.1", ports[(i + 1) % RING], SECRET, size=netcheck.SIZE,
                                           pings=netcheck.PINGS) for i in range(RING)))
            walls.append(time.perf_counter() - start_)
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
    start_ = time.perf_counter()
    found = find_suspects(ring)
    reprobes = {node: _link(rng, node == slow) for node in found.partners}  # each suspect against its partner
    marked = confirm(found, ring, reprobes)
    return time.perf_counter() - start_, marked


# --------------------------------------------------------------------------- a round of simulated nodes


def _slow_node(variant: str, nodes: int) -> int | None:
    return nodes // 3 if variant == "slow" else None


async def _round_host(nodes: int) -> None:
    """Serve the embedded store; at "go", judge the round as the hosting agent's coordinator does
    (``Coordinator._network_check``: ``judge``, each unhealthy node's key, the verdict), on the store it serves."""
    from rankrun.health.outliers import network_line  # noqa: PLC0415
    from rankrun.rendezvous.keys import Keys, unhealthy_value, verdict_value  # noqa: PLC0415
    from rankrun.store.embedded.server import StoreServer  # noqa: PLC0415
    from rankrun.store.memory import MemoryStore  # noqa: PLC0415

    memory = MemoryStore()
    server = StoreServer(memory, SECRET)
    port = await server.start("127.0.0.1", 0)
    keys = Keys.for_run("bench")
    loop = asyncio.get_running_loop()
    print(f"READY {port}", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # "go"
    began = time.monotonic()

    async def put(key: str, value: bytes) -> None:
        await memory.put(key, value)

    found = await netcheck.judge(memory, keys, ROUND, nodes, put)
    lines = {g: network_line(g, f"10.0.{g // 256}.{g % 256}", why) for g, why in sorted(found.items())}
    for g, line in lines.items():
        await memory.put(keys.unhealthy_node(f"node{g}"), unhealthy_value(line))
    await memory.put(keys.netcheck_verdict(ROUND), verdict_value(lines))
    print(json.dumps({"judge": time.monotonic() - began, "named": sorted(found)}), flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin
    await server.close()
    await memory.close()


async def _round_members(port: int, nodes: int, slow: int | None) -> None:
    """``nodes`` members in this process, each with its own connection: at "go", every one's ``take_part``, its
    measure simulated (the jittered links of ``_link``, slow where the slow node is at either end)."""
    from rankrun.rendezvous.keys import Keys  # noqa: PLC0415
    from rankrun.store.embedded.client import StoreClient  # noqa: PLC0415

    keys = Keys.for_run("bench")
    clients = [await StoreClient.connect("127.0.0.1", port, SECRET) for _ in range(nodes)]
    loop = asyncio.get_running_loop()
    print("READY", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # "go"
    done: list[float] = []
    verdicts: list[dict[int, str]] = []

    async def member(g: int) -> None:
        rng = random.Random(g)

        async def simulated(_addr: str, port_: int) -> Link:
            await asyncio.sleep(0)  # a real measure yields to the loop too
            return _link(rng, slow in (g, port_ - BASE_PORT))

        verdict = await netcheck.take_part(clients[g], keys, ROUND, g, nodes, endpoint=("127.0.0.1", BASE_PORT + g),
                                           measure=simulated)
        done.append(time.monotonic())
        verdicts.append(verdict)

    await asyncio.gather(*(member(g) for g in range(nodes)))
    named = sorted({g for v in verdicts for g in v})
    agreed = all(sorted(v) == named for v in verdicts)
    print(json.dumps({"last": max(done), "named": named, "agreed": agreed}), flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # "exit"
    for client in clients:
        await client.close()


def round_once(nodes: int, variant: str) -> RoundRun:
    """One simulated round's check (``variant``: one node slow, or none), checked to name exactly the slow node."""
    from rendezvous import cpu_of, end_process  # noqa: PLC0415 - this part only

    slow = _slow_node(variant, nodes)
    host = subprocess.Popen([PYTHON, __file__, "--role", "host", "--nodes", str(nodes)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    members: subprocess.Popen[str] | None = None
    try:
        assert host.stdout is not None
        assert host.stdin is not None
        port = int(host.stdout.readline().split()[1])
        members = subprocess.Popen([PYTHON, __file__, "--role", "members", "--port", str(port), "--nodes", str(nodes),
                                    "--slow", str(-1 if slow is None else slow)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        assert members.stdout is not None
        assert members.stdin is not None
        if members.stdout.readline().strip() != "READY":
            raise BenchError("the simulated members did not start")
        cpu = cpu_of(host.pid) + cpu_of(members.pid)
        began = time.monotonic()
        for proc in (host, members):
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        judged = json.loads(host.stdout.readline())
        report = json.loads(members.stdout.readline())
        cpu = cpu_of(host.pid) + cpu_of(members.pid) - cpu
        members.stdin.write("exit\n")
        members.stdin.flush()
    finally:
        if members is not None:
            end_process(members)
        end_process(host)
    expected = [] if slow is None else [slow]
    if judged["named"] != expected or report["named"] != expected or not report["agreed"]:
        raise BenchError(f"the simulated check at {nodes} nodes named {judged['named']} (members: {report['named']}, "
                         f"all agreed: {report['agreed']}); expected {expected}")
    return RoundRun(float(report["last"]) - began, float(judged["judge"]), cpu, expected)


def _rounds(result: Result) -> None:
    round_once(result.nodes, "slow")  # unrecorded: the page cache, the bytecode cache
    mark = cpu_mark()
    for rep in range(result.round_reps):
        for variant in VARIANTS[rep % 2:] + VARIANTS[:rep % 2]:
            run_ = round_once(result.nodes, variant)
            result.rounds.setdefault(variant, []).append(run_)
            log(f"  network check, {result.nodes} simulated nodes ({variant}): every verdict after {run_.seconds:.2f} s, "
                f"judged in {run_.judge:.2f} s, named {run_.named}")
    result.round_load = foreign_load(mark, cpu_mark())


# --------------------------------------------------------------------------- real agents in network namespaces


def _skip_reason() -> str:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "network namespaces need root and iproute2"
    return ""


def real_job(sw: object, check: bool, port: int) -> RealRun:
    """One job of ``REAL_NODES`` real launchers, each on its namespace host of ``sw`` (a ``netns.Switch``), the
    store on host 0: its wall, and the coordinator's line about the check."""
    env = {"RANKRUN_RDZV_SECRET": "bench-netcheck"}
    with tempfile.TemporaryDirectory(prefix="rankrun-bench-netcheck-") as tmp:
        procs = []
        began = time.monotonic()
        for i in range(REAL_NODES):
            argv = [*sw.exec(i), PYTHON, "-m", "rankrun", "--nnodes", str(REAL_NODES),  # type: ignore[attr-defined]
                    "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{sw.addr(0)}:{port}",  # type: ignore[attr-defined]
                    "--rdzv-id", "netcheck", "--rdzv-conf", f"is_host={int(i == 0)}",
                    "--local-addr", sw.addr(i), *(["--network-check"] if check else []),  # type: ignore[attr-defined]
                    "--no-python", "true"]
            with open(f"{tmp}/{i}.err", "wb") as err:
                procs.append(start(argv, stderr=err.fileno(), extra_env=env))
        try:
            codes = [finish(proc, max(1.0, REAL_BOUND - (time.monotonic() - began))).rc for proc in procs]
        finally:
            for proc in procs:
                if proc.returncode is None:
                    stop(proc)
        wall = time.monotonic() - began
        said = Path(f"{tmp}/0.err").read_text(errors="replace")
        if codes != [0] * REAL_NODES:
            raise BenchError(f"{REAL_NODES} agents in namespaces (--network-check: {check}) exited {codes}; host 0's "
                             f"stderr:\n{said[-2000:]}")
    run_ = RealRun(wall)
    if check:
        lines = [m for m in (CHECKED.search(line) for line in said.splitlines()) if m]
        if len(lines) != 1 or int(lines[0].group(1)) != REAL_NODES:
            raise BenchError(f"host 0 said no single line about a network check of {REAL_NODES} nodes:\n{said[-2000:]}")
        run_.check, run_.found = float(lines[0].group(2)), lines[0].group(3)
    return run_


def _real(result: Result) -> None:
    why = _skip_reason()
    if why:
        result.real_skipped = why
        log(f"  network check, {REAL_NODES} real agents: skipped: {why}")
        return
    import pytest  # noqa: PLC0415 - netns says "cannot build" by skipping

    import netns  # noqa: PLC0415 - root only

    try:
        sw = netns.Switch(REAL_NODES)
    except pytest.skip.Exception as exc:
        result.real_skipped = str(exc.msg)
        log(f"  network check, {REAL_NODES} real agents: skipped: {exc.msg}")
        return
    kinds = ("plain", "check")
    port = 29400  # inside the namespaces: nobody else's; a new one per job, so no TIME_WAIT is in the way
    try:
        real_job(sw, True, port)  # unrecorded: the page cache, the bytecode cache
        mark = cpu_mark()
        for rep in range(result.real_reps):
            for kind in kinds[rep % 2:] + kinds[:rep % 2]:
                port += 1
                run_ = real_job(sw, kind == "check", port)
                result.real.setdefault(kind, []).append(run_)
                log(f"  network check, {REAL_NODES} real agents ({kind}): job {run_.wall:.2f} s"
                    + (f", check {run_.check:.2f} s: {run_.found}" if run_.check is not None else ""))
        result.real_load = foreign_load(mark, cpu_mark())
    finally:
        sw.close()
        left = netns.namespaces_left([sw.switch, *sw.names])
        if left:
            log(f"  network check: namespaces left behind: {left}")


# --------------------------------------------------------------------------- the metric


def run(reps: int, nodes: int = ROUND_NODES, round_reps: int = 0, real_reps: int = 0) -> Result:
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
    result = Result(walls, cpus, ring, nodes, slow, clean, round_reps=round_reps, real_reps=real_reps)
    log(f"  network check: one measure {statistics.median(walls) * 1000:.2f} ms, {RING} at once "
        f"{statistics.median(ring) * 1000:.2f} ms, the rule at {nodes} nodes {statistics.median(slow) * 1000:.2f} ms")
    if round_reps:
        _rounds(result)
    if real_reps:
        _real(result)
    return result


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _within(limit: float) -> Target:
    return Target(f"≤ {limit:g} s", lambda r: r.rankrun <= limit)


def rows(r: Result) -> list[Row]:
    out = []
    for variant, said in (("slow", "one node 150 ms slow, named"), ("clean", "no slow node, nobody named")):
        runs = r.rounds.get(variant)
        if runs:
            out.append(Row(f"network check: one round of {r.nodes} simulated nodes (the real protocol over the "
                           f"embedded store, measures simulated), go → every member has the verdict; {said}", "s",
                           rankrun=_median([x.seconds for x in runs]), torchrun=float("nan"), compare=False,
                           decimals=2, target=_within(ROUND_TARGET)))
    out.append(Row(f"network check: one node's measure on loopback ({netcheck.PINGS} round trips, "
                   f"{netcheck.SIZE >> 20} MiB each way): what each real node adds, whatever the job's size", "ms",
                   rankrun=_median(r.measure_wall) * 1000, torchrun=float("nan"), compare=False, decimals=1))
    checks = [x.check for x in r.real.get("check", []) if x.check is not None]
    if checks:
        out.append(Row(f"network check: {REAL_NODES} real agents, one a network namespace (--nnodes {REAL_NODES} "
                       "--network-check --no-python true): the check, as the coordinator times it", "s",
                       rankrun=_median(checks), torchrun=float("nan"), compare=False, decimals=2,
                       target=_within(REAL_TARGET)))
        out.append(Row(f"network check: {REAL_NODES} real agents in namespaces, the job's wall (start → every "
                       "launcher exited 0), with --network-check", "s",
                       rankrun=_median([x.wall for x in r.real["check"]]), torchrun=float("nan"), compare=False,
                       baseline=_median([x.wall for x in r.real.get("plain", [])]), baseline_label="without",
                       decimals=2))
    return out


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.2f} ms"


def details(r: Result) -> list[str]:
    lines = [
        "### The network check: what `--network-check` costs a round",
        "",
        f"`python bench/netcheck_bench.py --reps {len(r.measure_wall)} --round-reps 0 --real-reps 0` (its docstring "
        "says how): the check's parts.",
        "",
        f"- one node's measure on loopback ({netcheck.PINGS} round trips, {netcheck.SIZE >> 20} MiB each way, as the "
        f"check measures): {_ms(r.measure_wall)} wall, {_ms(r.measure_cpu)} CPU (both sides), median of "
        f"{len(r.measure_wall)}",
        f"- {RING} endpoints on loopback in one process, each measuring the next at once: {_ms(r.ring_wall)} until the "
        f"last, median of {len(r.ring_wall)}",
        f"- find_suspects + confirm at {r.nodes} simulated nodes: {_ms(r.rule_slow)} with one 150 ms node (named), "
        f"{_ms(r.rule_clean)} with none (nobody named), median of {len(r.rule_slow)}",
    ]
    if r.rounds:
        others, steal = r.round_load
        lines += [
            "",
            f"**A round of {r.nodes} simulated nodes** (`python bench/netcheck_bench.py --reps 1 --real-reps 0 --round-reps "
            f"{r.round_reps}`): `netcheck.take_part` for each of {r.nodes} members in one process, each with its own "
            "connection to the real embedded store, and `netcheck.judge` with the coordinator's writes (the unhealthy "
            "nodes' keys, then the verdict) in the host process that serves it; only the measure is simulated (links "
            "of 0.2 ms ± 20 % and 1 GB/s ± 20 %, +150 ms wherever the slow node is at either end, returned at once). "
            "*every verdict*: seconds from \"go\" to the last member holding the verdict; *judged*: the "
            "coordinator's span, to the verdict written; CPU of both processes. A real node adds its one measure "
            "(above) to this, whatever the round's size: each measures one link, all at once. A round with a node 150 ms away "
            f"waits longer for the measures of that node's two links ({netcheck.PINGS} round trips of 150 ms, then TCP's "
            f"slow start over {netcheck.SIZE >> 20} MiB each way) and for its re-probe, which the simulation does not "
            "time. Other processes used "
            f"{others:.0%} of the machine's CPU meanwhile (steal {steal:.0%}).",
            "",
            "| ring | every verdict (s), samples | judged (s), samples | CPU (s), samples | named |",
            "|---|---|---|---|---|",
        ]
        for variant, runs in r.rounds.items():
            lines.append(f"| {'one node 150 ms slow' if variant == 'slow' else 'no slow node'} | "
                         f"{fmt_samples([x.seconds for x in runs], 2)} | {fmt_samples([x.judge for x in runs], 2)} | "
                         f"{fmt_samples([x.cpu for x in runs], 2)} | "
                         f"{', '.join(f'node {g}' for g in runs[0].named) or 'nobody'} |")
    if r.real_reps:
        lines += ["", f"**{REAL_NODES} real agents in network namespaces** (`python bench/netcheck_bench.py --reps 1 "
                  f"--round-reps 0 --real-reps {r.real_reps}`): "]
        if r.real_skipped:
            lines[-1] += f"skipped: {r.real_skipped}."
        else:
            others, steal = r.real_load
            lines[-1] += (f"{REAL_NODES} `rankrun` launchers, each on its own host of a switch the bench makes and "
                          "removes (`tests/netns.py`: a bridge in a namespace, a veth pair a host), `--nnodes "
                          f"{REAL_NODES} --nproc-per-node 1 --no-python true`, the store on host 0, with and without "
                          "`--network-check`, interleaved; *check*: the coordinator's line (\"network check of "
                          f"{REAL_NODES} nodes in X s\"), *job*: first start → last exit. All {REAL_NODES} share this "
                          f"machine's cores. Other processes used {others:.0%} of the machine's CPU meanwhile (steal "
                          f"{steal:.0%}).")
            lines += ["", "| job | wall (s), samples | the check (s), samples | found |", "|---|---|---|---|"]
            for kind, jobs in r.real.items():
                checks = [x.check for x in jobs if x.check is not None]
                lines.append(f"| {'with --network-check' if kind == 'check' else 'without'} | "
                             f"{fmt_samples([x.wall for x in jobs], 2)} | {fmt_samples(checks, 2) if checks else '—'} | "
                             f"{jobs[0].found or '—'} |")
    return [*lines, ""]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--nodes", type=int, default=ROUND_NODES)
    parser.add_argument("--round-reps", type=int, default=3, help="simulated rounds of --nodes, each variant")
    parser.add_argument("--real-reps", type=int, default=3, help=f"jobs of {REAL_NODES} real agents in namespaces, each way")
    parser.add_argument("--role", default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--slow", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    roles: dict[str, Callable[[], None]] = {
        "host": lambda: asyncio.run(_round_host(args.nodes)),
        "members": lambda: asyncio.run(_round_members(args.port, args.nodes, None if args.slow < 0 else args.slow)),
    }
    if args.role in roles:
        roles[args.role]()
        return 0
    for line in details(run(args.reps, args.nodes, args.round_reps, args.real_reps)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
