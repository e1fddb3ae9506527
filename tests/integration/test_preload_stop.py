"""A stop during ``--preload``'s import: the job stops as before any worker, at once, and leaves nothing running."""

from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import clean_environ, wait_gone

pytestmark = pytest.mark.usefixtures("private_tmpdir")

SLOW = """\
import os, time
open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "importing"), "w").write(str(os.getpid()))
time.sleep(120)
"""


def test_ctrl_c_during_the_import_stops_the_job_before_any_worker(tmp_path, launch):
    (tmp_path / "slow.py").write_text(SLOW)
    (tmp_path / "job.py").write_text("import os\nopen('worker-ran', 'w').close()\n")
    job = launch("--nproc-per-node", "2", "--preload", "slow", "job.py", env=clean_environ())
    importing = tmp_path / "importing"
    deadline = time.monotonic() + 60
    while not importing.exists():  # the preloading process is in its import (bounded)
        assert time.monotonic() < deadline and job.proc.poll() is None, job.err
        time.sleep(0.02)
    preloader = int(importing.read_text())
    assert preloader in _children(job.proc.pid)
    began = time.monotonic()
    os.kill(job.proc.pid, signal.SIGINT)
    assert job.finish(timeout=30) == 128 + signal.SIGINT
    assert time.monotonic() - began < 10  # not the import's 120 s
    assert "rankrun: received SIGINT before the workers started; exiting" in job.err, job.err
    assert not (tmp_path / "worker-ran").exists()
    assert wait_gone([preloader], 5) == []


def _children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(p) for p in f.read().split()}
