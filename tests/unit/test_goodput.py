"""The goodput account (``rankrun.events.goodput``), pure: hand-written event sequences of one node and the six parts
each must give, to the millisecond; the sum over random sequences; the job's account from its nodes'; the line.

A sequence is written as (mono, fact) pairs, stamped here as the job's ``EventStream`` stamps them. The job starts
at mono 100, so a part's expected seconds read off the pairs.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rankrun.events import goodput
from rankrun.events.goodput import Ledger, account, as_value, from_value, job, line, share
from rankrun.events.records import (
    CheckpointKept,
    Goodput,
    JobEnd,
    JobOutcome,
    JobStart,
    NodeExcluded,
    NodeLost,
    Preload,
    RdzvRound,
    Record,
    Restart,
    Stall,
    StallEnd,
    Startup,
    Training,
    WorkersEnd,
    WorkersOutcome,
    WorkersStart,
    stamp,
)

pytestmark = pytest.mark.unit

RUN, ME = "3f2c1a", "127.0.0.2"  # this node's address, as the rendezvous knows it
T0 = 1_767_225_500.0  # the wall clock at mono 0

Pair = tuple[float, Record]


def stamped(*pairs: Pair, node: str = ME) -> list[Record]:
    """The node's events, as its stream stamps them, in the order given."""
    return [stamp(fact, T0 + mono, mono, RUN, node) for mono, fact in pairs]


def gp(wall: float, productive: float = 0.0, waiting: float = 0.0, startup: float = 0.0, restart: float = 0.0,
       stall: float = 0.0, lost: float = 0.0) -> Goodput:
    return Goodput(wall, productive, waiting, startup, restart, stall, lost)


# the facts, as their producers build them
START = JobStart(2, "1", 3, "c10d", "train.py")
ROUND = RdzvRound(1, 1, 2, 0, 0.4)
RESTART = Restart(1, "rank 1 failed", 2)


def ws(attempt: int = 0) -> WorkersStart:
    return WorkersStart(attempt, "0-1", (41873, 41874))


def we(outcome: WorkersOutcome = "succeeded", attempt: int = 0) -> WorkersEnd:
    return WorkersEnd(attempt, outcome)


def end(outcome: JobOutcome = "succeeded") -> JobEnd:
    return JobEnd(0 if outcome == "succeeded" else 1, outcome)


def training(seconds: float, attempt: int = 0) -> Training:
    return Training(attempt, seconds)


def kept(step: int, seconds: float) -> CheckpointKept:
    return CheckpointKept(step, "0-1", 1 << 20, seconds, "kept", None)


def refused(step: int) -> CheckpointKept:
    return CheckpointKept(step, "0-1", 1 << 30, 0.25, "refused", "1.0 GB does not fit in the 512 MB left")


def startup(spawn: float, store_max: float | None, attempt: int = 0) -> Startup:
    store_p50 = None if store_max is None else store_max / 2
    return Startup(attempt, 4.0, 0.4, spawn, 1.0, 1.5, 1, store_p50, store_max, None)


def stall(silent: float | None) -> Stall:
    return Stall("0-1", "rankrun: job 3f2c1a stalled: every rank silent", silent)


def stall_end(seconds: float) -> StallEnd:
    return StallEnd("0-1", seconds)


def excluded(*names: str) -> NodeExcluded:
    return NodeExcluded(names, "blamed for 2 failures (--max-node-failures 2)")


