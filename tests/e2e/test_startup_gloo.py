"""The start-up timeline of a real torch job: two gloo workers whose ``init_process_group`` reaches the workers'
store, so the attempt's line comes while they run, with every phase (``rankrun.agent.startup``)."""

from __future__ import annotations

import json
import re

import pytest

from conftest import clean_environ, run_cli

pytestmark = pytest.mark.usefixtures("private_tmpdir")

pytest.importorskip("torch")

# After the barrier, each rank waits (bounded) until the launcher has told the start-up: the events file is flushed
# line by line, so the line came while the workers ran.
WORKER = """\
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
deadline = time.monotonic() + 60
while '"event":"startup"' not in open(sys.argv[1]).read() and time.monotonic() < deadline:
    time.sleep(0.02)
dist.destroy_process_group()
"""
LINE = re.compile(r"^rankrun: attempt 0 started in [0-9.]+ s: rendezvous [0-9.]+ s, spawn [0-9.]+ s, "
                  r"script p50 [0-9.]+ s / max [0-9.]+ s \(rank [01]\), store p50 [0-9.]+ s / max [0-9.]+ s$", re.M)


def test_two_gloo_workers_start_up_is_told_in_one_line_with_the_store_phase(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    events = tmp_path / "events.jsonl"
    done = run_cli("--nproc-per-node", "2", "--events", str(events), str(worker), str(events), env=clean_environ(),
                   cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    assert len(LINE.findall(done.stderr)) == 1, done.stderr
    (startup,) = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "startup"]
    assert startup["script_slowest"] in (0, 1) and startup["store_slowest"] is None
    assert 0 <= startup["script_p50"] <= startup["store_p50"] <= startup["store_max"]  # torch's import comes between
    assert startup["script_max"] <= startup["store_max"] <= startup["total"]
