"""The ``rendezvous`` metric of bench/run.py: one round for M simulated agents, rankrun beside torch's c10d handler,
the same on etcd beside the embedded store, an etcd leader failover (median of 5), a real-process point (64
rankrun agents, torchrun beside it), and a PNG plot of seconds vs M."""

from __future__ import annotations

import itertools
import math
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import rendezvous
from etcdserver import fresh_address
from harness import REPO, bench_env, log
from report import Row, Target

RANKRUN_M = (64, 256, 1024, 4096, 16384)
# through relays (store.embedded.relay): M → R relay processes, each holding M / R agents' connections (at most 4,096:
# this machine's somaxconn; the host's hard NOFILE limit, 20,000, is below 32,768), agents in max(4, R) processes
RELAYED_M = {16384: 4, 32768: 8}
# through the relays the host chooses (--rdzv-conf relay_group, the group the launcher picks by itself: isqrt(M - 1) + 1):
# the first agents to arrive relay for the others, each in its own agents process
ROUTED_M = {16384: 128, 32768: 182}
TORCH_M = (64, 256, 512)
TORCH_BOUND = 120.0  # seconds: past this torch's round is reported as "did not complete"
TORCH_PROCS = 16
REAL_AGENTS = 64
REAL_TORCHRUN = 32  # 64 torchrun agents would need ~14 GB (220 MB each); 32 fit
PLOT = REPO / "docs" / "rendezvous.png"
TARGETS = {1024: 2.0, 4096: 5.0, 16384: 10.0, 32768: 60.0}
PER_NODE_BASE = 1024  # the per-node cost (seconds / nodes) of every larger round is given as a ratio to this one's
PER_NODE_FLAT = 1.1  # the bound on that ratio
ETCD_M = (64, 256, 1024)
ETCD_TARGETS = {1024: 5.0}
FAILOVER_REPS = 5


@dataclass
class Result:
    rankrun: dict[int, list[dict[str, object]]] = field(default_factory=dict)
    relayed: dict[int, list[dict[str, object]]] = field(default_factory=dict)
    routed: dict[int, list[dict[str, object]]] = field(default_factory=dict)
    torch: dict[int, dict[str, object]] = field(default_factory=dict)
    real: dict[str, float] = field(default_factory=dict)
    etcd: dict[int, list[dict[str, object]]] = field(default_factory=dict)
    failover: dict[str, object] = field(default_factory=dict)


def run(reps: int) -> Result:
    result = Result()
    for m in RANKRUN_M:
        for rep in range(reps):
            r = rendezvous.run_rankrun(m, rendezvous.PROCS)
            result.rankrun.setdefault(m, []).append(r)
            log(f"  rendezvous rankrun M={m} rep {rep + 1}/{reps}: {r['seconds']} s, {r['ops_per_node']} ops, "
                f"{r['bytes_per_node']} B per node, CPU {r['cpu_s']} s (host {r['host_cpu_s']})")
    for m, relays in RELAYED_M.items():
        for rep in range(reps):
            r = rendezvous.run_rankrun(m, max(4, relays), relays=relays)
            result.relayed.setdefault(m, []).append(r)
            log(f"  rendezvous rankrun M={m} through {relays} relays rep {rep + 1}/{reps}: {r['seconds']} s, "
                f"{r['ops_per_node']} ops, {r['bytes_per_node']} B per node, CPU {r['cpu_s']} s (host {r['host_cpu_s']}, "
                f"relays {r['relays_cpu_s']}), at most {r['fds_max']} descriptors a process")
    for m, group in ROUTED_M.items():
        for rep in range(reps):
            r = rendezvous.run_rankrun(m, rendezvous.PROCS, group=group)
            result.routed.setdefault(m, []).append(r)
            log(f"  rendezvous rankrun M={m} through the host's relays (relay_group {group}) rep {rep + 1}/{reps}: "
                f"{r['seconds']} s, {r['ops_per_node']} ops, {r['bytes_per_node']} B per node, CPU {r['cpu_s']} s "
                f"(host {r['host_cpu_s']}, {r['host_fds']} descriptors), at most {r['fds_max']} descriptors a process")
    for m in TORCH_M:
        r = rendezvous.run_torch(m, min(TORCH_PROCS, m), TORCH_BOUND)
        result.torch[m] = r
        log(f"  rendezvous torch c10d M={m}: {r['seconds'] if r['completed'] else 'did not complete'} s")
        if not r["completed"]:
            break  # a larger M will not complete either
    for m in ETCD_M:
        for rep in range(reps):
            r = rendezvous.run_etcd(m, 4)
            result.etcd.setdefault(m, []).append(r)
            log(f"  rendezvous rankrun on etcd M={m} rep {rep + 1}/{reps}: {r['seconds']} s, {r['ops_per_node']} ops per node")
    result.failover = rendezvous.run_failover(FAILOVER_REPS)
    f = result.failover
    log(f"  etcd leader failover: keep-alive after {f['keepalive_s']} s, watch after {f['watch_s']} s")
    result.real["rankrun"] = _real_agents((sys.executable, "-m", "rankrun"), REAL_AGENTS)
    log(f"  {REAL_AGENTS} real rankrun agents: {result.real['rankrun']:.2f} s")
    result.real["torchrun"] = _real_agents((sys.executable, "-m", "torch.distributed.run"), REAL_TORCHRUN)
    log(f"  {REAL_TORCHRUN} real torchrun agents: {result.real['torchrun']:.2f} s")
    result.real["rankrun_same"] = _real_agents((sys.executable, "-m", "rankrun"), REAL_TORCHRUN)
    plot(result, PLOT)
    return result


