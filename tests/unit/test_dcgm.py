"""DCGM job mapping: the GPU ids from CUDA_VISIBLE_DEVICES, and the files the consumer writes and removes (a real
directory; dcgm-exporter's own file-name pattern and line format are the reference)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from rankrun.events.dcgm import DcgmMapping, gpu_ids
from rankrun.events.records import JobEnd, RdzvRound, Record, Stall, Startup, StragglerEvent, WorkersEnd, WorkersStart

# dcgm-exporter's internal/pkg/transformation/hpc.go: validGPUFile; any other name in the directory is skipped
EXPORTER_NAME = re.compile(r"^\d+(\.\d+)?$")
UUIDS = ("GPU-aaaa1111-0000", "GPU-bbbb2222-0000", "GPU-aaaa3333-0000")  # the driver's, in PCI bus order


@pytest.mark.parametrize(("visible", "nproc", "expected"), [
    (None, 3, ("0", "1", "2")),  # unset: the rank's GPU is LOCAL_RANK
    ("3,5", 2, ("3", "5")),  # the LOCAL_RANK-th entry
    ("3,5", 3, ("3", "5", None)),  # more workers than GPUs listed: the last has none
    ("", 2, (None, None)),  # no GPU at all
    (" 2 , 07", 2, ("2", "7")),  # CUDA takes spaces and leading zeros
    ("0,-1,2", 3, ("0", None, None)),  # CUDA stops at the first negative entry
    ("0,,2", 3, ("0", None, None)),  # ... and at an empty one
    ("1,bogus,2", 3, ("1", None, None)),  # ... and at one that names nothing
    ("GPU-bbbb2222-0000,GPU-aaaa3", 2, ("1", "2")),  # a UUID (or a prefix of one) becomes its PCI-order index
    ("GPU-aaaa", 1, (None,)),  # a prefix two GPUs share names no single GPU
    ("GPU-ffff", 1, (None,)),  # a UUID the driver does not know
    ("MIG-1234,0", 2, (None, "0")),  # a MIG instance: only NVML knows its GPU and instance
])
def test_gpu_ids(visible, nproc, expected):
    assert gpu_ids(visible, nproc, UUIDS) == expected


def _start(run: str = "job-7", pids: int = 2, attempt: int = 0) -> Record:
    return WorkersStart(attempt, f"0-{pids - 1}", tuple(range(100, 100 + pids)), ts=1.0, mono=1.0, run=run,
                        node="127.0.0.1")


def _files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in directory.iterdir()}


def test_a_file_per_gpu_holding_the_run_id_while_the_workers_run(tmp_path):
    mapping = DcgmMapping(tmp_path, ["3", "5"])
    mapping.on_event(_start())
    assert _files(tmp_path) == {"3": "job-7\n", "5": "job-7\n"}  # and no temp file left beside them
    for path in tmp_path.iterdir():
        assert EXPORTER_NAME.match(path.name)
        assert stat.S_IMODE(path.stat().st_mode) == 0o644  # the exporter runs as another user
    for other in (Stall("1", "stalled", run="job-7"),  # the job's other facts while the workers run: the files stay
                  StragglerEvent(1, "node-3/10.0.0.13", "recovered", None, 0.0, 0, "recovered", run="job-7"),
                  Startup(0, 1.0, 0.1, 0.1, None, None, None, None, None, None, run="job-7")):
        mapping.on_event(other)
    assert _files(tmp_path) == {"3": "job-7\n", "5": "job-7\n"}
    mapping.on_event(WorkersEnd(0, "failed", run="job-7"))
    assert _files(tmp_path) == {}
    mapping.on_event(_start(attempt=1))  # the restarted workers are mapped again
    assert _files(tmp_path) == {"3": "job-7\n", "5": "job-7\n"}
    mapping.on_event(JobEnd(0, "succeeded", run="job-7"))
    assert _files(tmp_path) == {}


def test_only_the_gpus_of_the_workers_started_and_each_once(tmp_path):
    DcgmMapping(tmp_path, ["2", "2", "4", "6"]).on_event(_start(pids=3))  # two ranks share GPU 2; rank 3 not started
    assert _files(tmp_path) == {"2": "job-7\n", "4": "job-7\n"}


def test_a_rank_without_a_known_gpu_gets_no_file(tmp_path):
    DcgmMapping(tmp_path, [None, "1"]).on_event(_start())
    assert _files(tmp_path) == {"1": "job-7\n"}


def test_a_file_another_job_took_since_is_left_to_it(tmp_path):
    mapping = DcgmMapping(tmp_path, ["0", "1"])
    mapping.on_event(_start())
    (tmp_path / "1").write_text("slurm-42\n")  # the GPU given to another job (a scheduler's prolog wrote it)
    (tmp_path / "9").write_text("slurm-43\n")  # a file this launcher never wrote
    mapping.on_event(JobEnd(1, "failed", run="job-7"))
    assert _files(tmp_path) == {"1": "slurm-42\n", "9": "slurm-43\n"}


def test_the_watchdog_hears_of_each_file_before_it_exists_and_after_it_is_gone(tmp_path):
    heard: list[tuple[str, ...]] = []

    def own(path: str, content: str) -> None:
        heard.append(("own", Path(path).name, content, str(os.path.exists(path))))

    def disown(path: str) -> None:
        heard.append(("disown", Path(path).name, str(os.path.exists(path))))

    mapping = DcgmMapping(tmp_path, ["0", "1"], on_file=own, off_file=disown)
    mapping.on_event(_start())
    assert heard == [("own", "0", "job-7\n", "False"), ("own", "1", "job-7\n", "False")]
    heard.clear()
    mapping.on_event(JobEnd(0, "succeeded", run="job-7"))
    assert heard == [("disown", "0", "False"), ("disown", "1", "False")]


def test_a_directory_it_cannot_write_costs_one_line_and_breaks_nothing(tmp_path):
    lines: list[str] = []
    disowned: list[str] = []
    missing = tmp_path / "missing"
    mapping = DcgmMapping(missing, ["0", "1"], off_file=disowned.append, warn=lines.append)
    mapping.on_event(_start())
    mapping.on_event(_start(attempt=1))
    assert lines == [f"rankrun: DCGM job mapping: cannot write {missing / '0'}: No such file or directory"]
    assert disowned == [str(missing / "0"), str(missing / "1")] * 2  # nothing left for the watchdog to remove
    mapping.on_event(JobEnd(0, "succeeded", run="job-7"))


def test_other_events_and_malformed_ones_write_nothing(tmp_path):
    mapping = DcgmMapping(tmp_path, ["0"])
    for event in (RdzvRound(0, 1, 1, 0, 0.1, run="job-7"), WorkersStart(0, "0", (1,)),
                  WorkersStart(0, "0", (1,), run="a\nb"), WorkersStart(0, "0", (1,), run="")):
        mapping.on_event(event)
    assert _files(tmp_path) == {}
