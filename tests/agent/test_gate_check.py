"""A node's health gate (``rankrun.agent.gate``) in-process, with a real ``--health-check`` command (``/bin/sh``): a
check that fails gives its reason, one that passes (or none) lets the node join, a check past its timeout is
killed, and a stop that arrives while the check runs ends it at once, its process with it, and is left queued for
the agent (which stops the job as it would before any round)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from fakes import Behaviour, FakeSpawner
from rankrun.agent.deps import AgentDeps
from rankrun.agent.gate import excluded, unhealthy
from rankrun.cli import spec_from_args
from rankrun.logs.console import Console
from rankrun.proc.signals import StopStream
from rankrun.spec import LaunchSpec

BOUND = 30.0


def _spec(tmp_path: Path, *flags: str) -> LaunchSpec:
    script = tmp_path / "train.py"
    script.write_text("")
    return spec_from_args([*flags, str(script)], {"PATH": "/usr/bin:/bin"})


async def _gate(spec: LaunchSpec, stops: StopStream | None = None) -> str | None:
    console = Console(os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY))
    try:
        deps = AgentDeps(FakeSpawner(lambda attempt, rank: Behaviour(exit_status=0)), console, "testhost")
        return await unhealthy(spec, deps, stops or StopStream())
    finally:
        console.close()


@pytest.mark.parametrize(("check", "reason"), [
    (None, None),
    ("true", None),
    ("echo checking the disks; echo /scratch is read-only >&2; exit 3", "/scratch is read-only"),
])
def test_the_checks_verdict(tmp_path, check, reason):
    flags = ("--health-check", check) if check is not None else ()
    assert asyncio.run(asyncio.wait_for(_gate(_spec(tmp_path, *flags)), BOUND)) == reason


def test_the_check_sees_the_jobs_share_of_this_node(tmp_path):
    spec = _spec(tmp_path, "--nproc-per-node", "3", "--health-check",
                 'echo "$LOCAL_WORLD_SIZE $TORCHELASTIC_RUN_ID"; exit 1')
    assert asyncio.run(asyncio.wait_for(_gate(spec), BOUND)) == f"3 {spec.rendezvous.run_id}"


def test_a_check_past_its_timeout_is_killed_and_fails(tmp_path):
    spec = _spec(tmp_path, "--health-check-timeout", "0.2", "--health-check", "exec sleep 60")
    reason = asyncio.run(asyncio.wait_for(_gate(spec), BOUND))
    assert reason is not None and "0.2" in reason


def test_a_stop_while_the_check_runs_ends_it_and_is_left_for_the_agent(tmp_path):
    started = tmp_path / "started"
    spec = _spec(tmp_path, "--health-check", f"echo $$ > {started}.tmp; mv {started}.tmp {started}; exec sleep 60")

    async def main() -> tuple[str | None, int, StopStream, float]:
        stops = StopStream()
        loop = asyncio.get_running_loop()
        gate = asyncio.ensure_future(_gate(spec, stops))
        while not started.exists():  # the check's shell wrote its pid (bounded by the test's wait_for)
            await asyncio.sleep(0.01)
        stops.deliver(signal.SIGTERM)
        stopped = loop.time()
        return await gate, int(started.read_text()), stops, loop.time() - stopped

    reason, pid, stops, took = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert reason is None
    assert took < 10  # at once, not at the check's 60 s timeout
    with pytest.raises(ProcessLookupError):  # killed and reaped, its group with it
        os.kill(pid, 0)
    stop = stops.take_pending()
    assert stop is not None and stop.signum == signal.SIGTERM


def test_an_unhealthy_nodes_line():
    assert excluded("node-3", "job-7", "GPU 2 has a pending reset") == (
        "this node (node-3) is unhealthy: health check: GPU 2 has a pending reset; it runs no workers in job job-7: "
        "drain it or reschedule the job elsewhere")
