"""Pure line handling and failure-report rendering (golden)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import GOLDEN_DIR
from rankrun.logs.lines import LineSplitter, LineState, Tail, matching_lines, prefix_lines, render, render_prefix, split_complete
from rankrun.policy import Action, Failed, Signalled, Succeeded, decide
from rankrun.report.cause import ending_exception, explain
from rankrun.report.errorfile import WorkerError, parse_error_json
from rankrun.report.failure import (
    Ending,
    WorkerResult,
    failure_words,
    render_report,
    root_cause,
    root_cause_json,
)

GOLDEN = GOLDEN_DIR


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


def test_explain_takes_the_last_traceback_with_torch_prefixes():
    tail = "noise\nTraceback (most recent call last):\n  old\nOldError\nmore\n[rank1]: Traceback (most recent call last):\n" \
           "[rank1]:   File 'x'\n[rank1]: ValueError: new\n"
    assert explain(tail) == "[rank1]: Traceback (most recent call last):\n[rank1]:   File 'x'\n[rank1]: ValueError: new"
    assert explain("a\nb\n") == "a\nb"
    assert explain("") == ""


def test_explain_takes_a_whole_chain():
    tail = (TB_REAL + "\n\nDuring handling of the above exception, another exception occurred:\n\n"
            "Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\n    cleanup()\nOSError: disk\n")
    assert explain(tail) == tail.rstrip("\n")


TB_REAL = 'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n    raise ValueError("REAL CAUSE")\nValueError: REAL CAUSE'
TB_ATEXIT = ('Exception ignored in atexit callback: <function noise at 0x7f>\nTraceback (most recent call last):\n'
             '  File "t.py", line 6, in noise\n    raise RuntimeError("cleanup noise in atexit")\nRuntimeError: cleanup noise in atexit')
TB_HANDLED = 'Traceback (most recent call last):\n  File "t.py", line 2, in <module>\n    open("/nope")\nFileNotFoundError: /nope'


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        # an atexit callback raised after the real error: Python marks it ignored, so is it here
        (f"{TB_REAL}\n{TB_ATEXIT}\n", TB_REAL),
        # a handled traceback (print_exc) and the program went on, then the uncaught one
        (TB_HANDLED + "\n" + "".join(f"step {i}\n" for i in range(20)) + TB_REAL + "\n", TB_REAL),
        # a handled traceback, the program went on for a while, then sys.exit("message")
        (TB_HANDLED + "\n" + "".join(f"step {i}\n" for i in range(20)) + "fatal: giving up\n",
         "\n".join(["(the last traceback, 21 lines before the end, was: FileNotFoundError: /nope)",
                    *(f"step {i}" for i in range(11, 20)), "fatal: giving up"])),
        # a thread died: its traceback keeps the line that says so
        ("Exception in thread Thread-1 (t):\n" + TB_REAL + "\n", "Exception in thread Thread-1 (t):\n" + TB_REAL),
        # a progress bar was open when it raised: the quote shows what a terminal showed, not the redraws
        ("\r 10%\r 20%Traceback (most recent call last):\n  File \"t.py\", line 1\nOSError: x\n",
         ' 20%Traceback (most recent call last):\n  File "t.py", line 1\nOSError: x'),
        # the uncaught traceback, then a final line (sys.exit message, shutdown noise) is kept with it
        (f"{TB_REAL}\nwandb: synced\n", f"{TB_REAL}\nwandb: synced"),
        # five lines after it still end with it (torch's teardown warnings, terminate ...): quoted with it
        (f"{TB_REAL}\n" + "noise\n" * 5, TB_REAL + "\nnoise" * 5),
        # "Exception ignored in" without a traceback
        ("Exception ignored in: <_io.TextIOWrapper>\nBrokenPipeError: [Errno 32] Broken pipe\nbye\n", "bye"),
    ],
)
def test_explain_picks_the_traceback_that_ended_the_process(tail, expected):
    assert explain(tail) == expected


def test_explain_for_a_death_by_signal_quotes_the_last_lines():
    tail = "step 1\nterminate called after throwing an instance of 'std::runtime_error'\n  what():  boom\n"
    assert explain(tail) == "step 1\nterminate called after throwing an instance of 'std::runtime_error'\n  what():  boom"


TERMINATE = "terminate called without an active exception"


@pytest.mark.parametrize(("tail", "raised"), [
    (f"{TB_REAL}\n{TERMINATE}\n", "ValueError: REAL CAUSE"),  # torch's teardown after the raise
    (f"{TB_REAL}\n{TB_ATEXIT}\n" + "noise\n" * 5, "ValueError: REAL CAUSE"),  # five lines after: still it; ignored ones skipped
    (f"{TB_HANDLED}\n" + "step\n" * 6, None),  # the program went on from it: six lines, not the end's
    (f"{TB_HANDLED}\n" + "step\n" * 20 + f"{TB_REAL}\n", "ValueError: REAL CAUSE"),  # the last one, not the handled one
    (f"[rank1]: {TB_REAL.replace(chr(10), chr(10) + '[rank1]: ')}\n\n\n", "[rank1]: ValueError: REAL CAUSE"),
    ("step 1\nSegmentation fault\n", None),
    ("", None),
])
def test_the_exception_that_ended_a_process_is_its_last_tracebacks_if_little_followed(tail, raised):
    assert ending_exception(tail) == raised


@pytest.mark.parametrize(("status", "error", "tail", "expected"), [
    (-9, None, "", ("signal", "Signal 9 (SIGKILL) received by PID 101")),  # nothing written: the signal alone
    (-6, None, "Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: x\n",
     ("signal", "Signal 6 (SIGABRT) received by PID 101 after ValueError: x; its last stderr lines:\n"
                "Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: x")),
    (-6, WorkerError("ValueError: x", "", 0), "noise\n", ("error file", "ValueError: x")),  # a message, no traceback
    (1, None, "", ("stderr", "<the worker wrote nothing to stderr>")),
])
def test_the_reports_exception_names_its_source(status, error, tail, expected):
    words = failure_words(_result(1, Ending.FAILED, status, 0.0, error, tail))
    assert (words.source, words.text) == expected


def test_report_golden_atexit_and_handled(utc):
    atexit = _result(1, Ending.FAILED, 1, 1796002631.25, tail=f"{TB_HANDLED}\n" + "x\n" * 8 + f"{TB_REAL}\n{TB_ATEXIT}\n")
    aborted = _result(0, Ending.FAILED, -6, 1796002631.5, tail="terminate called after throwing an instance of 'c10::Error'\n"
                      "  what():  CUDA error\n")
    raised = _result(0, Ending.FAILED, -6, 1796002631.5, tail=f"{TB_HANDLED}\n" + "x\n" * 8 + f"{TB_REAL}\n"
                     "terminate called without an active exception\n")
    text = render_report("train.py", "host1", 0, [aborted, atexit]) + render_report("train.py", "host1", 0, [aborted]) \
        + render_report("train.py", "host1", 0, [raised])
    assert text == (GOLDEN / "report_atexit_abort.txt").read_text()


@given(st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\x00", b"")), max_size=12))
def test_render_is_the_same_whatever_the_chunking(chunks):
    prefix = b"\x00P\x00"
    whole, _ = render(b"".join(chunks), prefix, LineState.FRESH)
    state, pieces = LineState.FRESH, []
    for chunk in chunks:
        shown, state = render(chunk, prefix, state)
        pieces.append(shown)
    assert b"".join(pieces) == whole
    assert whole.replace(prefix, b"") == b"".join(chunks)  # only prefixes are added


@pytest.mark.parametrize(
    ("data", "state", "shown", "after"),
    [
        (b"a\nb\n", LineState.FRESH, b"[p]a\n[p]b\n", LineState.FRESH),
        (b" 10%\r 20%\r", LineState.FRESH, b"[p] 10%\r[p] 20%\r", LineState.AFTER_CR),  # each redraw keeps the prefix
        (b" 30%", LineState.AFTER_CR, b"[p] 30%", LineState.MID),
        (b"\n", LineState.AFTER_CR, b"\n", LineState.FRESH),  # \r\n split across chunks: no prefix between
        (b"x\r\ny", LineState.FRESH, b"[p]x\r\n[p]y", LineState.MID),
        (b"a\r\n\r\nb\r\n", LineState.FRESH, b"[p]a\r\n[p]\r\n[p]b\r\n", LineState.FRESH),  # a blank CRLF line too
        (b"\r 5%", LineState.FRESH, b"[p]\r[p] 5%", LineState.MID),
        (b"\nnext", LineState.ENDED, b"[p]next", LineState.MID),  # the console already ended the line
        (b" more", LineState.ENDED, b"[p] more", LineState.MID),
    ],
)
def test_render_prefixes_lines_and_redraws(data, state, shown, after):
    assert render(data, b"[p]", state) == (shown, after)


def test_render_without_prefix_passes_bytes_unchanged():
    assert render(b"a\r b", b"", LineState.MID) == (b"a\r b", LineState.MID)
    assert split_complete(b"a\nb\nc") == (b"a\nb\n", b"c")


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


@pytest.mark.parametrize(("status", "error", "tail", "expected"), [
    (1, None, "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\nValueError: bad lr\n",
     "rank 1 (pid 101) exited 1: ValueError: bad lr"),
    (1, WorkerError("ValueError: bad lr\nmore", "Traceback ...", 0), "noise\n", "rank 1 (pid 101) exited 1: ValueError: bad lr"),
    (2, None, "usage: t.py [-h]\nt.py: error: unrecognized arguments: --lr\n\n",
     "rank 1 (pid 101) exited 2: t.py: error: unrecognized arguments: --lr"),
    (3, None, "", "rank 1 (pid 101) exited 3"),
    (-9, None, "loading\n", "rank 1 (pid 101) was killed by signal 9 (SIGKILL)"),
    # raised, then died in its teardown: both
    (-6, None, "Traceback (most recent call last):\n  File \"t.py\", line 1, in <module>\nValueError: bad lr\n"
     "terminate called without an active exception\n", "rank 1 (pid 101) was killed by signal 6 (SIGABRT): ValueError: bad lr"),
    (-6, WorkerError("ValueError: bad lr", "Traceback ...", 0), "", "rank 1 (pid 101) was killed by signal 6 (SIGABRT): ValueError: bad lr"),
    # a traceback it went on from is not why it was killed
    (-9, None, TB_HANDLED + "\n" + "step\n" * 6, "rank 1 (pid 101) was killed by signal 9 (SIGKILL)"),
    # shutdown noise after the traceback: the exception names it, not the noise
    (1, None, f"{TB_REAL}\nwandb: synced\n", "rank 1 (pid 101) exited 1: ValueError: REAL CAUSE"),
    # a traceback it went on from, then sys.exit("message"): the message
    (1, None, TB_HANDLED + "\n" + "step\n" * 6 + "fatal: giving up\n", "rank 1 (pid 101) exited 1: fatal: giving up"),
])
def test_one_line_names_the_root_cause_with_its_exception(status, error, tail, expected):
    assert failure_words(_result(1, Ending.FAILED, status, 0.0, error, tail)).line == expected


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
    ("event", "done", "budget", "action"),
    [
        (Succeeded(), 0, 0, Action.FINISH),
        (Failed(), 0, 1, Action.RESTART),
        (Failed(), 1, 1, Action.GIVE_UP),
        (Signalled(15), 0, 5, Action.SHUT_DOWN),
        (Signalled(15), 5, 5, Action.SHUT_DOWN),  # a spent budget does not matter
    ],
)
def test_policy(event, done, budget, action):
    assert decide(event, done, budget) is action


def test_filter_splitter_bounds_overlong_lines():
    splitter = LineSplitter(max_line=10)
    assert splitter.feed(b"abcdef") == b""
    assert splitter.feed(b"ghijkl") == b"abcdefghijkl\n"  # past the cap: emitted as a line of its own
    assert splitter.feed(b"mn\nop") == b"mn\n"
    assert splitter.flush() == b"op\n"


def test_the_report_lists_the_excluded_nodes_with_why_before_the_jobs_first_failure(utc):
    stopped = _result(0, Ending.STOPPED, -15, 1796002631.25)
    text = render_report("train.py", "host1", 2, [stopped], job_cause="rank 5 on host3: exit code 1",
                         excluded=[("h3-7-1a2b3c at 10.0.0.3", "blamed for 2 failures of the job (--max-node-failures 2)")])
    lines = text.split("\n")
    at = lines.index("Nodes excluded from the job (drain them or reschedule elsewhere):")
    assert lines[at + 1] == "  h3-7-1a2b3c at 10.0.0.3: blamed for 2 failures of the job (--max-node-failures 2)"
    assert lines.index("The job's first failure (on any node):") > at
    assert "excluded" not in render_report("train.py", "host1", 2, [stopped], job_cause="rank 5 on host3: exit code 1")
