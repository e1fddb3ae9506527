"""Metric 2: peak RSS of the launcher process itself (not its workers), 8 workers that wait for a go file."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import (
    DIRECT,
    PAYLOADS,
    RANKRUN,
    TORCHRUN,
    BenchError,
    Launcher,
    Samples,
    children,
    forget,
    log,
    pss_kib,
    rotated,
    scratch,
    start,
    status_kib,
    stop,
    tail,
    track_workers,
    wait_until,
)
from report import Row, Target, fmt_samples

NPROC = 8
LAUNCHERS = (DIRECT, RANKRUN, TORCHRUN)
TARGET_MB = 25.0
KEYS = ("hwm_exit", "hwm_running", "rss_running", "pss_running", "helpers_rss", "helpers_pss", "helpers", "wait4_maxrss",
        "harness_rss")


@dataclass
class RssResult:
    reps: int
    samples: dict[str, Samples] = field(default_factory=lambda: {k: Samples("MB") for k in KEYS})


def _ready_pids(ready: Path) -> list[int]:
    return [int(p.read_text()) for p in ready.iterdir() if not p.name.startswith(".")]


def _hwm_until_exit(pid: int, last: int, timeout: float = 60.0) -> int:
    """Poll VmHWM (a high-water mark) until the memory is gone; the last value read is the lifetime peak."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = status_kib(pid, "VmHWM")
        if value is None:
            return last
        last = value
        time.sleep(0.0005)
    raise BenchError(f"launcher {pid} did not exit within {timeout:.0f} s of the go file")


def measure(launcher: Launcher) -> dict[str, float]:
    """All figures in MB (1 MB = 2**20 bytes)."""
    with scratch("rss", ["ready"]) as tmp:
        with (tmp / "stderr").open("wb") as err:
            proc = start(launcher.command(NPROC, PAYLOADS / "hold.py", [str(tmp)]), stderr=err.fileno())
        try:
            return _measure_running(proc, tmp)
        except BenchError as exc:
            raise BenchError(f"{launcher.label}: {exc}; stderr tail:\n{tail(tmp / 'stderr')}") from None
        finally:
            stop(proc)


def _measure_running(proc: subprocess.Popen[bytes], tmp: Path) -> dict[str, float]:
    ready = tmp / "ready"
    wait_until(lambda: proc.poll() is not None or sum(1 for p in ready.iterdir() if not p.name.startswith(".")) >= NPROC,
               90, "8 workers to be ready")
    if proc.poll() is not None:
        raise BenchError(f"launcher exited {proc.returncode} before its workers were ready")
    workers = _ready_pids(ready)
    track_workers(workers)
    helpers = [c for c in children(proc.pid) if c not in workers]
    out = {
        "hwm_running": status_kib(proc.pid, "VmHWM") or 0,
        "rss_running": status_kib(proc.pid, "VmRSS") or 0,
        "pss_running": pss_kib(proc.pid) or 0,
        "helpers_rss": sum(status_kib(h, "VmRSS") or 0 for h in helpers),
        "helpers_pss": sum(pss_kib(h) or 0 for h in helpers),
        "harness_rss": status_kib(os.getpid(), "VmRSS") or 0,
    }
    (tmp / "go").touch()
    out["hwm_exit"] = _hwm_until_exit(proc.pid, int(out["hwm_running"]))
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    forget(proc)
    if proc.returncode != 0:
        raise BenchError(f"launcher exited {proc.returncode}")
    out["wait4_maxrss"] = usage.ru_maxrss  # KiB on Linux; max over the launcher and every child it reaped
    result = {k: v / 1024 for k, v in out.items()}
    result["helpers"] = float(len(helpers))
    return result


def run(reps: int) -> RssResult:
    result = RssResult(reps)
    for rep in range(reps):
        for launcher in rotated(LAUNCHERS, rep):
            for key, value in measure(launcher).items():
                result.samples[key].add(launcher.key, value)
        hwm = result.samples["hwm_exit"].by_launcher
        log(f"  rss rep {rep + 1}/{reps}: rankrun {hwm['rankrun'][-1]:.1f} MB, torchrun {hwm['torchrun'][-1]:.1f} MB")
    return result


def rows(result: RssResult) -> list[Row]:
    s = result.samples["hwm_exit"]
    return [Row(f"agent peak RSS, {NPROC} noop workers (VmHWM of launcher pid)", "MB", rankrun=s.median("rankrun"),
                torchrun=s.median("torchrun"), baseline=s.median("direct"), baseline_label="bare driver",
                target=Target(f"rankrun ≤ {TARGET_MB:.0f} MB", lambda r: r.rankrun <= TARGET_MB), decimals=1)]


def details(result: RssResult) -> list[str]:
    labels = {
        "hwm_exit": "VmHWM, last read before exit (headline)",
        "hwm_running": "VmHWM with all workers running",
        "rss_running": "VmRSS with all workers running",
        "pss_running": "Pss with all workers running",
        "helpers": "helper processes (children that are not workers)",
        "helpers_rss": "helpers' VmRSS (sum)",
        "helpers_pss": "helpers' Pss (sum)",
        "wait4_maxrss": "`wait4` ru_maxrss (launcher, reaped workers, pre-exec fork of the harness)",
        "harness_rss": "the harness's own VmRSS (for the line above)",
    }
    lines = [
        "### Agent peak RSS",
        "",
        f"The launcher starts {NPROC} workers running `bench/payloads/hold.py`, which mark themselves ready in a directory and "
        "then wait for a `go` file. With all workers ready the harness reads `/proc/<launcher pid>/status` (VmHWM, VmRSS), "
        "`smaps_rollup` (Pss) and the launcher's non-worker children (helpers, e.g. rankrun's forked watchdog). Then it "
        "creates `go` and keeps reading VmHWM every 0.5 ms until the launcher's memory is gone (zombie); since VmHWM is a "
        "high-water mark, the last value read is the peak over the whole life of the launcher process, shutdown included, "
        "up to its last ~0.5 ms. That is the headline figure. It covers the launcher's own pid only. "
        "`getrusage(RUSAGE_CHILDREN)` / `wait4` would not: their ru_maxrss folds in the peaks of the workers (children "
        "the launcher reaped) and, since ru_maxrss survives `exec`, the RSS of the harness's own forked copy before it "
        "exec'd the launcher; the `wait4` row below is therefore only an upper bound, shown as a cross-check. "
        "Helpers are listed separately; a forked helper shares most of its pages with the launcher, so its Pss, "
        "not its RSS, is what it adds. The baseline is the "
        "bare driver (`direct.py`) holding the same 8 workers. MB = 2^20 bytes.",
        "",
        "| medians (MB) | bare driver | rankrun | torchrun | samples rankrun | samples torchrun |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in labels.items():
        s = result.samples[key]
        lines.append(f"| {label} | {s.median('direct'):.1f} | {s.median('rankrun'):.1f} | {s.median('torchrun'):.1f} | "
                     f"{fmt_samples(s.by_launcher['rankrun'], 1)} | {fmt_samples(s.by_launcher['torchrun'], 1)} |")
    return [*lines, ""]