def _real_agents(launcher: tuple[str, ...], count: int) -> float:
    """``count`` agents on one endpoint, ``--nproc-per-node=1 --no-python true``: seconds until every one exited 0."""
    port = 29400
    addr = fresh_address()  # a fresh loopback address: the fixed port cannot collide
    cmd = [*launcher, "--nnodes", str(count), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr}:{port}", "--rdzv-id", "real",
           "--nproc-per-node", "1", "--rdzv-conf", "join_timeout=300", "--no-python", "true"]
    env = bench_env() | {"RANKRUN_RDZV_SECRET": "bench"}
    started = time.monotonic()
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(count)]
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    wall = time.monotonic() - started
    if any(codes):
        return float("nan")
    return wall


def _cpu(runs: list[dict[str, object]]) -> str:
    """Median CPU seconds of every process of the round, and of the host's."""
    return (f"{_median([float(r['cpu_s']) for r in runs]):.2f} "  # type: ignore[arg-type]
            f"({_median([float(r['host_cpu_s']) for r in runs]):.2f})")  # type: ignore[arg-type]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def rows(result: Result) -> list[Row]:
    out = []
    for m, runs in result.rankrun.items():
        seconds = _median([float(r["seconds"]) for r in runs])  # type: ignore[arg-type]
        torch = result.torch.get(m)
        torch_s = float(torch["seconds"]) if torch and torch["completed"] else float("nan")  # type: ignore[arg-type]
        target = Target(f"< {TARGETS[m]:.0f} s", lambda r, t=TARGETS[m]: r.rankrun < t) if m in TARGETS else None
        out.append(Row(f"rendezvous, one round, {m:,} simulated nodes (torch c10d: " +
                       ("did not complete" if torch and not torch["completed"] else "not run" if not torch else "completed")
                       + ")", "s", rankrun=seconds, torchrun=torch_s, target=target, decimals=2))
    for m, runs in result.relayed.items():
        seconds = _median([float(r["seconds"]) for r in runs])  # type: ignore[arg-type]
        target = Target(f"< {TARGETS[m]:.0f} s", lambda r, t=TARGETS[m]: r.rankrun < t) if m in TARGETS else None
        out.append(Row(f"rendezvous, one round, {m:,} simulated nodes through {runs[0]['relays']} relays (torch c10d: "
                       "not run)", "s", rankrun=seconds, torchrun=float("nan"), target=target, decimals=2))
    for m, runs in result.routed.items():
        seconds = _median([float(r["seconds"]) for r in runs])  # type: ignore[arg-type]
        target = Target(f"< {TARGETS[m]:.0f} s", lambda r, t=TARGETS[m]: r.rankrun < t) if m in TARGETS else None
        out.append(Row(f"rendezvous, one round, {m:,} simulated nodes through the relays the host chooses (relay_group "
                       f"{runs[0]['relay_group']}; torch c10d: not run)", "s", rankrun=seconds, torchrun=float("nan"),
                       target=target, decimals=2))
    base = result.rankrun.get(PER_NODE_BASE)
    if base:
        per_node = _median([float(r["seconds"]) for r in base]) / PER_NODE_BASE  # type: ignore[arg-type]
        for label, runs_by_m in (("", result.rankrun), (" through relays", result.relayed),
                                 (" through the host's relays", result.routed)):
            for m, runs in runs_by_m.items():
                if m > PER_NODE_BASE:
                    ratio = _median([float(r["seconds"]) for r in runs]) / m / per_node  # type: ignore[arg-type]
                    out.append(Row(f"rendezvous, per-node cost at {m:,} nodes{label} ÷ at {PER_NODE_BASE:,}", "x",
                                   rankrun=ratio, torchrun=float("nan"), decimals=2, compare=False,
                                   target=Target(f"≤ {PER_NODE_FLAT}", lambda r: r.rankrun <= PER_NODE_FLAT)))
    for m, runs in result.etcd.items():
        embedded = result.rankrun.get(m)
        target = (Target(f"< {ETCD_TARGETS[m]:.0f} s", lambda r, t=ETCD_TARGETS[m]: r.rankrun < t)
                  if m in ETCD_TARGETS else None)
        out.append(Row(f"rendezvous on etcd (1 member), one round, {m:,} simulated nodes (torch: its etcd backends need "
                       "the v2 API)", "s", rankrun=_median([float(r["seconds"]) for r in runs]),  # type: ignore[arg-type]
                       torchrun=float("nan"), decimals=2, target=target, compare=False,
                       baseline=_median([float(r["seconds"]) for r in embedded]) if embedded else None,  # type: ignore[arg-type]
                       baseline_label="embedded store"))
    failover = result.failover
    if failover:
        out.append(Row(f"etcd leader SIGKILLed (3 members): until a keep-alive is accepted again, median of {failover['reps']}",
                       "s", rankrun=float(failover["keepalive_median"]), torchrun=float("nan"), decimals=2,  # type: ignore[arg-type]
                       compare=False))
        out.append(Row(f"etcd leader SIGKILLed (3 members): until the next watch event arrives, median of {failover['reps']}",
                       "s", rankrun=float(failover["watch_median"]), torchrun=float("nan"), decimals=2,  # type: ignore[arg-type]
                       compare=False))
    real = result.real
    out.append(Row(f"{REAL_AGENTS} real agents on one endpoint, --no-python true (torchrun: not run, ~14 GB)", "s",
                   rankrun=real.get("rankrun", float("nan")), torchrun=float("nan"), decimals=2))
    out.append(Row(f"{REAL_TORCHRUN} real agents on one endpoint, --no-python true", "s",
                   rankrun=real.get("rankrun_same", float("nan")), torchrun=real.get("torchrun", float("nan")), decimals=2))
    return out


