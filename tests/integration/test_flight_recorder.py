"""The optional NCCL layer: with torch's Flight Recorder on, its dumps go to the run's directory and are taken at a stall.

The workers stand in for ``ProcessGroupNCCL``'s dump pipe (``tests/payloads/flight_worker.py``): no NCCL here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from conftest import clean_environ, payload
from rankrun.stacks.flight import flight_env, trigger

pytestmark = pytest.mark.usefixtures("private_tmpdir")

FR_LINE = r"rankrun: Flight Recorder dumps asked of ranks 0-1: (\S+)/rank_<rank> \(read them with: "


def _files(paths: list[Path], timeout: float = 30.0) -> list[Path]:
    """Bounded wait until every file exists (other processes write them; no event says so); what is missing."""
    deadline = time.monotonic() + timeout
    while (missing := [p for p in paths if not p.exists()]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return missing


def test_a_stall_asks_every_rank_for_its_dump_into_the_log_dir_and_says_where(launch, tmp_path):
    logs = tmp_path / "logs"
    env = clean_environ() | {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    run = launch("--nproc-per-node", "2", "--hang-timeout", "1", "--log-dir", str(logs), payload("flight_worker.py"), env=env)
    run.wait_for(r"READY rank \d fr True", count=2)  # both variable names point at the same place
    (line,) = run.wait_for(FR_LINE, timeout=30)
    found = re.search(FR_LINE + r"python -m torch\.distributed\.flight_recorder\.fr_trace (\S+) -p rank_\)$", line)
    assert found is not None and found.group(1) == found.group(2), line
    folder = Path(found.group(1))
    assert folder.name == "flight_recorder" and folder.parent.name == "attempt_0" and folder.parent.parent.parent == logs
    assert _files([folder / "rank_0", folder / "rank_1"]) == []
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGTERM


def test_without_a_log_dir_the_run_directory_with_dumps_is_kept_and_said(launch):
    env = clean_environ() | {"TORCH_FR_BUFFER_SIZE": "100"}
    run = launch("--nproc-per-node", "2", "--hang-timeout", "1", payload("flight_worker.py"), env=env)
    (line,) = run.wait_for(FR_LINE, timeout=30)
    folder = Path(re.search(FR_LINE, line).group(1))  # type: ignore[union-attr]
    assert _files([folder / "rank_0", folder / "rank_1"]) == []
    run.proc.send_signal(signal.SIGTERM)
    run.finish()
    assert run.err[-1] == f"rankrun: worker logs kept in {folder.parent.parent}"
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".pipe")) == ["rank_0", "rank_1"]
    shutil.rmtree(folder.parent.parent)  # kept for the user: this test is the user


def test_the_users_own_places_stay_and_a_recorder_that_is_off_changes_nothing(tmp_path):
    attempt = tmp_path / "attempt_0"
    off = {"PATH": "/usr/bin", "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}
    assert flight_env(off, attempt) is off and flight_env({"TORCH_FR_BUFFER_SIZE": "x"}, attempt) == {"TORCH_FR_BUFFER_SIZE": "x"}
    mine = flight_env({"TORCH_FR_BUFFER_SIZE": "10", "TORCH_FR_DUMP_TEMP_FILE": "/data/fr/r"}, attempt)
    assert mine["TORCH_FR_DUMP_TEMP_FILE"] == mine["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/data/fr/r"
    assert mine["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == str(attempt / "flight_recorder" / "pipe_")
    assert flight_env({"TORCH_FR_BUFFER_SIZE": "10"}, None) == {"TORCH_FR_BUFFER_SIZE": "10"}  # --log-dir /dev/null


def test_a_pipe_nobody_reads_is_skipped_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe_3.pipe")  # a rank that is gone: its pipe has no reader
    (tmp_path / "pipe_4.pipe.txt").write_text("")  # not a rank's pipe
    assert trigger(str(tmp_path / "pipe_")) == [] and trigger("") == []
