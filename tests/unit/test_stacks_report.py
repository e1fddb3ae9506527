"""Stack dumps parsed, and many ranks' stacks grouped into one short report (pure; golden files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rankrun.stacks.dump import Dump, Frame, ThreadStack, main_thread, parse
from rankrun.stacks.report import Child, ProcState, RankSample, ranges, render, stall_title

GOLDEN = Path(__file__).parent.parent / "golden"

DUMP = """\
Thread 0x00007f75d4b296c0 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f75d588bb80 (most recent call first):
  File "/w/train.py", line 12 in slow_read
  File "<frozen x>", line ??? in helper
  ...
"""


def test_a_dump_parses_into_threads_with_the_main_one_named_by_the_header() -> None:
    ident = main_thread("rankrun-stacks main=0x00007f75d4b296c0 pid=42\n")
    assert ident == 0x7F75D4B296C0
    dump = parse(DUMP, ident)
    assert [t.ident for t in dump.threads] == [0x7F75D4B296C0, 0x7F75D588BB80]
    main = dump.main
    assert main is not None and main.ident == ident  # the header wins over "Current thread"
    assert [str(f) for f in main.frames] == ["/usr/lib/python3.11/threading.py:1002 in _bootstrap",
                                              "/usr/lib/python3.11/threading.py:324 in wait"]  # outermost first
    (other,) = dump.others
    assert other.frames[0] == Frame("<frozen x>", 0, "helper") and other.truncated


def test_a_dump_of_the_main_thread_alone_is_labelled_with_the_headers_thread() -> None:
    one = 'Stack (most recent call first):\n  File "/w/train.py", line 12 in slow_read\n  File "/w/train.py", line 30 in <module>\n\n'
    (main,) = parse(one, 0x7F75D4B296C0).threads
    assert main.main and main.ident == 0x7F75D4B296C0 and not main.truncated
    assert [str(f) for f in main.frames] == ["/w/train.py:30 in <module>", "/w/train.py:12 in slow_read"]
    assert parse(one, None).main is not None  # no header: still the thread that took the signal, the main one
    assert parse("Stack (most recent call first):\n  File \"/w/a.py\", line 3 in f\n  ...\n", 1).threads[0].truncated


def test_the_shims_own_arrivals_thread_is_left_out_of_a_dump() -> None:
    own = """\
Thread 0x00007f75d0000000 (most recent call first):
  File "/venv/lib/python3.11/site-packages/rankrun/stacks/shim/sitecustomize.py", line 78 in _arrivals

"""
    dump = parse(own + DUMP, 0x7F75D588BB80)
    assert [t.ident for t in dump.threads] == [0x7F75D4B296C0, 0x7F75D588BB80]
    assert len(dump.others) == 1 and dump.others[0].frames[-1].function == "wait"
    for users in (own.replace("_arrivals", "_arrivals_of_mine"), own.replace("rankrun/stacks/shim", "mine")):
        assert len(parse(users + DUMP, 0x7F75D588BB80).others) == 2  # the user's own: kept


def test_a_forked_workers_outermost_preload_frames_are_left_out() -> None:
    forked = """\
Current thread 0x00007f0000000001 (most recent call first):
  File "/w/train.py", line 9 in step
  File "/w/train.py", line 20 in <module>
  File "/venv/site-packages/rankrun/preload/child.py", line 190 in _run_script
  File "/venv/site-packages/rankrun/preload/child.py", line 74 in run
  File "/venv/site-packages/rankrun/preload/__main__.py", line 50 in _main
  File "/venv/site-packages/rankrun/preload/__main__.py", line 53 in <module>