CASES = [
    # --- each part alone
    pytest.param([(100, START), (100.4, ROUND), (102.5, ws()), (110, we()), (110, end())],
                 gp(10, productive=7.5, waiting=2.5), id="waiting before the first attempt"),
    pytest.param([(100, START), (115, RESTART), (130, end())],
                 gp(30, waiting=30), id="a spare that never starts workers waits all along"),
    pytest.param([(100, START), (101, ws()), (106, training(4.0)), (120, we()), (120, end())],
                 gp(20, productive=15, waiting=1, startup=4), id="start-up ends at the first collective"),
    pytest.param([(100, START), (101, ws()), (101.75, training(0.5)), (120, we()), (120, end())],
                 gp(20, productive=18.5, waiting=1, startup=0.5), id="a first collective within a second"),
    pytest.param([(100, START), (101, ws()), (108, kept(5, 0.5)), (112, kept(10, 2.0)), (120, we()), (120, end())],
                 gp(20, productive=12.5, waiting=1, startup=6.5), id="start-up ends as the first kept save began"),
    pytest.param([(100, START), (101, ws()), (105, startup(0.25, 3.25)), (120, we()), (120, end())],
                 gp(20, productive=16, waiting=1, startup=3), id="start-up ends at the store's first request"),
    pytest.param([(100, START), (101, ws()), (105, startup(0.25, None)), (108, refused(5)), (120, we()), (120, end())],
                 gp(20, productive=19, waiting=1), id="no sign: start-up ends at the workers' start"),
    pytest.param([(100, START), (101, ws(0)), (102.5, training(1.0)), (110, we("failed")), (110.5, RESTART),
                  (113, ws(1)), (114.5, training(1.0, 1)), (120, we(attempt=1)), (120.25, end())],
                 gp(20.25, productive=6.25, waiting=1, startup=2, restart=3, lost=8), id="a restart between attempts"),
    pytest.param([(100, START), (101, ws()), (102, training(0.5)), (110, we("failed")), (112, end("failed"))],
                 gp(12, waiting=1, startup=0.5, restart=2, lost=8.5), id="a restart after the last attempt failed"),
    pytest.param([(100, START), (101, ws()), (103, training(1.0)), (110, stall(3.0)), (112, stall_end(5.0)),
                  (120, we()), (120, end())],
                 gp(20, productive=13, waiting=1, startup=1, stall=5), id="a stall from its silence to its end"),
    pytest.param([(100, START), (101, ws()), (103, training(1.0)), (110, stall(3.0)), (120, we()), (120, end())],
                 gp(20, productive=5, waiting=1, startup=1, stall=13), id="a stall with no end ends with the workers"),
    pytest.param([(100, START), (101, ws()), (103, training(1.0)), (110, stall(None)), (112, stall_end(2.0)),
                  (120, we()), (120, end())],
                 gp(20, productive=16, waiting=1, startup=1, stall=2), id="a stall of an older file starts at its report"),
    pytest.param([(100, START), (101, ws()), (104, stall(2.0)), (105, stall_end(3.0)), (108, training(6.0)),
                  (120, we()), (120, end())],
                 gp(20, productive=13, waiting=1, startup=3, stall=3), id="a stall during start-up is a stall"),
    pytest.param([(100, START), (101, ws()), (102, training(1.0)), (110, stall(3.0)), (112, stall_end(5.0)),
                  (114, stall(4.0)), (116, stall_end(6.0)), (120, we()), (120, end())],
                 gp(20, productive=9, waiting=1, startup=1, stall=9), id="overlapping stalls count once"),
    pytest.param([(100, START), (101, ws()), (102, training(1.0)), (105, kept(5, 0.25)), (108, kept(10, 0.25)),
                  (110, we("failed")), (110, end("failed"))],
                 gp(10, productive=6, waiting=1, startup=1, lost=2), id="lost since the newest kept step"),
    pytest.param([(100, START), (101, ws(0)), (102, training(1.0)), (105, kept(5, 0.25)), (108, we("failed")),
                  (108.5, RESTART), (110, ws(1)), (111, training(1.0, 1)), (113, refused(6)), (115, we("failed", 1)),
                  (115, end("failed"))],
                 gp(15, productive=3, waiting=1, startup=2, restart=2, lost=7),
                 id="an attempt that kept nothing loses all its training, whatever an earlier one kept"),
    pytest.param([(100, START), (101, ws()), (102, training(1.0)), (105, kept(5, 0.25)), (110, we()), (110, end())],
                 gp(10, productive=8, waiting=1, startup=1), id="nothing lost when the attempt succeeded"),
    pytest.param([(5012.337, START), (5012.727, RdzvRound(1, 1, 2, 0, 0.0002)), (5012.737, ws(0)),
                  (5016.117, we("failed")), (5016.147, RESTART), (5016.507, RdzvRound(2, 1, 2, 0, 0.0002)),
                  (5016.517, ws(1)), (5019.017, we(attempt=1)), (5019.047, end())],
                 gp(6.71, productive=2.53, waiting=0.4, restart=0.4, lost=3.38), id="docs/observing.md's example"),
    pytest.param([(100, START), (100.0004, ws()), (110.0007, we()), (110.0007, end())],
                 gp(10.001, productive=10.0), id="each part to the millisecond"),
    # --- the corner cases
    pytest.param([(100, START), (101, ws()), (103, startup(0.25, None)), (104, we("failed")), (105, end("failed"))],
                 gp(5, waiting=1, restart=1, lost=3),
                 id="a failure before any sign of training, in a job that never showed one: all lost"),
    pytest.param([(100, START), (101, ws(0)), (104, we("failed")), (104.5, RESTART), (105, ws(1)),
                  (106, training(1.0, 1)), (110, we(attempt=1)), (110, end())],
                 gp(10, productive=4, waiting=1, startup=4, restart=1),
                 id="a failure during start-up, in a job that trained later: all of that attempt is start-up"),
    pytest.param([(100, START), (101, ws(0)), (102, training(1.0)), (104, stall(1.0)), (106, stall(3.0)),
                  (107, StallEnd("0-1", 4.0)), (110, we()), (110, end())],
                 gp(10, productive=4, waiting=1, startup=1, stall=4),
                 id="a stall reported twice (its stacks moved) ends at its one stall.end"),
    pytest.param([(100, START), (104, ws(0)), (104.01, Preload("torch", 3.0, "ready")), (105, training(1.0)),
                  (110, we()), (110, end())],
                 gp(10, productive=5, waiting=1, startup=4), id="--preload's import before the first attempt is start-up"),
    pytest.param([(100, START), (102, ws(0)), (102.01, Preload("torch", 5.0, "ready")), (103, training(1.0)),
                  (104, we("failed")), (104.5, Preload("torch", 5.0, "unsafe", "a thread")), (105, ws(1)),
                  (106, training(1.0, 1)), (110, we(attempt=1)), (110, end())],
                 gp(10, productive=4, startup=4, restart=1, lost=1),
                 id="the import counts once, never more than the wait before the first attempt"),
    pytest.param([(100, START), (101, ws(1)), (102, training(0.5, 0)), (103, Startup(0, 2.0, 0.0, 0.1, None, None, None,
                                                                                    0.2, 0.5, None)),
                  (110, we(attempt=1)), (110, end())],
                 gp(10, productive=9, waiting=1), id="another attempt's signs are not this one's"),
    pytest.param([(100, START), (101, ws(0)), (102, training(1.0)), (104, kept(5, 0.25)), (108, stall(2.0)),
                  (112, we("stalled")), (112.5, RESTART), (115, ws(1)), (116, training(0.5, 1)), (120, we(attempt=1)),
                  (120, end())],
                 gp(20, productive=6.5, waiting=1, startup=1.5, restart=3, stall=6, lost=2),
                 id="a stall that ends in a restart: the stall, not lost, up to the workers' end"),
    pytest.param([(100, START), (159.5, ROUND), (160, ws()), (161, training(0.75)), (200, we()), (200, end())],
                 gp(100, productive=39.25, waiting=60, startup=0.75), id="a node that joins mid-job"),
    pytest.param([(100, START), (101, ws()), (102, training(1.0)), (106, kept(20, 0.25)), (109, we("interrupted")),
                  (109.5, end("interrupted"))],
                 gp(9.5, productive=4, waiting=1, startup=1, restart=0.5, lost=3), id="a job stopped by a signal"),
    pytest.param([(100, START), (101, ws()), (102, training(1.0)), (106, kept(20, 0.25)), (109, end("interrupted"))],
                 gp(9, productive=4, waiting=1, startup=1, lost=3), id="a signal ends the job as its workers run"),
    pytest.param([(100, START), (101, ws()), (102, training(1.0)), (106, kept(20, 0.25)), (109, end("succeeded"))],
                 gp(9, productive=7, waiting=1, startup=1), id="workers still running at a job.end that succeeded"),
    pytest.param([(100, START), (101, ws(0)), (102, training(1.0)), (106, kept(20, 0.25)), (109, we("moved_on")),
                  (109.5, NodeLost(("n3 at 127.0.0.3",), "lease expired")), (110, RESTART), (112, ws(1)),
                  (113, training(1.0, 1)), (120, we(attempt=1)), (120, end())],
                 gp(20, productive=11, waiting=1, startup=2, restart=3, lost=3), id="an attempt that moved on"),
    pytest.param([(100, START), (101, ws()), (102, training(1.0)), (105, kept(5, 0.25)), (110, we()), (110, end()),
                  (111, ws(1)), (112, stall(1.0)), (115, we("failed", 1)), (116, excluded(ME)), (118, end("failed"))],
                 gp(10, productive=8, waiting=1, startup=1), id="events after job.end are left out"),
]


