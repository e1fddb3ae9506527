"""The start-up timeline's pure parts (``rankrun.agent.startup``): p50/max/slowest over ranks, the ``startup`` record,
its console line, and the shim's header line read back."""

from __future__ import annotations

from rankrun.agent.startup import how_started, line, script_up, seconds, spread, summary
from rankrun.events.records import Preload, Startup, Warm
from rankrun.stacks.dump import main_thread, up_time


def test_spread_is_nearest_rank_p50_max_and_the_slowest_rank():
    assert spread({0: 2.1, 1: 0.4, 2: 3.8, 3: 1.0, 4: 2.0}) == (2.0, 3.8, 2)
    assert spread({0: 1.0, 1: 3.0}) == (1.0, 3.0, 1)  # an even count: the lower middle value
    assert spread({7: 0.5}) == (0.5, 0.5, 7)
    assert spread({}) == (None, None, None)


def test_of_ranks_tied_for_slowest_the_lowest_is_named():
    assert spread({5: 3.0, 2: 3.0, 9: 1.0}) == (3.0, 3.0, 2)


def test_summary_counts_the_total_to_the_latest_sign_of_life():
    s = summary(0, 0.9, 0.1, {0: 2.0, 1: 2.1, 5: 3.8}, [2.5, 4.0, 3.0])
    assert s == Startup(0, 4.9, 0.9, 0.1, 2.1, 3.8, 5, 3.0, 4.0, None)
    assert summary(1, 0.5, 0.2, {}, []) == Startup(1, 0.7, 0.5, 0.2, None, None, None, None, None, None)


def test_summary_rounds_to_microseconds_and_never_goes_below_zero():
    s = summary(0, 1e-7, 0.0123456789, {0: -0.001}, [])
    assert (s.rendezvous, s.spawn, s.script_p50, s.total) == (0.0, 0.012346, 0.0, 0.012346)


def test_the_console_line_has_every_phase_and_the_slowest_rank():
    s = Startup(0, 4.2, 0.9, 0.1, 2.1, 3.8, 5, 0.2, 0.4, None)
    assert line(s) == ("attempt 0 started in 4.2 s: rendezvous 0.9 s, spawn 0.1 s, script p50 2.1 s / max 3.8 s (rank 5), "
                       "store p50 0.2 s / max 0.4 s")


def test_the_console_line_says_dash_for_what_is_not_known():
    s = Startup(3, 0.0123, 0.0, 0.0123, None, None, None, None, None, None)
    assert line(s) == "attempt 3 started in 0.012 s: rendezvous 0.000 s, spawn 0.012 s, script -, store -"


WARM_START = Startup(1, 0.061, 0.0002, 0.012, 0.031, 0.04, 2, 0.05, 0.061, None)
TORCH = Preload(modules="torch", seconds=2.31, state="ready")


def test_the_console_line_says_the_workers_were_forked_and_the_import_paid_once():
    all_forked = Warm(attempt=1, forked="0-3", cold="", fork_p50=0.004, fork_max=0.006)
    assert line(WARM_START, all_forked, TORCH) == (
        "attempt 1 started in 0.061 s (forked; torch imported once in 2.3 s): rendezvous 0.000 s, spawn 0.012 s, "
        "script p50 0.031 s / max 0.040 s (rank 2), store p50 0.050 s / max 0.061 s")
    assert line(WARM_START, all_forked).startswith("attempt 1 started in 0.061 s (forked): rendezvous ")


def test_the_console_line_counts_the_forked_and_the_cold_when_some_started_cold():
    mixed = Warm(attempt=1, forked="0-2", cold="3", fork_p50=0.004, fork_max=0.006)
    assert line(WARM_START, mixed).startswith("attempt 1 started in 0.061 s (3 forked, 1 cold): rendezvous ")
    two = Preload(modules="torch,numpy", seconds=12.5, state="ready")
    assert how_started(Warm(1, "0,2-3,8-11", "1,4-7", 0.004, 0.006), two) == \
        " (7 forked, 5 cold; torch, numpy imported once in 12.5 s)"
    assert how_started(Warm(1, "0", "", 0.004, 0.004), Preload(modules=" ,", seconds=0.5, state="ready")) == \
        " (forked; the modules imported once in 0.5 s)"  # no name to give (--preload always has one)


def test_the_console_line_of_a_cold_start_is_unchanged():
    cold = line(WARM_START)
    assert cold == ("attempt 1 started in 0.061 s: rendezvous 0.000 s, spawn 0.012 s, "
                    "script p50 0.031 s / max 0.040 s (rank 2), store p50 0.050 s / max 0.061 s")
    none_forked = Warm(attempt=1, forked="", cold="0-3", fork_p50=None, fork_max=None)
    assert line(WARM_START, none_forked, Preload("torch", 2.31, "unsafe", "a thread")) == cold
    assert line(WARM_START, None, TORCH) == cold
    assert line(WARM_START, Warm(1, "0-x", "", None, None), TORCH) == cold  # ranks it cannot read: none it knows forked


def test_seconds_keep_milliseconds_when_short():
    assert [seconds(v) for v in (0.0042, 0.1, 4.25, 99.94, 100.4, 3725.0)] == \
           ["0.004 s", "0.1 s", "4.2 s", "99.9 s", "100 s", "3725 s"]


def test_the_shims_header_says_when_the_interpreter_came_up_and_still_names_the_main_thread():
    header = "rankrun-stacks main=0x00007f75d4b296c0 pid=42 up=6027.484994\n"
    assert up_time(header) == 6027.484994
    assert main_thread(header) == 0x00007F75D4B296C0
    assert up_time(header.rstrip("\n")) is None  # a line still being written is not read
    assert up_time("rankrun-stacks main=0x00007f75d4b296c0 pid=42\n") is None  # an older shim's header
    assert up_time("Thread 0x00007f75d4b296c0 (most recent call first):\n") is None


def test_script_up_reads_the_dump_files_first_line_only_once_it_is_whole(tmp_path):
    dump = tmp_path / "stacks.txt"
    assert script_up(dump) is None  # the worker has not come up yet
    dump.write_bytes(b"rankrun-stacks main=0x00007f75d4b296c0 pid=42 up=12.5")
    assert script_up(dump) is None
    dump.write_bytes(b"rankrun-stacks main=0x00007f75d4b296c0 pid=42 up=12.5\nThread 0x00007f75d4b296c0 (most recent")
    assert script_up(dump) == 12.5
