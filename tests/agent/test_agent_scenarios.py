"""The agent's restart loop on a fake spawner (real store, real console thread, no processes)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import pytest

from fakes import Behaviour, FakeHandle, FakeSpawner
from rankrun.agent.loop import AgentDeps, run_agent
from rankrun.cli import spec_from_args
from rankrun.errors import SpawnError
from rankrun.logs.console import Console
from rankrun.proc.early import EarlyCatcher
from rankrun.proc.group import supervise
from rankrun.proc.output import OutputReader
from rankrun.proc.signals import attach, detach
from rankrun.proc.spawn import Command, WorkerHandle
from rankrun.spec import LaunchSpec


def _spec(tmp_path: Path, *flags: str) -> LaunchSpec:
    script = tmp_path / "train.py"
    script.write_text("")
    return spec_from_args([*flags, str(script)], {"PATH": "/usr/bin"})


SCENARIO_TIMEOUT = 30.0  # a scenario that hangs (e.g. a missing SIGKILL escalation) fails here, not at pytest's 300 s


async def _bounded(spec: LaunchSpec, deps: AgentDeps, catcher: EarlyCatcher) -> int:
    try:
        return await asyncio.wait_for(run_agent(spec, deps, catcher), SCENARIO_TIMEOUT)
    except TimeoutError:
        pytest.fail(f"the agent did not finish within {SCENARIO_TIMEOUT} s; signals sent: {[h.signals for h in deps.spawner.spawned]}")  # type: ignore[attr-defined]


def _run(tmp_path: Path, spec: LaunchSpec, spawner: FakeSpawner, catcher: EarlyCatcher | None = None) -> tuple[int, str, str]:
    out, err = tmp_path / "console.out", tmp_path / "console.err"
    catcher = catcher or EarlyCatcher(())
    with out.open("wb") as o, err.open("wb") as e:
        console = Console(o.fileno(), e.fileno())
        try:
            rc = asyncio.run(_bounded(spec, AgentDeps(spawner, console, "testhost"), catcher))
        finally:
            console.close()
            catcher.restore()  # the agent leaves the handled signals caught (as a launcher must until it exits)
    return rc, out.read_text(), err.read_text()


def test_all_workers_succeed(tmp_path):
    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=0, stdout=f"hello {r}\n".encode()))
    rc, out, _ = _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "3"), spawner)
    assert rc == 0
    assert sorted(out.splitlines()) == ["[default0]:hello 0", "[default1]:hello 1", "[default2]:hello 2"]
    assert [h.env["RANK"] for h in spawner.spawned] == ["0", "1", "2"]
    assert {h.env["MASTER_PORT"] for h in spawner.spawned} != {"0"}
    assert all(h.command.argv[1:3] == ("-u", str(tmp_path / "train.py")) for h in spawner.spawned)


def test_failure_restarts_with_incremented_count_and_same_store(tmp_path):
    def plan(attempt: int, rank: int) -> Behaviour:
        return Behaviour(exit_status=2 if (attempt, rank) == (0, 1) else None if attempt == 0 else 0)

    spawner = FakeSpawner(plan)
    rc, _, err = _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "2", "--max-restarts", "3"), spawner)
    assert rc == 0
    first, second = spawner.attempt(0), spawner.attempt(1)
    assert len(first) == len(second) == 2
    assert first[0].signals[0] == signal.SIGTERM  # the healthy sibling was stopped politely
    assert {h.env["MASTER_PORT"] for h in first} == {h.env["MASTER_PORT"] for h in second}
    assert "attempt 0 failed: rank 1 (pid 10001) exited 2; restarting workers (1/3 restarts used)" in err


def test_the_restart_line_names_the_root_cause_and_its_exception(tmp_path):
    raised = b"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: bad lr 0.5\n"

    def plan(attempt: int, rank: int) -> Behaviour:
        return Behaviour(exit_status=1, stderr=raised) if (attempt, rank) == (0, 1) else Behaviour(exit_status=0 if attempt else None)

    rc, _, err = _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "2", "--max-restarts", "1"), FakeSpawner(plan))
    assert rc == 0
    (line,) = [line for line in err.splitlines() if line.startswith("rankrun: attempt 0")]
    assert line == "rankrun: attempt 0 failed: rank 1 (pid 10001) exited 1: ValueError: bad lr 0.5; restarting workers " \
                   "(1/1 restarts used)"


def test_restarts_exhausted_reports_root_cause_and_stopped_siblings(tmp_path):
    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=5, stderr=b"Traceback (most recent call last):\nKeyError: 'x'\n")
                          if r == 2 else Behaviour())
    rc, _, err = _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "3", "--max-restarts", "1"), spawner)
    assert rc == 1
    assert len(spawner.spawned) == 6
    assert "rankrun: " + str(tmp_path / "train.py") + " FAILED (attempt 1)" in err
    assert "  rank       : 2 (local_rank: 2)" in err
    assert "    KeyError: 'x'" in err
    assert "rank 0 (local_rank 0, pid 10003): stopped by rankrun (signal 15 (SIGTERM))" in err
    assert err.rstrip("\n").endswith("=" * 72)


def test_worker_ignoring_sigterm_gets_sigkill_after_grace(tmp_path):
    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=1) if r == 1 else Behaviour(ignore_term=True))
    rc, _, err = _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "2", "--shutdown-timeout", "0"), spawner)
    assert rc == 1
    assert spawner.spawned[0].signals[:2] == [signal.SIGTERM, signal.SIGKILL]
    assert "stopped by rankrun (signal 9 (SIGKILL))" in err


def test_a_worker_that_cannot_start_ends_the_attempt_and_the_others_are_killed(tmp_path):
    """Every worker is started before any is routed: one failure kills the ones already started, then raises."""

    class FailsForRank1(FakeSpawner):
        async def spawn(self, command: Command) -> FakeHandle:
            if command.env["LOCAL_RANK"] == "1":
                raise SpawnError("cannot start worker x: No such file or directory")
            return await super().spawn(command)

    spawner = FailsForRank1(lambda a, r: Behaviour())
    with pytest.raises(SpawnError, match="cannot start worker"):
        _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "3", "--max-restarts", "2"), spawner)
    assert [h.env["LOCAL_RANK"] for h in spawner.spawned] == ["0", "2"]  # all were tried, no restart followed
    assert all(h.signals == [signal.SIGKILL] for h in spawner.spawned)


def test_signal_is_forwarded_and_gives_128_plus_n(tmp_path):
    started: list[FakeHandle] = []

    def after_spawn(handle: FakeHandle) -> None:
        started.append(handle)
        if len(started) == 2:  # a real signal to this process, handled by the agent's loop
            os.kill(os.getpid(), signal.SIGHUP)

    spawner = FakeSpawner(lambda a, r: Behaviour(), after_spawn)
    rc, _, err = _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "2"), spawner)
    assert rc == 128 + signal.SIGHUP
    assert all(h.signals[0] == signal.SIGHUP for h in spawner.spawned)
    assert "received SIGHUP: forwarded to 2 worker(s) and stopped them" in err
    assert "FAILED" not in err


def test_second_signal_skips_the_grace_period(tmp_path):
    def after_spawn(handle: FakeHandle) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)  # handled too: --signals-to-handle below

    spawner = FakeSpawner(lambda a, r: Behaviour(ignore_term=True), after_spawn)
    spec = _spec(tmp_path, "--nproc-per-node", "1", "--shutdown-timeout", "3600", "--signals-to-handle", "SIGTERM,SIGUSR1")
    rc, _, _ = _run(tmp_path, spec, spawner)
    assert rc == 128 + signal.SIGTERM
    assert spawner.spawned[0].signals[:2] == [signal.SIGTERM, signal.SIGKILL]


@dataclass
class _SignalOnceTheGroupEnded(AgentDeps):
    """Deps whose hook after a worker group is gone (and before its output is drained) sends a real signal."""

    signum: int = signal.SIGINT

    async def after_group(self, handles: Sequence[WorkerHandle]) -> None:
        os.kill(os.getpid(), self.signum)  # handled by the agent's loop: queued on its stop stream
        await super().after_group(handles)


@pytest.mark.parametrize("console_reads", [True, False], ids=["console-reads", "console-stalled"])
def test_a_signal_after_every_worker_exited_0_is_still_not_success(tmp_path, console_reads):
    """Issue #11 6b: the workers all exit 0, then SIGINT arrives before the agent has judged the attempt.

    With a console that reads, the signal waits on the stop stream, which nobody reads any more; with a
    console that does not read (stdout: a pipe nobody drains, as in test_interrupt_while_the_console_does_not_read)
    the drain is stuck on it, takes the signal, abandons the console and puts the signal back, after which
    the attempt was judged a success. Both used to exit 0.
    """
    chunk = b"y" * 4095 + b"\n"
    # stalled: 4 MB in 1,000 writes, more than the console's queue (256) and its pipe (64 KB) hold
    chunks = 1 if console_reads else 1000

    def after_spawn(handle: FakeHandle) -> None:  # one chunk per write (the fake feeds its stdout in one), then exit 0
        source = handle.stdout
        assert isinstance(source, OutputReader)
        for _ in range(chunks):
            source.feed_data(chunk)
        handle._finish(0)  # the fake's own exit, after the output it wrote

    spawner = FakeSpawner(lambda a, r: Behaviour(), after_spawn)
    read_fd, write_fd = os.pipe()
    catcher = EarlyCatcher(())
    err = tmp_path / "err"
    try:
        with err.open("wb") as e, (tmp_path / "out").open("wb") as o:
            console = Console(o.fileno() if console_reads else write_fd, e.fileno())
            deps = _SignalOnceTheGroupEnded(spawner, console, "h")
            try:
                rc = asyncio.run(_bounded(_spec(tmp_path, "--nproc-per-node", "1"), deps, catcher))
            finally:
                console.close()
                catcher.restore()
    finally:
        os.close(read_fd)  # the stalled writer thread gets EPIPE and ends
        os.close(write_fd)
    assert set(spawner.spawned[0].signals) == {signal.SIGKILL}  # only the final sweeps: the group ended on its own
    assert console.abandoned is not console_reads  # the stalled console was abandoned by the drain
    assert rc == 128 + signal.SIGINT
    if console_reads:
        assert (tmp_path / "out").stat().st_size == len(chunk) * chunks  # nothing was dropped
        assert "rankrun: received SIGINT as the job ended; exiting" in err.read_text()


def test_a_signal_counts_even_if_the_loop_never_got_round_to_it():
    """The loop runs a signal's callback only once it has read the signal from its wakeup fd, and the agent can
    return before it does: on Python 3.12+, nothing on the path from the group's end to ``detach`` gives the loop a
    turn (the case above exited 0 there). The signal must count from the moment it arrives."""

    async def scenario() -> tuple[int | None, object]:
        loop = asyncio.get_running_loop()
        catcher = EarlyCatcher(())
        try:
            stops = attach(catcher, loop, (signal.SIGINT,))
            os.kill(os.getpid(), signal.SIGINT)  # and no await before detach: the loop does not run meanwhile
            detach(catcher, loop)
            return catcher.first, stops.take_pending()
        finally:
            catcher.restore()

    first, queued = asyncio.run(scenario())
    assert queued is None  # the loop had indeed not got round to it
    assert first == signal.SIGINT


def test_handled_signals_stay_caught_after_the_agent_returns(tmp_path):
    """The loop's teardown used to reset them to their defaults: a SIGTERM during the final flush killed rankrun."""
    catcher = EarlyCatcher(())
    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=0))
    console = Console(os.open(os.devnull, os.O_WRONLY), os.open(os.devnull, os.O_WRONLY))
    try:
        rc = asyncio.run(_bounded(_spec(tmp_path, "--nproc-per-node", "1"), AgentDeps(spawner, console, "h"), catcher))
        assert rc == 0
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)  # or the kill below ends pytest
        os.kill(os.getpid(), signal.SIGTERM)
        assert catcher.first == signal.SIGTERM
    finally:
        catcher.restore()
        console.close()
        os.close(console.stdout_fd)
        os.close(console.stderr_fd)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # given back as it was


