"""How fast one node's stack report comes: ``python bench/stacks.py [--ranks 8,64,512] [--reps 3] [--pyspy-jobs 1]``.

Starts N real Python workers with rankrun's dump channel (the shim first on ``PYTHONPATH``, as the launcher sets
it), each parked in one of two functions (rank 0 elsewhere, the rest together, like a hang), and waits until every
worker has registered its handler (``workers``). Then, on those same processes:

- ``measure_rankrun``: per repetition, the real sampling path, ``Sampler.sample`` (signal every worker, read every
  answer, /proc state) and ``render`` (grouping and layout), timed from the request to the last line.
- ``measure_pyspy``, the anchor: per repetition, ``py-spy dump --pid P`` for every worker, one after the other (what
  ``for p in $PIDS; do py-spy dump --pid $p; done`` does; ``--pyspy-jobs K`` runs K at a time instead), timed from
  the first start to the last exit, every line it prints counted (stdout and stderr). One unrecorded dump of rank 0
  first checks that py-spy can attach (and loads it into the page cache). py-spy comes from
  ``bench/requirements.txt``; when it is missing or cannot attach (ptrace refused: it needs CAP_SYS_PTRACE, or the
  target's uid with Yama ``ptrace_scope`` 0, or 1 and being the target's ancestor, which py-spy, a sibling, is not),
  one line says why and the py-spy columns stay empty: the benchmark never fails because of py-spy.

Prints one Markdown row per N: rankrun's median milliseconds, its report's lines and the dump bytes read per rank,
py-spy's median milliseconds and lines, and the ratio of the times. The workers are killed by PID at the end.
``bench/run.py`` runs the same measurement for its "stacks" section (``run``, ``rows``, ``details``).
``--nodes M`` (default 256) adds the whole job's report for M simulated nodes of 8 ranks through the embedded
store: ``bench/stacks_nodes.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import stacks_nodes
from harness import BenchError, log
from rankrun.stacks.channel import DUMP_SIGNAL, channel_env
from rankrun.stacks.report import render
from rankrun.stacks.sampler import Sampler, Target, catches
from report import Row, fmt_samples
from report import Target as Goal

WORKER = """\
import os, time
def waiting_in_a_collective():
    time.sleep(3600)
def stuck_elsewhere():
    time.sleep(3600)
(stuck_elsewhere if os.environ["RANK"] == "0" else waiting_in_a_collective)()
"""
READY_TIMEOUT = 300.0
PYSPY_TIMEOUT = 10.0  # seconds for one `py-spy dump` (a healthy one takes ~20 ms)
TARGET_MS = 1000.0  # request → report, any N
TARGET_LINES = 100  # docs/hangs-and-stacks.md: under 100 lines at any world size with 4 distinct stacks or fewer


# --------------------------------------------------------------------------- the workers


@dataclass(frozen=True)
class Workers:
    """N live workers, each parked in its function with the dump handler registered."""

    dir: Path
    procs: list[subprocess.Popen[bytes]]
    targets: list[Target]

    def dump_file(self, rank: int) -> Path:
        return self.dir / f"{rank}.stacks"


def _signal_of(proc: subprocess.Popen[bytes]) -> Callable[[int], bool]:
    def send(signum: int) -> bool:
        if proc.poll() is not None:
            return False
        os.kill(proc.pid, signum)
        return True

    return send


@contextlib.contextmanager
def workers(ranks: int) -> Iterator[Workers]:
    """Start ``ranks`` workers with rankrun's dump channel, wait until all registered, kill them all on the way out."""
    with tempfile.TemporaryDirectory(prefix="rankrun-bench-stacks-") as tmp:
        script = Path(tmp) / "worker.py"
        script.write_text(WORKER)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            targets = []
            for rank in range(ranks):
                dump = Path(tmp) / f"{rank}.stacks"
                env = channel_env(dict(os.environ, RANK=str(rank)), str(dump))
                proc = subprocess.Popen([sys.executable, str(script)], env=env)
                procs.append(proc)
                targets.append(Target(rank, "bench", proc.pid, dump, _signal_of(proc)))
            deadline = time.monotonic() + READY_TIMEOUT
            while not all(catches(p.pid, DUMP_SIGNAL) and (Path(tmp) / f"{r}.stacks").exists()
                          for r, p in enumerate(procs)):
                if time.monotonic() > deadline:
                    raise BenchError(f"stacks.py: {ranks} workers did not register within {READY_TIMEOUT} s")
                time.sleep(0.05)
            yield Workers(Path(tmp), procs, targets)
        finally:
            for proc in procs:
                proc.kill()
            for proc in procs:
                proc.wait(timeout=60)


