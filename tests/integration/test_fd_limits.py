"""Open files, with real launchers under a small RLIMIT_NOFILE: the launcher raises its soft limit to the hard one
(seen in ``/proc/<launcher>/limits`` while its job runs), and a job that cannot fit is said before any worker starts."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import Launcher, under_nofile

pytestmark = pytest.mark.integration

WORKER = """\
import os, resource, sys
print("worker", os.environ["RANK"], "launcher", os.getppid(), "soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0],
      flush=True)
with open(f"/proc/{os.getppid()}/limits") as limits:
    line = next(l for l in limits if l.startswith("Max open files"))
print("launcher limits:", " ".join(line.split()[3:5]), flush=True)
print("worker started", file=sys.stderr, flush=True)
"""


_under = under_nofile


def test_the_launcher_raises_its_soft_limit_to_the_hard_one(launch: Callable[..., Launcher], tmp_path: Path) -> None:
    script = tmp_path / "limits.py"
    script.write_text(WORKER)
    run = launch("--nproc-per-node", "1", str(script), cmd=_under(256, 4096))
    assert run.finish() == 0, run.err
    assert any(re.search(r"launcher limits: 4096 4096$", line) for line in run.out), run.out  # its soft, its hard
    assert any(line.endswith("soft 4096") for line in run.out), run.out  # and its workers inherit it
    assert not any("open files" in line for line in run.err), run.err  # 1 rank fits: nothing said


def test_a_job_past_the_hard_limit_is_said_before_its_workers_start(launch: Callable[..., Launcher], tmp_path: Path) -> None:
    script = tmp_path / "limits.py"
    script.write_text(WORKER)
    run = launch("--nproc-per-node", "2", str(script), cmd=_under(64, 64))  # needs 2 + 2 x 8 + 64: over 64
    assert run.finish() == 0, run.err
    said = [line for line in run.err if "open files" in line]
    assert len(said) == 1, run.err
    assert "needs about 82 open files" in said[0]
    assert "is 64 (hard 64)" in said[0]
    assert "raise the hard limit to at least 82" in said[0]
    started = [i for i, line in enumerate(run.err) if line.endswith("worker started")]
    assert len(started) == 2, run.err
    assert run.err.index(said[0]) < min(started), run.err  # said before any worker ran (one stream: in order)