def test_signal_before_workers_start_spawns_nothing(tmp_path):
    catcher = EarlyCatcher(())
    catcher.pending.append(signal.SIGINT)
    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=0))
    rc, _, err = _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "2"), spawner, catcher)
    assert rc == 128 + signal.SIGINT
    assert spawner.spawned == []
    assert "received SIGINT before the workers started" in err


@pytest.mark.skipif(sys.platform != "linux", reason="/proc")
def test_partial_last_line_and_stderr_tail(tmp_path):
    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=1, stdout=b"no newline", stderr=b"line1\nboom"))
    rc, out, err = _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "1"), spawner)
    assert rc == 1
    assert out == "no newline"  # one rank on the console: its bytes exactly, unprefixed, nothing added
    assert "    line1\n    boom\n" in err


def test_failures_noticed_together_are_all_failures_and_root_is_lowest_rank(tmp_path):
    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=3))
    rc, _, err = _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "3"), spawner)
    assert rc == 1
    assert "  rank       : 0 (local_rank: 0)" in err
    assert "stopped by rankrun" not in err
    assert err.count("also failed at") == 2


def test_a_rank_whose_own_exit_was_under_way_as_the_group_stopped_is_a_failure_not_stopped_by_rankrun(tmp_path):
    """Every rank refuses the same bad argument (exit 2). Rank 0's exit is heard first and stops the group; rank
    1 had exited too, its event still on the way, heard only after rankrun's SIGTERM: it was once listed as
    "stopped by rankrun (exit code 2)". A rank ends by rankrun's doing only if it still ran when signalled."""
    usage = b"usage: train.py [-h]\ntrain.py: error: unrecognized arguments: --lr\n"

    def plan(attempt: int, rank: int) -> Behaviour:
        return [Behaviour(exit_status=2, stderr=usage), Behaviour(exiting_status=2, stderr=usage), Behaviour()][rank]

    spawner = FakeSpawner(plan)
    rc, _, err = _run(tmp_path, _spec(tmp_path, "--nproc-per-node", "3"), spawner)
    assert rc == 1
    assert spawner.spawned[1].signals[0] == signal.SIGTERM  # the interleaving happened: signalled, then heard of
    assert "  rank       : 0 (local_rank: 0)" in err
    assert re.search(r"^  rank 1 \(local_rank 1, pid 10001\): also failed at .*: exit code 2$", err, re.M), err
    assert "rank 2 (local_rank 2, pid 10002): stopped by rankrun (signal 15 (SIGTERM))" in err
    assert "stopped by rankrun (exit code" not in err


