"""Metrics 3 and 4: a worker fails after every rank is READY.

Without restarts: time from the failing worker's exit to every worker gone and to the launcher's exit.
With ``--max-restarts 1``: time from the failure to the first (and last) worker of attempt 1 starting.
All clocks are ``time.time()`` on one machine; the harness polls /proc every 0.5 ms.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from harness import (
    PAYLOADS,
    RANKRUN,
    TORCHRUN,
    BenchError,
    Launcher,
    Samples,
    alive,
    log,
    rotated,
    scratch,
    start,
    stop,
    tail,
    track_workers,
    wait_until,
)
from report import Row, fmt_samples

NPROC = 4
FAIL_RANK = 1
LAUNCHERS = (RANKRUN, TORCHRUN)
FAIL_KEYS = ("gone", "exit")
RESTART_KEYS = ("gone", "first_start", "last_start", "exit")


@dataclass
class FailureResult:
    reps: int
    keys: tuple[str, ...]
    samples: dict[str, Samples] = field(default_factory=dict)


def _starts(tmp: Path, attempt: int) -> list[tuple[float, int]]:
    found = []
    for path in (tmp / "starts").glob(f"a{attempt}_r*"):
        stamp, pid = path.read_text().split()
        found.append((float(stamp), int(pid)))
    return found


def measure(launcher: Launcher, restarts: int) -> dict[str, float]:
    """Milliseconds after the failure timestamp."""
    with scratch("fail", ["starts", "ready"]) as tmp:
        argv = launcher.command(NPROC, PAYLOADS / "fail.py", [str(tmp), str(FAIL_RANK)], ["--max-restarts", str(restarts)])
        with (tmp / "stderr").open("wb") as err:
            proc = start(argv, stderr=err.fileno())
        try:
            return _observe(proc, tmp, restarts)
        except BenchError as exc:
            raise BenchError(f"{launcher.label}: {exc}; stderr tail:\n{tail(tmp / 'stderr')}") from None
        finally:
            stop(proc)


def _observe(proc: subprocess.Popen[bytes], tmp: Path, restarts: int) -> dict[str, float]:
    fail_file = tmp / "fail_ts"
    wait_until(lambda: fail_file.exists() or proc.poll() is not None, 90, "the failing worker", interval=0.0005)
    if not fail_file.exists():
        raise BenchError(f"launcher exited {proc.returncode} before the failure")
    pids = [pid for _, pid in _starts(tmp, 0)]
    track_workers(pids)
    gone_at = wait_until(lambda: not any(alive(p) for p in pids), 90, "attempt-0 workers to be gone", interval=0.0005)
    exit_at = wait_until(lambda: proc.poll() is not None, 90, "the launcher to exit", interval=0.0005)
    rc = proc.returncode
    if (rc == 0) != (restarts > 0):
        raise BenchError(f"launcher exited {rc} with --max-restarts {restarts}")
    fail_ts = float(fail_file.read_text())
    out = {"gone": gone_at - fail_ts, "exit": exit_at - fail_ts}
    if restarts:
        later = [stamp for stamp, _ in _starts(tmp, 1)]
        if len(later) != NPROC:
            raise BenchError(f"attempt 1 started {len(later)} of {NPROC} workers")
        out |= {"first_start": min(later) - fail_ts, "last_start": max(later) - fail_ts}
    return {k: v * 1000 for k, v in out.items()}


def run(reps: int, restarts: int) -> FailureResult:
    keys = RESTART_KEYS if restarts else FAIL_KEYS
    result = FailureResult(reps, keys, {k: Samples("ms") for k in keys})
    name = "restart" if restarts else "failure"
    for rep in range(reps):
        for launcher in rotated(LAUNCHERS, rep):
            for key, value in measure(launcher, restarts).items():
                result.samples[key].add(launcher.key, value)
        headline = result.samples[keys[1] if restarts else "gone"].by_launcher
        log(f"  {name} rep {rep + 1}/{reps}: rankrun {headline['rankrun'][-1]:.0f} ms, "
            f"torchrun {headline['torchrun'][-1]:.0f} ms")
    return result


_LABELS = {
    "gone": "failure → all workers gone",
    "exit": "failure → launcher exit",
    "first_start": "failure → first worker of attempt 1 starts",
    "last_start": "failure → last worker of attempt 1 starts",
}


def rows(result: FailureResult, restarts: int) -> list[Row]:
    shown = ("first_start", "last_start") if restarts else ("gone", "exit")
    suffix = f" (N={NPROC}, --max-restarts 1)" if restarts else f" (N={NPROC})"
    return [Row(_LABELS[k] + suffix, "ms", rankrun=result.samples[k].median("rankrun"),
                torchrun=result.samples[k].median("torchrun")) for k in shown]


def details(result: FailureResult, restarts: int) -> list[str]:
    if restarts:
        head = [
            "### Restart latency",
            "",
            f"`--max-restarts 1`, N={NPROC}, same worker as above; on attempt 0 (`TORCHELASTIC_RESTART_COUNT=0`) rank "
            f"{FAIL_RANK} fails once every rank is READY; on attempt 1 every worker records `time.time()` as its first "
            "statement (so the figure includes the worker interpreter's start-up, the same for both launchers) and exits 0. "
            "Measured from the failure timestamp; the launcher must exit 0.",
        ]
    else:
        head = [
            "### Failure → all workers gone",
            "",
            f"N={NPROC} workers run `bench/payloads/fail.py`: each records its pid and start time, prints READY and marks itself "
            f"ready in a directory. Rank {FAIL_RANK} waits (file polling) until all {NPROC} are ready, writes `time.time()` "
            "to a file and calls `os._exit(1)`. The others idle in `time.sleep(0.05)` with the default SIGTERM action. "
            "The harness, after seeing the timestamp file, polls `/proc/<pid>/stat` every 0.5 ms: a worker counts as "
            "gone once it has no entry or is a zombie (it no longer runs). It also records when the launcher exits "
            "(must be non-zero).",
        ]
    lines = [*head, "", "| ms after the failure | rankrun median | torchrun median | rankrun samples | torchrun samples |",
             "|---|---|---|---|---|"]
    for key in result.keys:
        s = result.samples[key]
        label = _LABELS[key] + ({"gone": " (attempt 0)", "exit": " (after attempt 1 succeeds)"}.get(key, "") if restarts else "")
        lines.append(f"| {label} | {s.median('rankrun'):.0f} | {s.median('torchrun'):.0f} | "
                     f"{fmt_samples(s.by_launcher['rankrun'])} | {fmt_samples(s.by_launcher['torchrun'])} |")
    return [*lines, ""]