"""
    (thread,) = parse(forked, 0x7F0000000001).threads
    assert [(f.file, f.function) for f in thread.frames] == [("/w/train.py", "<module>"), ("/w/train.py", "step")]
    setting_up = "\n".join(forked.splitlines()[:1] + forked.splitlines()[3:])  # not in the user's code yet: kept
    (thread,) = parse(setting_up, 0x7F0000000001).threads
    assert [f.function for f in thread.frames] == ["<module>", "_main", "run", "_run_script"]
    mine = forked.replace("rankrun/preload", "mine/preload")  # a user's own folder of that name: kept
    assert len(parse(mine, 0x7F0000000001).threads[0].frames) == 6


def test_without_a_header_the_current_thread_is_taken_as_main() -> None:
    dump = parse(DUMP, None)
    assert dump.main is not None and dump.main.ident == 0x7F75D588BB80
    assert main_thread("not a header") is None
    assert parse("Thread 0x00007f75d4b296c0 (most recent call first):\n  File \"/w/a.py\", line 3", None).threads[0].frames == ()


@pytest.mark.parametrize(("ranks", "text"), [([0, 1, 2, 4, 6, 7], "0-2,4,6-7"), ([5], "5"), ([], ""), ([3, 1, 2], "1-3")])
def test_ranges(ranks: list[int], text: str) -> None:
    assert ranges(ranks) == text


COMMON = (Frame("/w/train.py", 80, "<module>"), Frame("/w/train.py", 62, "main"))
AT_BARRIER = (*COMMON, Frame("/w/train.py", 45, "step"),
              Frame("/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2501, "all_reduce"))
ELSEWHERE = (*COMMON, Frame("/w/train.py", 40, "load_batch"), Frame("/w/data.py", 12, "very_slow_reader"))
LOADER = (Frame("/usr/lib/python3.11/threading.py", 1002, "_bootstrap"), Frame("/usr/lib/python3.11/threading.py", 324, "wait"))


def _sample(rank: int, frames: tuple[Frame, ...], host: str = "node-a", state: str = "S", cpu: float | None = 0.0,
            children: tuple[Child, ...] = ()) -> RankSample:
    threads = (ThreadStack(1, True, frames), ThreadStack(2, False, LOADER), ThreadStack(3, False, LOADER[:1]))
    return RankSample(rank, host, Dump(threads), ProcState(state, cpu), children=children)


def _golden(name: str, lines: list[str]) -> None:
    path = GOLDEN / name
    text = "\n".join(lines) + "\n"
    if os.environ.get("RANKRUN_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def test_sixteen_ranks_one_elsewhere_is_a_short_report_with_the_outlier_first() -> None:
    samples = [_sample(r, ELSEWHERE if r == 7 else AT_BARRIER, cpu=0.4 if r == 7 else 0.0, state="R" if r == 7 else "S",
                       children=(Child(9000 + r, "pt_data_worker", "S"),) if r == 0 else ()) for r in range(16)]
    lines = render("rankrun: job demo stalled: no output for 30 s; 2 distinct stacks across 16 ranks", samples)
    _golden("stacks_16_ranks.txt", lines)
    assert len(lines) <= 60
    assert lines.index("  rank 7 on node-a (1 rank; state R, 0.40 s CPU since the last sample):") < next(
        i for i, line in enumerate(lines) if line.startswith("  ranks 0-6,8-15"))
    assert sum(1 for line in lines if "/w/train.py:80 in <module>" in line) == 1  # common frames printed once


def test_size_depends_on_distinct_stacks_not_on_ranks() -> None:
    stacks = [(*COMMON, Frame("/w/train.py", 100 + k, f"phase{k}")) for k in range(4)]
    samples = [_sample(r, stacks[0 if r % 500 else r // 500 % 4], host=f"node-{r // 8}") for r in range(2048)]
    lines = render("rankrun: job big stalled: no output for 30 s; 4 distinct stacks across 2048 ranks", samples)
    assert len(lines) < 100
    assert any(line.startswith("  ranks 0-499,501-999,") and "on 256 hosts" in line for line in lines)
    every_rank_its_own = [_sample(r, (*COMMON, Frame("/w/train.py", r, "own"))) for r in range(300)]
    folded = render("rankrun: job many stalled", every_rank_its_own)
    assert len(folded) < 100
    assert any(line.startswith("  rank 0 on node-a (1 rank") for line in folded)  # the first group stays whole
    assert any("more stacks" in line for line in folded)  # the rest summed up in one line


def test_ranks_without_a_python_stack_say_why() -> None:
    samples = [
        _sample(0, AT_BARRIER),
        RankSample(1, "node-a", None, ProcState("D", 0.0, "io_schedule")),
        RankSample(2, "node-a", None, None),
        RankSample(3, "node-b", None, ProcState("T", None), answered=False),
    ]
    text = "\n".join(render("rankrun: job mixed: on request", samples, ["node 3 (10.0.0.4): no answer — its agent is stuck or gone"]))
    assert "kernel wait: io_schedule" in text
    assert "(the process is gone)" in text
    assert "no stack came back in time" in text
    assert "node 3 (10.0.0.4): no answer" in text


def test_the_title_names_ranks_that_exited_and_reports_on_the_rest() -> None:
    samples = [RankSample(r, "node-a", None, None) for r in range(3)] + [_sample(3, ELSEWHERE)]
    title, running = stall_title("job1", "31", samples)
    assert title == "rankrun: job job1 stalled: ranks 0-2 exited 0, rank 3 did not: no output for 31 s; 1 distinct stack across 1 rank"
    assert [s.rank for s in running] == [3]
    title, running = stall_title("job1", "2.5", [_sample(0, AT_BARRIER), _sample(1, ELSEWHERE)])
    assert title == "rankrun: job job1 stalled: no output for 2.5 s; 2 distinct stacks across 2 ranks" and len(running) == 2