# --------------------------------------------------------------------------- rankrun's report


@dataclass(frozen=True)
class RankrunResult:
    ms: list[float]  # request → report, per repetition
    lines: int  # the report's lines
    dump_bytes: float  # dump bytes read per rank and repetition (mean over ranks)


def measure_rankrun(w: Workers, reps: int) -> RankrunResult:
    ranks = len(w.targets)
    times, lines = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        samples = asyncio.run(Sampler().sample(w.targets, timeout=10.0))
        report = render(f"rankrun: job bench: on request; {ranks} ranks", samples)
        times.append((time.perf_counter() - t0) * 1000)
        lines = len(report)
        if not all(s.dump is not None for s in samples):
            raise BenchError(f"stacks.py: a worker of {ranks} did not answer")
    dump_bytes = statistics.mean(w.dump_file(r).stat().st_size for r in range(ranks)) / reps
    return RankrunResult(times, lines, dump_bytes)


# --------------------------------------------------------------------------- py-spy dump, the anchor


@dataclass(frozen=True)
class Dump:
    """One ``py-spy dump --pid P``: whether it worked, the lines it printed, its first line of complaint."""

    ok: bool
    lines: int
    error: str = ""


@dataclass
class PyspyResult:
    jobs: int  # dumps running at a time (1: one after the other)
    why_not: str | None = None  # set when py-spy did not run at all
    ms: list[float] = field(default_factory=list)  # every rank's dump, first start → last exit, per repetition
    lines: int = 0  # lines printed for all ranks, last repetition
    failed: int = 0  # ranks whose dump failed, most in any repetition
    error: str = ""  # the first failure's message

    @property
    def mode(self) -> str:
        return "one after the other" if self.jobs == 1 else f"{self.jobs} at a time"


def find_pyspy() -> str | None:
    """The venv's py-spy (``bench/requirements.txt``), else one on ``PATH``."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which("py-spy")


def pyspy_dump(pyspy: str, pid: int) -> Dump:
    try:
        done = subprocess.run([pyspy, "dump", "--pid", str(pid)], capture_output=True, text=True, errors="replace",
                              timeout=PYSPY_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return Dump(ok=False, lines=0, error=f"no answer within {PYSPY_TIMEOUT:.0f} s")
    except OSError as exc:
        return Dump(ok=False, lines=0, error=f"cannot run {pyspy}: {exc}")
    printed = len(done.stdout.splitlines()) + len(done.stderr.splitlines())
    if done.returncode != 0:
        first = next((line.strip() for line in done.stderr.splitlines() if line.strip()), "")
        return Dump(ok=False, lines=printed, error=first or f"exit status {done.returncode}")
    return Dump(ok=True, lines=printed)


def _ptrace_scope() -> str:
    try:
        return f"Yama ptrace_scope {Path('/proc/sys/kernel/yama/ptrace_scope').read_text().strip()}"
    except OSError:
        return "no Yama"


def why_not(error: str) -> str:
    low = error.lower()
    if any(s in low for s in ("permission denied", "operation not permitted", "ptrace", "eperm")):
        return (f"py-spy cannot attach here: ptrace refused ({_ptrace_scope()}, uid {os.getuid()}; it needs "
                f"CAP_SYS_PTRACE, or the target's uid with Yama ptrace_scope 0, or 1 and being its ancestor): {error}")
    return f"py-spy could not dump a worker: {error}"


def sweep(pyspy: str, pids: Sequence[int], jobs: int) -> tuple[float, list[Dump]]:
    """Every pid's dump, ``jobs`` at a time; milliseconds from the first start to the last exit."""
    t0 = time.perf_counter()
    if jobs <= 1:
        dumps = [pyspy_dump(pyspy, pid) for pid in pids]
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            dumps = list(pool.map(lambda pid: pyspy_dump(pyspy, pid), pids))
    return (time.perf_counter() - t0) * 1000, dumps


def measure_pyspy(w: Workers, reps: int, jobs: int = 1) -> PyspyResult:
    """``py-spy dump`` over the same workers; never raises for py-spy's sake (``why_not`` says what went wrong)."""
    result = PyspyResult(jobs)
    pyspy = find_pyspy()
    if pyspy is None:
        result.why_not = "py-spy is not installed (.venv/bin/pip install -r bench/requirements.txt)"
        return result
    pids = [p.pid for p in w.procs]
    probe = pyspy_dump(pyspy, pids[0])  # unrecorded: can it attach at all? (and py-spy into the page cache)
    if not probe.ok:
        result.why_not = why_not(probe.error)
        return result
    for _ in range(reps):
        ms, dumps = sweep(pyspy, pids, jobs)
        failed = [d for d in dumps if not d.ok]
        if len(failed) == len(dumps):
            result.why_not, result.ms = why_not(failed[0].error), []
            return result
        result.ms.append(ms)
        result.lines = sum(d.lines for d in dumps)
        result.failed = max(result.failed, len(failed))
        result.error = result.error or next((d.error for d in failed), "")
    return result