@pytest.mark.parametrize(("pairs", "expected"), CASES)
def test_each_part_of_a_hand_written_sequence(pairs, expected):
    assert account(stamped(*pairs)) == expected
    assert account(stamped(*pairs), now=1e6) == expected  # ended: whatever now says


@pytest.mark.parametrize("outcome", ["failed", "stopped", "interrupted", "moved_on", "stalled"])
def test_an_attempt_that_did_not_succeed_loses_its_training_since_the_newest_kept_step(outcome):
    pairs = [(100, START), (101, ws()), (102, training(1.0)), (106, kept(20, 0.25)), (109, we(outcome)),
             (111, end("failed"))]
    assert account(stamped(*pairs)) == gp(11, productive=4, waiting=1, startup=1, restart=2, lost=3)


SIGNS = {  # (the event, at mono): each marks a different moment, all in the attempt that started at 101
    "collective": (training(2.0), 103.0),  # the first collective
    "save": (kept(5, 0.5), 105.5),  # kept at 106: its save began at 105.5
    "store": (startup(0.25, 1.25), 102.0),  # spawn began at 100.75, the store's last first request 1.25 s on
}
TRUST = ("collective", "save", "store")  # most trusted first


@pytest.mark.parametrize("order", [o for n in (1, 2, 3) for o in itertools.permutations(TRUST, n)],
                         ids=" then ".join)
