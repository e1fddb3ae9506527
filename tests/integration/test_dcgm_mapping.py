"""DCGM job-mapping files and the launcher's death: a real lifetime watchdog, the mapping consumer in a launcher-like
process (payloads/dcgm_launcher.py), real SIGKILL. The files go with the launcher, whoever else's stay."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from conftest import PY, Launcher, clean_environ, payload, wait_gone

SRC = Path(__file__).resolve().parents[2] / "src"

pytestmark = pytest.mark.usefixtures("private_tmpdir")


def _start(tmp_path: Path, reaper, mapping_dir: Path, gpus: str) -> tuple[Launcher, int]:
    env = clean_environ() | {"PYTHONPATH": str(SRC)}
    run = Launcher([PY, payload("dcgm_launcher.py"), str(mapping_dir), gpus], env, tmp_path, reaper,
                   stdin=subprocess.PIPE)
    (ready,) = run.wait_for(r"^READY \d+$")
    watchdog = int(ready.split()[1])
    reaper.pids.add(watchdog)
    return run, watchdog


def _say(run: Launcher, line: str) -> None:
    assert run.proc.stdin is not None
    run.proc.stdin.write(line.encode() + b"\n")
    run.proc.stdin.flush()


def _finish(run: Launcher) -> int:
    rc = run.finish(timeout=30)
    assert run.proc.stdin is not None
    run.proc.stdin.close()
    return rc


def _files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in directory.iterdir()}


def test_kill_9_of_the_launcher_removes_its_files_but_not_another_jobs(tmp_path, reaper):
    mapping_dir = tmp_path / "dcgm"
    mapping_dir.mkdir()
    run, watchdog = _start(tmp_path, reaper, mapping_dir, "0,1,2")
    assert _files(mapping_dir) == {"0": "job-dcgm\n", "1": "job-dcgm\n", "2": "job-dcgm\n"}
    (mapping_dir / "1").write_text("slurm-42\n")  # GPU 1 given to another job meanwhile
    run.proc.send_signal(signal.SIGKILL)
    _finish(run)
    assert wait_gone([watchdog], 10.0) == []  # the watchdog has swept and exited
    assert _files(mapping_dir) == {"1": "slurm-42\n"}


def test_a_file_the_launcher_gave_up_is_not_the_watchdogs_to_remove(tmp_path, reaper):
    mapping_dir = tmp_path / "dcgm"
    mapping_dir.mkdir()
    run, watchdog = _start(tmp_path, reaper, mapping_dir, "0")
    _say(run, "end")
    run.wait_for("^ENDED$")
    assert _files(mapping_dir) == {}
    (mapping_dir / "0").write_text("job-dcgm\n")  # the same run's next launcher on this GPU, say
    run.proc.send_signal(signal.SIGKILL)
    _finish(run)
    assert wait_gone([watchdog], 10.0) == []
    assert _files(mapping_dir) == {"0": "job-dcgm\n"}


def test_a_clean_exit_removes_the_files_itself(tmp_path, reaper):
    mapping_dir = tmp_path / "dcgm"
    mapping_dir.mkdir()
    run, watchdog = _start(tmp_path, reaper, mapping_dir, "4,5")
    assert _files(mapping_dir) == {"4": "job-dcgm\n", "5": "job-dcgm\n"}
    _say(run, "exit")
    assert _finish(run) == 0
    assert wait_gone([watchdog], 10.0) == []
    assert _files(mapping_dir) == {}
