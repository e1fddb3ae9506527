"""Shared fixtures: a clean environment, a tracked launcher process, and a PID reaper.

Tests live in one folder per layer (``unit`` pure functions, ``agent`` the restart loop on
fakes, ``contract`` one suite per seam run against every implementation, ``integration`` real
processes, ``e2e`` the CLI with real torch); each folder is also a marker: ``pytest -m unit``.

Nothing here sleeps to synchronise: tests wait for READY lines (bounded) or for process
exit (bounded). Every PID a test learns about is killed at teardown if it still lives;
nothing is ever killed by name.

The whole run has a temp directory of its own (``TMPDIR``, and ``tempfile``'s in this process), made
empty under pytest's base temp: at the end it must be empty again, or the run fails naming what was
left. Other work on the machine cannot be blamed for an entry there, nor hide one.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from etcdserver import fresh_address

PAYLOADS = Path(__file__).parent / "payloads"
GOLDEN_DIR = Path(__file__).parent / "golden"
LAYERS = ("unit", "agent", "contract", "integration", "e2e")  # tests/<layer>/, each also a marker (pytest -m unit)
PY = sys.executable
RANKRUN = (PY, "-m", "rankrun")

_SCRUB = ("PET_", "TORCHELASTIC_", "TORCH_ELASTIC_", "MASTER_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "ROLE_")


def clean_environ() -> dict[str, str]:
    """The test process's environment without anything a launcher would read or set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB)}
    env.pop("OMP_NUM_THREADS", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"


def wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    """Wait (bounded) until none of ``pids`` is alive; return the survivors."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.01)
        left = [p for p in left if alive(p)]
    return left


def wait_empty(path: Path, timeout: float) -> list[Path]:
    """Wait (bounded) until directory ``path`` is empty; return what is still there."""
    deadline = time.monotonic() + timeout
    while (left := list(path.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.01)
    return left


class Reaper:
    """Remembers PIDs; kills the living ones at teardown."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.pid_dirs: list[Path] = []

    def watch_dir(self, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        self.pid_dirs.append(path)
        return path

    def collect(self) -> set[int]:
        for d in self.pid_dirs:
            for f in d.glob("*"):
                with contextlib.suppress(ValueError, OSError):
                    self.pids.update(int(p) for p in f.read_text().split())
        return self.pids

    def cleanup(self) -> list[str]:
        survivors = [p for p in self.collect() if alive(p)]
        described = [f"{pid} {_cmdline(pid)}" for pid in survivors]
        for pid in survivors:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return described


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its layer, from the folder it lives in."""
    for item in items:
        layer = item.path.parent.name
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))


LEFTOVER_WAIT = 10.0  # seconds a launcher's own clean-up (or its watchdog's, after kill -9) may still take


@pytest.fixture(scope="session", autouse=True)
def run_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The run's own temp directory: every process the tests start, and this one, put their temp files here."""
    tmp = tmp_path_factory.getbasetemp() / "TMPDIR"  # pytest's base first: it stays where pytest keeps it
    tmp.mkdir()
    saved = tempfile.tempdir
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp))
        tempfile.tempdir = None  # computed again from TMPDIR on next use
        try:
            yield tmp
        finally:
            tempfile.tempdir = saved
    left = wait_empty(tmp, LEFTOVER_WAIT)
    assert not left, f"the test run left {len(left)} entries in its temp directory: {sorted(p.name for p in left)}"
    tmp.rmdir()


