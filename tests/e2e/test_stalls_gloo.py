"""``--hang-timeout`` on a real gloo job: ranks 0-2 block in ``all_reduce`` (in C++) waiting for rank 3, which never comes.

The payload (``gloo_stall.py``) stalls on attempt 0 only; a restart succeeds, so ``--hang-action fail`` with a
restart left shows the stall cured.
"""

from __future__ import annotations

import re
import signal

import pytest

from conftest import payload, wait_gone

pytestmark = pytest.mark.usefixtures("private_tmpdir")

pytest.importorskip("torch")
if not pytest.importorskip("torch.distributed").is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

STALLED = r"rankrun: job \S+ stalled: "
ARGS = ("--nproc-per-node", "4", "--hang-timeout", "2")
STUCK = "rank_three_is_stuck_loading_data"


def _workers(tmp_path) -> list[int]:
    """The workers' PIDs, as each wrote them (the launch fixture's TEST_PID_DIR)."""
    return [int(p.read_text()) for p in (tmp_path / "pids").glob("g*")]


def _groups(report: list[str]) -> dict[str, list[str]]:
    """The report's groups of main-thread stacks, by head (``rank 3``, ``ranks 0-2``), in order, with their frames."""
    groups: dict[str, list[str]] = {}
    frames: list[str] = []
    for line in report[1:]:
        if m := re.match(r"  (ranks? [\d,-]+) on ", line):
            groups[m.group(1)] = frames = []
        elif line.startswith("    "):
            frames.append(line.strip())
        else:
            frames = []  # another section (shared frames, other threads, children)
    return groups


def test_ranks_in_a_gloo_all_reduce_are_grouped_after_the_missing_rank_and_the_job_keeps_running(launch, tmp_path):
    run = launch(*ARGS, payload("gloo_stall.py"))
    (first,) = run.wait_for(STALLED, timeout=60)  # 4 torch imports on a loaded machine, then the timeout + sampling
    # the ranks 0-2 group comes last (smallest first) and ends in all_reduce: once that line is here, so is the rest
    run.wait_for(r"^    \S+distributed_c10d\.py:\d+ in all_reduce$", timeout=10)
    assert sorted(line for line in run.out if " ready " in line) == [f"[default{r}]:rank {r} ready (restart 0)" for r in range(4)]
    assert "stalled" in first and first.endswith("; 2 distinct stacks across 4 ranks")
    groups = _groups(run.err[run.err.index(first) :])
    assert list(groups) == ["rank 3", "ranks 0-2"], run.err  # the odd rank out first
    assert re.search(rf"gloo_stall\.py:\d+ in {STUCK}$", groups["rank 3"][-1]), groups
    assert any(re.search(r"in all_reduce$", f) for f in groups["ranks 0-2"]), groups
    assert not any(STUCK in f for f in groups["ranks 0-2"]) and not any("all_reduce" in f for f in groups["rank 3"])
    assert run.proc.poll() is None  # report only: the job goes on
    workers = _workers(tmp_path)
    assert len(workers) == 4
    run.proc.send_signal(signal.SIGTERM)
    assert run.finish(timeout=60) == 128 + signal.SIGTERM
    assert wait_gone(workers, 10.0) == []
    assert sum(1 for line in run.err if re.search(STALLED, line)) == 1


@pytest.mark.parametrize("restarts", [1, 0], ids=["restart-cures-it", "no-restart-left"])
def test_fail_stops_the_stalled_gloo_job_and_a_restart_can_cure_it(launch, tmp_path, restarts):
    run = launch(*ARGS, "--hang-action", "fail", "--max-restarts", str(restarts), payload("gloo_stall.py"))
    rc = run.finish(timeout=120)
    err = "\n".join(run.err)
    assert len(re.findall(STALLED, err)) == 1, err  # attempt 0 only
    assert re.search(r"stalled: no output for [\d.]+ s; 2 distinct stacks across 4 ranks\n  rank 3 on ", err), err
    stall = rf"rank 3 \(the smallest group of stacks\) at \S+gloo_stall\.py:\d+ in {STUCK}"
    sums = sorted(line for line in run.out if " sum " in line)
    if restarts:
        assert rc == 0, err
        assert re.search(
            rf"attempt 0 failed: the workers stalled \(no output for [\d.]+ s; {stall}\); restarting workers "
            r"\(1/1 restarts used\)",
            err,
        ), err
        assert sums == [f"[default{r}]:rank {r} sum 10" for r in range(4)]  # the restart all-reduced
        assert sum(" ready (restart 1)" in line for line in run.out) == 4
        assert "FAILED" not in err
    else:
        assert rc == 1, err
        assert re.search(
            rf"Root cause: the workers on \S+ stalled \(--hang-action fail; [^\n]*\n  no output for [\d.]+ s; {stall}$",
            err,
            re.MULTILINE,
        ), err
        assert err.rindex("FAILED (attempt 0)") > err.index("stalled: no output")  # the failure report comes last
        assert sums == []
        assert "restarting workers" not in err
    assert wait_gone(_workers(tmp_path), 10.0) == []
