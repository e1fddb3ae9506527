"""``--preload``'s processes live and die with the launcher: ``kill -9`` of the launcher takes the preloading process
and every forked worker with it, as it takes cold workers (the watchdog and the death signal); a normal end and a
forwarded signal leave nothing running either. Real processes, real signals, no torch (the preloaded module is one of
the standard library's)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import alive, clean_environ, payload, wait_empty, wait_gone

pytestmark = pytest.mark.usefixtures("private_tmpdir")

PRELOAD = ("--preload", "json")


def _pids(pid_dir: Path, prefix: str) -> dict[str, int]:
    return {f.name: int(f.read_text()) for f in pid_dir.glob(f"{prefix}*") if not f.name.endswith(".tmp")}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _preloader(launcher: int, pid_dir: Path, workers: set[int]) -> int:
    """The launcher's child that is the preloading process (a forked worker has its command line too: set aside),
    written where the reaper looks, should the test fail before it is gone."""
    children = {int(p) for p in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()}
    (preloader,) = {p for p in children - workers if b"rankrun/preload/__main__.py" in _cmdline(p)}
    (pid_dir / "preloader").write_text(str(preloader))
    return preloader


def _forked(workers: dict[str, int]) -> None:
    """Each worker was forked from the preloading process (its command line is that process's): the test is about
    forked workers, not a silent fallback to cold ones."""
    assert all(b"rankrun/preload/__main__.py" in _cmdline(pid) for pid in workers.values()), workers


def test_kill_dash_nine_of_the_launcher_takes_the_preloading_process_and_every_forked_worker(launch, tmp_path,
                                                                                            private_tmpdir):
    env = clean_environ() | {"PAYLOAD_CHILDREN": "1"}
    run = launch("--nproc-per-node", "3", *PRELOAD, payload("sigwait.py"), env=env)
    run.wait_for(r"READY rank", count=3)
    pid_dir = tmp_path / "pids"
    workers, children = _pids(pid_dir, "worker"), _pids(pid_dir, "child")
    assert len(workers) == 3 and len(children) == 3
    _forked(workers)
    preloader = _preloader(run.proc.pid, pid_dir, set(workers.values()))
    assert all(alive(p) for p in [preloader, *workers.values(), *children.values()])
    run.proc.kill()
    run.finish()
    survivors = wait_gone([preloader, *workers.values(), *children.values()], timeout=2.0)
    assert survivors == [], f"outlived the launcher by 2 s: {survivors}"
    assert wait_empty(private_tmpdir, 5.0) == []  # the watchdog removed the private temp dir too
    escaped = list(_pids(pid_dir, "setsid").values())  # left the worker's session: outside the kill -9 guarantee
    for pid in escaped:
        os.kill(pid, signal.SIGKILL)
    assert wait_gone(escaped, timeout=5.0) == []


WAIT_THEN_EXIT = """\
import os, time
rank = os.environ["RANK"]
with open(os.path.join(os.environ["TEST_PID_DIR"], f"worker{rank}"), "w") as f:
    f.write(str(os.getpid()))
print("READY rank", rank, flush=True)
go = os.path.join(os.environ["TEST_PID_DIR"], "..", "go")
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:  # the test's event: it has seen every process
    time.sleep(0.01)
"""


def test_a_normal_end_leaves_no_process(launch, tmp_path):
    (tmp_path / "job.py").write_text(WAIT_THEN_EXIT)
    run = launch("--nproc-per-node", "2", *PRELOAD, "job.py")
    run.wait_for(r"READY rank", count=2)
    pid_dir = tmp_path / "pids"
    workers = _pids(pid_dir, "worker")
    _forked(workers)
    preloader = _preloader(run.proc.pid, pid_dir, set(workers.values()))
    (tmp_path / "go").write_text("")
    assert run.finish() == 0, run.err
    assert run.err == []
    assert not alive(preloader)  # reaped by the launcher before it exited (its child: not even a zombie)
    assert wait_gone(list(workers.values()), 5.0) == []


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_to_the_launcher_ends_the_job_as_without_preload(launch, tmp_path, signame):
    run = launch("--nproc-per-node", "3", *PRELOAD, payload("sigwait.py"))
    run.wait_for(r"READY rank", count=3)
    pid_dir = tmp_path / "pids"
    workers = _pids(pid_dir, "worker")
    _forked(workers)
    preloader = _preloader(run.proc.pid, pid_dir, set(workers.values()))
    sig = signal.Signals[signame]
    run.proc.send_signal(sig)
    assert run.finish() == 128 + sig
    got = sorted(line for line in run.out if "GOT" in line)
    assert got == [f"[default{r}]:GOT {signame} rank {r}" for r in range(3)]  # each forked worker had its handler
    assert any(f"received {signame}" in line for line in run.err)
    assert not [line for line in run.err if "--preload" in line or "Traceback" in line], run.err
    assert wait_gone([preloader, *workers.values()], 5.0) == []


@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "pre-exec-hook"])
def test_the_death_signal_alone_ends_them_when_the_watchdog_is_gone_too(launch, tmp_path, private_tmpdir, setpriv):
    """Each lifetime layer on its own: with the watchdog killed first, the death signal must still end the preloading
    process (set as for a cold worker: ``setpriv`` or the pre-exec hook) and each forked worker (set by the worker
    itself once it is the launcher's child: a fork clears it)."""
    env = clean_environ()
    if not setpriv:
        (tmp_path / "no-setpriv").mkdir()
        env["PATH"] = str(tmp_path / "no-setpriv")
    run = launch("--nproc-per-node", "2", *PRELOAD, payload("sigwait.py"), env=env)
    run.wait_for(r"READY rank", count=2)
    pid_dir = tmp_path / "pids"
    workers = set(_pids(pid_dir, "worker").values())
    _forked(_pids(pid_dir, "worker"))
    preloader = _preloader(run.proc.pid, pid_dir, workers)
    children = {int(p) for p in Path(f"/proc/{run.proc.pid}/task/{run.proc.pid}/children").read_text().split()}
    (watchdog,) = children - workers - {preloader}
    os.kill(watchdog, signal.SIGKILL)
    assert wait_gone([watchdog], 5.0) == []
    assert all(alive(p) for p in [preloader, *workers])  # killing the watchdog alone ends nothing
    run.proc.kill()
    run.finish()
    assert wait_gone([preloader, *sorted(workers)], timeout=2.0) == [], "outlived the launcher without the watchdog"
    for leftover in private_tmpdir.iterdir():  # removing the private dir after kill -9 was the watchdog's job
        shutil.rmtree(leftover)


BLOCKING = """\
import os, time
path = os.path.join(os.environ["TEST_PID_DIR"], "preloader")
with open(path + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(path + ".tmp", path)  # (its output is shown once the import is over: a file is the event)
release = os.path.join(os.getcwd(), "release")
deadline = time.monotonic() + 60
while not os.path.exists(release) and time.monotonic() < deadline:  # an import that hangs (a network filesystem)
    time.sleep(0.01)
"""


def _importing(launch, tmp_path: Path) -> tuple[object, int]:
    """A launcher whose preloading process is stuck in the import, and that process's pid (the reaper's too)."""
    (tmp_path / "blocking.py").write_text(BLOCKING)
    (tmp_path / "job.py").write_text("print('should not run')\n")
    run = launch("--nproc-per-node", "2", "--preload", "blocking", "job.py")
    said = tmp_path / "pids" / "preloader"
    deadline = time.monotonic() + 60
    while not said.exists() and run.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert said.exists(), (run.out, run.err)
    return run, int(said.read_text())


def test_kill_dash_nine_of_the_launcher_during_the_import_takes_the_preloading_process(launch, tmp_path,
                                                                                      private_tmpdir):
    run, preloader = _importing(launch, tmp_path)
    run.proc.kill()
    run.finish()
    assert wait_gone([preloader], timeout=2.0) == [], "the preloading process outlived the launcher by 2 s"
    assert wait_empty(private_tmpdir, 5.0) == []


def test_a_signal_during_the_import_ends_the_launcher_at_once(launch, tmp_path):
    """SIGTERM (test_preload_stop.py has Ctrl-C): the job stops as before any worker, without waiting for the import."""
    run, preloader = _importing(launch, tmp_path)
    run.proc.send_signal(signal.SIGTERM)
    try:
        rc = run.proc.wait(timeout=10)  # the import would take 60 s: the launcher must not wait for it
    except subprocess.TimeoutExpired:
        rc = None
    (tmp_path / "release").write_text("")  # let a launcher that waited end, then fail
    assert run.finish() == 128 + signal.SIGTERM
    assert wait_gone([preloader], 5.0) == []
    assert rc == 128 + signal.SIGTERM
