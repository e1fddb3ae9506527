"""The ``warm`` metric of bench/run.py (issue 36): rankrun cold, rankrun ``--preload torch`` and torchrun side by side.

``python bench/warm_bench.py [--reps 2] [--sizes 2,8]``. Every job is N real gloo ranks of
``payloads/pg_restart.py`` (it imports torch at its top) under ``--standalone --max-restarts 1``, the three launchers
interleaved in rotating order. One job gives every figure:

- **first start**: ``time.time()`` just before the harness starts the launcher → the last rank of attempt 0 past
  ``init_process_group`` (each rank writes its own time).
- **memory**, with every rank of attempt 0 idle past its ``init_process_group``: the workers' USS
  (``Private_Clean + Private_Dirty``) and PSS from ``/proc/<pid>/smaps_rollup``, summed; and the PSS of every process
  of the job (the launcher, its helpers such as the watchdog and the preloading process, the workers).
- **the launcher's own cost**: its CPU (``utime + stime`` of its own pid, workers excluded) up to that moment and at
  its exit, its VmRSS then and its VmHWM over the whole job, and whether its ``/proc/<pid>/maps`` holds libtorch.
- **restart**: the harness then lets one rank fail (it writes ``time.time()`` right before ``os._exit(1)``); the time
  from that failure to the last rank of attempt 1 past ``init_process_group``, and its steps: attempt 0's workers all
  gone (the harness polls their ``/proc/<pid>/stat`` while it waits), the first and the last rank of attempt 1
  entering ``init_process_group`` (the launcher's part and the workers' start-up), and the process group's own set-up
  (the last rank entering → the last rank past it).

torchrun runs with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: without it its restart fails (see ``EXTRA_ENV``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import select
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness import (
    PAYLOADS,
    PYTHON,
    RANKRUN,
    TORCHRUN,
    BenchError,
    Launcher,
    Samples,
    alive,
    bench_env,
    children,
    forget,
    log,
    pycache,
    rotated,
    run_timed,
    scratch,
    start,
    status_kib,
    stop,
    tail,
    wait_until,
)
from report import Row, Target, fmt_samples, text_table

PAYLOAD = PAYLOADS / "pg_restart.py"
FAIL_RANK = 1
HEADLINE_N = 8  # the size of the first-start, memory and launcher rows
COLD = Launcher("cold", "rankrun cold", RANKRUN.argv, ("--standalone", "--max-restarts", "1"))
WARM = Launcher("warm", "rankrun --preload torch", RANKRUN.argv, ("--standalone", "--max-restarts", "1", "--preload", "torch"))
TORCH = Launcher("torchrun", "torchrun", TORCHRUN.argv, ("--standalone", "--max-restarts", "1"))
# torchrun's restarts fail in gloo's connectFullMesh once the workers have called init_process_group: its agent store,
# reused by every attempt, still holds the previous attempt's keys (shared/reference/torchrun.md §6.3.4, pytorch#135712).
# This setting is its workaround: rank 0 of each attempt hosts a fresh store.
EXTRA_ENV = {TORCH.key: {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}}
TARGET_RESTART_MS = 100.0  # on top of the process group's own set-up
TARGET_SPEEDUP = 10.0
TARGET_FIRST_START_MS = 100.0  # on top of one `import torch`


# --------------------------------------------------------------------------- pure helpers


def rollup(text: str) -> dict[str, int]:
    """The ``kB`` fields of a ``smaps_rollup`` text, by name (``Pss``, ``Private_Clean``, ...)."""
    fields = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB" and parts[1].isdigit():
            fields[parts[0].rstrip(":")] = int(parts[1])
    return fields


def uss_kib(fields: dict[str, int]) -> int:
    """Unique set size: the pages only this process maps (what killing it would free)."""
    return fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)


def own_cpu_ticks(stat: str) -> int:
    """``utime + stime`` of a ``/proc/<pid>/stat`` line: the process's own CPU, not its reaped children's."""
    after_comm = stat.rsplit(")", 1)[1].split()
    return int(after_comm[11]) + int(after_comm[12])  # fields 14 and 15; after_comm[0] is field 3 (state)


def start_time(stat: str) -> int:
    """Field 22 (``starttime``): with the pid, names one process even after the pid is reused."""
    return int(stat.rsplit(")", 1)[1].split()[19])


def maps_torch(maps: str) -> bool:
    """Whether a ``/proc/<pid>/maps`` text maps torch's shared library."""
    return "libtorch" in maps