def details(result: Result) -> list[str]:
    lines = [
        "### Rendezvous",
        "",
        "`python bench/rendezvous.py --nodes M [--json] [--torch]` runs one complete round with M simulated agents: a host "
        "process serves the embedded store and runs the coordinator, as the hosting agent does; the agents are asyncio tasks "
        "spread over one process per core, each with its own authenticated connection, running exactly `Member.join` + "
        "`Member.next_round` (the code a real agent runs). Wall seconds run from \"go\" to the last assignment received; "
        "operations are requests on an agent's connection; bytes count both directions, handshake included. torch's row runs "
        f"its own c10d `DynamicRendezvousHandler` (threads in up to {TORCH_PROCS} processes, one TCPStore connection each, "
        f"torch's TCPStore server in a host process), stopped at {TORCH_BOUND:.0f} s. The real-process rows start that many "
        "agents at once on one endpoint with `--nproc-per-node=1 --no-python true` and time them until all exited 0.",
        "",
        f"![seconds for one round vs nodes]({PLOT.relative_to(REPO)})",
        "",
        "Seconds for one complete round (log scale) vs simulated nodes (log scale): blue rankrun, red torch's c10d "
        f"handler, a red cross where torch's round did not complete within {TORCH_BOUND:.0f} s.",
        "",
        "| nodes | rankrun s (samples) | store operations per node | bytes per node | CPU s, all processes (host) | "
        "torch c10d s |",
        "|---|---|---|---|---|---|",
    ]
    for m, runs in result.rankrun.items():
        torch = result.torch.get(m)
        torch_text = ("—" if not torch else f"{torch['seconds']}" if torch["completed"]
                      else f"did not complete in {TORCH_BOUND:.0f} s")
        lines.append(f"| {m:,} | {', '.join(str(r['seconds']) for r in runs)} | {runs[0]['ops_per_node']} | "
                     f"{runs[0]['bytes_per_node']:,} | {_cpu(runs)} | {torch_text} |")
    for m, runs in result.relayed.items():
        lines.append(f"| {m:,} through {runs[0]['relays']} relays | {', '.join(str(r['seconds']) for r in runs)} | "
                     f"{runs[0]['ops_per_node']} | {runs[0]['bytes_per_node']:,} | {_cpu(runs)} | — |")
    for m, runs in result.routed.items():
        lines.append(f"| {m:,} through the host's relays (relay_group {runs[0]['relay_group']}; host descriptors "
                     f"{max(int(r['host_fds']) for r in runs):,}, any process's at most "  # type: ignore[call-overload]
                     f"{max(int(r['fds_max']) for r in runs):,}) | {', '.join(str(r['seconds']) for r in runs)} | "  # type: ignore[call-overload]
                     f"{runs[0]['ops_per_node']} | {runs[0]['bytes_per_node']:,} | {_cpu(runs)} | — |")
    for m, torch in result.torch.items():
        if m not in result.rankrun:
            lines.append(f"| {m:,} | — | — | — | — | {torch['seconds'] if torch['completed'] else 'did not complete'} |")
    lines += ["", "Bytes per node grow only with the number of digits in ids and revisions (log M); operations per node "
              "are constant (6 when an assignment is already there at the first read, 10 otherwise). Through relays "
              "(`--relays R`): R relay processes (`store.embedded.relay`) each hold M / R agents' connections and "
              "forward them, in batches, over one connection each to the host. Through the host's relays "
              "(`--relay-group K`, as `--rdzv-conf relay_group=K`): the first agents to arrive are asked to relay and "
              "run their relay in their own agents process, the later ones are sent to them (docs/multinode.md, "
              "*Rendezvous relays*).", ""]
    if result.etcd:
        lines += [
            "#### On etcd",
            "",
            "`python bench/rendezvous.py --backend etcd --nodes M` runs the same round on a single-member etcd 3.4 the "
            "bench starts on a fresh loopback address (and kills): the coordinator in one process and the M agents in 4, "
            "each agent with its own etcd client (its own HTTP connections), all through rankrun's client over etcd's JSON "
            "gateway. etcd commits every write to disk (fsync), which the embedded store never does.",
            "",
            "| nodes | etcd s (samples) | requests per node | embedded store s (median) |",
            "|---|---|---|---|",
        ]
        for m, runs in result.etcd.items():
            embedded = result.rankrun.get(m)
            emb = f"{_median([float(r['seconds']) for r in embedded]):.2f}" if embedded else "—"  # type: ignore[arg-type]
            lines.append(f"| {m:,} | {', '.join(str(r['seconds']) for r in runs)} | {runs[0]['ops_per_node']} | {emb} |")
        lines.append("")
    if result.failover:
        f = result.failover
        lines += [
            "#### etcd leader failover",
            "",
            f"`python bench/rendezvous.py --failover --reps {f['reps']}`: a 3-member etcd on loopback (heartbeat 50 ms, "
            "election timeout 500 ms, as the tests run it); a client holding a lease and a prefix watch through all three "
            "endpoints, as an agent does; the leader is SIGKILLed, and the bench times from the kill until the cluster "
            "accepts a keep-alive again (the client fails over and waits out the election by itself), then until a watch "
            "event written after that arrives (the watch re-created on a survivor from the last revision seen). The "
            "killed member rejoins between repetitions.",
            "",
            f"- keep-alive accepted again: {', '.join(f'{v:.2f}' for v in f['keepalive_s'])} s "  # type: ignore[attr-defined]
            f"(median {float(f['keepalive_median']):.2f} s)",  # type: ignore[arg-type]
            f"- next watch event: {', '.join(f'{v:.2f}' for v in f['watch_s'])} s "  # type: ignore[attr-defined]
            f"(median {float(f['watch_median']):.2f} s)",  # type: ignore[arg-type]
            "",
        ]
    return lines


