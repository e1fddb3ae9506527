"""The connect storm through store relays (``--store-relays``): N raw-protocol TCPStore clients, spread over R relays
(``StoreRelay``, one process each, each on a loopback address of its own), to one host process (``TCPStoreServer`` and
its ``StoreRelayHost``), with every process's open descriptors sampled from ``/proc/<pid>/fd``.

The point: a job larger than one process's open-files limit (here the hard limit; 20,000 on the machine this was
written on) runs, and no process holds more than ``relays + its own`` (the host) or ``its clients + 1`` (a relay)
descriptors. Every client does what ``init_process_group``'s store traffic does (as ``bench/store_storm.py``): connect,
VALIDATE, ADD a counter; rank 0 SETs a 128-byte id, every other rank WAITs for it and GETs it; then a closing barrier
(ADD, the last one SETs a key, everyone WAITs for it). The clients run in ``--client-procs`` processes (asyncio streams),
connected to their relays' addresses, started and made ready before the clock starts.

Reported: the whole sequence's time, the storm's (every client connected, handshaken and its ADD answered), the host's
CPU, the most descriptors each kind of process held (sampled every ``--sample-s`` and once with every connection open),
the relays' coalescing (GETs and WAITs sent upstream on their own connections, and those that joined one in flight)
and the WAITs the host's keyspace registered.

    python bench/relay_storm.py --ranks 25000 --relays 25 --client-procs 5
    python bench/relay_storm.py --latency 5000     # one client's ADD round trip, direct and through a relay
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from report import Row, Target
from store_storm import _I64, _U64, HOST, ID, SRC, VALIDATE, _add, _get, _set, _wait  # one encoding of the wire

HERE = Path(__file__).resolve()
TIMEOUT_S = 600.0


def _raise_nofile() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def relay_address(index: int) -> str:
    return f"127.0.{1 + index // 250}.{1 + index % 250}"


# -- the host and relay processes -------------------------------------------------------------------------------------


def host(direct: bool = False) -> None:
    _raise_nofile()
    sys.path.insert(0, str(SRC))
    from rankrun.workerstore.keyspace import Keyspace  # noqa: PLC0415
    from rankrun.workerstore.relayhost import StoreRelayHost  # noqa: PLC0415
    from rankrun.workerstore.tcpstore import TCPStoreServer  # noqa: PLC0415

    waits = [0]  # WAITs the keyspace registered: a direct client's (wait), a relay's shared wait's (enqueue)
    for name in ("wait", "enqueue"):
        original = getattr(Keyspace, name)

        def counted(self: Keyspace, *args: object, _original: object = original, **kwargs: object) -> object:
            waits[0] += 1
            return _original(self, *args, **kwargs)  # type: ignore[operator]

        setattr(Keyspace, name, counted)

    async def main() -> None:
        server = TCPStoreServer()
        store_port = await server.start(HOST, 0)
        relays = StoreRelayHost(server, b"bench secret")
        print("port", await relays.start(HOST, 0), store_port if direct else "", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        print("waits", waits[0], flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await relays.close()
        await server.close()

    asyncio.run(main())


def relay(port: int, index: int) -> None:
    _raise_nofile()
    sys.path.insert(0, str(SRC))
    from rankrun.workerstore.relay import StoreRelay  # noqa: PLC0415

    async def main() -> None:
        address = relay_address(index)
        node = StoreRelay((HOST, port), b"bench secret", bind=address)
        print("port", await node.start(address, 0), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        print("stats", node.stats.clients, node.stats.shared, node.stats.coalesced, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await node.close()

    asyncio.run(main())


# -- a client process -------------------------------------------------------------------------------------------------


async def _rank(rank: int, world: int, where: tuple[str, int], stormed: list[float], held: list[asyncio.StreamWriter]) -> None:
    reader, writer = await asyncio.open_connection(*where, limit=4096)
    held.append(writer)
    writer.write(VALIDATE + _add(b"init", 1))
    await reader.readexactly(8)
    stormed.append(time.monotonic())
    if rank == 0:
        writer.write(_set(b"id", ID))
    else:
        writer.write(_wait(b"id"))  # as torch's client: the GET only after the WAIT's reply
        await reader.readexactly(1)
        writer.write(_get(b"id"))
        (size,) = _U64.unpack(await reader.readexactly(8))
        assert await reader.readexactly(size) == ID
    writer.write(_add(b"done", 1))
    (arrived,) = _I64.unpack(await reader.readexactly(8))
    writer.write((_set(b"fin", b"1") if arrived == world else b"") + _wait(b"fin"))
    await reader.readexactly(1)


def clients(world: int, first: int, count: int, per_relay: int, ports: str) -> None:
    _raise_nofile()
    relay_ports = [int(p) for p in ports.split(",")]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # "go"
        stormed: list[float] = []
        held: list[asyncio.StreamWriter] = []
        ranks = [_rank(r, world, (relay_address(r // per_relay), relay_ports[r // per_relay]), stormed, held)
                 for r in range(first, first + count)]
        await asyncio.wait_for(asyncio.gather(*ranks), TIMEOUT_S)
        print("storm", max(stormed), "done", time.monotonic(), flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # "close": connections held until the fds are read
        for writer in held:
            writer.close()

    asyncio.run(main())


# -- the driver -------------------------------------------------------------------------------------------------------


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(HERE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _line(proc: subprocess.Popen[str]) -> list[str]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{proc.args} ended: {proc.wait()}")
    return line.split()


def _tell(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(word + "\n")
    proc.stdin.flush()


class Sampler:
    """The most descriptors each process held, sampled every ``every`` seconds on a thread (and on ``sample()``)."""

    def __init__(self, kinds: dict[int, str], every: float) -> None:
        self.kinds = kinds
        self.most: dict[int, int] = dict.fromkeys(kinds, 0)
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def sample(self) -> None:
        for pid in self.kinds:
            self.most[pid] = max(self.most[pid], _fds(pid))

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for pid, kind in self.kinds.items():
            out[kind] = max(out.get(kind, 0), self.most[pid])
        return out


@dataclass
class Relayed:
    """One run through relays: the figures ``main`` prints and ``bench/run.py``'s store-scale rows show."""

    world: int
    relays: int
    client_procs: int
    hard: int  # the open-files hard limit every process ran under
    total_s: float
    storm_s: float
    host_cpu_s: float
    most: dict[str, int]  # kind ("host", "relay", "clients") -> the most descriptors one such process held
    clients: int  # the relays' clients, all of them
    upstream: int  # GETs/WAITs the relays sent upstream on their own
    joined: int  # GETs/WAITs that joined one already in flight
    waits: int  # WAITs the host's keyspace registered

    def lines(self) -> list[str]:
        return [f"{self.world} ranks, {self.relays} relays, {self.client_procs} client processes, hard NOFILE "
                f"{self.hard}, {os.cpu_count()} CPUs",
                f"total {self.total_s:.2f} s, storm {self.storm_s:.2f} s, host CPU {self.host_cpu_s:.2f} s "
                f"({self.host_cpu_s / self.world * 1e6:.1f} us/rank)",
                f"most fds: host {self.most['host']}, a relay {self.most['relay']}, a client process "
                f"{self.most['clients']}",
                f"relays: {self.clients} clients; GETs/WAITs upstream {self.upstream}, joined one in flight "
                f"{self.joined}; WAITs the host registered: {self.waits} (without relays: {2 * self.world - 1})"]


