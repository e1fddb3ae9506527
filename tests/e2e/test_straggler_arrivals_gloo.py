"""The straggler watch's arrivals from real gloo workers (``--straggler-window``): with no change to the script, each
rank's shim writes when it entered each collective (torch's Flight Recorder), and the rank the other waits for enters
each one later by what it spends before it. With the window at 0, no arrivals file."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from conftest import clean_environ, payload, run_cli
from rankrun.straggler.frfile import read_new

pytestmark = pytest.mark.usefixtures("private_tmpdir")

pytest.importorskip("torch")
if not pytest.importorskip("torch.distributed").is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

STEPS = 20
SLOW_S = 0.2  # rank 1's sleep before each all_reduce: rank 0 waits in it, and enters the next one at once


def _job(tmp_path: Path, window: str, steps: int = STEPS, preload: tuple[str, ...] = ()) -> tuple[Path, str]:
    logs = tmp_path / f"logs_{window}"
    env = clean_environ() | {"SLOW_RANK": "1", "SLOW_S": str(SLOW_S), "STEPS": str(steps),
                            "ARRIVALS_WAIT": "0" if window == "0" else "20"}  # bounded: up to 20 s for the last dump
    done = run_cli("--standalone", "--nproc-per-node", "2", "--straggler-window", window, "--log-dir", str(logs), *preload,
                   payload("gloo_straggler.py"), env=env, cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("[default")) == [
        f"[default{r}]:DONE rank {r} collectives {steps}" for r in (0, 1)]
    (attempt,) = logs.glob("*/attempt_0")
    return attempt, done.stderr


@pytest.mark.parametrize("preload", [(), ("--preload", "torch")], ids=["cold", "forked"])  # a forked worker's shim too
def test_each_rank_writes_its_arrivals_and_the_slow_rank_enters_each_collective_later(tmp_path, preload):
    attempt, _ = _job(tmp_path, "6", preload=preload)  # a dump a second
    times = {}
    for rank in (0, 1):
        arrivals, _ = read_new(attempt / "straggler" / f"rank_{rank}.fr", 0)
        assert {a.group for a in arrivals} == {"0"}  # the default group
        seqs = [a.seq for a in arrivals]
        assert seqs == sorted(set(seqs)) and set(range(1, STEPS + 1)) <= set(seqs), seqs  # each once, in order
        times[rank] = {a.seq: a.created_ns for a in arrivals}
    # From the second on, rank 0 enters each all_reduce as the previous one ends, rank 1 SLOW_S later.
    lags = [(times[1][seq] - times[0][seq]) / 1e9 for seq in range(2, STEPS + 1)]
    near = [lag for lag in lags if 0.75 * SLOW_S <= lag <= 1.25 * SLOW_S]
    assert len(near) >= 0.8 * len(lags), lags
    assert statistics.median(lags) == pytest.approx(SLOW_S, abs=0.05), lags


def test_with_the_window_at_0_there_are_no_arrivals(tmp_path):
    attempt, stderr = _job(tmp_path, "0", steps=3)
    assert not (attempt / "straggler").exists()
    assert list(attempt.rglob("*.fr")) == [] and "Flight Recorder" not in stderr
