"""The console's lines that say a lifecycle fact, made from the event alone (agent/lines.py)."""

from __future__ import annotations

import signal

import pytest

from rankrun.agent.lines import ConsoleLines, interrupted_line, restart_line, restored_line
from rankrun.events.fields import size_words
from rankrun.events.records import (
    CheckpointKept,
    CheckpointRestored,
    CheckpointWritten,
    Failure,
    NodeExcluded,
    Restart,
    Stall,
)
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


def test_a_restored_step_says_the_attempt_the_step_where_it_came_from_and_what_it_cost():
    assert restored_line(CheckpointRestored(1, 120, "memory", "0-7", 4_200_000_000, 0.61)) == \
        "attempt 1 resumes from step 120 kept in memory: ranks 0-7, 4.2 GB in 0.61 s"
    assert restored_line(CheckpointRestored(3, 7, "neighbour", "8-15", 42_000_000_000, 12.345)) == \
        "attempt 3 resumes from step 7 from the neighbour's copy: ranks 8-15, 42 GB in 12.3 s"
    assert restored_line(CheckpointRestored(0, 0, "disk", "0,2", 512_000_000, 9.999)) == \
        "attempt 0 resumes from step 0 from --checkpoint-dir: ranks 0,2, 512 MB in 10.0 s"
    assert restored_line(CheckpointRestored(0, 0, "disk", "0", 1, 9.994)).endswith("1 B in 9.99 s")
    assert restored_line(CheckpointRestored(2, 5, "tape", "", 900, 0.0)) == \
        "attempt 2 resumes from step 5 from tape: 900 B in 0.00 s"  # a source this rankrun does not name; no ranks


def test_the_stream_says_a_restore_once_and_not_the_saves_or_copies():
    said: list[str] = []
    stream = EventStream("run", "node", [ConsoleLines(said.append, 2)])
    stream.emit(CheckpointKept(120, "0-7", 4_200_000_000, 0.61, "kept", None))
    stream.emit(CheckpointWritten(120, "disk", "/ckpt/step-120", 4_200_000_000, 3.0, "complete"))
    assert said == []
    stream.emit(CheckpointRestored(1, 120, "memory", "0-7", 4_200_000_000, 0.61))
    assert said == ["attempt 1 resumes from step 120 kept in memory: ranks 0-7, 4.2 GB in 0.61 s"]


@pytest.mark.parametrize(("size", "words"), [
    (0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (1_500, "1.5 kB"), (9_949, "9.9 kB"), (9_960, "10 kB"), (10_000, "10 kB"),
    (999_499, "999 kB"), (999_500, "1.0 MB"), (1_000_000, "1.0 MB"), (4_200_000_000, "4.2 GB"), (42_000_000_000, "42 GB"),
    (999_000_000_000, "999 GB"), (10**12, "1.0 TB"), (3 * 10**15, "3000 TB"),
])
def test_sizes_are_said_in_decimal_units(size, words):
    assert size_words(size) == words
