"""rankrun as PID 1 of a container (a PID namespace: ``unshare --pid --fork --mount-proc``): orphans reaped as they
exit while the job runs, SIGTERM reaching the workers, the report printed, exit within ``--shutdown-timeout``."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from conftest import RANKRUN, clean_environ, payload
from rankrun.stacks.control import launchers

pytestmark = [pytest.mark.usefixtures("private_tmpdir"),
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")]


def _child_of(pid: int, timeout: float = 30.0) -> int:
    """The process ``unshare --fork`` started (rankrun, PID 1 inside), as this side numbers it (bounded wait)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.01)  # no event announces the fork
    raise AssertionError("unshare did not start rankrun")


def test_as_pid_1_orphans_are_reaped_while_the_job_runs_and_sigterm_ends_it_cleanly(launch):
    run = launch(*RANKRUN, "--nproc-per-node", "2", "--shutdown-timeout", "5", payload("orphan_worker.py"),
                 env=clean_environ() | {"ORPHAN_WAIT": "1"}, cmd=("unshare", "--pid", "--kill-child", "--mount-proc"))
    run.wait_for(r"READY", count=2, timeout=60)
    assert sum("grandchild reaped" in line for line in run.out) == 2, run.out  # not left a zombie until the end
    assert sum("ppid 1" in line for line in run.out) == 2  # rankrun is PID 1 in there
    os.kill(_child_of(run.proc.pid), signal.SIGTERM)
    assert run.finish(timeout=60) == 128 + signal.SIGTERM
    assert sum("worker got SIGTERM" in line for line in run.out) == 2
    assert run.err[-1] == "rankrun: received SIGTERM: forwarded to 2 worker(s) and stopped them"


def test_a_launcher_in_another_pid_namespace_is_not_listed_under_the_pid_it_has_there(launch):
    """Its control socket is named after its pid in there (1): that number means another process here."""
    inside = launch(*RANKRUN, "--nproc-per-node", "1", payload("orphan_worker.py"), env=clean_environ() | {"ORPHAN_WAIT": "1"},
                    cmd=("unshare", "--pid", "--kill-child", "--mount-proc"))
    inside.wait_for(r"READY", timeout=60)
    outer = _child_of(inside.proc.pid)
    assert 1 not in launchers()  # the listing rankrun --stacks uses without a PID
    os.kill(outer, signal.SIGTERM)
    inside.finish(timeout=60)


def test_as_pid_1_a_worker_ignoring_sigterm_is_killed_after_the_shutdown_timeout(launch):
    """The kubelet's grace period is 30 s by default: rankrun must be gone well within --shutdown-timeout + 2 s."""
    run = launch(*RANKRUN, "--nproc-per-node", "1", "--shutdown-timeout", "1", payload("orphan_worker.py"),
                 env=clean_environ() | {"ORPHAN_WAIT": "ignore"}, cmd=("unshare", "--pid", "--kill-child", "--mount-proc"))
    run.wait_for(r"READY", timeout=60)
    asked = time.monotonic()
    os.kill(_child_of(run.proc.pid), signal.SIGTERM)
    assert run.finish(timeout=60) == 128 + signal.SIGTERM
    took = time.monotonic() - asked
    assert took < 1 + 2, f"{took:.1f} s"  # a bound the kubelet relies on, not a speed measurement
    assert run.err[-1] == ("rankrun: received SIGTERM: forwarded to 1 worker(s); 1 did not stop within --shutdown-timeout "
                           "and were killed")
