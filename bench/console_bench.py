"""Metric 5: console throughput of 2 chatty workers, launcher stdout to a file, against the workers run directly."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from harness import (
    DIRECT,
    PAYLOADS,
    RANKRUN,
    TORCHRUN,
    TORCHRUN_TEE,
    Launcher,
    Samples,
    Timed,
    expect_ok,
    log,
    rotated,
    run_timed,
    scratch,
)
from report import Better, Row, Target, fmt_samples

NPROC = 2
# The same driver, but each worker writes its own file: no lock shared between the writers (an ideal, for reference).
DIRECT_SPLIT = Launcher("direct_split", "raw, one file per worker", DIRECT.argv)
LAUNCHERS = (DIRECT, DIRECT_SPLIT, RANKRUN, TORCHRUN, TORCHRUN_TEE)
PREFIXED = {"rankrun", "torchrun_tee"}  # outputs carrying the `[default<rank>]:` prefix
TARGET = 0.8
_LINE = re.compile(rb"(?:\[default(\d+)\]:)?rank(\d+) line (\d+) x{20}\n")


@dataclass(frozen=True)
class Check:
    """Output integrity: whole lines (right prefix, nothing spliced in) and per-rank order (no gap, no repeat)."""

    total: int
    whole: int
    disorder: int
    expected: int

    @property
    def exact(self) -> bool:
        return self.total == self.whole == self.expected and self.disorder == 0

    def describe(self) -> str:
        return (f"{self.whole:,}/{self.expected:,} whole lines, {self.total:,} lines in all, "
                f"{self.total - self.whole:,} spliced/garbled, {self.disorder:,} order breaks")


@dataclass
class ConsoleResult:
    reps: int
    lines: int
    walls: Samples = field(default_factory=lambda: Samples("s"))
    cpus: Samples = field(default_factory=lambda: Samples("s"))
    checks: dict[str, list[Check]] = field(default_factory=dict)


def validate(path: Path, prefixed: bool, lines: int) -> Check:
    """Count lines that fullmatch, and breaks in each rank's 0, 1, 2, ... sequence (resyncing after each)."""
    last = [-1] * NPROC
    total = whole = disorder = 0
    with path.open("rb") as fh:
        for raw in fh:
            total += 1
            m = _LINE.fullmatch(raw)
            if m is None or (m.group(1) is None) == prefixed:
                continue
            rank, number = int(m.group(2)), int(m.group(3))
            if (prefixed and int(m.group(1)) != rank) or rank >= NPROC:
                continue
            whole += 1
            disorder += number != last[rank] + 1
            last[rank] = number
    disorder += sum(n != lines - 1 for n in last)  # a rank whose last line is missing
    return Check(total, whole, disorder, NPROC * lines)


def measure(launcher: Launcher, lines: int, check: bool) -> tuple[Timed, Check | None]:
    with scratch("console") as tmp:
        out = tmp / "stdout.txt"
        split = ["--stdout-dir", str(tmp)] if launcher is DIRECT_SPLIT else []
        argv = launcher.command(NPROC, PAYLOADS / "spam.py", [str(lines)], split)
        with out.open("wb") as fh:
            timed = run_timed(argv, timeout=600, stdout=fh.fileno())
        expect_ok(timed, argv)
        return timed, validate(out, launcher.key in PREFIXED, lines) if check and not split else None


def run(reps: int, lines: int) -> ConsoleResult:
    result = ConsoleResult(reps, lines)
    for rep in range(reps):
        for launcher in rotated(LAUNCHERS, rep):
            # rankrun's output is checked every time; the others once, for information.
            timed, check = measure(launcher, lines, check=launcher is RANKRUN or rep == 0)
            result.walls.add(launcher.key, timed.wall)
            result.cpus.add(launcher.key, timed.cpu)
            if check is not None:
                result.checks.setdefault(launcher.key, []).append(check)
        w = result.walls.by_launcher
        log(f"  console rep {rep + 1}/{reps}: raw {w['direct'][-1]:.2f} s, raw split {w['direct_split'][-1]:.2f} s, "
            f"rankrun {w['rankrun'][-1]:.2f} s, "
            f"torchrun {w['torchrun'][-1]:.2f} s, torchrun --tee 3 {w['torchrun_tee'][-1]:.2f} s")
    return result


def _count(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n:,}"


