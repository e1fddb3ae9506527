"""The ``health`` metric of bench/run.py: what ``--health-check`` costs a round, and a black-hole node.

``python bench/health_bench.py [--reps 21]``. One node: ``rankrun --nproc-per-node 8 --no-python true``, plain and
with ``--health-check true`` (the check is ``/bin/sh -c true``: what the gate itself costs, not a check's own
work), interleaved in rotating order in the same repetitions; wall from exec to exit and CPU of the launcher, its
workers and the check; medians, and the median of the per-repetition differences (drift on a shared machine hits
both alike). One round on one node is one attempt: the check runs once.

**A black-hole node**: three agents on loopback (each its own ``--local-addr``, the endpoint and the store on the first:
``is_host``),
``--nnodes 2:3 --max-restarts 3``, one worker a node; the third node's worker exits 1 at once on every attempt, the
others' sleep ``WORK`` s and exit 0. torchrun restarts all three in place until its budget is spent; the run is
bounded at ``BOUND`` s (torch's healthy agents then wait on its store for 300 s). rankrun (``--max-node-failures
2``) excludes the node after its second failure: the time from that failure to the healthy nodes' workers running
without it is read from the ``--events`` files (the black hole's second ``workers.end`` ``failed``, the healthy node
0's next ``workers.start``: one machine, one monotonic clock).

**The gate at 512 simulated nodes** (``--scale-reps``): one rendezvous round of ``SCALE`` simulated agents on the real
embedded store (``bench/rendezvous.py``: asyncio tasks in 4 processes, each with its own connection, running
``Member.join`` + ``Member.next_round``), plain and with every agent first running the real check
(``health.check.run_check``, ``/bin/sh -c true``, all at once, as each node's agent does before it joins its first
round), interleaved; seconds from "go" to the last assignment, and CPU of the agents, their checks and the store's
host. The 512 checks share this machine's cores, where 512 real nodes run one each: an upper bound.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))

from harness import (  # noqa: E402
    RANKRUN,
    TORCHRUN,
    BenchError,
    Samples,
    cpu_mark,
    finish,
    foreign_load,
    log,
    run_timed,
    start,
    stop,
)
from report import Row, fmt_samples  # noqa: E402

NPROC = 8
SCALE = 512  # simulated nodes of the gate's round at scale
KINDS = ("plain", "gate")
OPTIONS = {"plain": (), "gate": ("--health-check", "true")}


WORK = 3.0  # seconds a healthy node's worker runs
BOUND = 40.0  # seconds a black-hole run may take
BLACKHOLE = '[ "$BLACKHOLE" = 1 ] && exit 1; exec sleep {work}'


@dataclass
class BlackHole:
    """One launcher's black-hole run: each node's exit code (the black hole last) and when it exited, seconds after
    the first start (None: still running at BOUND, then stopped); rankrun's gap from the second failure to the
    workers running without the node, and the restarts its job used."""

    codes: list[int | None]
    exited: list[float | None]
    gap: float | None = None
    restarts: int | None = None


def _addresses() -> list[str]:
    """Three fresh loopback addresses (not 127.0.0.x), the first the endpoint's."""
    b, c = os.urandom(2)
    return [f"127.{1 + b % 254}.{c}.{n}" for n in (1, 2, 3)]