def stamps(folder: Path, attempt: int) -> list[tuple[float, float, int]]:
    """``(entered, done, pid)`` of every rank of ``attempt`` that is past ``init_process_group``."""
    found = []
    for path in folder.glob(f"a{attempt}_r*"):
        entered, done, pid = path.read_text().split()
        found.append((float(entered), float(done), int(pid)))
    return found


# --------------------------------------------------------------------------- /proc


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _descendants(pid: int) -> list[int]:
    found, todo = [], children(pid)
    while todo:
        kid = todo.pop()
        found.append(kid)
        todo += children(kid)
    return found


def _identity(pids: Sequence[int]) -> dict[int, int]:
    """pid → start time, for the processes still there."""
    out = {}
    for pid in pids:
        stat = _read(f"/proc/{pid}/stat")
        if stat is not None:
            out[pid] = start_time(stat)
    return out


def _running(identity: dict[int, int]) -> list[int]:
    """The recorded processes still running: the same pid and start time, not a zombie."""
    out = []
    for pid, started in identity.items():
        stat = _read(f"/proc/{pid}/stat")
        if stat is not None and start_time(stat) == started and alive(pid):
            out.append(pid)
    return out


def _kill_leftovers(identity: dict[int, int], grace: float = 5.0) -> list[int]:
    """SIGKILL every recorded process that outlived its launcher by ``grace`` seconds (a worker or the preloading
    process dying of the launcher's death may still be on its way out when the launcher is reaped); their pids."""
    with contextlib.suppress(TimeoutError):
        wait_until(lambda: not _running(identity), grace, "the job's processes to be gone")
    left = _running(identity)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return left


def _memory(pids: Sequence[int]) -> tuple[int, int]:
    """Summed USS and PSS (KiB) of ``pids``."""
    uss = pss = 0
    for pid in pids:
        fields = rollup(_read(f"/proc/{pid}/smaps_rollup") or "")
        uss += uss_kib(fields)
        pss += fields.get("Pss", 0)
    return uss, pss


# --------------------------------------------------------------------------- one job


@dataclass
class Job:
    """What one job measured: ``values`` in ms or MB (see ``_LABELS``), whether its launcher mapped libtorch."""

    values: dict[str, float]
    launcher_torch: bool
    leftovers: list[int] = field(default_factory=list)  # pids still running once the launcher was gone


def measure(launcher: Launcher, nproc: int) -> Job:
    timeout = 120.0 + 5.0 * nproc  # cold ranks import torch one after another on 2 cores
    with scratch("warm", ["init"]) as tmp:
        argv = launcher.command(nproc, PAYLOAD, [str(tmp), str(FAIL_RANK)])
        identity: dict[int, int] = {}
        with (tmp / "stderr").open("wb") as err:
            t0 = time.time()
            proc = start(argv, stderr=err.fileno(), extra_env=EXTRA_ENV.get(launcher.key))
        try:
            job = _observe(proc, tmp, nproc, t0=t0, timeout=timeout, identity=identity)
        except BenchError as exc:
            raise BenchError(f"{launcher.label}, N={nproc}: {exc}; stderr tail:\n{tail(tmp / 'stderr')}") from None
        finally:
            stop(proc)
            left = _kill_leftovers(identity)
            if left:
                log(f"  warm: {launcher.label} left {len(left)} process(es) behind: {left} (killed)")
    job.leftovers = left
    return job


def _all_past_init(proc: subprocess.Popen[bytes], folder: Path, attempt: int, nproc: int, *, timeout: float,
                   what: str, meanwhile: Callable[[], object] = lambda: None) -> list[tuple[float, float, int]]:
    """Wait for every rank of ``attempt`` past init (calling ``meanwhile`` at each look); their stamps."""

    def done() -> bool:
        meanwhile()
        return proc.poll() is not None or len(stamps(folder, attempt)) >= nproc

    wait_until(done, timeout, what)
    found = stamps(folder, attempt)
    if len(found) < nproc:
        raise BenchError(f"launcher exited {proc.returncode} with {len(found)} of {nproc} ranks past init ({what})")
    return found


