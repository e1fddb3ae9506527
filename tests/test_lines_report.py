"""Pure line handling and failure-report rendering (golden)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankrun.agent.policy import Action, decide
from rankrun.logs.lines import LineSplitter, Tail, matching_lines, prefix_lines, render_prefix
from rankrun.report.errorfile import WorkerError, parse_error_json
from rankrun.report.failure import Ending, WorkerResult, render_report, root_cause, root_cause_json, traceback_from_tail

GOLDEN = Path(__file__).parent / "golden"


@given(st.lists(st.binary(max_size=50), max_size=30))
def test_splitter_emits_exactly_the_input_as_whole_lines(chunks):
    splitter = LineSplitter()
    out = b"".join(splitter.feed(c) for c in chunks)
    assert out.endswith(b"\n") or out == b""
    rest = splitter.flush()
    data = b"".join(chunks)
    assert out + rest == (data if data.endswith(b"\n") or not data else data + b"\n")


@given(st.lists(st.binary(max_size=20).filter(lambda b: b"\n" not in b), min_size=1, max_size=20))
def test_prefix_lines_prefixes_every_line(lines):
    block = b"".join(line + b"\n" for line in lines)
    assert prefix_lines(block, b"[p]:").split(b"\n")[:-1] == [b"[p]:" + line for line in lines]


def test_prefix_template_and_filters_and_tail():
    assert render_prefix("<${role_name}/${rank}/${local_rank}> ${x}", role="r", rank=3, local_rank=1) == b"<r/3/1> ${x}"
    assert matching_lines(b"a loss=1\nb\nc loss=2\n", (b"loss",)) == b"a loss=1\nc loss=2\n"
    tail = Tail(limit=10)
    for i in range(100):
        tail.add(f"{i:03d}\n".encode())
    assert tail.text().endswith("098\n099\n") and len(tail.text()) == 10


def test_traceback_from_tail_takes_the_last_traceback():
    tail = "noise\nTraceback (most recent call last):\n  old\nOldError\nmore\n[rank1]: Traceback (most recent call last):\n" \
           "[rank1]:   File 'x'\n[rank1]: ValueError: new\n"
    assert traceback_from_tail(tail) == "[rank1]: Traceback (most recent call last):\n[rank1]:   File 'x'\n[rank1]: ValueError: new"
    assert traceback_from_tail("a\nb\n") == "a\nb"
    assert traceback_from_tail("") == ""


def test_error_file_formats():
    new = '{"message": {"message": "ValueError: x", "extraInfo": {"py_callstack": "TB", "timestamp": "17"}}}'
    assert parse_error_json(new) == WorkerError("ValueError: x", "TB", 17)
    assert parse_error_json('{"message": "legacy", "timestamp": 5}') == WorkerError("legacy", "", 5)
    assert parse_error_json("not json") is None
    assert parse_error_json("[1]") is None


def _result(rank, ending, status, at, error=None, tail=""):
    return WorkerResult(rank, rank, 100 + rank, status, ending, at, f"/l/attempt_0/{rank}/error.json", error, tail)


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_report_golden(utc):
    results = [
        _result(0, Ending.STOPPED, -15, 1796002632.5),
        _result(1, Ending.FAILED, 1, 1796002631.25, tail="log\nTraceback (most recent call last):\n  File \"t.py\", line 3\nValueError: boom\n"),
        _result(2, Ending.FAILED, -11, 1796002631.9),
        _result(3, Ending.SUCCEEDED, 0, 1796002630.0),
    ]
    assert root_cause(results) is results[1]
    text = render_report("train.py", "host1", 0, results)
    assert text == (GOLDEN / "report_stderr.txt").read_text()
    recorded = [_result(0, Ending.FAILED, 1, 1.0, error=WorkerError("KeyError: 'k'", "Traceback ...\nKeyError: 'k'\n", 99))]
    assert render_report("train.py", "host1", 2, recorded) == (GOLDEN / "report_error_file.txt").read_text()
    data = json.loads(root_cause_json(recorded[0]))
    assert data == {"message": {"message": "KeyError: 'k'", "errorCode": 1,
                                "extraInfo": {"py_callstack": "Traceback ...\nKeyError: 'k'", "timestamp": "99"}}}


@pytest.mark.parametrize(
    ("failed", "signum", "done", "budget", "action", "code"),
    [(False, None, 0, 0, Action.SUCCEED, 0), (True, None, 0, 1, Action.RESTART, None), (True, None, 1, 1, Action.GIVE_UP, 1),
     (True, 15, 0, 5, Action.INTERRUPTED, 143), (False, 2, 0, 0, Action.INTERRUPTED, 130)],
)
def test_policy(failed, signum, done, budget, action, code):
    d = decide(failed=failed, interrupted_by=signum, restarts_done=done, max_restarts=budget)
    assert (d.action, d.exit_code) == (action, code)


def test_overlong_line_is_cut_not_hoarded():
    splitter = LineSplitter(max_line=10)
    assert splitter.feed(b"abcdef") == b""
    assert splitter.feed(b"ghijkl") == b"abcdefghijkl\n"  # past the cap: emitted as a line of its own
    assert splitter.feed(b"mn\nop") == b"mn\n"
    assert splitter.flush() == b"op\n"
