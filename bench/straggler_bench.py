"""The ``straggler`` metric of bench/run.py: how soon the straggler watch names a slow rank, how well it estimates its
lag, and what it costs a training loop.

``python bench/straggler_bench.py [--reps 3] [--detect-reps 2]``. Every job is ``RANKS`` real gloo workers on one node
running ``tests/payloads/gloo_steps.py`` (every rank "computes" 50 ms a step, then they all_reduce):

- **detection**: rank 5 computes 300 ms a step from ``SLOW_AFTER`` s on (it prints when, by the wall clock); rankrun
  with ``--straggler-window WINDOW`` (shorter than the default 60 s, to keep the run short: the target scales with
  it) and ``--events``; the time from the slowdown's start to the ``straggler`` event, and the lag it names against
  the 250 ms injected.
- **overhead**: the balanced job for ``RUN_S`` s under torchrun, rankrun ``--straggler-window 0`` (off) and rankrun
  with the default window (on), interleaved in rotating order; the step time is ``RUN_S`` over the steps rank 0 did.
  The watch's cost is the paired difference on/off, against the target of 1 % of a step.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "src"))

from harness import RANKRUN, TORCHRUN, BenchError, Samples, cpu_mark, finish, foreign_load, log, start  # noqa: E402
from report import Row, Target  # noqa: E402

PAYLOAD = BENCH.parent / "tests" / "payloads" / "gloo_steps.py"
RANKS = 8
SLOW_RANK = 5
INJECTED = 0.25  # seconds rank 5 adds to every step (300 ms against 50 ms)
WINDOW = 10.0
SLOW_AFTER = 8.0
RUN_S = 30.0
KINDS = ("torchrun", "off", "on")


@dataclass
class Result:
    reps: int
    detect_reps: int
    delays: list[float] = field(default_factory=list)  # seconds, slowdown → the line
    lags: list[float] = field(default_factory=list)  # seconds, the lag named
    step: Samples = field(default_factory=lambda: Samples("ms"))
    load: tuple[float, float] = (0.0, 0.0)


def _job(argv: list[str], env: dict[str, str], timeout: float, folder: Path) -> list[str]:
    """Run one job, its output in ``folder``; its stdout lines."""
    with open(folder / "out", "wb") as out, open(folder / "err", "wb") as err:
        proc = start(argv, stdout=out.fileno(), stderr=err.fileno(), extra_env=env)
        rc = finish(proc, timeout).rc
    if rc != 0:
        raise BenchError(f"{' '.join(argv)} exited {rc}; stderr tail:\n{(folder / 'err').read_text()[-2000:]}")
    return (folder / "out").read_text().splitlines()


def detect() -> tuple[float, float]:
    """One detection run: seconds from the slowdown to the straggler event, and the lag it named."""
    with tempfile.TemporaryDirectory(prefix="rankrun-bench-straggler-") as tmp:
        events = Path(tmp) / "events.jsonl"
        argv = [*RANKRUN.argv, "--standalone", "--nproc-per-node", str(RANKS), "--straggler-window", f"{WINDOW:g}",
                "--events", str(events), str(PAYLOAD)]
        run_s = SLOW_AFTER + 2 * WINDOW + 10
        out = _job(argv, {"SLOW_RANK": str(SLOW_RANK), "SLOW_AFTER": f"{SLOW_AFTER:g}", "RUN_S": f"{run_s:g}"},
                   run_s + 120, Path(tmp))
        slow = [float(m.group(1)) for line in out if (m := re.search(r"SLOW FROM ([\d.]+)", line))]
        named = [json.loads(line) for line in events.read_text().splitlines()]
        named = [e for e in named if e["event"] == "straggler" and e["verdict"] == "named"]
        if len(slow) != 1 or not named or named[0]["rank"] != SLOW_RANK:
            raise BenchError(f"detection run: slow from {slow}, named {named}")
        return float(named[0]["ts"]) - slow[0], float(named[0]["lag"])


def step_time(kind: str) -> float:
    """One balanced job of ``kind``: its step time in ms (rank 0's ``RUN_S`` over its steps)."""
    launcher = TORCHRUN if kind == "torchrun" else RANKRUN
    options = ["--straggler-window", "0"] if kind == "off" else []
    argv = [*launcher.argv, "--standalone", "--nproc-per-node", str(RANKS), *options, str(PAYLOAD)]
    with tempfile.TemporaryDirectory(prefix="rankrun-bench-straggler-") as tmp:
        out = _job(argv, {"RUN_S": f"{RUN_S:g}"}, RUN_S + 120, Path(tmp))
    steps = [int(m.group(1)) for line in out if (m := re.search(r"DONE (\d+)", line))]
    if not steps:
        raise BenchError(f"{kind}: no DONE line in {out[-5:]}")
    return 1000 * RUN_S / max(steps)


def run(reps: int, detect_reps: int) -> Result:
    result = Result(reps, detect_reps)
    for _ in range(detect_reps):
        delay, lag = detect()
        result.delays.append(delay)
        result.lags.append(lag)
        log(f"  straggler: named {delay:.1f} s after the slowdown, lag {lag * 1000:.0f} ms (injected {INJECTED * 1000:.0f})")
    mark = cpu_mark()
    for rep in range(reps):
        for kind in KINDS[rep % 3:] + KINDS[:rep % 3]:
            result.step.add(kind, step_time(kind))
        log(f"  straggler: step time, rep {rep}: " + ", ".join(f"{k} {result.step.by_launcher[k][-1]:.2f} ms" for k in KINDS))
    result.load = foreign_load(mark, cpu_mark())
    return result


def _paired(result: Result) -> float:
    """The watch's cost: the median of the per-repetition differences on - off, as a share of the off step."""
    off, on = result.step.by_launcher.get("off", []), result.step.by_launcher.get("on", [])
    return statistics.median((b - a) / a for a, b in zip(off, on, strict=True)) if off else float("nan")


def rows(result: Result) -> list[Row]:
    out = []
    if result.delays:
        out += [
            Row(f"straggler: rank {SLOW_RANK} of {RANKS} slowed by {INJECTED * 1000:.0f} ms a step → its line "
                f"(--straggler-window {WINDOW:g})", "s", rankrun=statistics.median(result.delays), torchrun=float("nan"),
                compare=False, decimals=1,
                target=Target(f"≤ window + 10 s = {WINDOW + 10:g} s", lambda r: r.rankrun <= WINDOW + 10)),
            Row(f"straggler: the lag named against the {INJECTED * 1000:.0f} ms injected (error)", "%",
                rankrun=100 * (statistics.median(result.lags) / INJECTED - 1), torchrun=float("nan"), compare=False,
                decimals=1, target=Target("within ±25 %", lambda r: abs(r.rankrun) <= 25)),
        ]
    if result.reps:
        out += [
            Row(f"straggler watch: step time of a balanced {RANKS}-rank gloo loop (50 ms a step + all_reduce), the watch "
                "on (the default window)", "ms", rankrun=result.step.median("on"), torchrun=result.step.median("torchrun"),
                baseline=result.step.median("off"), baseline_label="off", decimals=2),
            Row("straggler watch: its cost, on vs off, paired per repetition", "%", rankrun=100 * _paired(result),
                torchrun=float("nan"), compare=False, decimals=2,
                target=Target("≤ 1 % of a step", lambda r: r.rankrun <= 1.0)),
        ]
    return out


def details(result: Result) -> list[str]:
    others, steal = result.load
    lines = ["### Stragglers: the time to name a slow rank, the lag's error, the watch's cost", "",
             f"**Straggler watch** ({RANKS} real gloo ranks on one node, `tests/payloads/gloo_steps.py`):",
             "",
             f"- detection, {result.detect_reps} runs: rank {SLOW_RANK} slow from {SLOW_AFTER:g} s on; named after "
             + ", ".join(f"{d:.1f} s" for d in result.delays) + "; lags named "
             + ", ".join(f"{lag * 1000:.0f} ms" for lag in result.lags) + f" (injected {INJECTED * 1000:.0f} ms).",
             f"- step time, {result.reps} rotations of torchrun / rankrun off / rankrun on, {RUN_S:g} s each: "
             + "; ".join(f"{k} " + ", ".join(f"{v:.2f}" for v in result.step.by_launcher.get(k, [])) + " ms"
                         for k in KINDS) + f"; other processes used {100 * others:.0f} % of the CPU meanwhile.",
             "", f"Commands: `python bench/straggler_bench.py --reps {result.reps} --detect-reps {result.detect_reps}`."]
    if steal:
        lines.append(f"(steal {100 * steal:.0f} %)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--detect-reps", type=int, default=2)
    args = parser.parse_args()
    result = run(args.reps, args.detect_reps)
    for row in rows(result):
        print(f"{row.metric}: {row.rankrun:.{row.decimals}f} {row.unit}"
              + (f" (off {row.baseline:.2f})" if row.baseline is not None else ""))
    print("\n".join(details(result)))


if __name__ == "__main__":
    main()
