"""``--hang-timeout``: a silent job whose stacks do not move is reported once, grouped, and keeps running."""

from __future__ import annotations

import re
import signal

import pytest

from conftest import clean_environ, payload

STALLED = r"rankrun: job \S+ stalled: "


def _report(run, stalled_line: str) -> list[str]:
    """The report's lines: from its first line up to the next line that is not part of it."""
    lines = run.err[run.err.index(stalled_line):]
    end = next((i for i, line in enumerate(lines[1:], 1) if not line.startswith("  ")), len(lines))
    return lines[:end]


def _stop(run) -> int:
    run.proc.send_signal(signal.SIGTERM)
    return run.finish()


def test_the_odd_rank_is_shown_first_and_the_job_keeps_running(launch, tmp_path):
    site = tmp_path / "usersite"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    env = clean_environ() | {"PYTHONPATH": str(site)}
    run = launch("--nproc-per-node", "4", "--hang-timeout", "1", payload("stall.py"), env=env)
    (line,) = run.wait_for(STALLED, timeout=30)  # workers start (16 s on a loaded machine), then timeout + 5 s
    run.wait_for(r"in wait_for_peers$")  # the report's last line: all of it has been read
    assert sum("user sitecustomize ran" in out for out in run.out) == 4  # the user's own still runs under the shim
    report = _report(run, line)
    silent = re.search(r"no output for ([\d.]+) s", line)
    assert silent is not None and float(silent.group(1)) <= 1 + 5  # reported within timeout + 5 s of the last output
    assert re.search(r"; 2 distinct stacks across 4 ranks$", report[0])
    text = "\n".join(report)
    assert text.index("  rank 3 on ") < text.index("  ranks 0-2 on ")  # smallest group first
    assert re.search(r"stall\.py:\d+ in stuck_loading_data", text) and re.search(r"stall\.py:\d+ in wait_for_peers", text)
    assert run.proc.poll() is None  # report only: the job goes on
    assert _stop(run) == 128 + signal.SIGTERM
    assert sum(1 for err_line in run.err if re.search(STALLED, err_line)) == 1  # the same stacks are reported once


@pytest.mark.parametrize("preload", [(), ("--preload", "re")], ids=["cold", "forked"])  # the shim of a forked worker
def test_a_rank_holding_the_gil_in_a_regex_is_shown_in_it(launch, preload):
    env = clean_environ() | {"PAYLOAD_STALL": "regex"}
    run = launch("--nproc-per-node", "2", "--hang-timeout", "1", *preload, payload("stall.py"), env=env)
    (line,) = run.wait_for(STALLED, timeout=30)
    run.wait_for(r"re/__init__\.py:\d+ in match$")  # the last group's innermost frame
    text = "\n".join(_report(run, line))
    assert "  rank 1 on " in text and re.search(r"in stuck_in_a_regex\n.*re/__init__\.py:\d+ in match", text)
    assert "state R" in text  # spinning, not blocked
    _stop(run)


def test_sixteen_ranks_one_elsewhere_fit_in_sixty_lines(launch):
    env = clean_environ() | {"PAYLOAD_ODD_RANK": "7"}
    run = launch("--nproc-per-node", "16", "--hang-timeout", "1", payload("stall.py"), env=env)
    (line,) = run.wait_for(STALLED, timeout=30)
    run.wait_for(r"in wait_for_peers$")
    report = _report(run, line)
    assert len(report) <= 60
    assert report[0].endswith("2 distinct stacks across 16 ranks")
    assert any(r.startswith("  rank 7 on ") for r in report) and any(r.startswith("  ranks 0-6,8-15 on ") for r in report)
    _stop(run)


def test_a_rank_computing_without_output_is_not_a_stall(launch):
    env = clean_environ() | {"PAYLOAD_STALL": "compute", "PAYLOAD_SECONDS": "4"}
    run = launch("--nproc-per-node", "1", "--hang-timeout", "1", payload("stall.py"), env=env)
    assert run.finish() == 0
    assert not any(re.search(STALLED, line) for line in run.err)


def test_ranks_that_exited_are_named_and_the_one_that_did_not_is_shown(launch):
    env = clean_environ() | {"PAYLOAD_STALL": "exit"}
    run = launch("--nproc-per-node", "4", "--hang-timeout", "1", payload("stall.py"), env=env)
    (line,) = run.wait_for(STALLED, timeout=30)
    run.wait_for(r"in stuck_loading_data$")
    assert re.search(r"stalled: ranks 0-2 exited 0, rank 3 did not: no output for [\d.]+ s; 1 distinct stack across 1 rank$",
                     line)
    text = "\n".join(_report(run, line))
    assert "in stuck_loading_data" in text and "wait_for_peers" not in text and "process is gone" not in text
    _stop(run)


def test_fail_stops_a_stalled_job_as_a_failure_and_the_restart_budget_applies(launch):
    run = launch("--nproc-per-node", "4", "--hang-timeout", "1", "--hang-action", "fail", "--max-restarts", "1",
                 "--shutdown-timeout", "1", payload("stall.py"))
    assert run.finish(timeout=120) == 1
    err = "\n".join(run.err)
    assert len(re.findall(STALLED, err)) == 2  # attempt 0, then the restart stalls the same way
    assert re.search(r"attempt 0 failed: the workers stalled \(no output for [\d.]+ s; rank 3 \(the smallest group of "
                     r"stacks\) at \S+stall\.py:\d+ in stuck_loading_data\); restarting workers \(1/1 restarts used\)", err)
    assert re.search(r"Root cause: the workers on \S+ stalled \(--hang-action fail", err)
    assert "rank 3 (the smallest group of stacks) at" in err.split("FAILED (attempt 1)")[1]
    assert err.rindex("FAILED (attempt 1)") > err.rindex("stalled: no output")  # the failure report comes last


def test_a_job_that_keeps_printing_is_never_reported(launch):
    """Output is what resets the watch: a ticking worker sits in the same time.sleep line at every sample."""
    run = launch("--nproc-per-node", "2", "--hang-timeout", "1", payload("stall.py"),
                 env=clean_environ() | {"PAYLOAD_STALL": "tick"})
    run.wait_for(r"tick 1 40", timeout=60)  # four seconds of ticking: several timeouts' worth
    assert _stop(run) == 128 + signal.SIGTERM
    assert not any(re.search(STALLED, line) for line in run.err)
