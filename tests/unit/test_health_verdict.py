"""The health check's verdict from how its shell ended (``health.check.verdict``, pure): exit 0 is healthy; a
non-zero exit is unhealthy for the reason its output gives; a shell still running at the timeout is unhealthy."""

from __future__ import annotations

from rankrun.health.check import CheckResult, verdict


def test_exit_0_is_healthy_whatever_it_printed():
    assert verdict(0, b"warning: fan slow\n", 30.0, 1.5) == CheckResult(healthy=True, reason="", seconds=1.5, exit_code=0)


def test_a_non_zero_exit_is_unhealthy_for_its_last_line():
    assert verdict(3, b"checking\nGPU 2: ECC errors\n\n", 30.0, 0.25) == CheckResult(
        healthy=False, reason="GPU 2: ECC errors", seconds=0.25, exit_code=3)


def test_a_silent_death_says_how_it_ended():
    assert verdict(-9, b"", 30.0, 2.0) == CheckResult(healthy=False, reason="killed by SIGKILL", seconds=2.0, exit_code=-9)


def test_a_check_still_running_at_its_timeout_timed_out_whatever_it_printed():
    assert verdict(None, b"still checking\n", 2.5, 2.6) == CheckResult(
        healthy=False, reason="timed out after 2.5 s", seconds=2.6, exit_code=None)