def blackhole(launcher: str) -> BlackHole:
    addrs = _addresses()
    argv0 = RANKRUN.argv if launcher == "rankrun" else TORCHRUN.argv
    common = ["--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "3", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"{addrs[0]}:29471", "--rdzv-id", "blackhole"]  # torch's store binds every address
    if launcher == "rankrun":
        common += ["--max-node-failures", "2"]
    with tempfile.TemporaryDirectory(prefix="rankrun-bench-blackhole-") as tmp:
        procs = []
        t0 = time.perf_counter()
        for n, addr in enumerate(addrs):
            extra = ["--events", f"{tmp}/{n}.jsonl"] if launcher == "rankrun" else []
            # every address is this machine's: the first node hosts the store (else whoever binds first, perhaps the
            # black hole, which then serves the job without workers); all three in the first round
            extra += ["--rdzv-conf", f"is_host={int(n == 0)}" + (",last_call_timeout=10" if launcher == "rankrun" else "")]
            argv = [*argv0, *common, "--local-addr", addr, *extra, "--no-python", "sh", "-c",
                    BLACKHOLE.format(work=WORK)]
            env = {"BLACKHOLE": "1" if n == 2 else "0", "RANKRUN_RDZV_SECRET": "bench-blackhole"}
            with open(f"{tmp}/{n}.err", "wb") as err:  # kept for the error message of a run that went wrong
                procs.append(start(argv, stderr=err.fileno(), extra_env=env))
        codes: list[int | None] = [None] * 3
        exited: list[float | None] = [None] * 3
        fds = {os.pidfd_open(proc.pid): n for n, proc in enumerate(procs)}
        try:
            while fds and (left := BOUND - (time.perf_counter() - t0)) > 0:
                for fd in select.select(list(fds), [], [], left)[0]:
                    n = fds.pop(fd)
                    os.close(fd)
                    exited[n] = time.perf_counter() - t0
                    codes[n] = finish(procs[n], 10).rc
        finally:
            for fd, n in fds.items():
                os.close(fd)
                stop(procs[n])
        result = BlackHole(codes, exited)
        if launcher == "rankrun":
            result.gap, result.restarts = _gap(Path(tmp))
            if codes != [0, 0, 4] or result.gap is None:
                said = "\n".join(f"node {n}: {Path(f'{tmp}/{n}.err').read_text()[-1500:]}" for n in range(3))
                raise BenchError(f"rankrun's black-hole run: exit codes {codes}, gap {result.gap}; stderr:\n{said}")
    return result


def _gap(tmp: Path) -> tuple[float | None, int | None]:
    """Seconds from the black hole's second failure (the second ``workers.end`` ``failed`` in its own events) to the
    next ``workers.start`` of the healthy node 0 (one machine: the files share CLOCK_MONOTONIC), and the restarts the
    job used (``max_restarts`` minus node 0's last ``restarts_left``)."""
    def read(n: int) -> list[dict[str, object]]:
        path = tmp / f"{n}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    failed = [float(e["mono"]) for e in read(2) if e["event"] == "workers.end" and e["outcome"] == "failed"]  # type: ignore[arg-type]
    healthy = read(0)
    lefts = [int(e["restarts_left"]) for e in healthy if e["event"] == "restart"]  # type: ignore[call-overload]
    restarts = 3 - min(lefts) if lefts else 0
    if len(failed) < 2:
        return None, restarts
    after = [float(e["mono"]) for e in healthy if e["event"] == "workers.start" and float(e["mono"]) > failed[1]]  # type: ignore[arg-type]
    return (after[0] - failed[1] if after else None), restarts


@dataclass
class Result:
    reps: int
    hole_reps: int = 0
    wall: Samples = field(default_factory=lambda: Samples("ms"))
    cpu: Samples = field(default_factory=lambda: Samples("ms"))
    load: tuple[float, float] = (0.0, 0.0)  # others' CPU share, steal share
    holes: dict[str, list[BlackHole]] = field(default_factory=dict)
    scale_reps: int = 0
    scale_wall: Samples = field(default_factory=lambda: Samples("s"))  # SCALE simulated nodes: one round
    scale_cpu: Samples = field(default_factory=lambda: Samples("s"))
    scale_load: tuple[float, float] = (0.0, 0.0)


def _launch(kind: str) -> tuple[float, float]:
    argv = [*RANKRUN.argv, "--nproc-per-node", str(NPROC), *OPTIONS[kind], "--no-python", "true"]
    timed = run_timed(argv, timeout=120)
    if timed.rc != 0:
        raise BenchError(f"{' '.join(argv)} exited {timed.rc}; stderr tail:\n{timed.stderr_tail}")
    return timed.wall * 1000, timed.cpu * 1000


def run(reps: int, hole_reps: int = 3, scale_reps: int = 0) -> Result:
    result = Result(reps, hole_reps, scale_reps=scale_reps)
    if reps:
        _one_node(result)
    for rep in range(hole_reps):
        for launcher in ("rankrun", "torchrun")[rep % 2:] + ("rankrun", "torchrun")[:rep % 2]:
            hole = blackhole(launcher)
            result.holes.setdefault(launcher, []).append(hole)
            log(f"  black hole, {launcher}: exit codes {hole.codes}, exited at "
                + ", ".join("-" if t is None else f"{t:.1f} s" for t in hole.exited)
                + (f", gap {hole.gap * 1000:.1f} ms, restarts {hole.restarts}" if hole.gap is not None else ""))
    if scale_reps:
        _scale(result)
    return result


def _one_node(result: Result) -> None:
    """The gate on one node: launches plain and with ``--health-check true``, interleaved."""
    for kind in KINDS:  # unrecorded: the page cache, the bytecode cache
        _launch(kind)
    mark = cpu_mark()
    for rep in range(result.reps):
        for kind in KINDS[rep % 2:] + KINDS[:rep % 2]:
            wall, cpu = _launch(kind)
            result.wall.add(kind, wall)
            result.cpu.add(kind, cpu)
    result.load = foreign_load(mark, cpu_mark())
    log(f"  health gate, one node: plain {result.wall.median('plain'):.0f} ms, with --health-check true "
        f"{result.wall.median('gate'):.0f} ms (medians)")


def _scale(result: Result) -> None:
    """The gate at ``SCALE`` simulated nodes: rounds plain and with every node's check, interleaved."""
    import rendezvous  # noqa: PLC0415 - the scale part only

    checks = {"plain": None, "gate": "true"}
    rendezvous.run_rankrun(SCALE, 4, "true")  # unrecorded: the page cache, the bytecode cache
    mark = cpu_mark()
    for rep in range(result.scale_reps):
        for kind in KINDS[rep % 2:] + KINDS[:rep % 2]:
            got = rendezvous.run_rankrun(SCALE, 4, checks[kind])
            result.scale_wall.add(kind, float(got["seconds"]))  # type: ignore[arg-type]
            result.scale_cpu.add(kind, float(got["cpu_s"]))  # type: ignore[arg-type]
    result.scale_load = foreign_load(mark, cpu_mark())
    log(f"  health gate, {SCALE} simulated nodes: one round plain {result.scale_wall.median('plain'):.2f} s, with every "
        f"node's check {result.scale_wall.median('gate'):.2f} s (medians)")


def _healthy_end(hole: BlackHole) -> float:
    """When the healthy nodes had both exited, whatever their exit code (seconds; BOUND when one still ran)."""
    ends = hole.exited[:2]
    return BOUND if any(t is None for t in ends) else max(t for t in ends if t is not None)


def _paired(samples: Samples) -> list[float]:
    return [g - p for p, g in zip(samples.by_launcher["plain"], samples.by_launcher["gate"], strict=True)]


def rows(result: Result) -> list[Row]:
    holes = result.holes
    gap = statistics.median(h.gap for h in holes.get("rankrun", []) if h.gap is not None) * 1000 if holes else float("nan")
    ends = {k: statistics.median(_healthy_end(h) for h in v) for k, v in holes.items()}
    hole_rows = [
        Row("a black-hole node (3 nodes, --nnodes 2:3 --max-restarts 3): its second failure → the job running "
            "without it (rankrun --max-node-failures 2; torchrun never does)", "ms", rankrun=gap, torchrun=float("nan"),
            compare=False, decimals=1),
        Row(f"a black-hole node: until the two healthy nodes have exited ({WORK:g} s of work; rankrun: 0, the job done "
            f"without it; torchrun: 1, its budget spent, or still waiting on its store at {BOUND:g} s, counted as "
            f"{BOUND:g} s)", "s", rankrun=ends.get("rankrun", float("nan")),
            torchrun=ends.get("torchrun", float("nan")), decimals=1),
    ] if holes else []
    scale_rows = [
        Row(f"health gate, --health-check true: one round of {SCALE} simulated nodes, each running the check before it "
            "joins (all at once on 2 cores: an upper bound), go → the last assignment", "s",
            rankrun=result.scale_wall.median("gate"), torchrun=float("nan"), baseline=result.scale_wall.median("plain"),
            baseline_label="without", compare=False, decimals=2),
        Row(f"health gate, --health-check true: one round of {SCALE} simulated nodes (CPU of the agents, their checks "
            "and the store's host)", "s", rankrun=result.scale_cpu.median("gate"), torchrun=float("nan"),
            baseline=result.scale_cpu.median("plain"), baseline_label="without", compare=False, decimals=2),
    ] if result.scale_reps else []
    one_rows = [
        Row(f"health gate, --health-check true: one node's round (a launch of {NPROC} --no-python true workers, "
            "wall, exec→exit)", "ms", rankrun=result.wall.median("gate"), torchrun=float("nan"),
            baseline=result.wall.median("plain"), baseline_label="without", compare=False, decimals=1),
        Row(f"health gate, --health-check true: one node's round (CPU of the launcher, its {NPROC} workers and the "
            "check)", "ms", rankrun=result.cpu.median("gate"), torchrun=float("nan"),
            baseline=result.cpu.median("plain"), baseline_label="without", compare=False, decimals=1),
    ] if result.reps else []
    return [*hole_rows, *one_rows, *scale_rows]


def _one_node_details(result: Result) -> list[str]:
    others, steal = result.load
    lines = [
        f"`python bench/health_bench.py --reps {result.reps}` (its docstring says how). *without* is `rankrun "
        f"--nproc-per-node {NPROC} --no-python true`, *with* adds `--health-check true`: the launcher runs "
        "`/bin/sh -c true` in its own process group before the attempt and waits for its verdict, so this is the "
        "gate's own cost, not a check's work. The two run interleaved, in rotating order. Other processes used "
        f"{others:.0%} of the machine's CPU meanwhile (steal {steal:.0%}).",
        "",
        "| one node, 8 workers | without | with | with - without (medians) | median of paired differences | "
        "samples without | samples with |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, s in (("wall, exec→exit (ms)", result.wall), ("CPU, launcher + workers + check (ms)", result.cpu)):
        p, g = s.median("plain"), s.median("gate")
        lines.append(f"| {name} | {p:.1f} | {g:.1f} | {g - p:+.1f} | {statistics.median(_paired(s)):+.1f} | "
                     f"{fmt_samples(s.by_launcher['plain'])} | {fmt_samples(s.by_launcher['gate'])} |")
    return lines


def details(result: Result) -> list[str]:
    lines = ["### The health gate: what `--health-check` costs a round"]
    if result.reps:
        lines += ["", *_one_node_details(result)]
    if result.holes:
        lines += ["", f"**A black-hole node** (`python bench/health_bench.py --hole-reps {result.hole_reps}`): three "
                  "agents on loopback, `--nnodes 2:3 --max-restarts 3`, one `--no-python sh` worker a node; node 2's "
                  f"exits 1 at once on every attempt, the others' sleep {WORK:g} s; rankrun with `--max-node-failures 2`. "
                  "Per run: each node's exit code and when it exited (seconds after the start; `-`: still running at "
                  f"{BOUND:g} s, then stopped).", "",
                  "| launcher | run | exit codes (node 0, 1, black hole) | exited at (s) | second failure → running "
                  "without it | restarts used |", "|---|---|---|---|---|---|"]
        for launcher, runs in result.holes.items():
            for n, hole in enumerate(runs):
                at = ", ".join("-" if t is None else f"{t:.1f}" for t in hole.exited)
                codes = ", ".join("-" if c is None else str(c) for c in hole.codes)
                gap = f"{hole.gap * 1000:.1f} ms" if hole.gap is not None else "never"
                used = str(hole.restarts) if hole.restarts is not None else \
                    "all 3 (its budget spent, the black hole exited 1)" if hole.codes[2] == 1 else "—"
                lines.append(f"| {launcher} | {n + 1} | {codes} | {at} | {gap} | {used} |")
    if result.scale_reps:
        others, steal = result.scale_load
        lines += ["", f"**The gate at {SCALE} simulated nodes** (`python bench/health_bench.py --reps 0 --hole-reps 0 "
                  f"--scale-reps {result.scale_reps}`): one rendezvous round of {SCALE} simulated agents on the real "
                  "embedded store (`bench/rendezvous.py --nodes 512 [--check true]`: asyncio tasks in 4 processes, "
                  "each with its own connection, running `Member.join` + `Member.next_round`); *with*, every agent "
                  "first runs the real check (`health.check.run_check`: `/bin/sh -c true` in its own process group), "
                  "all at once, as each node's agent does before it joins its first round. Seconds from \"go\" to the "
                  "last assignment; CPU of the agents' processes, their checks and the store's host. The "
                  f"{SCALE} checks share this machine's 2 cores, where real nodes run one each: an upper bound. "
                  f"Plain and with run interleaved; other processes used {others:.0%} of the machine's CPU meanwhile "
                  f"(steal {steal:.0%}).", "",
                  f"| {SCALE} simulated nodes, one round | without | with | with - without (medians) | median of "
                  "paired differences | samples without | samples with |", "|---|---|---|---|---|---|---|"]
        for name, s in (("go → the last assignment (s)", result.scale_wall),
                        ("CPU, agents + checks + host (s)", result.scale_cpu)):
            p, g = s.median("plain"), s.median("gate")
            lines.append(f"| {name} | {p:.2f} | {g:.2f} | {g - p:+.2f} | {statistics.median(_paired(s)):+.2f} | "
                         f"{fmt_samples(s.by_launcher['plain'], 2)} | {fmt_samples(s.by_launcher['gate'], 2)} |")
        per_node = statistics.median(_paired(result.scale_cpu)) / SCALE * 1000
        lines += ["", f"Per node, the check costs {per_node:.1f} ms of CPU here (the paired CPU difference ÷ {SCALE}): "
                  "what one real node pays, once, on its own cores; the round's wall difference is those "
                  f"{SCALE} checks queued on this machine's 2 cores."]
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--hole-reps", type=int, default=3)
    parser.add_argument("--scale-reps", type=int, default=3, help=f"rounds of {SCALE} simulated nodes, each way")
    args = parser.parse_args()
    result = run(args.reps, args.hole_reps, args.scale_reps)
    print("\n".join(details(result)))


if __name__ == "__main__":
    main()