@pytest.fixture
def private_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every launcher a test starts puts its temp files here, and leaves nothing behind."""
    tmp = tmp_path / "TMPDIR"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    yield tmp
    assert list(tmp.iterdir()) == [], "a launcher left temporary files behind"


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    r = Reaper()
    yield r
    leaked = r.cleanup()
    assert not leaked, f"processes left behind: {leaked}"


class Launcher:
    """A rankrun (or torchrun) process whose stdout/stderr lines are collected by threads."""

    def __init__(self, args: Sequence[str], env: dict[str, str], cwd: Path, reaper: Reaper, stdin: int | None = None) -> None:
        self.proc = subprocess.Popen(
            list(args), env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=stdin, start_new_session=True
        )
        reaper.pids.add(self.proc.pid)
        self.out: list[str] = []
        self.err: list[str] = []
        self._lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self._threads = [
            threading.Thread(target=self._read, args=(self.proc.stdout, self.out, "out"), daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, self.err, "err"), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self, stream: object, sink: list[str], name: str) -> None:
        for raw in stream:  # type: ignore[attr-defined]
            line = raw.decode(errors="replace").rstrip("\n")
            sink.append(line)
            self._lines.put((name, line))

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 60.0) -> list[str]:
        """Block until ``count`` stdout/stderr lines match ``pattern`` (bounded)."""
        rx = re.compile(pattern)
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while len(seen) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {count}x {pattern!r}; got {seen}\nstdout={self.out}\nstderr={self.err}")
            try:
                _, line = self._lines.get(timeout=left)
            except queue.Empty:
                continue
            if rx.search(line):
                seen.append(line)
        return seen

    def finish(self, timeout: float = 120.0) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # what it said so far is the clue to why it still runs
            raise AssertionError(f"{self.proc.args} still running after {timeout:g} s\nstdout={self.out}\n"
                                 f"stderr={self.err}") from None
        self._close()
        return rc

    def _close(self) -> None:
        for t in self._threads:
            t.join(30)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait(timeout=30)
        self._close()


@pytest.fixture
def launch(tmp_path: Path, reaper: Reaper) -> Iterator[object]:
    started: list[Launcher] = []

    def start(*args: str, env: dict[str, str] | None = None, cmd: Sequence[str] = RANKRUN, stdin: int | None = None) -> Launcher:
        e = clean_environ() if env is None else env
        e.setdefault("TEST_PID_DIR", str(reaper.watch_dir(tmp_path / "pids")))
        launcher = Launcher([*cmd, *args], e, tmp_path, reaper, stdin=stdin)
        started.append(launcher)
        return launcher

    yield start
    for launcher in started:
        if launcher.proc.poll() is None:
            launcher.kill()
        else:
            launcher._close()


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run rankrun to completion and capture its output."""
    return subprocess.run(
        [*RANKRUN, *args], env=clean_environ() if env is None else env, cwd=cwd, capture_output=True, text=True, timeout=timeout,
        check=False,
    )


# rankrun started under a given (soft, hard) RLIMIT_NOFILE, as `prlimit --nofile=SOFT:HARD rankrun` (stdlib only)
_UNDER_NOFILE = ("import os, resource, sys; soft, hard = map(int, sys.argv[1:3]); "
                 "resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)); "
                 "os.execv(sys.executable, [sys.executable, '-m', 'rankrun', *sys.argv[3:]])")


def under_nofile(soft: int, hard: int) -> tuple[str, ...]:
    """The command that starts rankrun under that open-files limit (a ``launch(..., cmd=)``)."""
    return (sys.executable, "-c", _UNDER_NOFILE, str(soft), str(hard))


def fresh_loopback() -> str:
    """A loopback address nobody else uses (127.0.0.0/8 without 127.0.0.x), for a test's fixed-port endpoint:
    multi-node jobs need a port every node knows in advance, and a fresh address cannot collide (no port probing)."""
    return fresh_address()


def payload(name: str) -> str:
    return str(PAYLOADS / name)


def two_api_nodes(tmp_path: Path, reaper: Reaper, *args: str) -> list[list[str]]:
    """Two callers of ``rankrun.launch`` (``payloads/api_driver.py ARGS``), each one node of the same job; their
    stdout lines, once both have exited 0."""
    nodes = [Launcher([sys.executable, payload("api_driver.py"), *args], clean_environ(), tmp_path, reaper) for _ in range(2)]
    for node in nodes:
        assert node.finish(timeout=120) == 0, node.err
    return [node.out for node in nodes]
