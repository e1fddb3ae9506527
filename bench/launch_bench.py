"""Metric 1: launch overhead of N no-op workers, against a bare Python driver that spawns the same N processes."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness import DIRECT, PAYLOADS, RANKRUN, RANKRUN_M, TORCHRUN, Launcher, Samples, expect_ok, log, rotated, run_timed
from report import Row, Target, fmt_samples

SIZES = (1, 8, 32)
LAUNCHERS = (DIRECT, RANKRUN, RANKRUN_M, TORCHRUN)
TARGET = 1.5  # for N=8, the figure; N=1 and N=32 are shown without a target
TARGET_N = 8


@dataclass
class LaunchResult:
    reps: int
    by_size: dict[int, Samples] = field(default_factory=dict)
    cpu_by_size: dict[int, Samples] = field(default_factory=dict)


def time_launch(launcher: Launcher, nproc: int) -> tuple[float, float]:
    """Milliseconds from exec of the launcher to its exit, and CPU milliseconds of the launcher and its workers."""
    argv = launcher.command(nproc, PAYLOADS / "noop.py")
    timed = run_timed(argv, timeout=180)
    expect_ok(timed, argv)
    return timed.wall * 1000, timed.cpu * 1000


def run(reps: int) -> LaunchResult:
    result = LaunchResult(reps, {n: Samples("ms") for n in SIZES}, {n: Samples("ms") for n in SIZES})
    for rep in range(reps):
        for i, nproc in enumerate(SIZES):
            for launcher in rotated(LAUNCHERS, rep + i):
                wall, cpu = time_launch(launcher, nproc)
                result.by_size[nproc].add(launcher.key, wall)
                result.cpu_by_size[nproc].add(launcher.key, cpu)
        log(f"  launch rep {rep + 1}/{reps}: " + ", ".join(
            f"N={n} rankrun {s.by_launcher['rankrun'][-1]:.0f} ms / floor {s.by_launcher['direct'][-1]:.0f} ms"
            for n, s in result.by_size.items()))
    return result


def rows(result: LaunchResult) -> list[Row]:
    target = Target(f"rankrun ≤ {TARGET}x floor", lambda r: (r.vs_baseline(r.rankrun) or 99.0) <= TARGET)
    return [
        Row(f"launch, {n} noop worker{'s' if n > 1 else ''} (wall, exec→exit)", "ms",
            rankrun=s.median("rankrun"), torchrun=s.median("torchrun"), baseline=s.median("direct"),
            baseline_label="floor", target=target if n == TARGET_N else None)
        for n, s in result.by_size.items()
    ]


def details(result: LaunchResult) -> list[str]:
    lines = [
        "### Launch overhead",
        "",
        "Each worker is `python -u bench/payloads/noop.py` (an empty file: no imports). The wall time runs from just before "
        "the harness forks the launcher to the moment it has been reaped, so it includes the launcher's own interpreter "
        "start-up. The **floor** is `python bench/payloads/direct.py --nproc-per-node N noop.py`: one Python interpreter "
        "that `subprocess.Popen`s the same N `python -u noop.py` processes and waits for them, i.e. the least any "
        "Python launcher can cost. The `rankrun` column is the console script `venv/bin/rankrun` (what users run); "
        "`python -m rankrun` is shown below for comparison. torchrun is `python -m torch.distributed.run` "
        "(static rendezvous, the default). Launchers run in rotating order within each repetition.",
        "",
        f"Samples in ms ({result.reps} repetitions each):",
        "",
        "| N | floor | rankrun | python -m rankrun | torchrun |",
        "|---|---|---|---|---|",
    ]
    for n, s in result.by_size.items():
        cols = (fmt_samples(s.by_launcher[k]) for k in ("direct", "rankrun", "rankrun_m", "torchrun"))
        lines.append(f"| {n} | " + " | ".join(cols) + " |")
    lines += ["", "Medians, `python -m rankrun` (ms) and its ratio to the floor: " + "; ".join(
        f"N={n}: {s.median('rankrun_m'):.0f} ({s.median('rankrun_m') / s.median('direct'):.2f}x)"
        for n, s in result.by_size.items()) + ".", ""]
    lines += [
        "CPU time (user + system) of the launcher and its workers, median ms: less sensitive than wall time to other "
        "load on the machine. Launcher's own share ≈ launcher - floor.",
        "",
        "| N | floor | rankrun | python -m rankrun | torchrun |",
        "|---|---|---|---|---|",
    ]
    for n, s in result.cpu_by_size.items():
        cols = (f"{s.median(k):.0f}" for k in ("direct", "rankrun", "rankrun_m", "torchrun"))
        lines.append(f"| {n} | " + " | ".join(cols) + " |")
    return [*lines, ""]