def test_the_most_trusted_sign_ends_start_up_in_whatever_order_they_come(order):
    monos = iter((106.0, 107.0, 108.0))
    pairs: list[Pair] = [(100, START), (101, ws())]
    for name in order:
        fact, _ = SIGNS[name]
        at = next(monos)
        if isinstance(fact, CheckpointKept):  # its sign is its mono less its blocking seconds: keep it at 105.5
            fact = kept(5, at - 105.5)
        pairs.append((at, fact))
    pairs += [(120, we()), (120, end())]
    best = min(order, key=TRUST.index)
    sign = SIGNS[best][1]
    ledger = Ledger()
    for event in stamped(*pairs):
        ledger.add(event)
    assert ledger.at(0) == gp(20, productive=120 - sign, waiting=1, startup=sign - 101)
    assert ledger.sign == {"collective": "the first collective", "save": "the first kept save",
                           "store": "the store's first requests"}[best]


def test_the_sign_words_and_counts_of_the_ledger():
    ledger = Ledger()
    assert ledger.sign is None
    for event in stamped((100, START), (101, ws(0)), (102, training(0.5)), (103, we("failed")), (103.5, RESTART),
                         (104, ws(1))):
        ledger.add(event)
    assert (ledger.sign, ledger.restarts, ledger.kept_any) == ("the first collective", 1, False)
    for event in stamped((105, kept(5, 0.25)), (106, we("failed", 1)), (106.5, RESTART), (107, ws(2)),
                         (108, we("succeeded", 2))):
        ledger.add(event)
    assert (ledger.sign, ledger.restarts, ledger.kept_any) == (None, 2, True)  # attempt 2 showed no sign


def test_a_kept_step_between_attempts_is_counted_as_kept_but_moves_no_boundary():
    pairs = [(100, START), (101, ws()), (102, training(1.0)), (105, we("failed")), (106, kept(3, 0.25)),
             (108, end("failed"))]
    ledger = Ledger()
    for event in stamped(*pairs):
        ledger.add(event)
    assert ledger.kept_any
    assert ledger.at(0) == gp(8, waiting=1, startup=1, restart=3, lost=3)


# --- exclusion


