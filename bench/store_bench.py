"""Metric 6: the worker store, rankrun's ``TCPStoreServer`` against torch's own ``TCPStore`` server, side by side.

Both servers run in their own processes for the whole metric (torch's: ``TCPStore(is_master=True)``, libuv, C++;
rankrun's: ``payloads/store_rankrun_server.py``, the asyncio server on the default event loop) and are driven by the
same client code, torch's ``TCPStore(is_master=False)`` client, from separate processes:

- **latency**: one client process, one connection per server, client and servers pinned (same CPU, then different
  CPUs); ``LAT_ITERS`` timed calls of each operation (set+get, add, wait on an existing key, check) per server and
  repetition, in short chunks alternating between the servers; p50 and p90, medians over repetitions.
- **throughput**: 256 concurrent clients = ``PROCS`` processes x ``THREADS`` threads, each thread with its own
  connection (torch's store calls release the GIL, so every thread keeps one request in flight); all threads run the
  operation from one agreed monotonic instant for ``TP_SECONDS``; ops/s = completed calls / duration.
- **init_process_group**: ``payloads/store_pg.py`` imports torch once and forks N workers with torchrun's environment
  (``TORCHELASTIC_USE_AGENT_STORE=True``), released together; each times its own ``init_process_group("gloo",
  "env://")``; the slowest rank's time counts. The store is reset between runs.

Servers run in rotating order within each repetition; every number is quoted next to torch's from the same minutes.
Every child is tracked (``harness.track_workers``) and stopped on the way out, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness import PAYLOADS, PYTHON, BenchError, Samples, bench_env, log, stop, track_workers
from report import Better, Row, Target, fmt_samples

SERVERS = ("torch", "rankrun")
LABELS = {"torch": "torch TCPStore (libuv, C++)", "rankrun": "rankrun TCPStoreServer (asyncio)"}
LAT_OPS = ("set+get", "add", "wait", "check")
# Where the latency client and the servers run. A request that wakes a process sleeping on the *other* CPU costs an
# inter-processor interrupt and, on this VM, an exit from the idle state: tens of microseconds that depend on where
# the scheduler happened to put the processes (unpinned, the same server measured 20 us or 70 us per ADD from one run
# to the next). Pinned, both servers get the same placement: "same CPU" is each server's own serial cost; "different
# CPUs" adds the cross-CPU wake-up every real worker pays too.
PLACEMENTS = {"same CPU": (0, 0), "different CPUs": (0, 1)}
TP_OPS = ("add", "set+get")
PG_SIZES = (4, 32)
CLIENTS = 256
PROCS = 4
THREADS = CLIENTS // PROCS
LAT_ITERS = 2000
TP_SECONDS = 2.0
LATENCY_TARGET = 1.5
THROUGHPUT_TARGET = 0.5
STEP_TIMEOUT_S = 120.0


# --------------------------------------------------------------------------- child processes


class Child:
    """A payload process in its own session, driven by lines on stdin/stdout; always stopped by ``close()``."""

    def __init__(self, name: str, *args: str) -> None:
        self.name = name
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([PYTHON, str(PAYLOADS / name), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err.fileno(), env=bench_env(), start_new_session=True)
        track_workers([self.proc.pid])  # harness.cleanup() kills it if anything below goes wrong
        self._buffer = b""

    def line(self, timeout: float = STEP_TIMEOUT_S) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                raise BenchError(f"{self.name}: no answer within {timeout:.0f} s; stderr:\n{self.stderr()}")
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise BenchError(f"{self.name} exited ({self.proc.wait()}); stderr:\n{self.stderr()}")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def ask(self, command: str, timeout: float = STEP_TIMEOUT_S) -> str:
        self.send(command)
        return self.line(timeout)

    def expect(self, prefix: str, timeout: float = STEP_TIMEOUT_S) -> str:
        line = self.line(timeout)
        if not line.startswith(prefix):
            raise BenchError(f"{self.name}: expected {prefix!r}, got {line!r}; stderr:\n{self.stderr()}")
        return line

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read()[-3000:].decode(errors="replace")

    def close(self) -> None:
        """EOF on stdin (a clean exit), then SIGTERM/SIGKILL of its process group if it lingers."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        stop(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.err.close()


@contextlib.contextmanager
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in started:
            child.close()