def test_stacks_on_request_say_the_job_and_what_the_launcher_does_when_no_worker_runs(tmp_path):
    """``rankrun --stacks`` between attempts (the next attempt's workers are being started) and once the job is done."""
    answers: list[asyncio.Task[list[str]]] = []

    def plan(attempt: int, rank: int) -> Behaviour:
        return Behaviour(exit_status=1 if attempt == 0 else 0)

    def asked(handle: FakeHandle) -> None:
        if handle.command.attempt == 1:
            answers.append(asyncio.ensure_future(deps.on_demand.report()))

    spec = _spec(tmp_path, "--nproc-per-node", "1", "--max-restarts", "1")
    with (tmp_path / "out").open("wb") as o, (tmp_path / "err").open("wb") as e:
        deps = AgentDeps(FakeSpawner(plan, after_spawn=asked), Console(o.fileno(), e.fileno()), "testhost")
        catcher = EarlyCatcher(())

        async def main() -> tuple[int, list[str]]:
            rc = await _bounded(spec, deps, catcher)
            return rc, [*(await asyncio.gather(*answers))[0], *await deps.on_demand.report()]

        try:
            rc, lines = asyncio.run(main())
        finally:
            deps.console.close()
            catcher.restore()
    assert rc == 0
    said = f"rankrun: job {spec.rendezvous.run_id}: no workers are running right now: "
    assert spec.rendezvous.run_id and lines == [said + "between attempts", said + "done (the launcher is finishing)"]