@pytest.mark.parametrize("name", [ME, f"host-b/{ME}", f"n2 at {ME}"])
def test_after_this_node_is_excluded_its_time_is_waiting(name):
    pairs = [(100, START), (101, ws()), (102, training(1.0)), (110, we("failed")), (110.5, RESTART),
             (113, excluded("n9 at 127.0.0.9", name)), (115, end("error"))]
    assert account(stamped(*pairs)) == gp(15, waiting=3, startup=1, restart=3, lost=8)


@pytest.mark.parametrize("name", ["127.0.0.3", "host-c/127.0.0.3", "n3 at 127.0.0.3", f"host-b/{ME}2",
                                  f"n2 at {ME}0", f"{ME}.5", f"x{ME}", f"host-b/1{ME}"])
def test_another_nodes_exclusion_changes_nothing(name):
    pairs = [(100, START), (101, ws()), (102, training(1.0)), (110, we("failed")), (110.5, RESTART),
             (113, excluded(name)), (115, end("error"))]
    assert account(stamped(*pairs)) == gp(15, waiting=1, startup=1, restart=5, lost=8)


def test_an_exclusion_told_while_the_workers_run_moves_no_boundary():
    pairs = [(100, START), (101, ws()), (102, training(1.0)), (105, excluded(f"n2 at {ME}")), (110, we("failed")),
             (115, end("error"))]
    assert account(stamped(*pairs)) == gp(15, waiting=1, startup=1, restart=5, lost=8)


def test_the_ledger_knows_its_node_from_the_events_unless_told():
    pairs = [(100, START), (101, ws()), (110, we("failed")), (113, excluded(f"n2 at {ME}")), (115, end("error"))]
    told = Ledger(node="127.0.0.9")  # another node reading this file's excluded name: not its own
    for event in stamped(*pairs):
        told.add(event)
    assert told.at(0) == gp(15, waiting=1, restart=5, lost=9)
    assert account(stamped(*pairs)) == gp(15, waiting=3, restart=3, lost=9)


# --- a job still running


def test_a_sequence_without_job_end_runs_to_now_or_to_its_last_event():
    pairs = [(100, START), (101, ws()), (102, training(1.0))]
    assert account(stamped(*pairs), now=110) == gp(10, productive=8, waiting=1, startup=1)
    assert account(stamped(*pairs)) == gp(2, waiting=1, startup=1)
    gap = [(100, START), (101, ws()), (102, training(1.0)), (105, we("failed"))]
    assert account(stamped(*gap), now=108) == gp(8, waiting=1, startup=1, restart=3, lost=3)
    assert account([]) == gp(0)
    assert account(stamped((100, START)), now=104.5) == gp(4.5, waiting=4.5)


def test_the_ledger_mid_attempt_counts_start_up_until_a_sign_then_productive():
    ledger = Ledger()
    for event in stamped((100, START), (101, ws())):
        ledger.add(event)
    assert ledger.at(105) == gp(5, waiting=1, startup=4)  # no sign yet: start-up so far
    ledger.add(stamp(startup(0.25, 2.25), T0 + 106, 106, RUN, ME))  # the store's: at 103
    assert ledger.at(110) == gp(10, productive=7, waiting=1, startup=2)
    assert ledger.at(102.5) == gp(2.5, waiting=1, startup=1.5)  # before the sign's moment: still start-up
    ledger.add(stamp(stall(2.0), T0 + 111, 111, RUN, ME))  # silent since 109, not over
    assert ledger.at(112) == gp(12, productive=6, waiting=1, startup=2, stall=3)
    ledger.add(stamp(JobEnd(0, "succeeded"), T0 + 113, 113, RUN, ME))
    assert ledger.at(200) == ledger.at(0) == gp(13, productive=6, waiting=1, startup=2, stall=4)


# --- the sum, over random sequences

OUTCOMES: tuple[WorkersOutcome, ...] = ("succeeded", "failed", "stopped", "interrupted", "moved_on", "stalled")
ENDINGS: tuple[JobOutcome, ...] = ("succeeded", "failed", "interrupted", "error")


