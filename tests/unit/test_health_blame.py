"""The blame and exclusion rule (``rankrun.health.blame``), on plain data: who is blamed, when a node is excluded and
with which reason, and what the job does without it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankrun.health.blame import CannotGoOn, Failure, GoOn, Judgement, NodeId, Replace, after_exclusion, judge

NODES = [NodeId(f"node{i}", f"10.200.{i // 256}.{i % 256}") for i in range(512)]
ECC = "rank 5 exited 1: uncorrectable ECC error"


def test_a_node_is_named_by_host_and_address() -> None:
    assert str(NodeId("gpu7", "10.0.0.7")) == "gpu7 (10.0.0.7)"
    assert str(NodeId("10.0.0.7", "10.0.0.7")) == "10.0.0.7"
    assert NodeId("gpu7", "10.0.0.7") == NodeId("gpu7", "10.0.0.7")  # the same node when its launcher comes back
    assert NodeId("gpu7", "10.0.0.7") != NodeId("gpu7", "10.0.0.8")


def test_a_blamed_node_is_excluded_at_its_kth_failure_not_before() -> None:
    node = NODES[5]
    first = judge(Failure(node, ECC), {}, 2, {})
    assert first == Judgement(counts={node: 1}, excluded={})
    second = judge(Failure(node, ECC), first.counts, 2, {})
    assert second == Judgement(counts={node: 2}, excluded={node: f"blamed for 2 failures, the last: {ECC}"})


def test_k_1_excludes_at_the_first_failure() -> None:
    assert judge(Failure(NODES[0], ECC), {}, 1, {}).excluded == {NODES[0]: f"blamed for 1 failure, the last: {ECC}"}


def test_k_0_never_excludes_by_blame_but_still_counts() -> None:
    counts: dict[NodeId, int] = {}
    for _ in range(10):
        verdict = judge(Failure(NODES[1], ECC), counts, 0, {})
        assert verdict.excluded == {}
        counts = dict(verdict.counts)
    assert counts == {NODES[1]: 10}


def test_no_blame_leaves_the_counts_as_they_were() -> None:
    # a stop, a signal, a lost node or a regroup: nobody is blamed, even a node one failure from exclusion
    counts = {NODES[2]: 1}
    assert judge(None, counts, 2, {}) == Judgement(counts=counts, excluded={})


def test_failures_on_different_nodes_are_counted_apart() -> None:
    counts: dict[NodeId, int] = {}
    for node in (NODES[0], NODES[1], NODES[0], NODES[2]):
        verdict = judge(Failure(node, ECC), counts, 3, {})
        assert verdict.excluded == {}
        counts = dict(verdict.counts)
    assert counts == {NODES[0]: 2, NODES[1]: 1, NODES[2]: 1}
    assert judge(Failure(NODES[0], "rank 0 exited 1"), counts, 3, {}).excluded == {
        NODES[0]: "blamed for 3 failures, the last: rank 0 exited 1"}


def test_the_counts_given_are_not_changed() -> None:
    counts = {NODES[0]: 1}
    judge(Failure(NODES[0], ECC), counts, 2, {})
    assert counts == {NODES[0]: 1}


def test_an_unhealthy_node_is_excluded_at_once_whatever_k() -> None:
    verdict = judge(None, {}, 0, {NODES[3]: "GPU 2 not visible"}, {NODES[4]: "151 ms round trip to its neighbours"})
    assert verdict == Judgement(counts={}, excluded={NODES[3]: "health check: GPU 2 not visible",
                                                     NODES[4]: "network check: 151 ms round trip to its neighbours"})


def test_a_node_excluded_for_several_reasons_has_them_all_checks_first() -> None:
    verdict = judge(Failure(NODES[6], ECC), {NODES[6]: 1}, 2, {NODES[6]: "HBM row remap pending"}, {NODES[6]: "slow"})
    assert verdict.excluded == {
        NODES[6]: f"health check: HBM row remap pending; network check: slow; blamed for 2 failures, the last: {ECC}"}


def test_512_nodes_a_black_hole_is_excluded_and_nobody_else() -> None:
    # node 300's workers exit at start on every attempt; now and then another node fails once, or nobody is to blame
    counts: dict[NodeId, int] = {}
    excluded: dict[NodeId, str] = {}
    rounds = [Failure(NODES[300], ECC), None, Failure(NODES[17], "rank 136 exited 1"), Failure(NODES[300], ECC)]
    for failure in rounds:
        verdict = judge(failure, counts, 2, {})
        counts = dict(verdict.counts)
        excluded.update(verdict.excluded)
    assert excluded == {NODES[300]: f"blamed for 2 failures, the last: {ECC}"}
    assert counts == {NODES[300]: 2, NODES[17]: 1}


def test_512_nodes_healthy_and_clean_exclude_nobody() -> None:
    assert judge(None, {}, 2, {}, {}) == Judgement(counts={}, excluded={})


@given(st.lists(st.one_of(st.none(), st.integers(0, 511)), max_size=30), st.integers(0, 4),
       st.dictionaries(st.integers(0, 511), st.text(min_size=1, max_size=5), max_size=4))
def test_exclusions_are_exactly_the_unhealthy_and_those_blamed_k_times(blamed: list[int | None], k: int,
                                                                      unhealthy: dict[int, str]) -> None:
    counts: dict[NodeId, int] = {}
    excluded: set[NodeId] = set()
    for i in blamed:
        verdict = judge(None if i is None else Failure(NODES[i], ECC), counts, k, {})
        counts = dict(verdict.counts)
        excluded |= set(verdict.excluded)
    last = judge(None, counts, k, {NODES[i]: r for i, r in unhealthy.items()})
    excluded |= set(last.excluded)
    times = {NODES[i]: blamed.count(i) for i in set(blamed) if i is not None}
    assert counts == times
    assert excluded == {n for n, c in times.items() if k and c >= k} | {NODES[i] for i in unhealthy}


def test_enough_nodes_remain_the_job_goes_on() -> None:
    assert after_exclusion(NODES[1:3], [], {NODES[0]: "health check: x"}, 2, 3) == GoOn()
    assert after_exclusion(NODES[1:511], [], {NODES[0]: "x", NODES[511]: "y"}, 510, 512) == GoOn()


def test_a_waiting_spare_takes_the_excluded_nodes_place() -> None:
    # even when MIN would be met without it
    assert after_exclusion(NODES[1:3], [NODES[3], NODES[4]], {NODES[0]: "x"}, 2, 3) == Replace((NODES[3],))
    assert after_exclusion(NODES[2:4], NODES[4:7], {NODES[0]: "x", NODES[1]: "y"}, 4, 4) == Replace((NODES[4], NODES[5]))


def test_spares_take_places_only_up_to_max() -> None:
    assert after_exclusion(NODES[1:4], NODES[4:6], {NODES[0]: "x"}, 2, 3) == GoOn()
    assert after_exclusion(NODES[1:3], NODES[4:6], {NODES[0]: "x", NODES[3]: "y"}, 2, 3) == Replace((NODES[4],))


def test_a_spare_brings_the_job_back_to_min() -> None:
    assert after_exclusion([NODES[1]], [NODES[2]], {NODES[0]: "x"}, 2, 2) == Replace((NODES[2],))


def test_fewer_than_min_and_no_spare_ends_the_job_naming_the_node() -> None:
    gpu = NodeId("gpu3", "10.200.0.13")
    assert after_exclusion([NODES[1]], [], {gpu: "health check: uncorrectable ECC error"}, 2, 3) == CannotGoOn(
        "the job cannot go on: node gpu3 (10.200.0.13) is excluded: health check: uncorrectable ECC error; "
        "1 node remains and no spare waits, fewer than MIN = 2")


def test_too_few_spares_end_the_job_too() -> None:
    step = after_exclusion(NODES[2:4], [NODES[9]], {NODES[0]: "a", NODES[1]: "b"}, 4, 4)
    assert step == CannotGoOn(f"the job cannot go on: node {NODES[0]} is excluded: a; node {NODES[1]} is excluded: b; "
                              "3 nodes remain and only 1 spare waits, fewer than MIN = 4")
    step = after_exclusion([], NODES[9:11], dict.fromkeys(NODES[0:3], "x"), 3, 3)
    assert isinstance(step, CannotGoOn)
    assert step.line.endswith("2 nodes remain and only 2 spares wait, fewer than MIN = 3")


@given(st.integers(0, 512), st.integers(0, 8), st.integers(1, 8), st.integers(1, 512), st.integers(0, 64))
def test_the_job_goes_on_exactly_when_min_can_be_met(remaining: int, spares: int, excluded: int, min_nodes: int,
                                                      room: int) -> None:
    max_nodes = max(min_nodes, remaining) + room
    step = after_exclusion(NODES[:remaining], [NodeId("spare", str(i)) for i in range(spares)],
                           {NodeId("bad", str(i)): "x" for i in range(excluded)}, min_nodes, max_nodes)
    taken = min(spares, excluded, max_nodes - remaining)
    assert isinstance(step, CannotGoOn) == (remaining + taken < min_nodes)
    if not isinstance(step, CannotGoOn):
        assert step == (Replace(tuple(NodeId("spare", str(i)) for i in range(taken))) if taken else GoOn())


def test_a_negative_k_is_refused() -> None:
    with pytest.raises(ValueError, match="max_node_failures must be 0 or more, not -1"):
        judge(None, {}, -1, {})