# --------------------------------------------------------------------------- a PNG plot without matplotlib


def plot(result: Result, path: Path) -> None:
    """Seconds vs nodes on log-log axes: rankrun (blue) and torch c10d (red; a cross where it did not complete)."""
    width, height, margin = 640, 400, 50
    pixels = bytearray(b"\xff" * width * height * 3)
    xs = [*RANKRUN_M, *TORCH_M]
    lo_x, hi_x = math.log10(min(xs)), math.log10(max(xs))
    lo_y, hi_y = -2.0, math.log10(TORCH_BOUND) + 0.3

    def at(m: float, s: float) -> tuple[int, int]:
        x = margin + (math.log10(m) - lo_x) / (hi_x - lo_x) * (width - 2 * margin)
        y = height - margin - (math.log10(max(s, 0.01)) - lo_y) / (hi_y - lo_y) * (height - 2 * margin)
        return int(x), int(y)

    def dot(x: int, y: int, colour: tuple[int, int, int], r: int = 3) -> None:
        for dx in range(-r, r + 1):
            for dy in range(-r, r + 1):
                if 0 <= x + dx < width and 0 <= y + dy < height:
                    i = ((y + dy) * width + x + dx) * 3
                    pixels[i : i + 3] = bytes(colour)

    def line(a: tuple[int, int], b: tuple[int, int], colour: tuple[int, int, int], r: int = 1) -> None:
        steps = max(abs(b[0] - a[0]), abs(b[1] - a[1]), 1)
        for k in range(steps + 1):
            dot(a[0] + (b[0] - a[0]) * k // steps, a[1] + (b[1] - a[1]) * k // steps, colour, r)

    def text(x: int, y: int, label: str, scale: int = 2) -> None:
        """``label`` in a 3x5 pixel font (digits, '.', ',', 's', 'x', '-'), its top-left at (x, y)."""
        for n, char in enumerate(label):
            rows = _FONT.get(char, _FONT[" "])
            for r, bits in enumerate(rows):
                for c in range(3):
                    if bits >> (2 - c) & 1:
                        for sx in range(scale):
                            for sy in range(scale):
                                dot(x + (n * 4 + c) * scale + sx, y + r * scale + sy, (0, 0, 0), 0)

    grey = (180, 180, 180)
    line((margin, height - margin), (width - margin, height - margin), (0, 0, 0), 0)
    line((margin, margin), (margin, height - margin), (0, 0, 0), 0)
    for decade in range(-2, 3):  # 0.01 s .. 100 s gridlines
        y = at(min(xs), 10.0**decade)[1]
        if margin <= y <= height - margin:
            line((margin, y), (width - margin, y), grey, 0)
            label = f"{10.0**decade:g}"
            text(margin - 8 * len(label) - 4, y - 5, label)
    for m in sorted(set(xs)):
        x = at(m, 1)[0]
        line((x, height - margin), (x, height - margin + 6), (0, 0, 0), 0)
        text(x - 4 * len(str(m)), height - margin + 10, str(m))
    text(width // 2 - 20, height - 16, "nodes")
    text(8, 12, "s")
    blue, red = (30, 90, 200), (200, 40, 40)
    points = [at(m, _median([float(r["seconds"]) for r in runs])) for m, runs in result.rankrun.items()]  # type: ignore[arg-type]
    for a, b in itertools.pairwise(points):
        line(a, b, blue)
    for p in points:
        dot(*p, blue, 4)
    done = [(m, float(r["seconds"])) for m, r in result.torch.items() if r["completed"]]  # type: ignore[arg-type]
    tpoints = [at(m, s) for m, s in done]
    for a, b in itertools.pairwise(tpoints):
        line(a, b, red)
    for p in tpoints:
        dot(*p, red, 4)
    for m, r in result.torch.items():
        if not r["completed"]:
            x, y = at(m, TORCH_BOUND)
            line((x - 6, y - 6), (x + 6, y + 6), red, 1)
            line((x - 6, y + 6), (x + 6, y - 6), red, 1)
    _write_png(path, width, height, bytes(pixels))


_FONT = {  # 3 bits per row, 5 rows
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7), "4": (5, 5, 7, 1, 1),
    "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1), "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7),
    ".": (0, 0, 0, 0, 2), ",": (0, 0, 0, 2, 4), "-": (0, 0, 7, 0, 0), " ": (0, 0, 0, 0, 0),
    "s": (0, 3, 6, 3, 6), "n": (0, 6, 5, 5, 5), "o": (0, 7, 5, 5, 7), "d": (1, 7, 5, 5, 7), "e": (0, 7, 7, 4, 7),
}


def _write_png(path: Path, width: int, height: int, rgb: bytes) -> None:
    raw = b"".join(b"\x00" + rgb[y * width * 3 : (y + 1) * width * 3] for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