@st.composite
def sequences(draw: st.DrawFn) -> tuple[list[Pair], bool, float]:
    """A well-formed node's sequence: a job start, attempts (each with signs, kept and refused steps, stalls, in any
    order, and an outcome; the last one maybe still running), restarts and exclusions between them, gaps of any
    length; the job's end or not, and events after it. Returns the pairs, whether it ended, and a ``now``."""
    t = 100.0
    pairs: list[Pair] = [(t, START)]

    def later() -> float:
        nonlocal t
        t = round(t + draw(st.floats(0.0, 30.0)), 4)
        return t

    attempts = draw(st.integers(0, 4))
    for attempt in range(attempts):
        if attempt and draw(st.booleans()):
            pairs.append((later(), RESTART))
        if draw(st.integers(0, 4)) == 0:
            pairs.append((later(), excluded(draw(st.sampled_from([f"n2 at {ME}", "n9 at 127.0.0.9"])))))
        start = later()
        pairs.append((start, ws(attempt)))
        for _ in range(draw(st.integers(0, 6))):
            at = later()
            pairs.append((at, _inside(draw, attempt, at - start)))
        if attempt < attempts - 1 or draw(st.booleans()):
            pairs.append((later(), we(draw(st.sampled_from(OUTCOMES)), attempt)))
    ended = draw(st.booleans())
    if ended:
        pairs.append((later(), end(draw(st.sampled_from(ENDINGS)))))
        if draw(st.booleans()):
            pairs += [(later(), ws(attempts)), (later(), we("failed", attempts)), (later(), end("failed"))]
    return pairs, ended, later()


def _inside(draw: st.DrawFn, attempt: int, age: float) -> Record:
    """An event of a running attempt ``age`` seconds old: a sign of training, a step kept or refused, a stall's start
    (silent since before the attempt, maybe) or end."""
    kind = draw(st.sampled_from(["training", "kept", "refused", "startup", "stall", "stall.end"]))
    if kind == "training":
        return training(draw(st.floats(0.0, age)), attempt)
    if kind == "kept":
        return kept(attempt, draw(st.floats(0.0, age)))
    if kind == "refused":
        return refused(attempt)
    if kind == "startup":
        spawn = draw(st.floats(0.0, 1.0))
        return startup(spawn, draw(st.none() | st.floats(0.0, age + spawn)), attempt)
    if kind == "stall":
        return stall(draw(st.none() | st.floats(0.0, age + 5.0)))
    return stall_end(draw(st.floats(0.0, age)))


def _parts(a: Goodput) -> list[float]:
    return [a.productive_s, a.waiting_s, a.startup_s, a.restart_s, a.stall_s, a.lost_s]


@settings(max_examples=200, deadline=None)
@given(sequences())
def test_the_parts_are_never_negative_and_sum_to_the_wall_time(drawn):
    pairs, ended, now = drawn
    events = stamped(*pairs)
    a = account(events, now)
    last = next(m for m, fact in pairs if isinstance(fact, JobEnd)) if ended else now  # the first job.end
    assert a.wall_s == pytest.approx(last - 100.0, abs=0.001)
    assert all(part >= 0 for part in _parts(a))
    assert abs(sum(_parts(a)) - a.wall_s) <= 0.001 * len(goodput.PARTS)
    facts = [fact for m, fact in pairs if not ended or m <= last]
    if not any(isinstance(f, Stall) for f in facts):
        assert a.stall_s == 0
    if not any(isinstance(f, NodeExcluded) for f in facts):  # waiting: the time before the first attempt
        first = next((m for m, f in pairs if isinstance(f, WorkersStart) and m <= last), last)
        assert a.waiting_s == pytest.approx(first - 100.0, abs=0.001)
    outcomes = [f.outcome for f in facts if isinstance(f, WorkersEnd)]
    closed = sum(isinstance(f, WorkersStart) for f in facts) == len(outcomes)
    if closed and all(o == "succeeded" for o in outcomes):  # nothing failed: nothing lost, nothing restarted
        assert a.lost_s == a.restart_s == 0


@settings(max_examples=100, deadline=None)
@given(sequences(), st.floats(0.0, 20.0))
def test_the_account_so_far_only_grows_with_time(drawn, later):
    pairs, _, _ = drawn
    ledger, wall = Ledger(), 0.0
    for event in stamped(*pairs):
        ledger.add(event)
        now = ledger.at(event.mono)
        assert now.wall_s >= wall
        wall = now.wall_s
        then = ledger.at(event.mono + later)  # the same events, later: no part shrinks
        assert then.wall_s >= now.wall_s
        assert all(b >= a - 0.001 for a, b in zip(_parts(now), _parts(then), strict=True))
        assert abs(sum(_parts(then)) - then.wall_s) <= 0.001 * len(goodput.PARTS)