def _observe(proc: subprocess.Popen[bytes], tmp: Path, nproc: int, *, t0: float, timeout: float,
             identity: dict[int, int]) -> Job:
    first = _all_past_init(proc, tmp / "init", 0, nproc, timeout=timeout, what="attempt 0 past init_process_group")
    workers = [pid for _, _, pid in first]
    helpers = [p for p in _descendants(proc.pid) if p not in workers]
    identity |= _identity([*workers, *helpers])
    tick = os.sysconf("SC_CLK_TCK")
    stat = _read(f"/proc/{proc.pid}/stat") or ""
    uss, pss = _memory(workers)
    _, helpers_pss = _memory(helpers)
    _, launcher_pss = _memory([proc.pid])
    out = {
        "first_start": (max(done for _, done, _ in first) - t0) * 1000,
        "uss_workers": uss / 1024, "pss_workers": pss / 1024, "pss_helpers": helpers_pss / 1024,
        "pss_all": (pss + helpers_pss + launcher_pss) / 1024,
        "launcher_cpu_first": own_cpu_ticks(stat) * 1000 / tick,
        "launcher_rss_first": (status_kib(proc.pid, "VmRSS") or 0) / 1024,
    }
    launcher_torch = maps_torch(_read(f"/proc/{proc.pid}/maps") or "")
    restart, again = _restart(proc, tmp, workers, timeout=timeout)
    identity |= _identity(again)
    out |= restart
    hwm, cpu_ticks, rc = _until_exit(proc, timeout)
    if rc != 0:
        raise BenchError(f"launcher exited {rc} (expected 0 after the restart)")
    out |= {"launcher_hwm": hwm / 1024, "launcher_cpu_job": cpu_ticks * 1000 / tick}
    return Job(out, launcher_torch)


def _restart(proc: subprocess.Popen[bytes], tmp: Path, workers: Sequence[int], *,
             timeout: float) -> tuple[dict[str, float], list[int]]:
    """Let rank FAIL_RANK fail; ms from its failure to each step of the restart, and the pids of attempt 1."""
    (tmp / "fail").touch()
    wait_until(lambda: (tmp / "fail_ts").exists() or proc.poll() is not None, 60, "the failing rank")
    if not (tmp / "fail_ts").exists():
        raise BenchError(f"launcher exited {proc.returncode} before the failure")
    gone: list[float] = []

    def note_gone() -> None:  # attempt 0's workers all gone (exited or zombies), checked at each look for attempt 1
        if not gone and not any(alive(p) for p in workers):
            gone.append(time.time())

    again = _all_past_init(proc, tmp / "init", 1, len(workers), timeout=timeout, what="attempt 1 past init_process_group",
                           meanwhile=note_gone)
    fail_ts = float((tmp / "fail_ts").read_text())
    entered, done = [e for e, _, _ in again], [d for _, d, _ in again]
    ms = {"restart": max(done) - fail_ts, "restart_gone": (gone[0] if gone else math.nan) - fail_ts,
          "restart_first": min(entered) - fail_ts, "restart_enter": max(entered) - fail_ts,
          "pg_setup": max(done) - max(entered)}
    return {k: v * 1000 for k, v in ms.items()}, [pid for _, _, pid in again]


def _until_exit(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, int, int]:
    """Follow the launcher to its exit: its lifetime VmHWM (KiB, the last read before its memory is gone), its own CPU
    ticks (read from the zombie, so its shutdown counts), its exit code; then reap it."""
    hwm = 0
    deadline = time.monotonic() + timeout
    while (value := status_kib(proc.pid, "VmHWM")) is not None:
        hwm = value
        if time.monotonic() > deadline:
            raise BenchError(f"launcher did not exit within {timeout:.0f} s of attempt 1 passing init")
        time.sleep(0.0005)
    pidfd = os.pidfd_open(proc.pid)
    try:
        if not select.select([pidfd], [], [], 30)[0]:
            raise BenchError("launcher freed its memory but did not exit within 30 s")
    finally:
        os.close(pidfd)
    ticks = own_cpu_ticks(_read(f"/proc/{proc.pid}/stat") or "")
    _, status, _ = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    forget(proc)
    return hwm, ticks, proc.returncode


# --------------------------------------------------------------------------- the runs


@dataclass
class Result:
    reps: dict[int, int]  # N → repetitions
    preload: bool  # whether this rankrun has --preload (the warm column is empty without it)
    samples: dict[tuple[str, int], Samples] = field(default_factory=dict)
    launcher_torch: dict[str, list[bool]] = field(default_factory=dict)
    leftovers: dict[str, int] = field(default_factory=dict)  # launcher → processes it left running, over every job
    import_torch: list[float] = field(default_factory=list)  # ms, `python -c "import torch"`

    def add(self, key: str, n: int, launcher: str, value: float) -> None:
        self.samples.setdefault((key, n), Samples("ms")).add(launcher, value)

    def median(self, key: str, n: int, launcher: str) -> float:
        found = self.samples.get((key, n))
        return found.median(launcher) if found else float("nan")

    def values(self, key: str, n: int, launcher: str) -> list[float]:
        found = self.samples.get((key, n))
        return found.by_launcher.get(launcher, []) if found else []


