"""The lifecycle facts the agent builds from what it holds (``agent.facts``, pure), and how the rendezvous carries
the job's root cause and lost nodes to every node (``rendezvous.keys``)."""

from __future__ import annotations

import pytest

from rankrun.agent.facts import (
    failure,
    failure_from,
    failure_line,
    failure_value,
    job_outcome,
    workers_outcome,
)
from rankrun.events.records import Failure
from rankrun.proc.group import Exit, GroupOutcome
from rankrun.rendezvous.keys import RoundWord, result_from, result_value
from rankrun.rendezvous.round import Phase
from rankrun.report.errorfile import WorkerError
from rankrun.report.failure import Ending, WorkerResult, failure_words

RAISED = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    main()\n"
          "ValueError: bad batch 17\n")


def result(status: int, tail: str = "", error: WorkerError | None = None) -> WorkerResult:
    return WorkerResult(1, 5, 4242, status, Ending.FAILED, 1.0, "", error, tail)


@pytest.mark.parametrize(("outcome", "word"), [
    (GroupOutcome({0: Exit(0, 0, 1.0, False)}), "succeeded"),
    (GroupOutcome({0: Exit(0, 1, 1.0, False)}), "failed"),
    (GroupOutcome({0: Exit(0, 1, 1.0, False)}, interrupted_by=15), "interrupted"),
    (GroupOutcome({0: Exit(0, -15, 1.0, True)}, regrouped="node n2 was lost"), "moved_on"),
    (GroupOutcome({0: Exit(0, -15, 1.0, True)}, stalled="no output for 5 s"), "stalled"),
])
def test_how_a_group_ended_in_the_schemas_words(outcome, word):
    assert workers_outcome(outcome) == word


def test_the_exception_is_the_error_files_first_line_else_the_tracebacks_last():
    assert failure_words(result(1, RAISED + "some exit noise\n")).exception == "ValueError: bad batch 17"
    recorded = WorkerError("KeyError: 'lr'\nmore of it", "Traceback ...", 0)
    assert failure_words(result(1, RAISED, recorded)).exception == "KeyError: 'lr'"
    assert failure_words(result(3, "exit 3 with no traceback\n")).exception is None
    # raised, then killed in its teardown (torch's SIGABRT): the traceback is why
    assert failure_words(result(-6, RAISED + "terminate called without an active exception\n")).exception == "ValueError: bad batch 17"
    # a traceback it went on from is not why it was killed, nor why it exited
    assert failure_words(result(-9, RAISED + "".join(f"step {i}\n" for i in range(6)))).exception is None
    assert failure_words(result(1, RAISED + "".join(f"step {i}\n" for i in range(6)))).exception is None


def test_a_failure_by_signal_names_it_and_has_no_exit_code():
    assert failure(result(-9), 2, "10.0.0.5") == Failure(2, 5, "10.0.0.5", None, "SIGKILL", None)
    assert failure(result(1, RAISED), 0, "h") == Failure(0, 5, "h", 1, None, "ValueError: bad batch 17")
    assert failure(result(-6, RAISED), 0, "h") == Failure(0, 5, "h", None, "SIGABRT", "ValueError: bad batch 17")


def test_a_failure_travels_to_the_other_nodes_and_back_with_their_attempt():
    fact = Failure(0, 5, "10.0.0.5", 1, None, "ValueError: bad batch 17")
    word = RoundWord(3, Phase.RUNNING, 1, "node n1 reported a worker failure", failure=failure_value(fact),
                     lost=("n2 at 10.0.0.2",))
    back = RoundWord.parse(word.value())
    assert back == word
    assert failure_from(back.failure or {}, 4) == Failure(4, 5, "10.0.0.5", 1, None, "ValueError: bad batch 17")
    assert failure_from({"rank": "5", "host": "h"}, 0) is None  # malformed: nothing is told
    assert RoundWord.parse(RoundWord(1, Phase.FORMING).value()) == RoundWord(1, Phase.FORMING)  # none: as before
    assert RoundWord.parse(b'{"round": 2, "phase": "running"}').failure is None  # an older coordinator's word


def test_a_nodes_result_carries_its_root_cause():
    root = failure_value(Failure(0, 5, "10.0.0.5", None, "SIGKILL", None))
    assert result_from(result_value(False, "rank 5 ...", root), 7).root == root
    assert result_from(result_value(True), 7).root is None


@pytest.mark.parametrize(("code", "error", "word"), [
    (0, False, "succeeded"), (1, False, "failed"), (143, False, "interrupted"), (130, False, "interrupted"),
    (3, False, "error"), (2, True, "error"), (0, True, "error"),
])
def test_how_the_job_ended_from_its_exit_code(code, error, word):
    assert job_outcome(code, error) == word


def test_a_failure_in_one_line_as_another_node_says_it():
    assert failure_line(Failure(0, 5, "node-3", 1, None, "ValueError: bad lr")) == \
        "rank 5 on node-3 exited 1: ValueError: bad lr"
    assert failure_line(Failure(2, 0, "10.0.0.1", None, "SIGKILL", None)) == "rank 0 on 10.0.0.1 killed by SIGKILL"
    assert failure_line(Failure(0, 7, "", 3, None, None)) == "rank 7 exited 3"
    assert failure_line(Failure(0, 7, "h", None, None, None)) == "rank 7 on h failed"
