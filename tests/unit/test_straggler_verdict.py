"""The straggler rule (``rankrun.straggler.verdict``) on windows built as the watch would record them: arrivals of
synchronous steps (every rank computes ~50 ms, a slow one more, then they all_reduce), and stack-sample counts; and
the clock-offset estimate (``rankrun.straggler.clock``) on round trips with an injected skew."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rankrun.straggler import clock, verdict
from rankrun.straggler.verdict import RankWindow, Straggler

WINDOW = 20.0


def _steps(ranks: int, steps: int, extra: dict[int, float], *, jitter: float = 0.002, seed: int = 1,
           pause: dict[int, float] | None = None) -> dict[tuple[str, int], dict[int, float]]:
    """Arrivals of ``steps`` all_reduces: each rank computes 50 ms (± jitter), plus ``extra[rank]``; every rank leaves
    a collective when the last arrives. ``pause``: step → seconds every rank spends loading data before it."""
    rng = random.Random(seed)
    out, released = {}, 0.0
    for seq in range(1, steps + 1):
        wait = (pause or {}).get(seq, 0.0)
        when = {r: released + wait + 0.050 + extra.get(r, 0.0) + rng.uniform(-jitter, jitter) for r in range(ranks)}
        out[("0", seq)] = when
        released = max(when.values())
    return out


def _where(ranks: int, per_node: int = 2) -> list[RankWindow]:
    return [RankWindow(r, f"node-{r // per_node}/127.0.0.{r // per_node + 1}", cpu=1.0, state="R") for r in range(ranks)]


def test_a_rank_slower_by_250_ms_on_every_step_is_named_with_its_lag_within_a_quarter():
    found = verdict.judge(_where(4), _steps(4, 60, {3: 0.250}), WINDOW)
    assert [s.rank for s in found] == [3]
    (s,) = found
    assert s.late == s.total == 60 and 0.75 * 0.250 <= s.lag <= 1.25 * 0.250  # type: ignore[operator]
    assert verdict.line(s) == ("rankrun: straggler: rank 3 on node-1/127.0.0.2 — the other ranks waited for it in 100 % "
                               f"of 60 collectives (median lag +{s.lag * 1000:.0f} ms); CPU 100 %, running")  # type: ignore[operator]


def test_a_balanced_job_names_nobody_whatever_its_jitter():
    for seed in range(20):
        assert verdict.judge(_where(8), _steps(8, 200, {}, jitter=0.004, seed=seed), WINDOW) == []


def test_two_ranks_one_slow_the_reference_is_the_first_to_arrive():
    found = verdict.judge(_where(2), _steps(2, 40, {0: 0.030}), WINDOW)
    assert [(s.rank, s.late) for s in found] == [(0, 40)]


def test_every_rank_of_a_slow_node_is_named_not_only_the_last_of_them():
    found = verdict.judge(_where(8, per_node=4), _steps(8, 60, dict.fromkeys(range(4, 8), 0.100)), WINDOW)
    assert sorted(s.rank for s in found) == [4, 5, 6, 7]
    assert all(s.where == "node-1/127.0.0.2" for s in found)


def test_late_once_is_no_straggler_however_late():
    arrivals = _steps(4, 60, {})
    arrivals[("0", 30)] = {**arrivals[("0", 30)], 2: arrivals[("0", 30)][2] + 2.0}  # a 2 s hiccup: a page fault storm
    assert verdict.judge(_where(4), arrivals, WINDOW) == []


def test_a_rank_late_in_a_minority_of_collectives_is_not_named():
    arrivals = _steps(4, 60, {})
    for seq in range(1, 61, 3):  # late on a third of them
        arrivals[("0", seq)] = {**arrivals[("0", seq)], 1: arrivals[("0", seq)][1] + 0.1}
    assert verdict.judge(_where(4), arrivals, WINDOW) == []


def test_a_small_lag_that_costs_the_job_little_is_not_named():
    # 6 ms late on every one of 40 collectives in 20 s: 1.2 % of the window
    assert verdict.judge(_where(4), _steps(4, 40, {2: 0.006}, jitter=0.0005), WINDOW) == []


def test_data_loading_on_every_rank_names_nobody():
    pauses = dict.fromkeys(range(1, 80, 10), 1.5)
    assert verdict.judge(_where(4), _steps(4, 80, {}, pause=pauses), WINDOW) == []


def test_a_collective_only_one_rank_reached_yet_is_not_counted():
    arrivals = _steps(4, 60, {})
    arrivals[("0", 61)] = {0: 999.0}
    assert verdict.lags(arrivals)[0][0] == 60


def test_collectives_of_other_groups_are_judged_within_their_own_ranks():
    arrivals = _steps(4, 30, {}) | {("1", seq): when for (_, seq), when in _steps(2, 30, {1: 0.2}).items()}
    assert [s.rank for s in verdict.judge(_where(4), arrivals, WINDOW)] == [1]


def _sampled(waiting: dict[int, int], samples: int = 30) -> list[RankWindow]:
    return [RankWindow(r, "node-0/127.0.0.1", samples, w, cpu=0.98 if w < samples // 2 else 0.05,
                       state="R" if w < samples // 2 else "S") for r, w in waiting.items()]


def test_without_arrivals_the_rank_almost_never_found_waiting_while_the_others_are_is_named():
    found = verdict.judge(_sampled({0: 25, 1: 26, 2: 1, 3: 24}), {}, WINDOW)
    assert [s.rank for s in found] == [2]
    assert verdict.line(found[0]) == (
        "rankrun: straggler: rank 2 on node-0/127.0.0.1 — the other ranks were found waiting in a collective in 83 % of "
        "their stack samples, it in 3 % (no Flight Recorder arrivals); CPU 98 %, running")


@pytest.mark.parametrize("waiting", [
    {0: 0, 1: 1, 2: 0, 3: 0},  # idle, between steps, or loading data on every rank
    {0: 15, 1: 14, 2: 16, 3: 15},  # balanced
])
def test_without_arrivals_an_idle_job_and_a_balanced_one_name_nobody(waiting):
    assert verdict.judge(_sampled(waiting), {}, WINDOW) == []


@pytest.mark.parametrize(("waiting", "samples"), [
    ({0: 30, 1: 30, 2: 0, 3: 30}, 30),  # a stall: the others wait in every sample (the stall report's), rank 2 elsewhere
    ({0: 30, 1: 30, 2: 30, 3: 30}, 30),  # every rank in one collective throughout
    ({0: 5, 1: 5, 2: 0, 3: 5}, 6),  # too few samples
    ({0: 25}, 30),  # one rank: nobody to wait for it
])
def test_a_stall_or_too_little_to_go_on_leaves_the_verdict_as_it_was(waiting, samples):
    assert verdict.judge(_sampled(waiting, samples), {}, WINDOW) is None


def test_a_main_thread_in_a_collective_is_told_from_one_joining_or_leaving_the_group():
    dist = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"
    assert verdict.in_collective([("train.py", "<module>"), ("train.py", "step"), (dist, "wrapper"), (dist, "all_reduce")])
    assert not verdict.in_collective([("train.py", "<module>"), ("train.py", "step"), ("train.py", "forward")])
    assert not verdict.in_collective([("train.py", "<module>"), (dist, "init_process_group"), (dist, "rendezvous")])


def test_arrivals_decide_when_there_are_enough_and_samples_do_not_overrule_them():
    # the samples would name rank 2, the arrivals (a balanced job) name nobody
    assert verdict.judge(_sampled({0: 25, 1: 26, 2: 1, 3: 24}), _steps(4, 60, {}), WINDOW) == []


def test_only_a_changed_verdict_is_said_and_a_rank_that_catches_up_is_said_once():
    slow = Straggler(3, "node-1/127.0.0.2", 0.8, 60, 60, 0.25)
    other = Straggler(1, "node-0/127.0.0.1", 0.5, 50, 60, 0.1)
    assert [c.line for c in verdict.changes({}, [slow])] == [verdict.line(slow)]
    assert verdict.changes({3: slow}, [slow]) == []
    assert verdict.changes({3: slow}, [other]) == [
        verdict.Change(other, True, verdict.line(other)),
        verdict.Change(slow, False, "rankrun: straggler: rank 3 on node-1/127.0.0.2 keeps up again: the others no "
                                    "longer wait for it")]
    assert verdict.streaks({3: 2}, [slow, other]) == {3: 3, 1: 1}


def test_a_rank_that_stays_slow_is_blamed_every_third_window_and_a_window_without_it_starts_it_afresh():
    """``--max-node-failures 3`` excludes a node blamed 3 times: after 9 slow windows in a row, not 5."""
    slow = Straggler(3, "node-1/127.0.0.2", 0.8, 60, 60, 0.25)
    counts: dict[int, int] = {}
    blamed_in = []
    for window in range(1, 10):
        counts, due = verdict.blamed(counts, [slow], 3)
        if due:
            assert due == [slow]
            blamed_in.append(window)
    assert blamed_in == [3, 6, 9]
    counts, due = verdict.blamed({3: 2}, [], 3)  # it kept up for a window: the next slow window is its first again
    assert (counts, due) == ({}, [])
    assert verdict.blamed(counts, [slow], 3) == ({3: 1}, [])


# --- clock offsets


def test_an_injected_skew_is_recovered_within_half_the_shortest_round_trip():
    rng = random.Random(7)
    for skew in (0.050, -0.050):
        exchanges = []
        now = 100.0
        for _ in range(10):
            there = rng.uniform(0.0002, 0.005)  # each way: loopback and a busy store, not symmetric
            back = rng.uniform(0.0002, 0.005)
            exchanges.append(clock.Exchange(now, now + there + skew, now + there + back))
            now += 0.1
        found = clock.estimate(exchanges)
        assert found is not None and abs(found.offset - skew) <= found.error <= 0.005
        assert abs(found.offset - skew) <= 0.002
        assert found.to_remote(1.0) == pytest.approx(1.0 + found.offset)


def test_the_shortest_round_trip_is_trusted_and_a_backwards_one_is_left_out():
    slow = clock.Exchange(0.0, 10.5, 1.0)  # 1 s round trip
    quick = clock.Exchange(2.0, 12.001, 2.002)
    backwards = clock.Exchange(5.0, 0.0, 4.0)
    found = clock.estimate([slow, backwards, quick])
    assert found == clock.Offset(pytest.approx(10.0), pytest.approx(0.001))  # type: ignore[arg-type]
    assert clock.estimate([backwards]) is None and clock.estimate([]) is None


# --- recorded: the arrivals files of two real 4-rank gloo jobs (tests/payloads/gloo_steps.py, 8 s each), as the shim
# wrote them: rank 2 computing 300 ms a step against 50 ms, and every rank 50 ms


def _recorded(name: str) -> tuple[dict[tuple[str, int], dict[int, float]], float]:
    from rankrun.agent.stragglers.watch import LocalArrivals  # noqa: PLC0415 - the agent's reader of the same files

    folder = Path(__file__).resolve().parents[1] / "golden" / name
    arrivals = LocalArrivals({r: folder / f"rank_{r}.fr" for r in range(4)}).complete()
    times = [t for when in arrivals.values() for t in when.values()]
    return arrivals, max(times) - min(times)


def test_a_recorded_job_with_one_slow_rank_names_it_with_its_lag_within_a_quarter():
    arrivals, span = _recorded("arrivals_slow_rank_2")
    found = verdict.judge(_where(4), arrivals, span)
    assert found is not None and [s.rank for s in found] == [2]
    assert found[0].late >= 0.9 * found[0].total and 0.75 * 0.25 <= found[0].lag <= 1.25 * 0.25  # type: ignore[operator]


def test_a_recorded_balanced_job_names_nobody():
    arrivals, span = _recorded("arrivals_balanced")
    assert len(arrivals) >= 100
    assert verdict.judge(_where(4), arrivals, span) == []


# --- the rule's thresholds, each exactly on its boundary and just past it (times exact in binary: 0.0 and k/4)


def _exact(late: dict[int, float], collectives: int, ranks: int = 4) -> dict[tuple[str, int], dict[int, float]]:
    """``collectives`` collectives every rank entered at 0.0 but each rank in ``late``, which entered every one of
    them ``late[rank]`` seconds later."""
    return {("0", seq): {r: late.get(r, 0.0) for r in range(ranks)} for seq in range(collectives)}


def test_a_lag_of_exactly_the_floor_is_late_and_just_below_it_is_jitter():
    ((count, lags),) = [v for r, v in verdict.lags(_exact({3: verdict.LAG_FLOOR}, 1)).items() if r == 3]
    assert (count, lags) == (1, [verdict.LAG_FLOOR])
    assert verdict.lags(_exact({3: verdict.LAG_FLOOR * 0.999}, 1))[3] == (1, [])


def test_exactly_min_collectives_are_judged_and_one_fewer_tells_nothing():
    window = 1.0  # lags of 0.25 s: far over the cost threshold; no stack samples to fall back on
    assert [s.rank for s in verdict.judge(_where(4), _exact({3: 0.25}, verdict.MIN_COLLECTIVES), window)] == [3]
    assert verdict.judge(_where(4), _exact({3: 0.25}, verdict.MIN_COLLECTIVES - 1), window) is None


def test_late_on_exactly_the_share_is_named_and_on_one_fewer_is_not():
    arrivals = _exact({}, 8)
    for seq in range(4):  # late on 4 of 8: exactly SHARE
        arrivals[("0", seq)][3] = 0.25
    assert [s.rank for s in verdict.judge(_where(4), arrivals, 1.0)] == [3]
    arrivals[("0", 3)][3] = 0.0  # 3 of 8
    assert verdict.judge(_where(4), arrivals, 1.0) == []


def test_lags_adding_up_to_exactly_the_cost_are_named_and_a_longer_window_is_not():
    arrivals = _exact({3: 0.25}, 8)  # 8 x 0.25 = 2.0 s of lag
    exact = 2.0 / verdict.COST  # the window in which 2.0 s is exactly COST
    assert [s.rank for s in verdict.judge(_where(4), arrivals, exact)] == [3]
    assert verdict.judge(_where(4), arrivals, exact * 1.001) == []
    assert [s.rank for s in verdict.judge(_where(4), arrivals, exact * 1.001, scale=1.01)] == [3]  # a sample's scale counts


def _shares(its: tuple[int, int], others: tuple[int, int]) -> list[RankWindow]:
    """Rank 0 waiting ``its[0]`` of ``its[1]`` samples; ranks 1-3 ``others[0]`` of ``others[1]``."""
    return [RankWindow(0, "node-0", samples=its[1], waiting=its[0])] + [
        RankWindow(r, f"node-{r}", samples=others[1], waiting=others[0]) for r in (1, 2, 3)]


@pytest.mark.parametrize(("its", "others", "named"), [
    ((3, 12), (6, 12), True),  # exactly ITS_WAITING (0.25), the others exactly OTHERS_WAITING (0.5)
    ((4, 12), (6, 12), False),  # over ITS_WAITING
    ((3, 12), (5, 12), False),  # the others under OTHERS_WAITING
    ((0, 50), (49, 50), True),  # the others exactly PROGRESS (0.98)
    ((0, 10), (10, 10), None),  # every other rank always waiting: the job's median over PROGRESS, a stall
    ((0, 10), (6, 10), True),  # exactly MIN_SAMPLES each
    ((0, 9), (6, 9), None),  # one fewer: too little to go on
], ids=["its-at", "its-over", "others-under", "progress-at", "stall", "min-samples-at", "min-samples-under"])
def test_the_sample_rule_on_each_boundary(its, others, named):
    found = verdict.judge(_shares(its, others), {}, WINDOW)
    if named is None:
        assert found is None
    else:
        assert found is not None and (0 in [s.rank for s in found]) is named