# --------------------------------------------------------------------------- one node, both ways


@dataclass(frozen=True)
class ShimResult:
    """A Python worker's start-up with the dump channel (the shim first on ``PYTHONPATH``) and without it."""

    with_ms: list[float]
    without_ms: list[float]

    @property
    def cost_ms(self) -> float:
        return statistics.median(self.with_ms) - statistics.median(self.without_ms)

    @property
    def spread_ms(self) -> float:
        """The interquartile range of the starts without the shim: the noise the cost is compared with."""
        q = statistics.quantiles(self.without_ms, n=4)
        return q[2] - q[0]


def measure_shim(reps: int = 40) -> ShimResult:
    """``python -c pass`` started ``reps`` times each way, alternating, with the environment a worker gets."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # the shim's bytecode cached, as usual
    with tempfile.TemporaryDirectory(prefix="rankrun-bench-shim-") as tmp:
        shimmed = channel_env(env, str(Path(tmp) / "stacks.txt"))
        runs: dict[bool, list[float]] = {True: [], False: []}
        for i in range(reps * 2):
            shim = i % 2 == (i // 2) % 2  # alternate, and alternate which goes first
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], env=shimmed if shim else env, check=True)
            runs[shim].append((time.perf_counter() - start) * 1000)
    return ShimResult(runs[True], runs[False])


def shim_row(r: ShimResult) -> Row:
    return Row("a Python worker's start-up with the stack-dump shim (`python -c pass`)", "ms",
               rankrun=statistics.median(r.with_ms), torchrun=float("nan"), baseline=statistics.median(r.without_ms),
               baseline_label="without the shim", decimals=1, compare=False)


def shim_line(r: ShimResult) -> str:
    return (f"- **The dump channel's cost**: a Python worker starts {r.cost_ms:+.2f} ms slower with the shim first on "
            f"`PYTHONPATH` (median of {len(r.with_ms)} starts of `python -c pass` each way, alternating: "
            f"{statistics.median(r.with_ms):.1f} ms against {statistics.median(r.without_ms):.1f} ms); the "
            f"interquartile spread of the starts without it is {r.spread_ms:.2f} ms. The workers start in parallel, so "
            "a launch pays it once on its critical path: below the launch rows' noise (their samples above).")


@dataclass(frozen=True)
class NodeResult:
    ranks: int
    rankrun: RankrunResult
    pyspy: PyspyResult


def measure(ranks: int, reps: int, pyspy_jobs: int = 1) -> NodeResult:
    """rankrun's report, then py-spy's sweep, on the same ``ranks`` workers."""
    with workers(ranks) as w:
        own = measure_rankrun(w, reps)
        spy = measure_pyspy(w, reps, pyspy_jobs)
    if spy.why_not:
        log(f"stacks.py: {ranks} ranks: py-spy left out: {spy.why_not}")
    elif spy.failed:
        log(f"stacks.py: {ranks} ranks: py-spy failed on {spy.failed} of {ranks} workers: {spy.error}")
    return NodeResult(ranks, own, spy)


def run(ranks: Sequence[int], reps: int, pyspy_jobs: int = 1, on_result: Callable[[NodeResult], None] | None = None,
        ) -> list[NodeResult]:
    results = []
    for n in ranks:
        results.append(measure(n, reps, pyspy_jobs))
        if on_result is not None:
            on_result(results[-1])
    return results


# --------------------------------------------------------------------------- report


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


TABLE_HEADER = [
    "| ranks | rankrun: request → report (median ms) | rankrun: report lines | dump bytes per rank "
    "| py-spy dump, every rank (median ms) | py-spy: lines printed | time, rankrun ÷ py-spy "
    "| rankrun samples (ms) | py-spy samples (ms) |",
    "|---|---|---|---|---|---|---|---|---|",
]


def table_row(r: NodeResult) -> str:
    own, spy = r.rankrun, r.pyspy
    if spy.ms:
        failed = f" ({spy.failed} of {r.ranks} failed)" if spy.failed else ""
        spy_cells = (f"{_median(spy.ms):,.0f}{failed} | {spy.lines:,} | {_median(own.ms) / _median(spy.ms):.3f}x | "
                     f"{fmt_samples(own.ms)} | {fmt_samples(spy.ms)}")
    else:
        spy_cells = f"— | — | — | {fmt_samples(own.ms)} | —"
    return f"| {r.ranks} | {_median(own.ms):,.0f} | {own.lines} | {own.dump_bytes:.0f} | {spy_cells} |"


def rows(results: Sequence[NodeResult]) -> list[Row]:
    """Summary rows: rankrun against py-spy (the *baseline* column); torchrun has no stack report."""
    in_time = Goal(f"rankrun ≤ {TARGET_MS / 1000:g} s", lambda row: row.rankrun <= TARGET_MS)
    short = Goal(f"rankrun < {TARGET_LINES} lines", lambda row: row.rankrun < TARGET_LINES)
    out = []
    for r in results:
        spy = r.pyspy
        label = f"py-spy dump, {spy.mode}"
        out.append(Row(f"stack report, one node, {r.ranks} ranks: request → report", "ms", rankrun=_median(r.rankrun.ms),
                       torchrun=float("nan"), baseline=_median(spy.ms) if spy.ms else None, baseline_label=label,
                       target=in_time, compare=False))
        out.append(Row(f"stack report, one node, {r.ranks} ranks: lines printed", "lines", rankrun=float(r.rankrun.lines),
                       torchrun=float("nan"), baseline=float(spy.lines) if spy.ms else None, baseline_label="py-spy dump",
                       target=short, compare=False))
    return out


def details(results: Sequence[NodeResult], reps: int) -> list[str]:
    ranks = ",".join(str(r.ranks) for r in results)
    jobs = results[0].pyspy.jobs if results else 1
    lines = [
        "### Stack report (one node)",
        "",
        f"`python bench/stacks.py --ranks {ranks} --reps {reps}"
        + (f" --pyspy-jobs {jobs}" if jobs != 1 else "") + "` (its docstring says how): N plain Python workers "
        "started with rankrun's dump channel (the shim first on `PYTHONPATH`), rank 0 parked in one function and the "
        "others in another, like a hang. *rankrun* is the real sampling path, `Sampler.sample` (signal every worker, "
        "read every answer, /proc state) then `render` (grouping, layout), from the request to the report's last line. "
        f"The *baseline* is `py-spy dump --pid P` over the same processes, in the same run, right after: every rank "
        f"{'one after the other, as a shell loop does' if jobs == 1 else f'{jobs} at a time'}, from the first start to "
        "the last exit, every printed line counted; one unrecorded dump of rank 0 first. torchrun has no stack report "
        f"(its column is empty). {reps} repetition{'s' if reps != 1 else ''} each; medians. Targets: the report within "
        f"{TARGET_MS / 1000:g} s, and under {TARGET_LINES} lines at any world size with 4 distinct stacks or fewer "
        "(docs/hangs-and-stacks.md).",
        "",
        *TABLE_HEADER,
        *(table_row(r) for r in results),
        "",
    ]
    said = notes(results)
    return [*lines, *said, *([""] if said else [])]


def notes(results: Sequence[NodeResult]) -> list[str]:
    """A line per N where py-spy was left out or failed on some workers."""
    said = [f"- {r.ranks} ranks: py-spy left out: {r.pyspy.why_not}" for r in results if r.pyspy.why_not]
    return said + [f"- {r.ranks} ranks: py-spy failed on {r.pyspy.failed} of {r.ranks} workers: {r.pyspy.error}"
                   for r in results if r.pyspy.failed and not r.pyspy.why_not]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ranks", default="8,64,512", help="comma-separated worker counts")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pyspy-jobs", type=int, default=1, help="py-spy dumps at a time (default 1: one after the other)")
    parser.add_argument("--nodes", default="256", help="comma-separated simulated node counts (8 ranks each); 0: none")
    args = parser.parse_args(argv)
    ranks = [int(x) for x in args.ranks.split(",") if int(x) > 0]
    if ranks:
        for line in TABLE_HEADER:
            print(line)
        try:
            results = run(ranks, args.reps, args.pyspy_jobs, on_result=lambda r: print(table_row(r), flush=True))
        except BenchError as exc:
            print(exc, file=sys.stderr)
            return 1
        for line in notes(results):
            print(line)
    print()
    print(shim_line(measure_shim()))
    nodes = [int(x) for x in args.nodes.split(",") if int(x) > 0]
    if nodes:
        print()
        for line in stacks_nodes.HEADER:
            print(line)
        for n in nodes:
            print(stacks_nodes.table_row(stacks_nodes.measure(n, args.reps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
