"""What a worker is given for the straggler watch's arrivals (``agent.watch.observed_env``, pure): the shim's file and
period, and a Flight Recorder buffer only where the user configured none; whether the user turned the recorder on
(its dumps and pipes in the run directory, the run directory kept) stays decided on the user's settings alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from rankrun.agent.env import WorkerIdentity
from rankrun.agent.watch import observed_env
from rankrun.cli import spec_from_args
from rankrun.spec import LaunchSpec
from rankrun.stacks.channel import arrivals_buffer, arrivals_every
from rankrun.stacks.flight import DUMP_FILES, PIPE_FILE, enabled

ATTEMPT = Path("/logs/job_x/attempt_0")
WHO = WorkerIdentity(local_rank=1, rank=5, group_rank=2, role_rank=5, local_world_size=2, world_size=8,
                     group_world_size=4, role_world_size=8)
ARRIVALS = ("RANKRUN_FR_FILE", "RANKRUN_FR_EVERY", "TORCH_FR_BUFFER_SIZE")


def _spec(tmp_path: Path, *argv: str) -> LaunchSpec:
    script = tmp_path / "train.py"
    script.write_text("")
    script.chmod(0o755)
    return spec_from_args([*argv, str(script)], {})


def _env(spec: LaunchSpec, user: dict[str, str], attempt_dir: Path | None = ATTEMPT) -> dict[str, str]:
    return observed_env(spec, attempt_dir, WHO, {"HOME": "/home/u", **user})


def test_a_python_worker_gets_its_file_its_period_and_a_buffer_that_does_not_turn_the_users_recorder_on(tmp_path):
    env = _env(_spec(tmp_path), {})
    assert env["RANKRUN_FR_FILE"] == str(ATTEMPT / "straggler" / "rank_5.fr")  # by the rank in the job
    assert env["RANKRUN_FR_EVERY"] == "10.0"  # the default window, 60 s, over 6
    assert env["TORCH_FR_BUFFER_SIZE"] == "300"  # 30 entries a second of the period
    assert not any(name in env for name in (*DUMP_FILES, PIPE_FILE))  # no dumps nor pipes: the user asked for none
    assert enabled(env)  # which the same decision would have turned on, had it come after the buffer


@pytest.mark.parametrize("user", [{"TORCH_FR_BUFFER_SIZE": "500"}, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "64"}])
def test_the_users_own_recorder_keeps_its_buffer_and_its_dumps_and_pipes(tmp_path, user):
    env = _env(_spec(tmp_path), user)
    assert {k: env.get(k) for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")} == \
        {k: user.get(k) for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
    assert all(name in env for name in (*DUMP_FILES, PIPE_FILE))
    assert env["RANKRUN_FR_FILE"].endswith("rank_5.fr")


def test_a_recorder_the_user_turned_off_stays_off(tmp_path):
    env = _env(_spec(tmp_path), {"TORCH_FR_BUFFER_SIZE": "0"})
    assert env["TORCH_FR_BUFFER_SIZE"] == "0" and "RANKRUN_FR_FILE" in env  # no entries: the shim writes nothing
    assert not any(name in env for name in (*DUMP_FILES, PIPE_FILE))


@pytest.mark.parametrize("argv", [("--straggler-window", "0"), ("--no-python",)])
def test_off_or_not_python_nothing_is_added(tmp_path, argv):
    spec = _spec(tmp_path, *argv)
    env = _env(spec, {})
    assert not any(name in env for name in ARRIVALS)
    assert env == observed_env(spec, ATTEMPT, WHO, {"HOME": "/home/u"})


def test_without_a_run_directory_there_is_no_file_and_no_buffer(tmp_path):
    assert not any(name in _env(_spec(tmp_path), {}, attempt_dir=None) for name in ARRIVALS)


@pytest.mark.parametrize(("window", "every"), [(60, 10.0), (6, 1.0), (3, 1.0), (0.5, 1.0), (120, 20.0)])
def test_the_period_is_a_sixth_of_the_window_and_at_least_a_second(window, every):
    assert arrivals_every(window) == every


@pytest.mark.parametrize(("every", "entries"), [(10.0, 300), (1.0, 100), (2.5, 100), (20.0, 600), (100.0, 2000)])
def test_the_buffer_follows_the_period_within_bounds(every, entries):
    assert arrivals_buffer(every) == entries


def test_a_fractional_period_reaches_the_worker_as_a_number(tmp_path):
    assert float(_env(_spec(tmp_path, "--straggler-window", "7"), {})["RANKRUN_FR_EVERY"]) == pytest.approx(7 / 6)