def test_slow_console_longer_than_drain_timeout_loses_nothing(tmp_path, monkeypatch):
    """The console reads slower than the workers wrote; the drain must wait for it, not give up."""
    import threading  # noqa: PLC0415

    import rankrun.agent.attempt as attempt_module  # noqa: PLC0415

    monkeypatch.setattr(attempt_module, "DRAIN_TIMEOUT", 0.01)
    lines = b"".join(b"line %06d " % i + b"x" * 90 + b"\n" for i in range(20000))  # 2 MB per worker
    spawner = FakeSpawner(lambda a, r: Behaviour(exit_status=0, stdout=lines))
    read_fd, write_fd = os.pipe()
    received = bytearray()

    def slow_reader() -> None:  # a console that takes ~0.5 s to read what the workers wrote at once
        while chunk := os.read(read_fd, 8192):
            received.extend(chunk)
            time.sleep(0.001)

    reader = threading.Thread(target=slow_reader)
    reader.start()
    err = tmp_path / "err"
    catcher = EarlyCatcher(())
    with err.open("wb") as e:
        console = Console(write_fd, e.fileno())
        try:
            rc = asyncio.run(_bounded(_spec(tmp_path, "--nproc-per-node", "2"), AgentDeps(spawner, console, "h"), catcher))
        finally:
            console.close()
            catcher.restore()
            os.close(write_fd)
            reader.join(60)
            os.close(read_fd)
    assert rc == 0
    assert received.count(b"\n") == 2 * 20000