def has_preload() -> bool:
    """Whether the rankrun measured has ``--preload`` (before it lands, the warm column stays empty and says so)."""
    done = subprocess.run([*RANKRUN.argv, "--help"], capture_output=True, text=True, env=bench_env(), timeout=60,
                          check=False)
    return "--preload" in done.stdout


def launchers(preload: bool) -> tuple[Launcher, ...]:
    return (COLD, WARM, TORCH) if preload else (COLD, TORCH)


def _import_torch_ms() -> float:
    timed = run_timed([PYTHON, "-c", "import torch"], timeout=120)
    if timed.rc != 0:
        raise BenchError(f"python -c 'import torch' exited {timed.rc}:\n{timed.stderr_tail}")
    return timed.wall * 1000


def warm_up(preload: bool) -> None:
    """One small job per launcher, unrecorded: torch's bytecode into the run's cache, its files into the page cache."""
    for launcher in launchers(preload):
        measure(launcher, 2)


def run(reps: dict[int, int]) -> Result:
    result = Result(reps, has_preload())
    if not result.preload:
        log("  warm: this rankrun has no --preload; the warm column stays empty")
    warm_up(result.preload)
    for n, count in reps.items():
        for rep in range(count):
            if n == HEADLINE_N:
                result.import_torch.append(_import_torch_ms())
            for launcher in rotated(launchers(result.preload), rep):
                job = measure(launcher, n)
                for key, value in job.values.items():
                    result.add(key, n, launcher.key, value)
                result.launcher_torch.setdefault(launcher.key, []).append(job.launcher_torch)
                result.leftovers[launcher.key] = result.leftovers.get(launcher.key, 0) + len(job.leftovers)
            log(f"  warm N={n} rep {rep + 1}/{count}: restart " + ", ".join(
                f"{launcher.label} {result.values('restart', n, launcher.key)[-1]:.0f} ms"
                for launcher in launchers(result.preload)))
    return result


# --------------------------------------------------------------------------- report


def _row(result: Result, key: str, n: int, metric: str, unit: str, *, target: Target | None = None,
         decimals: int = 0) -> Row:
    """rankrun's column is the warm one, the baseline the cold one: *vs base* is warm ÷ cold."""
    return Row(f"warm (--preload torch): {metric}", unit, rankrun=result.median(key, n, WARM.key),
               torchrun=result.median(key, n, TORCH.key), baseline=result.median(key, n, COLD.key),
               baseline_label="rankrun cold", target=target if result.preload else None, decimals=decimals)


def rows(result: Result) -> list[Row]:
    out = []
    setup = result.median("pg_setup", HEADLINE_N, WARM.key)
    for n in result.reps:
        target = None
        if n == HEADLINE_N:
            target = Target(f"--preload ≤ {TARGET_RESTART_MS:.0f} ms + the process group's set-up ({setup:.0f} ms) and "
                            f"≥ {TARGET_SPEEDUP:.0f}x faster than cold",
                            lambda r: r.rankrun <= TARGET_RESTART_MS + setup
                            and r.baseline is not None and r.rankrun * TARGET_SPEEDUP <= r.baseline)
        out.append(_row(result, "restart", n, f"restart, failure → every rank of attempt 1 past init_process_group "
                        f"(N={n}, gloo)", "ms", target=target))
    n = HEADLINE_N
    if n not in result.reps:
        return out
    torch_ms = statistics.median(result.import_torch) if result.import_torch else float("nan")
    torch_free = not any(result.launcher_torch.get(WARM.key, [True]))
    out += [
        _row(result, "first_start", n, f"first start, launch → every rank past init_process_group (N={n})", "ms",
             target=Target(f"--preload ≤ one import torch ({torch_ms:.0f} ms) + {TARGET_FIRST_START_MS:.0f} ms",
                    lambda r: r.rankrun <= torch_ms + TARGET_FIRST_START_MS)),
        _row(result, "uss_workers", n, f"workers' total USS after import torch + init (N={n})", "MB"),
        _row(result, "pss_workers", n, f"workers' total PSS after import torch + init (N={n})", "MB"),
        _row(result, "pss_all", n, f"PSS of every process of the job: launcher, helpers, workers (N={n})", "MB"),
        _row(result, "launcher_cpu_first", n, f"the launcher's own CPU, launch → every rank past init (N={n})", "ms"),
        _row(result, "launcher_hwm", n, f"the launcher's peak RSS (VmHWM), whole job with its restart (N={n})", "MB",
             target=Target("--preload: the launcher maps no libtorch", lambda _r: torch_free), decimals=1),
    ]
    return out