@settings(max_examples=100, deadline=None)
@given(sequences(), st.floats(0.0, 20.0), st.sampled_from(["succeeded", "failed", "signalled"]))
def test_the_account_a_job_end_carries_is_the_one_the_ledger_keeps_after_it(drawn, later, outcome):
    pairs, _, _ = drawn
    ledger = Ledger()
    for event in stamped(*pairs):
        ledger.add(event)
    now = max((m for m, _ in pairs), default=100.0) + later
    before = ledger.at(now)
    carried = ledger.at_end(now, succeeded=outcome == "succeeded")
    assert ledger.at(now) == before  # asking changed nothing
    (closing,) = stamped((now, end(outcome)))
    ledger.add(closing)
    assert carried == ledger.at(now) == ledger.at(now + 5)  # and the account stops at the end


def test_a_job_that_ends_in_an_open_attempt_carries_its_time_as_the_end_makes_it():
    ledger = Ledger()
    for event in stamped((100, START), (100, ROUND), (101, ws()), (102, training(0.5)), (110, kept(3, 0.1))):
        ledger.add(event)
    assert ledger.at(120).productive_s > 15  # still running: the attempt's time since its sign is work so far
    failed = ledger.at_end(120, succeeded=False)  # ended by a signal: work since the kept step is lost
    assert failed.lost_s == pytest.approx(10, abs=0.01) and failed.productive_s < 10
    assert ledger.at_end(120, succeeded=True).lost_s == 0


# --- the job's account


def test_the_job_takes_the_longest_wall_and_the_worst_nodes_parts_its_missing_time_waiting():
    a = gp(20, productive=15, waiting=1, startup=2, restart=1, stall=0.5, lost=0.5)
    b = gp(19.5, productive=10, waiting=2, startup=3, restart=2, stall=1, lost=1.5)
    assert job([a, b]) == job([b, a]) == gp(20, productive=10, waiting=2.5, startup=3, restart=2, stall=1, lost=1.5)
    assert job([a]) == a


def test_the_worst_node_is_the_least_productive_share_not_the_fewest_seconds():
    short = gp(10, productive=6, waiting=4)  # 60 %, 6 s
    long = gp(20, productive=9, waiting=11)  # 45 %, 9 s
    assert job([short, long]) == gp(20, productive=9, waiting=11)
    even, longer = gp(10, productive=5, waiting=5), gp(20, productive=10, waiting=10)  # a tie: the longer one
    assert job([even, longer]) == job([longer, even]) == gp(20, productive=10, waiting=10)


def test_a_node_with_no_time_is_never_the_worst_and_no_nodes_is_no_time():
    assert share(gp(0)) == 1.0
    assert share(gp(8, productive=2, waiting=6)) == 0.25
    assert share(gp(0.5, productive=0.125, startup=0.375)) == 0.25  # under a second is time too
    assert job([gp(0), gp(10, productive=9, waiting=1)]) == gp(10, productive=9, waiting=1)
    assert job([]) == gp(0)


def test_the_jobs_waiting_is_rounded_to_the_millisecond():
    assert job([gp(10.0004, productive=10.0004), gp(9.9, productive=5, waiting=4.9)]) == gp(10.0004, productive=5,
                                                                                             waiting=5.0)


# --- the line


EXAMPLE = Goodput(40.1, 35.09, 0.0, 2.5, 2.0, 0.0, 0.51)


def test_the_line_is_the_issues_example():
    assert line(EXAMPLE, 1) == ("goodput 87.5 % of 40.1 s — start-up 6.2 %, restarts 5.0 % (1), stalls 0 %, lost 1.3 %, "
                                "waiting 0 %")
    assert line(Goodput(40.1, 35.09, 0.0, 2.5, 2.0, 0.0, 0.51), 1, kept=True, nodes=1, worst="n2") == line(EXAMPLE, 1)


