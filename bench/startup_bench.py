"""The launch of 8 no-op workers taken apart: which milliseconds are the interpreter, asyncio, rankrun's own modules,
the spawns and the workers; and what starting the workers before the heavy imports would gain at most.

Three measurements, each interleaved over its repetitions:

- **imports**: ``python -c <imports>`` for the interpreter alone, the floor driver's one import (``subprocess``),
  the big stdlib pieces the launcher uses, and rankrun's modules in the order a launch imports them;
- **timeline**: ``payloads/timeline.py`` runs the real console-script entry with stage marks (wall and CPU of the
  launcher process), its 8 workers ``payloads/stamp.py`` noting when their script began;
- **spawn first**: ``payloads/spawn_first.py``, the floor driver and rankrun side by side.

``-X importtime`` of one real launch gives the heaviest modules by their own import time.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from harness import DIRECT, PAYLOADS, PYTHON, RANKRUN, Launcher, Samples, bench_env, expect_ok, log, rotated, run_timed

NPROC = 8
_NO_SSL = "import sys; sys.modules['ssl'] = None; "
IMPORTS: tuple[tuple[str, str], ...] = (
    ("interpreter alone (`python -c pass`)", "pass"),
    ("`import subprocess` (all the floor driver imports)", "import subprocess"),
    ("`import argparse`", "import argparse"),
    ("`import dataclasses`", "import dataclasses"),
    ("`import asyncio` (ssl kept out, as rankrun does)", _NO_SSL + "import asyncio"),
    ("rankrun up to its argument parser (`rankrun.__main__`, `rankrun.cli`)", _NO_SSL + "import rankrun.__main__, rankrun.cli"),
    ("every module a single-node launch imports (+ `rankrun.main`)",
     _NO_SSL + "import rankrun.__main__, rankrun.cli, rankrun.main"),
)
SPAWN_FIRST = Launcher("spawn_first", "spawn-first experiment", (PYTHON, str(PAYLOADS / "spawn_first.py")))


@dataclass
class Breakdown:
    reps: int
    imports: Samples = field(default_factory=lambda: Samples("ms"))
    import_cpu: Samples = field(default_factory=lambda: Samples("ms"))
    stages: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    stage_cpu: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    walls: Samples = field(default_factory=lambda: Samples("ms"))
    heaviest: list[tuple[float, str]] = field(default_factory=list)
    own_share: tuple[float, float] = (0.0, 0.0)  # rankrun's modules, all modules: summed self import time (ms)


def _timeline(breakdown: Breakdown) -> None:
    with tempfile.TemporaryDirectory(prefix="rankrun-bench-timeline-") as tmp:
        marks, stamps = Path(tmp) / "marks", Path(tmp) / "stamps"
        stamps.mkdir()
        argv = [PYTHON, str(PAYLOADS / "timeline.py"), "--nproc-per-node", str(NPROC), str(PAYLOADS / "stamp.py")]
        t0 = time.time()
        timed = run_timed(argv, timeout=120, extra_env={"BENCH_T0": repr(t0), "BENCH_MARKS": str(marks),
                                                         "STAMP_DIR": str(stamps)})
        expect_ok(timed, argv)
        for line in marks.read_text().splitlines():
            at, cpu, stage = line.split(" ", 2)
            breakdown.stages[stage].append(float(at))
            breakdown.stage_cpu[stage].append(float(cpu))
        began = sorted((float(p.read_text()) - t0) * 1000 for p in stamps.iterdir())
        breakdown.stages["first worker's script began"].append(began[0])
        breakdown.stages["last worker's script began"].append(began[-1])
        breakdown.stages["launcher reaped by the harness"].append(timed.wall * 1000)


def _importtime(breakdown: Breakdown) -> None:
    argv = [PYTHON, "-X", "importtime", str(RANKRUN.argv[0]), "--nproc-per-node", str(NPROC), str(PAYLOADS / "noop.py")]
    own: dict[str, list[int]] = defaultdict(list)
    for _ in range(3):
        run = subprocess.run(argv, env=bench_env(), capture_output=True, text=True, timeout=120, check=True)
        for line in run.stderr.splitlines():
            if line.startswith("import time:") and "self [us]" not in line:
                self_us, _, name = line[len("import time:"):].split("|")
                own[name.strip()].append(int(self_us))
    medians = {name: statistics.median(v) / 1000 for name, v in own.items()}
    breakdown.heaviest = sorted(((ms, name) for name, ms in medians.items()), reverse=True)[:12]
    breakdown.own_share = (sum(ms for n, ms in medians.items() if n.startswith("rankrun")), sum(medians.values()))


def warm_up() -> None:
    """Compile the payloads and every import listed once, unrecorded."""
    for _, code in IMPORTS:
        run_timed([PYTHON, "-c", code], timeout=60)
    _timeline(Breakdown(0))
    run_timed(SPAWN_FIRST.command(NPROC, PAYLOADS / "noop.py"), timeout=120)


def measure(reps: int) -> Breakdown:
    breakdown = Breakdown(reps)
    for rep in range(reps):
        order = IMPORTS[rep % len(IMPORTS):] + IMPORTS[:rep % len(IMPORTS)]
        for label, code in order:
            timed = run_timed([PYTHON, "-c", code], timeout=60)
            expect_ok(timed, [PYTHON, "-c", code])
            breakdown.imports.add(label, timed.wall * 1000)
            breakdown.import_cpu.add(label, timed.cpu * 1000)
        _timeline(breakdown)
        for launcher in rotated((DIRECT, RANKRUN, SPAWN_FIRST), rep):
            argv = launcher.command(NPROC, PAYLOADS / "noop.py")
            timed = run_timed(argv, timeout=120)
            expect_ok(timed, argv)
            breakdown.walls.add(launcher.key, timed.wall * 1000)
        log(f"  start-up rep {rep + 1}/{reps}: rankrun {breakdown.walls.by_launcher['rankrun'][-1]:.0f} ms, "
            f"spawn-first {breakdown.walls.by_launcher['spawn_first'][-1]:.0f} ms, "
            f"floor {breakdown.walls.by_launcher['direct'][-1]:.0f} ms")
    _importtime(breakdown)
    return breakdown


def details(b: Breakdown) -> list[str]:
    base = b.imports.median(IMPORTS[0][0])
    lines = [
        f"### Start-up breakdown ({NPROC} no-op workers)",
        "",
        "Produced by `bench/startup_bench.py` in the same run (its docstring says how). **Imports**: the wall time of "
        f"`python -c ...`, median of {b.reps}, and what it adds to the bare interpreter:",
        "",
        "| what is imported | wall ms | added to the interpreter | CPU ms |",
        "|---|---|---|---|",
    ]
    for label, _ in IMPORTS:
        wall = b.imports.median(label)
        lines.append(f"| {label} | {wall:.1f} | {wall - base:+.1f} | {b.import_cpu.median(label):.1f} |")
    lines += [
        "",
        "**Timeline** of one launch (console-script entry, median of each mark over the repetitions; ms since the "
        "harness exec'd the launcher; CPU is the launcher process's own, workers excluded):",
        "",
        "| stage | at (ms) | launcher CPU (ms) |",
        "|---|---|---|",
    ]
    for stage, ats in sorted(b.stages.items(), key=lambda kv: statistics.median(kv[1])):
        cpu = b.stage_cpu.get(stage)
        lines.append(f"| {stage} | {statistics.median(ats):.1f} | {statistics.median(cpu):.1f} |" if cpu
                     else f"| {stage} | {statistics.median(ats):.1f} | |")
    own, total = b.own_share
    lines += [
        "",
        f"**Heaviest modules** by their own import time (`-X importtime`, which roughly doubles every figure; median of 3 "
        f"launches): rankrun's own modules are {own:.1f} of {total:.1f} ms in all, the rest is the standard library.",
        "",
        "| module | self ms |",
        "|---|---|",
        *(f"| {name} | {ms:.1f} |" for ms, name in b.heaviest),
        "",
        "**Spawn first?** `bench/payloads/spawn_first.py` parses the arguments, starts the workers at once and only then "
        "imports asyncio and the agent (no console, watchdog or store: a lower bound for a launcher built that way). "
        "Median wall ms: " + ", ".join(
            f"{label} {b.walls.median(key):.0f} ({b.walls.median(key) / b.walls.median('direct'):.2f}x floor)"
            for key, label in (("direct", "floor"), ("rankrun", "rankrun"), ("spawn_first", "spawn-first")))
        + ".",
        "",
    ]
    return lines
