"""Shared plumbing: which launchers, how to start them, how to time them, and how to leave nothing behind."""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PAYLOADS = BENCH / "payloads"
PYTHON = sys.executable  # the real interpreter of the venv, never a pyenv shim

# Environment keys a launcher or a worker would read: cleared so the caller's shell cannot skew a run.
_SCRUB_PREFIXES = ("PET_", "TORCHELASTIC_", "RANKRUN_")
_SCRUB_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
               # Interpreter settings of this CI shell, not of a user's: without bytecode caching every run of rankrun
               # would recompile it from source, while torch ships compiled .pyc files (see pycache()).
               "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONPYCACHEPREFIX")
_pycache: Path | None = None


@dataclass(frozen=True)
class Launcher:
    """A way of starting N copies of a worker script; ``argv`` is the part before ``--nproc-per-node``."""

    key: str
    label: str
    argv: tuple[str, ...]
    options: tuple[str, ...] = ()

    def command(self, nproc: int, script: Path, args: Sequence[str] = (), options: Sequence[str] = ()) -> list[str]:
        return [*self.argv, "--nproc-per-node", str(nproc), *self.options, *options, str(script), *args]


RANKRUN = Launcher("rankrun", "rankrun", (str(Path(PYTHON).parent / "rankrun"),))
RANKRUN_M = Launcher("rankrun_m", "python -m rankrun", (PYTHON, "-m", "rankrun"))
TORCHRUN = Launcher("torchrun", "torchrun", (PYTHON, "-m", "torch.distributed.run"))
TORCHRUN_TEE = Launcher("torchrun_tee", "torchrun --tee 3", TORCHRUN.argv, ("--tee", "3"))
DIRECT = Launcher("direct", "bare python driver", (PYTHON, str(PAYLOADS / "direct.py")))


class BenchError(RuntimeError):
    """A launcher misbehaved (wrong exit code, missing output): the measurement is void."""


def bench_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB_PREFIXES) and k not in _SCRUB_KEYS}
    # torch's TCPStore does a reverse DNS lookup per connection; on these machines ~1 in 25 stalls 5 s.
    # Shortening resolver timeouts only trims torchrun's outliers (medians are unaffected).
    env.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
    if _pycache is not None:
        env["PYTHONPYCACHEPREFIX"] = str(_pycache)
    return env


@contextlib.contextmanager
def pycache() -> Iterator[Path]:
    """Give every child a private, writable bytecode cache for the duration of the benchmark.

    Python then compiles each module it imports once (during the warm-up) and loads bytecode afterwards, as an installed
    package does, without writing ``__pycache__`` directories into the source tree.
    """
    global _pycache  # noqa: PLW0603 - one setting for every child started by this process
    with tempfile.TemporaryDirectory(prefix="rankrun-bench-pycache-") as tmp:
        _pycache = Path(tmp)
        try:
            yield _pycache
        finally:
            _pycache = None


# --------------------------------------------------------------------------- process tracking

_LIVE: dict[int, subprocess.Popen[bytes]] = {}
_WORKER_PIDS: set[int] = set()


