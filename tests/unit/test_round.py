"""The rendezvous decisions (pure): placement invariants by hypothesis, the round's steps by table."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rankrun.rendezvous.coordinator import RoundState
from rankrun.rendezvous.round import (
    Finish,
    NodeInfo,
    Phase,
    Placement,
    Regroup,
    Restart,
    Result,
    Settings,
    Start,
    View,
    Wait,
    first_failure,
    next_step,
    place,
)


def _node(i: int, *, host: bool = False, rank: int | None = None) -> NodeInfo:
    return NodeInfo(f"n{i}", joined=100 + i, nproc=2, role="default", addr=f"127.0.0.{i + 1}", host=f"h{i}", static_rank=rank,
                    is_host=host)


@st.composite
def _cluster(draw):
    count = draw(st.integers(1, 30))
    lo = draw(st.integers(1, count + 2))
    hi = draw(st.integers(lo, lo + 10))
    joined = draw(st.permutations(range(count)))
    host = draw(st.integers(0, count - 1))
    nodes = [NodeInfo(f"n{i}", joined=joined[i], nproc=1, role="r", addr="a", host="h", is_host=i == host) for i in range(count)]
    previous = draw(st.lists(st.sampled_from([f"n{i}" for i in range(count + 5)]), unique=True, max_size=count + 5))
    return nodes, previous, Settings(lo, hi, 30.0, 0)


@given(_cluster())
def test_placement_is_dense_unique_bounded_and_host_first(case):
    nodes, previous, settings = case
    p = place(nodes, previous, settings)
    everyone = [*p.members, *p.spares]
    assert sorted(everyone) == sorted(n.id for n in nodes)  # every live node exactly once
    assert len(p.members) == min(len(nodes), settings.max_nodes)
    host = next(n.id for n in nodes if n.is_host)
    assert p.members[0] == host


@given(_cluster())
def test_when_nobody_left_the_earlier_members_keep_their_ranks(case):
    nodes, _, settings = case
    first = place(nodes, [], settings)
    again = place(nodes, first.members, settings)
    assert again == first
    newcomer = NodeInfo("late", joined=10_000, nproc=1, role="r", addr="a", host="h")
    grown = place([*nodes, newcomer], first.members, settings)
    assert grown.members[: len(first.members)] == first.members


@given(_cluster(), st.data())
def test_an_elected_leader_is_group_rank_0_whatever_the_join_order(case, data):
    nodes, previous, settings = case
    leader = data.draw(st.sampled_from([n.id for n in nodes]))
    p = place(nodes, previous, settings, leader)
    assert p.members[0] == leader
    assert sorted([*p.members, *p.spares]) == sorted(n.id for n in nodes)


def test_a_newcomer_takes_the_place_of_a_node_that_left():
    host, a, b, c = _node(0, host=True), _node(1), _node(2), _node(3)
    settings = Settings(1, 4, 30.0, 0)
    first = place([host, a, b, c], [], settings)
    assert first.members == ("n0", "n1", "n2", "n3")
    d = _node(4)
    second = place([host, a, c, d], first.members, settings)  # b left, d joined
    assert second.members == ("n0", "n1", "n4", "n3")  # c keeps rank 3
    third = place([host, c], second.members, settings)  # a and d left: the gaps close up
    assert third.members == ("n0", "n3")


def test_the_first_newcomer_in_join_order_takes_the_leavers_place_the_later_one_comes_last():
    host, a, c = _node(0, host=True), _node(1), _node(3)  # n2 left
    settings = Settings(1, 5, 30.0, 0)
    late, later = _node(4), _node(5)
    second = place([host, a, c, later, late], ("n0", "n1", "n2", "n3"), settings)  # listed out of join order on purpose
    assert second.members == ("n0", "n1", "n4", "n3", "n5")


def test_static_placement_is_by_node_rank():
    nodes = [_node(i, rank=r) for i, r in enumerate([2, 0, 1])]
    assert place(nodes, [], Settings(3, 3, 0.0, 0, static=True)).members == ("n1", "n2", "n0")


def _view(nodes, phase=Phase.RUNNING, members=(), results=None, restarts=0, min_since=None):
    return View(tuple(nodes), phase, 1, tuple(members), restarts, min_since, results)


ELASTIC = Settings(min_nodes=2, max_nodes=3, last_call_timeout=30.0, max_restarts=1)
NODES = [_node(0, host=True), _node(1), _node(2)]


def test_forming_waits_for_min_then_last_call_unless_max():
    assert next_step(_view(NODES[:1], Phase.FORMING), ELASTIC, now=0.0) == Wait(None)
    assert next_step(_view(NODES[:2], Phase.FORMING, min_since=10.0), ELASTIC, now=20.0) == Wait(40.0)
    started = next_step(_view(NODES[:2], Phase.FORMING, min_since=10.0), ELASTIC, now=40.0)
    assert isinstance(started, Start) and started.placement.members == ("n0", "n1")
    at_max = next_step(_view(NODES, Phase.FORMING, min_since=10.0), ELASTIC, now=11.0)
    assert isinstance(at_max, Start) and len(at_max.placement.members) == 3


def test_running_round_reacts_to_leavers_joiners_failures_and_success():
    members = ("n0", "n1")
    assert next_step(_view(NODES[:2], members=members), ELASTIC, 0.0) == Wait(None)
    assert next_step(_view(NODES, members=members), ELASTIC, 0.0) == Regroup("node n2 joined")
    assert next_step(_view(NODES[:1], members=members), ELASTIC, 0.0) == Regroup("node n1 was lost")
    failed = {"n1": Result(False, 7, "rank 2 exit 1"), "n0": Result(False, 9)}
    assert next_step(_view(NODES[:2], members=members, results=failed), ELASTIC, 0.0) == Restart(
        "node n1 reported a worker failure")  # the first failure the store got
    assert next_step(_view(NODES[:2], members=members, results=failed, restarts=1), ELASTIC, 0.0) == Finish(
        False, "node n1 reported a worker failure")
    done = {"n0": Result(True, 5), "n1": Result(True, 6)}
    assert next_step(_view(NODES[:1], members=members, results=done), ELASTIC, 0.0) == Finish(True, "every node's workers succeeded")
    # a node that finished and then went away is not "lost"
    assert next_step(_view(NODES[:1], members=members, results={"n1": Result(True, 5)}), ELASTIC, 0.0) == Wait(None)


def test_a_full_round_keeps_newcomers_as_spares():
    full = ("n0", "n1", "n2")
    extra = _node(3)
    assert next_step(_view([*NODES, extra], members=full), ELASTIC, 0.0) == Wait(None)


def test_static_loss_is_a_failure():
    static = Settings(2, 2, 0.0, 0, static=True)
    nodes = [_node(0, rank=0), _node(1, rank=1)]
    assert next_step(_view(nodes[:1], members=("n0", "n1")), static, 0.0) == Finish(False, "node n1 was lost")


def test_the_first_failure_is_the_failed_result_the_store_got_first():
    """Whatever order the results are read in: the lowest revision among the failed ones; an earlier success is none."""
    ok = Result(True, 3)
    late = Result(False, 9, "late", {"rank": 1})
    first = Result(False, 5, "first", {"rank": 0})
    assert first_failure([ok, late, first]) is first
    assert first_failure([late, ok]) is late
    assert first_failure([ok]) is None
    assert first_failure([]) is None


def test_the_coordinators_round_starts_the_next_one_on_a_placement_with_no_results_and_the_same_restarts():
    current = RoundState(number=2, restarts=1, members=("n0",), member_set=frozenset({"n0"}), spares={"n9"},
                         results={"n0": Result(False, 7)}, news=("lost n1", None, ("n1",)))
    current.start(Placement(("n2", "n0"), ("n3",)))
    assert current == RoundState(number=3, phase=Phase.RUNNING, restarts=1, members=("n2", "n0"),
                                 member_set=frozenset({"n0", "n2"}), spares={"n3"}, results={},
                                 news=("lost n1", None, ("n1",)))
