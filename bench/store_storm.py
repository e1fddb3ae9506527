"""The connect storm: N raw-protocol TCPStore clients at once against rankrun's ``TCPStoreServer`` and torch's own
``TCPStore(is_master=True)`` server (libuv), each server in a fresh process of its own per run, alternating.

Every client does what ``init_process_group``'s store traffic does: connect, VALIDATE, ADD a counter; rank 0 SETs a
128-byte id, every other rank WAITs for it and GETs it; then a closing barrier (ADD, the last one SETs a key, everyone
WAITs for it). The clients run in ``--client-procs`` processes (asyncio streams), started and made ready before the
clock starts. Per run: the whole sequence, the storm (every client connected, handshaken and its ADD answered), the
server's CPU (``/proc/<pid>/stat``), its RSS before and with every connection open and idle (per connection), and
the kernel's ``ListenOverflows``/``ListenDrops``/``TCPSynRetrans`` (``/proc/net/netstat``, TcpExt) before and after.

Both servers get the same open-files limit: their soft limit raised to the hard one.

    python bench/store_storm.py --sizes 1024,4096 --reps 2
    python bench/store_storm.py --sizes 16384 --somaxconn 65535   # as root: a listen queue for every rank

It is also ``bench/run.py``'s ``store_scale`` metric (``run_scale``, ``rows``, ``details``): 1,024, 4,096 and 16,384
clients, the two servers alternating, a row per size and quantity, medians over the repetitions, with issue 24's
targets at 16,384: the whole sequence within 1.2x torch's, server CPU within 1.5x, at most 4 KiB per idle connection
and no listen overflow.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from report import Row, Target

HERE = Path(__file__).resolve()
SRC = HERE.parents[1] / "src"
HOST = "127.0.0.1"
ID = bytes(range(128))
TIMEOUT_S = 300.0

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")


def _s(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


VALIDATE = b"\x00" + _U32.pack(0x3C85F7CE)


def _add(key: bytes, n: int) -> bytes:
    return b"\x04" + _s(key) + _I64.pack(n)


def _set(key: bytes, value: bytes) -> bytes:
    return b"\x01" + _s(key) + _s(value)


def _wait(key: bytes) -> bytes:
    return b"\x06" + _U64.pack(1) + _s(key)


def _get(key: bytes) -> bytes:
    return b"\x03" + _s(key)


# -- the server process ---------------------------------------------------------------------------------------------


def serve(kind: str, src: str = str(SRC)) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if kind == "torch":
        import torch.distributed as dist  # noqa: PLC0415 - only the torch server process imports torch

        store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False, use_libuv=True)
        print("port", store.port, flush=True)
        sys.stdin.read()
        return
    sys.path.insert(0, src)
    from rankrun.workerstore.tcpstore import TCPStoreServer  # noqa: PLC0415

    try:
        from rankrun.main import collect_less_often  # noqa: PLC0415
    except ImportError:  # --before-src: a checkout from before it, served as it was
        pass
    else:
        collect_less_often()  # as the launcher that hosts the store does at start

    async def main() -> None:
        server = TCPStoreServer()
        print("port", await server.start(HOST, 0), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.close()

    profile = os.environ.get("STORM_PROFILE")  # a path: the server's cProfile stats go there (where the CPU goes)
    if not profile:
        asyncio.run(main())
        return
    import cProfile  # noqa: PLC0415 - only when asked

    cProfile.runctx("asyncio.run(main())", globals(), {"main": main, "asyncio": asyncio}, profile)


# -- a client process -------------------------------------------------------------------------------------------------


async def _rank(rank: int, world: int, port: int, stormed: list[float], held: list[asyncio.StreamWriter]) -> None:
    reader, writer = await asyncio.open_connection(HOST, port, limit=4096)
    held.append(writer)
    writer.write(VALIDATE + _add(b"init", 1))
    await reader.readexactly(8)
    stormed.append(time.monotonic())
    if rank == 0:
        writer.write(_set(b"id", ID))
    else:
        writer.write(_wait(b"id"))  # as torch's client: the GET only after the WAIT's reply (libuv answers a
        await reader.readexactly(1)  # pipelined GET at once, before the WAIT it follows)
        writer.write(_get(b"id"))
        (size,) = _U64.unpack(await reader.readexactly(8))
        assert await reader.readexactly(size) == ID
    writer.write(_add(b"done", 1))
    (arrived,) = _I64.unpack(await reader.readexactly(8))
    writer.write((_set(b"fin", b"1") if arrived == world else b"") + _wait(b"fin"))
    await reader.readexactly(1)


def clients(port: int, world: int, first: int, count: int) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # "go"
        stormed: list[float] = []
        held: list[asyncio.StreamWriter] = []
        await asyncio.wait_for(asyncio.gather(*(_rank(r, world, port, stormed, held) for r in range(first, first + count))),
                               TIMEOUT_S)
        print("storm", max(stormed), "done", time.monotonic(), flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)  # "close": connections held until the RSS is read
        for writer in held:
            writer.close()

    asyncio.run(main())


# -- the driver -------------------------------------------------------------------------------------------------------


def _netstat() -> dict[str, int]:
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            return dict(zip(names.split()[1:], map(int, values.split()[1:]), strict=True))
    return {}


def _cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _child(*args: str, quiet: bool = False) -> subprocess.Popen[str]:
    # torch's server does a reverse-DNS lookup per connection on its loop thread; a resolver that loses queries stalls
    # it 5 s each (1,024 ranks: 96 s here). As bench/harness.py: RES_OPTIONS shortens that to 1 s (still counted).
    env = {**os.environ, "RES_OPTIONS": os.environ.get("RES_OPTIONS", "timeout:1 attempts:1")}
    return subprocess.Popen([sys.executable, str(HERE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env, stderr=subprocess.DEVNULL if quiet else None)


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


def one_run(kind: str, world: int, procs: int, src: str) -> dict[str, float]:
    server = _child("serve", kind, src, quiet=kind == "torch")  # torch warns per failed lookup
    port = int(_line(server)[1])
    per = -(-world // procs)
    parts = [(first, min(per, world - first)) for first in range(0, world, per)]
    workers = [_child("clients", str(port), str(world), str(first), str(count)) for first, count in parts]
    try:
        for worker in workers:
            assert _line(worker) == ["ready"]
        rss0, cpu0, net0 = _rss_kib(server.pid), _cpu_s(server.pid), _netstat()
        start = time.monotonic()
        for worker in workers:
            _tell(worker, "go")
        ends = [_line(worker) for worker in workers]
        storm = max(float(end[1]) for end in ends) - start
        total = max(float(end[3]) for end in ends) - start
        cpu1 = _cpu_s(server.pid)
        user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        cpu = user + system
        rss = _rss_kib(server.pid)
        net1 = _netstat()
        for worker in workers:
            _tell(worker, "close")
        for worker in workers:
            worker.wait(timeout=60)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return {"total_s": total, "storm_s": storm, "cpu_s": cpu, "cpu_us_per_rank": cpu / world * 1e6,
            "user_us_per_rank": user / world * 1e6, "sys_us_per_rank": system / world * 1e6,
            "rss_mib": rss / 1024, "kib_per_conn": (rss - rss0) / world,
            **{k: float(net1.get(k, 0) - net0.get(k, 0)) for k in ("ListenOverflows", "ListenDrops", "TCPSynRetrans")}}


# -- bench/run.py's store_scale metric -----------------------------------------------------------------------------

SCALE_SIZES = (1024, 4096, 16384)
SCALE_KINDS = ("rankrun", "torch")
TARGET_AT = 16384  # the targets are for this size
KEEP = 64  # descriptors a process needs besides its connections


def _sysctls() -> str:
    net = Path("/proc/sys/net")
    names = ("core/somaxconn", "ipv4/tcp_max_syn_backlog", "ipv4/tcp_syncookies")
    return ", ".join(f"{name.split('/')[1]} {(net / name).read_text().strip()}" for name in names)


@dataclass
class Scale:
    reps: int
    sizes: tuple[int, ...]
    runs: dict[tuple[str, int], list[dict[str, float]]] = field(default_factory=dict)
    skipped: dict[int, str] = field(default_factory=dict)  # size -> why it was not run
    sysctls: str = ""
    loadavg: tuple[str, str] = ("", "")  # /proc/loadavg before and after

    def median(self, kind: str, size: int, key: str) -> float:
        runs = self.runs.get((kind, size), [])
        return statistics.median(r[key] for r in runs) if runs else float("nan")


def run_scale(reps: int, sizes: tuple[int, ...] = SCALE_SIZES, procs: int = 2, src: str = str(SRC),
              log: Callable[[str], None] | None = None) -> Scale:
    """Every size ``reps`` times, rankrun's server and torch's alternating (which goes first rotates)."""
    result = Scale(reps, sizes, sysctls=_sysctls())
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    before = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    for world in sizes:
        if hard != resource.RLIM_INFINITY and hard < world + KEEP:
            result.skipped[world] = f"the open-files hard limit ({hard}) is below {world} connections"
            continue
        for rep in range(reps):
            for kind in SCALE_KINDS[rep % 2:] + SCALE_KINDS[:rep % 2]:
                r = one_run(kind, world, procs, src)
                result.runs.setdefault((kind, world), []).append(r)
                if log is not None:
                    log(f"  store_scale {kind:7} {world:6} rep {rep}: total {r['total_s']:.2f} s, storm {r['storm_s']:.2f} s, "
                        f"CPU {r['cpu_us_per_rank']:.0f} us/rank, {r['kib_per_conn']:.2f} KiB/conn, "
                        f"{r['ListenOverflows']:.0f} overflows")
    result.loadavg = (before, " ".join(Path("/proc/loadavg").read_text().split()[:3]))
    return result


def _ratio_within(limit: float) -> Target:
    return Target(f"≤ {limit:g}x torch's", lambda r: r.rankrun <= limit * r.torchrun)


def rows(result: Scale) -> list[Row]:
    out: list[Row] = []
    for world in result.sizes:
        if ("rankrun", world) not in result.runs:
            continue
        at = world == TARGET_AT

        def m(kind: str, key: str, world: int = world) -> float:
            return result.median(kind, world, key)

        name = f"store scale {world:,} clients"
        out += [
            Row(f"{name}: whole sequence", "s", rankrun=m("rankrun", "total_s"),
                torchrun=m("torch", "total_s"), decimals=2, target=_ratio_within(1.2) if at else None),
            Row(f"{name}: connect storm", "s",
                rankrun=m("rankrun", "storm_s"), torchrun=m("torch", "storm_s"), decimals=2),
            Row(f"{name}: server CPU per rank", "us", rankrun=m("rankrun", "cpu_us_per_rank"),
                torchrun=m("torch", "cpu_us_per_rank"), target=_ratio_within(1.5) if at else None),
            Row(f"{name}: server RSS per idle connection", "KiB", rankrun=m("rankrun", "kib_per_conn"),
                torchrun=m("torch", "kib_per_conn"), decimals=2,
                target=Target("≤ 4 KiB", lambda r: r.rankrun <= 4) if at else None),
            Row(f"{name}: listen overflows", "count", rankrun=m("rankrun", "ListenOverflows"),
                torchrun=m("torch", "ListenOverflows"), compare=False,
                target=Target("0", lambda r: r.rankrun == 0) if at else None),
        ]
    return out


def details(result: Scale) -> list[str]:
    lines = ["### The workers' store at scale", "",
             f"**Workers' store at scale** (`bench/store_storm.py`: N raw-protocol clients doing init_process_group's "
             f"store traffic (the whole sequence; the connect storm: every client connected, handshaken and its first "
             f"ADD answered), in 2 processes, against rankrun's `TCPStoreServer` and torch's `TCPStore(is_master=True)` "
             f"(libuv), each server in a fresh process per run, alternating; {result.reps} run(s) per size and server; "
             f"{result.sysctls}; load average {result.loadavg[0]} before, {result.loadavg[1]} after):",
             "",
             "| server | ranks | total s | storm s | CPU us/rank (user+sys) | RSS MiB | KiB/conn | overflows | SYN retrans |",
             "|---|---|---|---|---|---|---|---|---|"]
    for world in result.sizes:
        for kind in SCALE_KINDS:
            for r in result.runs.get((kind, world), []):
                lines.append(f"| {kind} | {world:,} | {r['total_s']:.2f} | {r['storm_s']:.2f} | {r['cpu_us_per_rank']:.0f} "
                             f"({r['user_us_per_rank']:.0f}+{r['sys_us_per_rank']:.0f}) | {r['rss_mib']:.1f} | "
                             f"{r['kib_per_conn']:.2f} | {r['ListenOverflows']:.0f} | {r['TCPSynRetrans']:.0f} |")
    lines.append("")
    lines += [f"- {world:,} clients not run: {why}." for world, why in result.skipped.items()]
    # The 25,000-rank row through store relays goes here: bench/relay_storm.py (the relay work, to come) adds its own
    # rows and lines to this metric in bench/run.py.
    lines += [f"Command: `python bench/store_storm.py --sizes {','.join(map(str, result.sizes))} --reps {result.reps}`.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--servers", default="rankrun,torch")
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--src", default=str(SRC), help="the rankrun sources to serve from")
    parser.add_argument("--before-src", default="", help="another checkout's sources, served as the server 'before'")
    parser.add_argument("--somaxconn", type=int, default=0,
                        help="run in a network namespace of its own with this net.core.somaxconn (root, unshare, ip)")
    args = parser.parse_args()
    if args.somaxconn:  # the host's setting stays as it is (other jobs share it); a fresh namespace has only lo, down
        rest = [a for a in sys.argv[1:] if not a.startswith("--somaxconn")]
        if "--somaxconn" in sys.argv:
            del rest[sys.argv.index("--somaxconn") - 1]  # its value
        script = 'ip link set lo up && sysctl -qw net.core.somaxconn="$0" && exec "$@"'
        sys.exit(subprocess.call(["unshare", "-n", "sh", "-c", script, str(args.somaxconn), sys.executable, str(HERE), *rest]))
    kinds = args.servers.split(",")
    sysctl = Path("/proc/sys/net")
    print(f"somaxconn {(sysctl / 'core/somaxconn').read_text().strip()}, tcp_max_syn_backlog "
          f"{(sysctl / 'ipv4/tcp_max_syn_backlog').read_text().strip()}, NOFILE {resource.getrlimit(resource.RLIMIT_NOFILE)}, "
          f"{os.cpu_count()} CPUs")
    print("server   ranks  rep  total_s storm_s  cpu_s  cpu_us/rank (user+sys)  rss_MiB  KiB/conn  overflows drops synretrans")
    for world in map(int, args.sizes.split(",")):
        for rep in range(args.reps):
            for kind in kinds[rep % len(kinds):] + kinds[:rep % len(kinds)]:  # alternating which goes first
                src = args.before_src if kind == "before" else args.src
                r = one_run("rankrun" if kind == "before" else kind, world, args.client_procs, src)
                print(f"{kind:8} {world:6} {rep:4} {r['total_s']:8.2f} {r['storm_s']:7.2f} {r['cpu_s']:6.2f} "
                      f"{r['cpu_us_per_rank']:6.1f} ({r['user_us_per_rank']:4.0f}+{r['sys_us_per_rank']:4.0f}) "
                      f"{r['rss_mib']:8.1f} {r['kib_per_conn']:9.2f} "
                      f"{r['ListenOverflows']:10.0f} {r['ListenDrops']:5.0f} {r['TCPSynRetrans']:10.0f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(*sys.argv[2:4])
    elif sys.argv[1:2] == ["clients"]:
        clients(*map(int, sys.argv[2:6]))
    else:
        main()