def start(argv: Sequence[str], stdout: int | None = subprocess.DEVNULL, stderr: int | None = subprocess.DEVNULL,
          cwd: Path | None = None, extra_env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a launcher in its own session (so cleanup can reach its whole process group)."""
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                            env=bench_env() | dict(extra_env or {}), cwd=cwd, start_new_session=True)
    _LIVE[proc.pid] = proc
    return proc


@dataclass(frozen=True)
class Exit:
    """How a launcher ended: exit code, and CPU seconds of it plus every descendant it reaped (its workers)."""

    rc: int
    cpu: float


def finish(proc: subprocess.Popen[bytes], timeout: float) -> Exit:
    """Wait for a launcher, waking the moment it exits; on timeout, stop it and raise.

    ``Popen.wait(timeout)`` polls with sleeps of up to 50 ms, which would quantise every measurement to 50 ms;
    a pidfd becomes readable exactly when the process exits. ``wait4`` then reaps it with its resource usage.
    """
    if proc.returncode is not None:
        raise BenchError(f"process {proc.pid} was already reaped")
    pidfd = os.pidfd_open(proc.pid)
    try:
        exited = select.select([pidfd], [], [], timeout)[0]
    finally:
        os.close(pidfd)
    if not exited:
        stop(proc)
        raise subprocess.TimeoutExpired(proc.args, timeout)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    _LIVE.pop(proc.pid, None)
    return Exit(proc.returncode, usage.ru_utime + usage.ru_stime)


@dataclass(frozen=True)
class Timed:
    wall: float  # seconds from just before exec to exit
    cpu: float  # CPU seconds of the launcher and its workers
    rc: int
    stderr_tail: str


def run_timed(argv: Sequence[str], timeout: float, stdout: int | None = subprocess.DEVNULL,
              extra_env: Mapping[str, str] | None = None) -> Timed:
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = start(argv, stdout=stdout, stderr=err.fileno(), extra_env=extra_env)
        end = finish(proc, timeout)
        elapsed = time.perf_counter() - t0
        err.seek(0)
        tail = err.read()[-2000:].decode(errors="replace")
    return Timed(elapsed, end.cpu, end.rc, tail)


def tail(path: Path, limit: int = 2000) -> str:
    """The end of a captured stderr file, for error messages."""
    try:
        return path.read_bytes()[-limit:].decode(errors="replace")
    except OSError:
        return ""


def expect_ok(timed: Timed, argv: Sequence[str]) -> None:
    if timed.rc != 0:
        raise BenchError(f"{' '.join(argv)} exited {timed.rc} (expected 0); stderr tail:\n{timed.stderr_tail}")


def forget(proc: subprocess.Popen[bytes]) -> None:
    _LIVE.pop(proc.pid, None)


def track_workers(pids: Sequence[int]) -> None:
    _WORKER_PIDS.update(pids)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the launcher's process group, SIGKILL after 10 s."""
    for signum, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    _LIVE.pop(proc.pid, None)


def cleanup() -> list[str]:
    """Stop every launcher still running and every recorded worker still alive; say what was stopped."""
    stopped = []
    for proc in list(_LIVE.values()):
        if proc.poll() is None:
            stopped.append(f"launcher {proc.pid}")
            stop(proc)
    for pid in sorted(_WORKER_PIDS):
        if alive(pid) and _ours(pid):
            stopped.append(f"worker {pid}")
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    _LIVE.clear()
    _WORKER_PIDS.clear()
    return stopped


def _ours(pid: int) -> bool:
    """True if ``pid`` still runs one of our payload scripts (guards against pid reuse)."""
    try:
        return str(PAYLOADS).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


# --------------------------------------------------------------------------- /proc helpers


def alive(pid: int) -> bool:
    """Running, i.e. neither gone nor a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def status_kib(pid: int, key: str) -> int | None:
    """A ``kB`` field of /proc/<pid>/status (``VmHWM``, ``VmRSS``), or None once the memory is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return None


def pss_kib(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return None


def children(pid: int) -> list[int]:
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                kids.extend(int(p) for p in (task / "children").read_text().split())
    return kids


# --------------------------------------------------------------------------- waiting and statistics


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.001) -> float:
    """Poll ``predicate()`` (bounded); return ``time.time()`` when it first held."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextlib.contextmanager
def scratch(prefix: str, subdirs: Sequence[str] = ()) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"rankrun-bench-{prefix}-") as tmp:
        path = Path(tmp)
        for sub in subdirs:
            (path / sub).mkdir()
        yield path


@dataclass
class Samples:
    """Repeated measurements of one quantity for several launchers."""

    unit: str
    by_launcher: dict[str, list[float]] = field(default_factory=dict)

    def add(self, key: str, value: float) -> None:
        self.by_launcher.setdefault(key, []).append(value)

    def median(self, key: str) -> float:
        return median(self.by_launcher.get(key, []))


def rotated(items: Sequence[Launcher], rep: int) -> list[Launcher]:
    """Interleave: each repetition starts with a different launcher, so drift hits all of them alike."""
    k = rep % len(items)
    return [*items[k:], *items[:k]]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- foreign load


@dataclass(frozen=True)
class CpuMark:
    wall: float
    busy: float  # CPU seconds the whole machine spent busy (all CPUs, /proc/stat)
    steal: float  # CPU seconds the hypervisor gave to someone else
    ours: float  # CPU seconds of this process and every child it has reaped (launchers, hence their workers)


def cpu_mark() -> CpuMark:
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (ticks + [0] * 8)[:8]
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return CpuMark(time.monotonic(), (user + nice + system + irq + softirq) / hz, steal / hz,
                   me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime)


def foreign_load(start: CpuMark, end: CpuMark) -> tuple[float, float]:
    """Share of the machine's CPU capacity used by processes other than ours, and stolen, between two marks."""
    capacity = (end.wall - start.wall) * (os.cpu_count() or 1)  # /proc/stat counts every CPU
    if capacity <= 0:
        return 0.0, 0.0
    others = (end.busy - start.busy) - (end.ours - start.ours)
    return max(others, 0.0) / capacity, (end.steal - start.steal) / capacity
