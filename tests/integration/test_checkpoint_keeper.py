"""The keeper of kept progress with plain-Python ranks (no torch): what a rank is handed, that only a rank's own
process is, and that the kept memory leaves nothing behind, after a normal end and after ``kill -9`` of the launcher
and its watchdog together."""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

from conftest import clean_environ, payload, run_cli, wait_gone
from sysfs import FakeMemory

MiB, GiB = 1 << 20, 1 << 30


def _holders(launcher: int) -> list[str]:
    """Every process of this machine that still maps or holds one of ``launcher``'s kept memory files."""
    mark = f"memfd:rankrun-ckpt-{launcher}-"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            maps = (proc / "maps").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if mark in maps or any(mark in fd for fd in fds):
            found.append(proc.name)
    return found


def _shm() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir()}


def test_each_rank_gets_its_own_slots_and_a_child_of_a_rank_is_refused(tmp_path, private_tmpdir):
    before = _shm()
    done = run_cli("--nproc-per-node", "2", payload("keeper_probe.py"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    handed = [line for line in lines if "child" not in line]
    assert handed == [f"[default{r}]:rank {r} local {r} world 2 capacity 4096" for r in range(2)], lines
    refused = [line for line in lines if "child" in line]
    assert len(refused) == 2 and all("child refused: rankrun.checkpoint: only a rank's own process keeps state, and "
                                     "process " in line for line in refused), refused
    assert {p for p in _shm() - before if "rankrun" in p} == set()


def test_a_state_the_node_has_no_room_for_is_one_line_and_the_ranks_go_on(tmp_path, private_tmpdir):
    """A node with 100 MiB of room above the margin (a fake /proc for the keeper's rule): both ranks ask for 200 MiB,
    both are refused, the launcher says it once, and the job ends 0."""
    fake = FakeMemory(4 * GiB, GiB + 100 * MiB, None).write(tmp_path / "node")
    env = clean_environ() | {"ASK": str(200 * MiB), "RANKRUN_MEMROOM_ROOT": str(fake)}
    done = run_cli("--nproc-per-node", "2", payload("keeper_probe.py"), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    room = "this node has 1.1 GiB of room (MemAvailable, MemTotal 4.0 GiB; 1.0 GiB stays free for the workers' own growth)"
    assert sorted(line for line in done.stdout.splitlines() if "room" in line) == [
        f"[default{r}]:no room: {room}" for r in range(2)]
    said = [line for line in done.stderr.splitlines() if "is not kept" in line]
    assert len(said) == 1, done.stderr
    assert re.fullmatch(rf"rankrun: checkpoint: rank [01]'s state \(200.0 MiB\) is not kept: {re.escape(room)}; nothing "
                        "was kept before", said[0]), said


def test_nothing_is_left_after_kill_9_of_the_launcher_and_its_watchdog(launch, tmp_path, private_tmpdir):
    before = _shm()
    run = launch("--nproc-per-node", "2", payload("keeper_probe.py"), env=clean_environ() | {"HOLD": "1"})
    ready = run.wait_for(r"READY \d+", count=2)
    workers = [int(re.search(r"READY (\d+)", line)[1]) for line in ready]  # type: ignore[index]
    launcher = run.proc.pid
    assert sorted(_holders(launcher)) == sorted(str(p) for p in [launcher, *workers])  # the launcher's and the ranks'
    children = {int(c) for c in Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()}
    (watchdog,) = children - set(workers)
    for pid in (launcher, watchdog):  # as a cgroup's kill does: both at once, so nobody cleans up
        os.kill(pid, signal.SIGKILL)
    run.finish()
    assert wait_gone([watchdog, *workers], timeout=10.0) == []
    assert _holders(launcher) == []
    assert {p for p in _shm() - before if "rankrun" in p} == set()
    for leftover in private_tmpdir.iterdir():  # the private log dir was the watchdog's to remove
        shutil.rmtree(leftover)