_LABELS = {
    "first_start": "launch → every rank past init (ms)",
    "restart": "failure → every rank of attempt 1 past init (ms)",
    "restart_gone": "  failure → attempt 0's workers all gone (ms)",
    "restart_first": "  failure → the first rank of attempt 1 enters init (ms)",
    "restart_enter": "  failure → the last rank of attempt 1 enters init (ms)",
    "pg_setup": "  the process group's own set-up: the last rank enters init → the last past it (ms)",
    "uss_workers": "workers' USS, summed (MB)",
    "pss_workers": "workers' PSS, summed (MB)",
    "pss_helpers": "helpers' PSS, summed: watchdog, preloading process (MB)",
    "pss_all": "PSS of every process of the job (MB)",
    "launcher_cpu_first": "launcher's own CPU up to every rank past init (ms)",
    "launcher_cpu_job": "launcher's own CPU, whole job (ms)",
    "launcher_rss_first": "launcher's VmRSS with every rank past init (MB)",
    "launcher_hwm": "launcher's VmHWM, whole job (MB)",
}


def _ratio(a: float, b: float) -> str:
    return "—" if math.isnan(a) or math.isnan(b) or not b else f"{a / b:.2f}"


def details(result: Result) -> list[str]:
    kinds = launchers(result.preload)
    lines = [
        "### Warm starts (`--preload torch`)",
        "",
        "Produced by `bench/warm_bench.py` in the same run (its docstring says how). Each job: N ranks of "
        f"`bench/payloads/pg_restart.py` under `--standalone --max-restarts 1`; rank {FAIL_RANK} fails once the harness "
        "has sampled attempt 0; the launcher must exit 0 after attempt 1. Columns: rankrun cold, rankrun "
        "`--preload torch`, torchrun, interleaved in rotating order; torchrun with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, "
        "without which its restart fails once the workers have called `init_process_group` (its reused agent store "
        "keeps the previous attempt's keys; rank 0 then hosts a fresh store each attempt). In the summary rows the "
        "*baseline* is rankrun cold, "
        "*rankrun* is `--preload torch`: *rankrun vs base* is warm ÷ cold. Repetitions: "
        + ", ".join(f"N={n} {c}" for n, c in result.reps.items()) + ". `python -c \"import torch\"`: "
        + (fmt_samples(result.import_torch) + " ms" if result.import_torch else "not measured") + ".",
        "",
    ]
    if not result.preload:
        lines += ["**This rankrun has no `--preload`** (not in `rankrun --help`): the warm column is empty.", ""]
    for n in result.reps:
        lines += [f"**N={n}** (medians; samples in brackets)", "",
                  "| | " + " | ".join(k.label for k in kinds) + " | warm ÷ cold | torchrun ÷ warm |",
                  "|---|" + "---|" * (len(kinds) + 2)]
        for key, label in _LABELS.items():
            med = {k.key: result.median(key, n, k.key) for k in kinds}
            places = 1 if label.endswith("(MB)") else 0
            cells = [f"{med[k.key]:,.{places}f} ({fmt_samples(result.values(key, n, k.key), places)})" for k in kinds]
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {_ratio(med.get(WARM.key, float('nan')), med[COLD.key])}"
                         f" | {_ratio(med[TORCH.key], med.get(WARM.key, float('nan')))} |")
        lines.append("")
    lines += ["The launcher maps libtorch (`/proc/<pid>/maps`, with every rank past init): " + "; ".join(
        f"{k.label} {sum(result.launcher_torch.get(k.key, []))} of {len(result.launcher_torch.get(k.key, []))} jobs"
        for k in kinds) + ". Processes left running once the launcher was gone (killed by the harness): " + "; ".join(
        f"{k.label} {result.leftovers.get(k.key, 0)}" for k in kinds) + ".", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--sizes", default=f"2,{HEADLINE_N}", help="comma-separated N (ranks per job)")
    args = parser.parse_args()
    with pycache():  # as bench/run.py: a private bytecode cache, filled by the warm-up
        result = run({int(n): args.reps for n in args.sizes.split(",")})
    print(text_table(rows(result)))
    print("\n".join(details(result)))


if __name__ == "__main__":
    main()
