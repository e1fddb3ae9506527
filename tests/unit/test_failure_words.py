"""One rule for a failed worker's words (``report.failure.failure_words``), and the places that say them: the
report, this node's restart line (``restart_reason``), the ``failure`` event (``agent.facts.failure``) and this
node's first failure in the other nodes' reports (``node_summary``)."""

from __future__ import annotations

import pytest

from rankrun.agent.facts import failure
from rankrun.report.errorfile import WorkerError
from rankrun.report.failure import Ending, WorkerResult, failure_words, node_summary, restart_reason

RAISED = "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n    main()\nValueError: bad lr\n"
TERMINATE = "terminate called without an active exception\n"


def _result(status: int, tail: str = "", error: WorkerError | None = None, *, rank: int = 1, at: float = 1.0,
            ending: Ending = Ending.FAILED) -> WorkerResult:
    return WorkerResult(rank, rank + 4, 4240 + rank, status, ending, at, "", error, tail)


@pytest.mark.parametrize(("result", "exception"), [
    (_result(1, RAISED), "ValueError: bad lr"),
    (_result(-6, RAISED + TERMINATE), "ValueError: bad lr"),  # raised, then died in its teardown
    (_result(1, "", WorkerError("KeyError: 'k'\nmore", "Traceback ...\nKeyError: 'k'\n", 0)), "KeyError: 'k'"),
    # an error file with a traceback and no message: its traceback's exception, not the (empty) output's
    (_result(1, "", WorkerError("", "Traceback ...\nKeyError: 'k'\n", 0)), "KeyError: 'k'"),
    (_result(-9, "loading\n"), None),
])
def test_every_place_names_the_same_exception(result, exception):
    words = failure_words(result)
    assert words.exception == exception
    assert failure(result, 0, "h").exception == exception  # the failure event (and the other nodes' restart line)
    assert restart_reason([result], None) == words.line  # this node's restart line
    if exception is not None:
        assert words.line.endswith(f": {exception}")
        assert exception in words.text and exception in node_summary([result], "h", None)


def test_the_restart_reason_is_the_stall_else_the_first_failures_line():
    first, later = _result(1, RAISED, rank=2, at=1.0), _result(-9, rank=0, at=2.0)
    stopped = _result(-15, rank=3, at=0.5, ending=Ending.STOPPED)
    assert restart_reason([later, stopped, first], None) == "rank 6 (pid 4242) exited 1: ValueError: bad lr"
    assert restart_reason([first], "no output for 5 s") == "the workers stalled (no output for 5 s)"
    assert restart_reason([stopped], None) == "workers failed"


def test_a_nodes_summary_is_the_stall_else_the_first_failures_status_and_last_twelve_lines():
    frames = "".join(f"  File \"t.py\", line {n}, in f{n}\n    f{n + 1}()\n" for n in range(20))
    deep = _result(1, "Traceback (most recent call last):\n" + frames + "RecursionError: deep\n", rank=2)
    summary = node_summary([_result(-15, rank=0, at=0.5, ending=Ending.STOPPED), deep], "h/10.0.0.2", None)
    lines = summary.split("\n")
    assert lines[0] == "rank 6 (local_rank 2) on h/10.0.0.2, pid 4242: exit code 1"
    assert lines[1:] == failure_words(deep).text.split("\n")[-12:] and lines[-1] == "RecursionError: deep"
    assert node_summary([deep], "h", "no output for 5 s") == "the workers on h stalled: no output for 5 s"
    assert node_summary([_result(-15, ending=Ending.STOPPED)], "h", None) == "a worker on h failed"
