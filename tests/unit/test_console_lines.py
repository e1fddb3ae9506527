"""The console's lines that say a lifecycle fact, made from the event alone (agent/lines.py)."""

from __future__ import annotations

import signal

from rankrun.agent.lines import ConsoleLines, interrupted_line, restart_line
from rankrun.events.records import Failure, NodeExcluded, Restart, Stall
from rankrun.events.stream import EventStream
from rankrun.report.failure import Ending, WorkerResult


def test_a_restart_says_the_failed_attempt_its_reason_and_the_restarts_used():
    assert restart_line(Restart(1, "rank 1 (pid 7) exited 2", 2), 3) == \
        "attempt 0 failed: rank 1 (pid 7) exited 2; restarting workers (1/3 restarts used)"
    assert restart_line(Restart(4, "the workers stalled (no output for 30 s)", 0), 4) == \
        "attempt 3 failed: the workers stalled (no output for 30 s); restarting workers (4/4 restarts used)"


def test_a_restart_gives_the_workers_restart_count_too_where_it_is_not_the_attempts_number():
    # a membership change began attempt 1 without spending a restart: its workers saw TORCHELASTIC_RESTART_COUNT=0
    assert restart_line(Restart(2, "rank 1 on node exited 1: ValueError: rank 1 fails on attempt 0", 2), 3) == (
        "attempt 1 (TORCHELASTIC_RESTART_COUNT=0) failed: rank 1 on node exited 1: ValueError: rank 1 fails on attempt 0;"
        " restarting workers (1/3 restarts used)")
    # a node that joined after two restarts: its attempt 0's workers saw 2
    assert restart_line(Restart(1, "rank 3 on other exited 7", 0), 3) == (
        "attempt 0 (TORCHELASTIC_RESTART_COUNT=2) failed: rank 3 on other exited 7; restarting workers (3/3 restarts used)")


def test_the_stream_says_each_restart_once_and_nothing_else():
    said: list[str] = []
    stream = EventStream("run", "node", [ConsoleLines(said.append, 2)])
    stream.emit(Failure(0, 1, "node", 1, None, "ValueError: x"))
    stream.emit(Stall("0-1", "stalled"))
    assert said == []
    stream.emit(Restart(1, "rank 1 on node exited 1: ValueError: x", 1))
    assert said == ["attempt 0 failed: rank 1 on node exited 1: ValueError: x; restarting workers (1/2 restarts used)"]


def test_an_exclusion_is_said_naming_the_node_and_why():
    said: list[str] = []
    stream = EventStream("run", "node", [ConsoleLines(said.append, 2)])
    stream.emit(NodeExcluded(("h-7-1a2b3c at 127.0.0.3",), "blamed for 2 failures of the job (--max-node-failures 2)"))
    assert said == ["node h-7-1a2b3c at 127.0.0.3 is excluded from the job: blamed for 2 failures of the job "
                    "(--max-node-failures 2)"]


def worker(rank: int, status: int, ending: Ending = Ending.STOPPED) -> WorkerResult:
    return WorkerResult(rank, rank, 100 + rank, status, ending, 0.0, "", None, "")


def test_a_signal_that_stopped_the_workers_is_said_with_what_became_of_them():
    stopped = [worker(0, -signal.SIGINT), worker(1, 0, Ending.SUCCEEDED), worker(2, -signal.SIGINT)]
    assert interrupted_line(signal.SIGINT, None, stopped) == "received SIGINT: forwarded to 2 worker(s) and stopped them"
    slow = [worker(0, -signal.SIGTERM), worker(1, -signal.SIGKILL)]
    assert interrupted_line(signal.SIGTERM, None, slow) == (
        "received SIGTERM: forwarded to 2 worker(s); 1 did not stop within --shutdown-timeout and were killed")
    assert interrupted_line(signal.SIGTERM, signal.SIGINT, slow) == (
        "received SIGTERM, then SIGINT: killed 1 worker(s) without waiting (1 had already stopped)")
