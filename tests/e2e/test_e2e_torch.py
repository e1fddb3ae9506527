"""The CLI end to end with real torch.distributed (gloo, CPU) and, where it helps, torchrun beside it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import GOLDEN_DIR, clean_environ, payload, run_cli

pytestmark = pytest.mark.usefixtures("private_tmpdir")

pytest.importorskip("torch")

GOLDEN = GOLDEN_DIR
TORCHRUN = (sys.executable, "-m", "torch.distributed.run")
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def _dump_env(tmp_path: Path, cmd: tuple[str, ...], name: str) -> dict[str, dict[str, str]]:
    out = tmp_path / name
    out.mkdir()
    env = clean_environ() | {"TEST_OUT": str(out)}
    res = subprocess.run([*cmd, "--nproc-per-node", "4", payload("envdump.py"), "--foo", "bar"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    dumps = {f.stem: json.loads(f.read_text()) for f in out.glob("*.json")}
    assert all(d["argv"] == [payload("envdump.py"), "--foo", "bar"] for d in dumps.values())
    return {rank: {k: v for k, v in d["env"].items() if env.get(k) != v and k not in ("_", "TEST_OUT")}
            for rank, d in dumps.items()}


def _normalise(added: dict[str, str]) -> dict[str, str]:
    out = dict(added)
    assert re.fullmatch(r"\d+", out.pop("MASTER_PORT"))
    assert re.fullmatch(UUID, out.pop("TORCHELASTIC_RUN_ID"))
    assert re.fullmatch(rf".*{UUID}_\w+/attempt_0/{added['LOCAL_RANK']}/error\.json", out.pop("TORCHELASTIC_ERROR_FILE"))
    out.pop("MASTER_ADDR")  # torchrun: socket.getfqdn(); rankrun: 127.0.0.1 (no DNS), see docs/design.md
    for noise in ("PATH", "SHLVL"):  # pyenv shims rewrite these for any child
        out.pop(noise, None)
    return out


def test_worker_env_nproc4_matches_golden_and_torchrun(tmp_path, private_tmpdir):
    ours = _dump_env(tmp_path, (sys.executable, "-m", "rankrun"), "ours")
    assert list(private_tmpdir.iterdir()) == []
    theirs = _dump_env(tmp_path, TORCHRUN, "theirs")
    (leaked,) = private_tmpdir.iterdir()  # torchrun leaks one torchelastic_* dir per run (torchrun.md §8.1)
    assert leaked.name.startswith("torchelastic_")
    from rankrun.fsutil import remove_tree  # noqa: PLC0415

    remove_tree(leaked)
    # rankrun's one addition: the Flight Recorder's buffer for the straggler watch's arrivals (--straggler-window,
    # on by default), where the user configured none (docs/options.md, the worker's environment)
    assert [e.pop("TORCH_FR_BUFFER_SIZE") for e in ours.values()] == ["300"] * 4
    # and the keeper of kept progress (rankrun.checkpoint): the same socket for every worker of the node
    assert len({e.pop("RANKRUN_CHECKPOINT") for e in ours.values()}) == 1
    assert {r: _normalise(e) for r, e in ours.items()} == {r: _normalise(e) for r, e in theirs.items()}
    assert {r: e["MASTER_ADDR"] for r, e in ours.items()} == {str(r): "127.0.0.1" for r in range(4)}
    assert len({e["MASTER_PORT"] for e in ours.values()}) == 1
    golden = json.loads((GOLDEN / "worker_env_nproc4.json").read_text())
    assert {r: _normalise(e) for r, e in sorted(ours.items())} == golden


@pytest.mark.parametrize("shape", [
    (), ("--standalone",), ("--master-port", "0"), ("--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"),
], ids=["implicit-standalone", "standalone", "static", "c10d"])
def test_rdzv_id_reaches_the_workers_exactly_when_torchruns_does(tmp_path, private_tmpdir, shape):
    """torchrun 2.13 drops --rdzv-id on a standalone run (a fresh uuid4) and keeps it otherwise; rankrun's workers
    see the same, and rankrun says so where it drops one."""
    argv = ("--nproc-per-node", "1", "--rdzv-id", "dcgmjob", *shape, "--no-python", "sh", "-c", "echo $TORCHELASTIC_RUN_ID")
    ours = run_cli(*argv, cwd=tmp_path)
    theirs = subprocess.run([*TORCHRUN, *argv], env=clean_environ(), cwd=tmp_path, capture_output=True, text=True,
                            timeout=120, check=False)
    from rankrun.fsutil import remove_tree  # noqa: PLC0415

    for leaked in private_tmpdir.iterdir():  # torchrun leaks one torchelastic_* dir per run (torchrun.md §8.1)
        assert leaked.name.startswith("torchelastic_")
        remove_tree(leaked)
    assert (ours.returncode, theirs.returncode) == (0, 0), (ours.stderr, theirs.stderr)

    def kind(run_id: str) -> str:
        return "given" if run_id == "dcgmjob" else "uuid4" if re.fullmatch(UUID, run_id) else run_id

    assert kind(ours.stdout.strip()) == kind(theirs.stdout.strip())
    dropped = kind(ours.stdout.strip()) == "uuid4"
    assert ("rankrun: note: --rdzv-id dcgmjob is not used" in ours.stderr) == dropped
    assert dropped == (shape in ((), ("--standalone",)))


def test_allreduce_over_env_init(tmp_path):
    res = run_cli("--standalone", "--nproc-per-node", "4", payload("gloo_job.py"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == [f"[default{r}]:rank {r} restart 0 sum 10" for r in range(4)]


def test_restart_after_init_process_group_forms_a_new_group(tmp_path):
    """torchrun 2.13 fails this (stale keys in its reused store); rankrun gives each attempt a fresh keyspace."""
    env = clean_environ() | {"FAIL_RANK": "1"}
    res = run_cli("--nproc-per-node", "3", "--max-restarts", "1", payload("gloo_job.py"), env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == [f"[default{r}]:rank {r} restart 1 sum 6" for r in range(3)]
    assert "attempt 0 failed: rank 1" in res.stderr


@pytest.mark.parametrize("record", [True, False], ids=["with-record", "without-record"])
def test_failure_report_shows_the_real_exception_last(tmp_path, record):
    env = clean_environ() | {"FAIL_RANK": "1"}
    args = ["--nproc-per-node", "2", payload("gloo_job.py"), *(["--record"] if record else [])]
    res = run_cli(*args, env=env, cwd=tmp_path)
    assert res.returncode == 1
    report = res.stderr[res.stderr.rindex("=" * 72 + "\nrankrun:"):]
    assert res.stderr.endswith(report)  # printed once, last
    assert res.stderr.count("FAILED (attempt 0)") == 1
    assert f"rankrun: {payload('gloo_job.py')} FAILED (attempt 0)" in report
    assert "  rank       : 1 (local_rank: 1)" in report
    assert "  exit       : exit code 1" in report
    assert "ValueError: boom from rank 1" in report
    assert ("(from error file)" in report) == record
    assert ("(from stderr)" in report) == (not record)
    assert "error_file : <not written>" not in report if record else "error_file : <not written>" in report
    assert re.search(r"rank 0 \(local_rank 0, pid \d+\): (stopped by rankrun|also failed)", report)


def test_run_path_failure_is_recorded(tmp_path, reaper):
    env = clean_environ() | {"TEST_PID_DIR": str(reaper.watch_dir(tmp_path / "pids"))}
    res = run_cli("--run-path", "--nproc-per-node", "2", payload("raiser.py"), env=env, cwd=tmp_path)
    assert res.returncode == 1
    assert f"rankrun: {payload('raiser.py')} FAILED" in res.stderr  # the script's name, not the shim's (torchrun: run_script_path)
    assert "(from error file)" in res.stderr
    assert "ValueError: boom from rank 1" in res.stderr
    assert "in helper" in res.stderr  # the real traceback, not just the message


def test_module_and_no_python_modes(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "job.py").write_text("import os, sys\nprint('module', os.environ['RANK'], sys.argv[1:])\n")
    res = run_cli("-m", "--nproc-per-node", "2", "mypkg.job", "a", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["[default0]:module 0 ['a']", "[default1]:module 1 ['a']"]
    res = run_cli("--no-python", "--nproc-per-node", "2", "echo", "LR=${local_rank}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["[default0]:LR=0", "[default1]:LR=1"]