def test_the_line_says_nothing_was_kept_only_when_time_was_lost():
    words = "; nothing was kept (rankrun.checkpoint): each failed attempt lost all its training"
    assert line(EXAMPLE, 1, kept=False) == line(EXAMPLE, 1) + words
    assert words not in line(gp(10, productive=10), 0, kept=False)


def test_the_line_of_several_nodes_names_the_worst():
    assert line(EXAMPLE, 2, nodes=3, worst="n2 at 10.0.0.2") == (
        "goodput 87.5 % of 40.1 s (the job, 3 nodes; the worst: n2 at 10.0.0.2) — start-up 6.2 %, restarts 5.0 % (2), "
        "stalls 0 %, lost 1.3 %, waiting 0 %")
    assert line(EXAMPLE, 1, nodes=2, worst="n1 at 10.0.0.1").startswith(
        "goodput 87.5 % of 40.1 s (the job, 2 nodes; the worst: n1 at 10.0.0.1) — ")


@pytest.mark.parametrize(("wall", "words"), [(0.04, "0.0 s"), (599.94, "599.9 s"), (600, "10 min"),
                                             (7140, "119 min"), (7200, "2 h 00 min"), (7500, "2 h 05 min"),
                                             (90_000, "25 h 00 min")])
def test_the_line_gives_long_wall_times_in_minutes_and_hours(wall, words):
    assert line(gp(wall, productive=wall), 0).startswith(f"goodput 100.0 % of {words} — start-up 0 %,")


def test_a_part_of_almost_nothing_shows_and_no_time_at_all_is_zero():
    assert line(gp(40, productive=39.99, stall=0.01), 0) == (
        "goodput 100.0 % of 40.0 s — start-up 0 %, restarts 0 % (0), stalls 0.0 %, lost 0 %, waiting 0 %")
    assert line(gp(0), 0) == "goodput 0 % of 0.0 s — start-up 0 %, restarts 0 % (0), stalls 0 %, lost 0 %, waiting 0 %"
    # another node's value (from_value) with parts and no wall time: still a line, not a ZeroDivisionError
    assert line(gp(0, productive=1, lost=1), 0, kept=False).startswith("goodput 0 % of 0.0 s — start-up 0 %,")


# --- the value in job.end and the store


def test_the_value_round_trips_through_json():
    value = as_value(EXAMPLE)
    assert list(value) == ["wall_s", "productive_s", "waiting_s", "startup_s", "restart_s", "stall_s", "lost_s"]
    assert value == {"wall_s": 40.1, "productive_s": 35.09, "waiting_s": 0.0, "startup_s": 2.5, "restart_s": 2.0,
                     "stall_s": 0.0, "lost_s": 0.51}
    assert from_value(json.loads(json.dumps(value))) == EXAMPLE
    assert from_value(dict.fromkeys(value, 0)) == gp(0)  # JSON's integers are seconds too
    assert from_value({**value, "later": 1.0}) == EXAMPLE  # a key a later version adds


@pytest.mark.parametrize("bad", [
    None, 40.1, "40.1", [40.1] * 7, {}, {k: v for k, v in as_value(EXAMPLE).items() if k != "lost_s"},
    {**as_value(EXAMPLE), "lost_s": None}, {**as_value(EXAMPLE), "lost_s": "a lot"},
    {**as_value(EXAMPLE), "lost_s": "0.51"}, {**as_value(EXAMPLE), "lost_s": True}, {**as_value(EXAMPLE), "lost_s": [1]},
    {**as_value(EXAMPLE), "lost_s": -0.51}, {**as_value(EXAMPLE), "wall_s": math.nan},
    {**as_value(EXAMPLE), "wall_s": math.inf},
], ids=repr)
def test_anything_else_is_no_account(bad):
    assert from_value(bad) is None


def test_a_node_that_only_waited_is_not_the_jobs_worst_unless_every_node_only_waited():
    """A spare, or a node excluded before it ran workers: its waiting is not the job's (the timeline page's case)."""
    ran = gp(19.05, productive=9.1, waiting=0.95, startup=0.8, restart=3.3, lost=4.9)
    spare = gp(0.1, waiting=0.1)
    assert job([ran, spare]) == job([spare, ran]) == ran
    assert job([spare, gp(5, waiting=5)]) == gp(5, waiting=5)