class Server:
    def __init__(self, key: str, child: Child) -> None:
        self.key = key
        self.child = child
        self.port = int(child.expect("READY ").split()[1])

    def reset(self) -> None:
        if (answer := self.child.ask("RESET")) != "RESET-OK":
            raise BenchError(f"{self.key} server: RESET answered {answer!r}")

    def cpu_seconds(self) -> float:
        """User + system CPU of the server process so far."""
        fields = Path(f"/proc/{self.child.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_servers(started: list[Child]) -> dict[str, Server]:
    scripts = {"torch": "store_torch_server.py", "rankrun": "store_rankrun_server.py"}
    for key in SERVERS:
        started.append(Child(scripts[key]))
    return {key: Server(key, child) for key, child in zip(SERVERS, started[-len(SERVERS):], strict=True)}


def start_clients(started: list[Child], servers: dict[str, Server], procs: int, threads: int) -> list[Child]:
    ports = [f"{key}={s.port}" for key, s in servers.items()]
    clients = [Child("store_client.py", "--clients", str(threads), *ports) for _ in range(procs)]
    started.extend(clients)
    for c in clients:
        c.expect("READY")
    return clients


def rotated(keys: Sequence[str], rep: int) -> list[str]:
    k = rep % len(keys)
    return [*keys[k:], *keys[:k]]


# --------------------------------------------------------------------------- measurements


def _by_placement() -> dict[str, dict[str, Samples]]:
    return {place: {op: Samples("us") for op in LAT_OPS} for place in placements()}


def placements() -> dict[str, tuple[int, int]]:
    """The placements this machine can offer (CPU numbers taken from our own affinity mask)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {"same CPU": (cpus[0], cpus[0])}
    return {place: (cpus[a], cpus[b]) for place, (a, b) in PLACEMENTS.items()}


def pin(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of ``pid`` (torch's server answers from its own libuv thread)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task.name), cpus)


@dataclass
class StoreResult:
    reps: int
    # placement -> op -> samples
    p50: dict[str, dict[str, Samples]] = field(default_factory=_by_placement)
    p90: dict[str, dict[str, Samples]] = field(default_factory=_by_placement)
    ops: dict[str, Samples] = field(default_factory=lambda: {op: Samples("ops/s") for op in TP_OPS})
    cpu_us: dict[str, Samples] = field(default_factory=lambda: {op: Samples("us") for op in TP_OPS})
    busy: dict[str, Samples] = field(default_factory=lambda: {op: Samples("share of one CPU") for op in TP_OPS})
    pg: dict[int, Samples] = field(default_factory=lambda: {n: Samples("s") for n in PG_SIZES})


def measure_latency(client: Child, servers: Sequence[str], op: str, iters: int = LAT_ITERS) -> dict[str, tuple[float, float]]:
    """Per server, (p50, p90) in microseconds of ``iters`` calls of ``op`` on one connection (servers interleaved)."""
    answer = json.loads(client.ask(f"LAT {op} {iters} {' '.join(servers)}"))
    return {key: (p50, p90) for key, (p50, p90) in answer.items()}


def measure_throughput(clients: Sequence[Child], server: Server, op: str, seconds: float = TP_SECONDS) -> tuple[float, float]:
    """(ops/s, server CPU microseconds per op) with every client thread of every process running ``op``."""
    start = time.monotonic() + 0.3  # time for every process to start its threads
    for c in clients:
        c.send(f"GO {server.key} {op} {start} {seconds}")
    cpu0 = None
    while time.monotonic() < start:
        time.sleep(0.001)
    cpu0 = server.cpu_seconds()
    answers = [json.loads(c.line()) for c in clients]
    cpu = server.cpu_seconds() - cpu0
    total = sum(a["ops"] for a in answers)
    return total / seconds, cpu / total * 1e6 if total else float("nan")


def measure_pg(driver: Child, server: Server, nproc: int) -> float:
    server.reset()
    answer = json.loads(driver.ask(f"RUN {server.port} {nproc}"))
    if answer["failed"]:
        raise BenchError(f"init_process_group failed on ranks {answer['failed']} against {server.key}")
    return max(answer["seconds"])


def run_latency(result: StoreResult, started: list[Child], servers: dict[str, Server]) -> None:
    (client,) = start_clients(started, servers, 1, 1)
    try:
        for place, (client_cpu, server_cpu) in placements().items():
            pin(client.proc.pid, {client_cpu})
            for server in servers.values():
                pin(server.child.proc.pid, {server_cpu})
            for op in LAT_OPS:
                measure_latency(client, SERVERS, op, 200)  # warm-up
            for rep in range(result.reps):
                p50 = result.p50[place]
                for i, op in enumerate(LAT_OPS):
                    for key, (fifty, ninety) in measure_latency(client, rotated(SERVERS, rep + i), op).items():
                        p50[op].add(key, fifty)
                        result.p90[place][op].add(key, ninety)
                log(f"  store latency, {place}, rep {rep + 1}/{result.reps} (p50 rankrun/torch): " + ", ".join(
                    f"{op} {p50[op].by_launcher['rankrun'][-1]:.0f}/{p50[op].by_launcher['torch'][-1]:.0f} us"
                    for op in LAT_OPS))
    finally:
        every = os.sched_getaffinity(0)
        for server in servers.values():
            pin(server.child.proc.pid, every)
        client.close()


def run_throughput(result: StoreResult, started: list[Child], servers: dict[str, Server]) -> None:
    clients = start_clients(started, servers, PROCS, THREADS)
    for key in SERVERS:
        measure_throughput(clients, servers[key], "add", 0.5)  # warm-up
    for rep in range(result.reps):
        for i, op in enumerate(TP_OPS):
            for key in rotated(SERVERS, rep + i):
                ops, cpu = measure_throughput(clients, servers[key], op)
                result.ops[op].add(key, ops)
                result.cpu_us[op].add(key, cpu)
                result.busy[op].add(key, ops * cpu / 1e6)
        log(f"  store throughput rep {rep + 1}/{result.reps} (rankrun/torch): " + ", ".join(
            f"{op} {result.ops[op].by_launcher['rankrun'][-1]:,.0f}/{result.ops[op].by_launcher['torch'][-1]:,.0f} ops/s"
            for op in TP_OPS))
    for c in clients:
        c.close()


def run_pg(result: StoreResult, started: list[Child], servers: dict[str, Server]) -> None:
    driver = Child("store_pg.py")
    started.append(driver)
    driver.expect("READY")
    for key in SERVERS:
        for nproc in PG_SIZES:
            measure_pg(driver, servers[key], nproc)  # warm-up (torch's first 32-rank run is often ~1 s)
    for rep in range(result.reps):
        for i, nproc in enumerate(PG_SIZES):
            for key in rotated(SERVERS, rep + i):
                result.pg[nproc].add(key, measure_pg(driver, servers[key], nproc))
        log(f"  store init_process_group rep {rep + 1}/{result.reps} (rankrun/torch): " + ", ".join(
            f"N={n} {s.by_launcher['rankrun'][-1]:.3f}/{s.by_launcher['torch'][-1]:.3f} s" for n, s in result.pg.items()))
    driver.close()


def warm_up() -> None:
    """Both servers and one client, every operation a few times: page cache and bytecode cache, nothing recorded."""
    with children() as started:
        servers = start_servers(started)
        (client,) = start_clients(started, servers, 1, 1)
        for op in LAT_OPS:
            measure_latency(client, SERVERS, op, 100)


def run(reps: int) -> StoreResult:
    result = StoreResult(reps)
    with children() as started:
        servers = start_servers(started)
        run_latency(result, started, servers)
        run_throughput(result, started, servers)
        run_pg(result, started, servers)
    return result


# --------------------------------------------------------------------------- report


def rows(result: StoreResult) -> list[Row]:
    lat = Target(f"rankrun ≤ {LATENCY_TARGET}x torch", lambda r: r.rankrun_vs_torchrun <= LATENCY_TARGET)
    tput = Target(f"rankrun ≥ {THROUGHPUT_TARGET}x torch", lambda r: r.rankrun_vs_torchrun >= THROUGHPUT_TARGET)
    out = [Row(f"store latency p50, {op} (1 client, {place})", "us", rankrun=s.median("rankrun"),
               torchrun=s.median("torch"), target=lat, decimals=1)
           for place, by_op in result.p50.items() for op, s in by_op.items()]
    out += [Row(f"store throughput, {op} ({CLIENTS} clients)", "ops/s", rankrun=s.median("rankrun"),
                torchrun=s.median("torch"), better=Better.HIGHER_THROUGHPUT, target=tput) for op, s in result.ops.items()]
    # On 2 CPUs torch's clients cannot saturate torch's server, so ops/s also measures the clients; the server's own
    # CPU per operation is its capacity (ops/s at one busy CPU = 1e6 / it), whoever the bottleneck is.
    capacity = Target(f"rankrun ≤ {1 / THROUGHPUT_TARGET:.0f}x torch (capacity ≥ {THROUGHPUT_TARGET}x)",
                      lambda r: r.rankrun_vs_torchrun <= 1 / THROUGHPUT_TARGET)
    out += [Row(f"store server CPU per op, {op} ({CLIENTS} clients)", "us", rankrun=s.median("rankrun"),
                torchrun=s.median("torch"), target=capacity, decimals=1) for op, s in result.cpu_us.items()]
    out += [Row(f"store: init_process_group, {n} gloo workers (slowest rank)", "s", rankrun=s.median("rankrun"),
                torchrun=s.median("torch"), decimals=3) for n, s in result.pg.items()]
    return out


def details(result: StoreResult) -> list[str]:
    lines = [
        "### Worker store",
        "",
        "In the summary rows above, the *torchrun* column is **torch's own TCPStore server** (`TCPStore(is_master=True)`, "
        "libuv backend, C++, the server torchrun's agent hosts), and *rankrun* is `rankrun.workerstore.tcpstore."
        "TCPStoreServer` on a default asyncio event loop, as in the launcher. Each runs in its own process "
        "(`bench/payloads/store_torch_server.py`, `store_rankrun_server.py`), both for the whole metric; both are driven "
        "by the same client code, torch's `TCPStore(is_master=False)` client (`bench/payloads/store_client.py`).",
        "",
        f"- **Latency**: one client process, one connection per server; {LAT_ITERS} timed calls per operation, server and "
        "repetition, in chunks of 50 calls alternating between the servers (both see the same background load). "
        "`set+get` is `set(k, 128 B)` then `get(k)`, which the client sends as SET, WAIT, GET (two round trips); `wait` "
        "and `check` are on an existing key. The client and the servers are **pinned** (every thread, "
        "`sched_setaffinity`): unpinned, the same server measured 20 us or 70 us per ADD from one run to the next, "
        "depending on whether the scheduler put it on the client's CPU (a wake-up on the other CPU costs an "
        "inter-processor interrupt and, on this VM, an exit from idle). *same CPU* is each server's own serial cost; "
        "*different CPUs* adds the cross-CPU wake-up that real workers also pay.",
        f"- **Throughput**: {CLIENTS} concurrent clients = {PROCS} processes x {THREADS} threads, one connection per "
        "thread, each on its own key, all starting at one agreed monotonic instant, for "
        f"{TP_SECONDS:.0f} s. torch's client releases the GIL while it waits on the socket (checked: a thread blocked in "
        "`wait()` does not stop another thread of the process, and 1 → 4 threads on one process scale ADDs ~5x), so "
        "every thread keeps one request in flight. 2 x 128, 4 x 64 and 8 x 32 gave the same ratios within the noise; "
        "more processes take more of the 2 CPUs from the server, fewer queue on the GIL. On 2 CPUs the clients need "
        "most of the machine (torch's clients cannot saturate torch's server here), so *server busy* (CPU seconds "
        "of the server process per second) says how close each server was to its limit of one CPU, and the server's "
        "CPU per operation (its capacity: 1e6 / it ops/s at one busy CPU) is quoted as a row of its own.",
        "- **init_process_group**: `bench/payloads/store_pg.py` imports torch once and forks N workers with torchrun's "
        "environment (`TORCHELASTIC_USE_AGENT_STORE=True`, `MASTER_PORT` = the server), released together through one "
        "pipe; each times its own `init_process_group(backend=\"gloo\", init_method=\"env://\")` (then a barrier); "
        "the slowest rank counts. The store is reset before each run; one unrecorded run per size and server first.",
        "",
        "Servers run in rotating order within every repetition.",
        "",
        f"Latency, per repetition p50 in us, and medians of p90 ({result.reps} repetitions per placement):",
        "",
        "| placement | operation | rankrun | torch | p90 rankrun | p90 torch | p50 ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for place, by_op in result.p50.items():
        for op, p50 in by_op.items():
            p90 = result.p90[place][op]
            lines.append(f"| {place} | {op} | {fmt_samples(p50.by_launcher['rankrun'], 1)} | "
                         f"{fmt_samples(p50.by_launcher['torch'], 1)} | {p90.median('rankrun'):.1f} | "
                         f"{p90.median('torch'):.1f} | {p50.median('rankrun') / p50.median('torch'):.2f}x |")
    lines += [
        "",
        f"Throughput samples (ops/s), server CPU per operation (us) and server busy (medians), {CLIENTS} clients:",
        "",
        "| operation | rankrun | torch | CPU/op rankrun | CPU/op torch | busy rankrun | busy torch | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for op in TP_OPS:
        s, cpu, busy = result.ops[op], result.cpu_us[op], result.busy[op]
        lines.append(f"| {op} | {fmt_samples(s.by_launcher['rankrun'])} | {fmt_samples(s.by_launcher['torch'])} | "
                     f"{cpu.median('rankrun'):.1f} | {cpu.median('torch'):.1f} | {busy.median('rankrun'):.0%} | "
                     f"{busy.median('torch'):.0%} | {s.median('rankrun') / s.median('torch'):.2f}x |")
    lines += [
        "",
        "init_process_group, slowest rank (s):",
        "",
        "| workers | rankrun | torch |",
        "|---|---|---|",
    ]
    for n, s in result.pg.items():
        lines.append(f"| {n} | {fmt_samples(s.by_launcher['rankrun'], 3)} | {fmt_samples(s.by_launcher['torch'], 3)} |")
    return [*lines, ""]


if __name__ == "__main__":
    from report import text_table

    res = run(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    print(text_table(rows(res)))
    print("\n".join(details(res)))