def test_a_membership_change_stops_the_group_and_nobody_counts_as_failed():
    from rankrun.proc.group import MovedOn, supervise  # noqa: PLC0415
    from rankrun.proc.signals import StopStream  # noqa: PLC0415
    from rankrun.proc.spawn import Command  # noqa: PLC0415

    async def scenario():
        stops = StopStream()
        handles = [FakeHandle(1, Command(("w",), {}), Behaviour()), FakeHandle(2, Command(("w",), {}), Behaviour(ignore_term=True))]
        ended = asyncio.get_running_loop().create_future()
        ended.set_result(MovedOn("node 3 joined"))  # the round is over: the rendezvous moved on
        return handles, await asyncio.wait_for(supervise(handles, stops.next, shutdown_timeout=0.0, ended=ended),
                                               SCENARIO_TIMEOUT)

    handles, outcome = asyncio.run(scenario())
    assert outcome.regrouped == "node 3 joined" and outcome.interrupted_by is None
    assert not outcome.failed and all(e.after_stop for e in outcome.exits.values())
    assert handles[0].signals[0] == signal.SIGTERM and handles[1].signals[:2] == [signal.SIGTERM, signal.SIGKILL]


def test_exits_heard_together_keep_the_order_the_kernel_told_them():
    """On a loaded machine one turn of the loop hears several exits: rank 1 raised, and rank 0's collective failed
    because of it. The root cause is the one heard first, not the lowest rank of the batch (which named rank 0's
    gloo error as the job's cause)."""
    async def main():
        handles = [FakeHandle(100 + i, Command(("w",), {}), Behaviour()) for i in range(3)]
        never: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        ticks = count()
        run = asyncio.ensure_future(supervise(handles, lambda: never, 5.0, lambda: float(next(ticks))))
        for _ in range(5):  # supervise starts, then every wait of it is waiting (a few turns of the loop)
            await asyncio.sleep(0)
        handles[1]._finish(1)  # one turn: rank 1's exit, then rank 0's, as the kernel reported them
        handles[0]._finish(1)
        await asyncio.sleep(0)
        handles[2]._finish(-15)
        return await asyncio.wait_for(run, 10)

    outcome = asyncio.run(main())
    assert outcome.exits[1].at < outcome.exits[0].at
    assert not outcome.exits[0].after_stop and not outcome.exits[1].after_stop  # both failed by themselves