def run(world: int, relays: int, client_procs: int, every: float) -> Relayed:
    host_proc = _child("host")
    procs = [host_proc]
    try:
        port = int(_line(host_proc)[1])
        relay_procs = [_child("relay", str(port), str(i)) for i in range(relays)]
        procs += relay_procs
        relay_ports = [_line(p)[1] for p in relay_procs]
        per_relay = -(-world // relays)
        per_proc = -(-world // client_procs)
        parts = [(first, min(per_proc, world - first)) for first in range(0, world, per_proc)]
        client_list = [_child("clients", str(world), str(first), str(count), str(per_relay), ",".join(relay_ports))
                       for first, count in parts]
        procs += client_list
        for c in client_list:
            assert _line(c) == ["ready"]
        kinds = {host_proc.pid: "host", **{p.pid: "relay" for p in relay_procs}, **{p.pid: "clients" for p in client_list}}
        sampler = Sampler(kinds, every)
        cpu0 = _cpu_s(host_proc.pid)
        sampler.start()
        start = time.monotonic()
        for c in client_list:
            _tell(c, "go")
        ends = [_line(c) for c in client_list]
        storm = max(float(end[1]) for end in ends) - start
        total = max(float(end[3]) for end in ends) - start
        cpu = _cpu_s(host_proc.pid) - cpu0
        sampler.stop()  # every connection is still open: the last sample sees them all
        for p in relay_procs:
            _tell(p, "stats")
        stats = [list(map(int, _line(p)[1:])) for p in relay_procs]
        _tell(host_proc, "waits")
        waits = int(_line(host_proc)[1])
        result = Relayed(world, relays, client_procs, resource.getrlimit(resource.RLIMIT_NOFILE)[1], total, storm, cpu,
                         sampler.by_kind(), sum(s[0] for s in stats), sum(s[1] for s in stats),
                         sum(s[2] for s in stats), waits)
        for c in client_list:
            _tell(c, "close")
        for c in client_list:
            c.wait(timeout=120)
        for p in [*relay_procs, host_proc]:
            _tell(p, "close")
            p.wait(timeout=60)
        return result
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run_reps(reps: int, world: int = 25000, relays: int = 25, client_procs: int = 5,
             every: float = 0.5) -> list[Relayed]:
    """``reps`` runs (``bench/run.py``'s store-scale metric)."""
    return [run(world, relays, client_procs, every) for _ in range(reps)]


def rows(runs: list[Relayed]) -> list[Row]:
    """The store-scale rows through relays: rankrun only (torch's server holds one descriptor per rank: past the hard
    limit it cannot be run at this size)."""
    if not runs:
        return []
    world, hard = runs[0].world, runs[0].hard
    most = max(max(r.most.values()) for r in runs)
    name = f"store scale {world:,} clients through {runs[0].relays} relays (torch's server: not runnable, hard limit {hard:,})"
    limit = 20000 if hard == resource.RLIM_INFINITY else hard  # the figure: this machine's hard limit
    return [Row(f"{name}: whole sequence", "s", rankrun=statistics.median(r.total_s for r in runs),
                torchrun=float("nan"), decimals=2, compare=False),
            Row(f"{name}: the most descriptors any process held", "count", rankrun=most, torchrun=float("nan"),
                compare=False, target=Target(f"≤ {limit:,} (the hard limit)", lambda r: r.rankrun <= limit))]


def details(runs: list[Relayed]) -> list[str]:
    if not runs:
        return []
    r0 = runs[0]
    lines = [f"**Through store relays** (`bench/relay_storm.py --ranks {r0.world} --relays {r0.relays} --client-procs "
             f"{r0.client_procs}`: the same clients' traffic, each through its node's relay process (one per loopback "
             f"address) to one host process; every process's `/proc/<pid>/fd` sampled every 0.5 s and once with every "
             f"connection open; hard `RLIMIT_NOFILE` {r0.hard:,}):",
             "",
             "| run | total s | storm s | host CPU s | most fds: host | a relay | a client process | GETs/WAITs upstream "
             "| joined one in flight | WAITs the host's keyspace registered |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        lines.append(f"| {i} | {r.total_s:.2f} | {r.storm_s:.2f} | {r.host_cpu_s:.2f} | {r.most['host']:,} | "
                     f"{r.most['relay']:,} | {r.most['clients']:,} | {r.upstream:,} | {r.joined:,} | {r.waits:,} |")
    lines.append("")
    return lines


def _round_trips(port: int, address: str, count: int) -> list[float]:
    import socket  # noqa: PLC0415

    with socket.create_connection((address, port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(VALIDATE)
        took = []
        for _ in range(count):
            start = time.perf_counter()
            sock.sendall(_add(b"n", 1))
            got = b""
            while len(got) < 8:
                got += sock.recv(8 - len(got))
            took.append(time.perf_counter() - start)
    return took


def latency(count: int) -> None:
    """One client's ADD round trip (p50, p99), to the store directly and through a relay, host and relay in processes
    of their own."""
    host_proc = _child("host-direct")
    procs = [host_proc]
    try:
        _, relay_port, store_port = _line(host_proc)
        relay_proc = _child("relay", relay_port, "0")
        procs.append(relay_proc)
        port = int(_line(relay_proc)[1])
        for name, where in (("direct", (int(store_port), HOST)), ("relay", (port, relay_address(0))),
                            ("direct", (int(store_port), HOST)), ("relay", (port, relay_address(0)))):
            took = sorted(_round_trips(*where, count))
            print(f"{name:7} ADD round trip: p50 {took[len(took) // 2] * 1e6:7.1f} us, p99 "
                  f"{took[int(len(took) * 0.99)] * 1e6:7.1f} us ({count})", flush=True)
        for p in (relay_proc, host_proc):
            _tell(p, "stats")
            _line(p)
            _tell(p, "close")
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=25000)
    parser.add_argument("--relays", type=int, default=25)
    parser.add_argument("--client-procs", type=int, default=5)
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--latency", type=int, default=0, metavar="N", help="only: N ADD round trips, direct and relayed")
    args = parser.parse_args()
    if args.latency:
        latency(args.latency)
        return
    print("\n".join(run(args.ranks, args.relays, args.client_procs, args.sample_s).lines()))


if __name__ == "__main__":
    if sys.argv[1:2] == ["host"]:
        host()
    elif sys.argv[1:2] == ["host-direct"]:
        host(direct=True)
    elif sys.argv[1:2] == ["relay"]:
        relay(*map(int, sys.argv[2:4]))
    elif sys.argv[1:2] == ["clients"]:
        clients(*map(int, sys.argv[2:6]), sys.argv[6])
    else:
        main()
