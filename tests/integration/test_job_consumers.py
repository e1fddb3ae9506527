"""The event stream's other consumers on real launchers: torchelastic's own lines (``--event-log-handler console``)
and dcgm-exporter's GPU-to-job files (``DCGM_HPC_JOB_MAPPING_DIR``), after a clean end and after ``kill -9``."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import alive, clean_environ, payload, run_cli, wait_gone

pytestmark = pytest.mark.usefixtures("private_tmpdir")

WORKER = payload("events_worker.py")
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
STATES = "torchelastic.worker.status."
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


def _torch_lines(stderr: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{") and STATES in line]


def test_event_log_handler_console_prints_torchelastics_events_with_real_timestamps(tmp_path):
    before = time.time() * 1000
    done = run_cli("--event-log-handler", "console", "--nproc-per-node", "2", WORKER, env=clean_environ(), cwd=tmp_path)
    after = time.time() * 1000
    assert done.returncode == 0, done.stderr
    mine = _torch_lines(done.stderr)
    golden = [json.loads(line) for line in (GOLDEN / "torchelastic_events_succeeded.jsonl").read_text().splitlines()]
    assert [e["name"] for e in mine] == [e["name"] for e in golden]  # torchrun's events, in torchrun's order
    assert [list(e) for e in mine] == [list(e) for e in golden]  # and its fields, in its order
    stamps = [e["timestamp"] for e in mine]
    assert all(before <= t <= after for t in stamps)  # type: ignore[operator]  # real times, in ms (torchrun writes 0)


def test_without_console_there_are_no_torchelastic_lines(tmp_path):
    done = run_cli("--nproc-per-node", "1", WORKER, env=clean_environ(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert _torch_lines(done.stderr) == []


def test_dcgm_files_name_each_gpu_with_the_run_while_the_workers_run_and_go_with_them(launch, tmp_path):
    mapping = tmp_path / "dcgm"
    mapping.mkdir()
    env = clean_environ() | {"DCGM_HPC_JOB_MAPPING_DIR": str(mapping), "CUDA_VISIBLE_DEVICES": "3,5",
                             "WAIT_FILE": str(tmp_path / "go")}
    run = launch("--nproc-per-node", "2", WORKER, env=env)
    run.wait_for(r"READY rank \d attempt 0", count=2)
    assert sorted(p.name for p in mapping.iterdir()) == ["3", "5"]  # CUDA_VISIBLE_DEVICES' entries, by local rank
    (run_id,) = {p.read_text() for p in mapping.iterdir()}  # one line, the run id (standalone: a fresh uuid)
    assert run_id.endswith("\n") and len(run_id.strip()) == 36
    (tmp_path / "go").touch()
    assert run.finish() == 0
    assert list(mapping.iterdir()) == []


def test_dcgm_files_go_with_a_launcher_killed_with_sigkill(launch, tmp_path):
    mapping = tmp_path / "dcgm"
    mapping.mkdir()
    env = clean_environ() | {"DCGM_HPC_JOB_MAPPING_DIR": str(mapping), "WAIT_FILE": str(tmp_path / "never")}
    run = launch("--nproc-per-node", "2", WORKER, env=env)
    run.wait_for(r"READY rank \d attempt 0", count=2)
    assert sorted(p.name for p in mapping.iterdir()) == ["0", "1"]  # no CUDA_VISIBLE_DEVICES: LOCAL_RANK
    workers = [int(p.read_text()) for p in (tmp_path / "pids").glob("w*")]
    assert len(workers) == 2
    run.kill()  # SIGKILL: the launcher cleans nothing; its watchdog does
    assert wait_gone([run.proc.pid, *workers], 10) == []  # the workers die with it
    deadline = time.monotonic() + 10
    while any(mapping.iterdir()) and time.monotonic() < deadline:  # the watchdog's sweep: no event says it is done
        time.sleep(0.02)
    assert list(mapping.iterdir()) == []
    assert not alive(run.proc.pid)


def test_an_unused_rdzv_id_is_said_and_one_fresh_id_names_the_run_everywhere(launch, tmp_path):
    """A single node with --rdzv-id and no --standalone: torchrun's implicit standalone, whose workers get a fresh
    uuid whatever --rdzv-id says (torchrun 2.13, as tests/e2e/test_e2e_torch.py compares). The worker's
    TORCHELASTIC_RUN_ID, the events, the metrics and the DCGM file name that one id; one line says --rdzv-id is not it."""
    mapping, events, pids = tmp_path / "dcgm", tmp_path / "events.jsonl", tmp_path / "pids"
    mapping.mkdir()
    env = clean_environ() | {"DCGM_HPC_JOB_MAPPING_DIR": str(mapping), "WAIT_FILE": str(tmp_path / "go")}
    run = launch("--rdzv-id", "dcgmjob", "--events", str(events), "--metrics-port", "0", WORKER, env=env)
    said = run.wait_for(r"^rankrun: metrics at http://\S+$|^READY rank 0 attempt 0$", count=2)  # two streams: any order
    (address,) = [line.split()[-1] for line in said if line.startswith("rankrun: metrics at ")]
    with urllib.request.urlopen(address, timeout=30) as reply:
        series = reply.read().decode()
    (worker,) = [int(p.read_text()) for p in pids.glob("w*")]
    worker_env = dict(item.split("=", 1) for item in Path(f"/proc/{worker}/environ").read_text().split("\0") if "=" in item)
    run_id = worker_env["TORCHELASTIC_RUN_ID"]
    assert re.fullmatch(UUID, run_id)
    assert {p.name: p.read_text() for p in mapping.iterdir()} == {"0": f"{run_id}\n"}
    labels = set(re.findall(r'run="([^"]*)"', series))
    (tmp_path / "go").touch()
    assert run.finish() == 0
    assert labels == {run_id}
    assert {json.loads(line)["run"] for line in events.read_text().splitlines()} == {run_id}
    assert [line for line in run.err if "dcgmjob" in line] == [
        f"rankrun: note: --rdzv-id dcgmjob is not used: one node without --rdzv-endpoint or --master-port runs "
        f"standalone, which gives each run a fresh id, as torchrun does; the workers' TORCHELASTIC_RUN_ID, the events, "
        f"the metrics and the DCGM files name {run_id}; to run as dcgmjob, add --rdzv-backend c10d --rdzv-endpoint "
        "localhost:0"]