def rows(result: ConsoleResult) -> list[Row]:
    target = Target(f"rankrun ≥ {TARGET}x raw", lambda r: (r.vs_baseline(r.rankrun) or 0.0) >= TARGET)
    w = result.walls
    what = f"console {NPROC}x{_count(result.lines)} lines → file (wall; vs base = throughput ratio)"
    checks = result.checks.get("rankrun", [])
    torch_checks = result.checks.get("torchrun", [])

    def wall_row(label: str, torch_key: str, base_key: str, base_label: str, with_target: bool) -> Row:
        return Row(f"{what}, {label}", "s", rankrun=w.median("rankrun"), torchrun=w.median(torch_key),
                   baseline=w.median(base_key), baseline_label=base_label, better=Better.HIGHER_THROUGHPUT,
                   target=target if with_target else None, decimals=2)

    return [
        wall_row("torchrun default", "torchrun", "direct", "raw", True),
        wall_row("torchrun --tee 3", "torchrun_tee", "direct", "raw", True),
        wall_row("torchrun default; base = raw split (reference)", "torchrun", "direct_split", "raw split", False),
        Row(f"console integrity: whole lines of {_count(NPROC * result.lines)} (rankrun: worst run; torchrun: default)",
            "lines", rankrun=float(min((c.whole for c in checks), default=0)),
            torchrun=float(min((c.whole for c in torch_checks), default=float("nan"))), baseline=float(NPROC * result.lines),
            baseline_label="expected", compare=False,
            target=Target("rankrun: all, in order", lambda _r: bool(checks) and all(c.exact for c in checks))),
    ]


def _summarise(checks: list[Check]) -> str:
    """Identical outcomes once, with a count: ``3 runs: ...``."""
    seen: dict[str, int] = {}
    for check in checks:
        seen[check.describe()] = seen.get(check.describe(), 0) + 1
    return "; ".join(f"{n} run{'s' if n > 1 else ''}: {text}" for text, n in seen.items()) or "—"


def details(result: ConsoleResult) -> list[str]:
    names = {"direct": "raw (bare driver, one shared file)", "direct_split": "raw split (one file per worker)",
             "rankrun": "rankrun", "torchrun": "torchrun (default)",
             "torchrun_tee": "torchrun --tee 3"}
    lines = [
        "### Console throughput",
        "",
        f"{NPROC} workers each run `python -u bench/payloads/spam.py {result.lines}`, which prints `rank<r> line <i> "
        "xxxxxxxxxxxxxxxxxxxx` for i = 0..N-1 (both launchers add `-u` themselves, so each `print` is two `write()`s). "
        "The launcher's stdout is a regular file; its stderr goes to a temporary file. **Raw** is the bare driver "
        "(`direct.py`) starting the same 2 workers with its stdout, hence theirs, on the file: both workers write "
        "directly through one shared file description, as they do under torchrun's default mode. **Raw split** is "
        "the same driver with each worker's stdout on its own file: no lock shared between the writers, an ideal "
        "shown for reference only (no target). The wall time runs from exec of the launcher (or the driver) to its "
        "exit, so every column includes one interpreter start-up of the parent; torchrun's additionally includes its "
        "~1 s `import torch`. Ratio = (lines/s under the launcher) ÷ (lines/s raw) = raw wall ÷ launcher wall; above "
        "1 means faster than raw. torchrun's default mode is raw plus torchrun's start-up (no prefix, lines spliced); "
        "`--tee 3` makes it redirect to per-rank files and tail them (0.1 s polling) with the `[default<r>]:` prefix, "
        "which is the mode comparable to rankrun's prefixed console.",
        "",
        "Integrity: each output line must fullmatch `([default<r>]:)?rank<r> line <i> x{20}\\n` (prefix required for "
        "rankrun and `--tee 3`, forbidden otherwise, and equal to the rank in the text), and per rank the line numbers "
        "must run 0, 1, 2, … without gaps. rankrun's output is checked on every repetition, the others on the first only.",
        "",
        "CPU s = user + system time of the launcher (or driver) and its workers, a figure less sensitive than wall time "
        "to other load on the machine.",
        "",
        "| | median wall (s) | lines/s (median) | vs raw (throughput) | samples (s) | median CPU s | integrity |",
        "|---|---|---|---|---|---|---|",
    ]
    raw = result.walls.median("direct")
    for key, name in names.items():
        wall = result.walls.median(key)
        checks = _summarise(result.checks.get(key, []))
        lines.append(f"| {name} | {wall:.2f} | {NPROC * result.lines / wall:,.0f} | {raw / wall:.2f}x | "
                     f"{fmt_samples(result.walls.by_launcher[key], 2)} | {result.cpus.median(key):.2f} | {checks} |")
    return [*lines, ""]
