"""The ``health`` metric of bench/run.py: what ``--health-check`` costs a round.

``python bench/health_bench.py [--reps 21]``. One node: ``rankrun --nproc-per-node 8 --no-python true``, plain and
with ``--health-check true`` (the check is ``/bin/sh -c true``: what the gate itself costs, not a check's own
work), interleaved in rotating order in the same repetitions; wall from exec to exit and CPU of the launcher, its
workers and the check; medians, and the median of the per-repetition differences (drift on a shared machine hits
both alike). One round on one node is one attempt: the check runs once.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))

from harness import RANKRUN, BenchError, Samples, cpu_mark, foreign_load, log, run_timed  # noqa: E402
from report import Row, fmt_samples  # noqa: E402

NPROC = 8
KINDS = ("plain", "gate")
OPTIONS = {"plain": (), "gate": ("--health-check", "true")}


@dataclass
class Result:
    reps: int
    wall: Samples = field(default_factory=lambda: Samples("ms"))
    cpu: Samples = field(default_factory=lambda: Samples("ms"))
    load: tuple[float, float] = (0.0, 0.0)  # others' CPU share, steal share


def _launch(kind: str) -> tuple[float, float]:
    argv = [*RANKRUN.argv, "--nproc-per-node", str(NPROC), *OPTIONS[kind], "--no-python", "true"]
    timed = run_timed(argv, timeout=120)
    if timed.rc != 0:
        raise BenchError(f"{' '.join(argv)} exited {timed.rc}; stderr tail:\n{timed.stderr_tail}")
    return timed.wall * 1000, timed.cpu * 1000


def run(reps: int) -> Result:
    result = Result(reps)
    for kind in KINDS:  # unrecorded: the page cache, the bytecode cache
        _launch(kind)
    mark = cpu_mark()
    for rep in range(reps):
        for kind in KINDS[rep % 2:] + KINDS[:rep % 2]:
            wall, cpu = _launch(kind)
            result.wall.add(kind, wall)
            result.cpu.add(kind, cpu)
    result.load = foreign_load(mark, cpu_mark())
    log(f"  health gate, one node: plain {result.wall.median('plain'):.0f} ms, with --health-check true "
        f"{result.wall.median('gate'):.0f} ms (medians)")
    return result


def _paired(samples: Samples) -> list[float]:
    return [g - p for p, g in zip(samples.by_launcher["plain"], samples.by_launcher["gate"], strict=True)]


def rows(result: Result) -> list[Row]:
    return [
        Row(f"health gate, --health-check true: one node's round (a launch of {NPROC} --no-python true workers, "
            "wall, exec→exit)", "ms", rankrun=result.wall.median("gate"), torchrun=float("nan"),
            baseline=result.wall.median("plain"), baseline_label="without", compare=False, decimals=1),
        Row(f"health gate, --health-check true: one node's round (CPU of the launcher, its {NPROC} workers and the "
            "check)", "ms", rankrun=result.cpu.median("gate"), torchrun=float("nan"),
            baseline=result.cpu.median("plain"), baseline_label="without", compare=False, decimals=1),
    ]


def details(result: Result) -> list[str]:
    others, steal = result.load
    lines = [
        "### The health gate: what `--health-check` costs a round",
        "",
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
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=21)
    args = parser.parse_args()
    result = run(args.reps)
    print("\n".join(details(result)))


if __name__ == "__main__":
    main()
