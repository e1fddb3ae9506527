"""The network check's outlier rule (``rankrun.health.outliers``) on made-up rings: who is suspect, who is only
ambiguous, whom each is re-probed against, who the re-probe confirms, and the line that names a node."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rankrun.health.outliers import (
    Baseline,
    Link,
    Suspects,
    baseline,
    confirm,
    find_suspects,
    network_line,
    slow_rtt,
    slow_throughput,
)

FAST = Link(rtt=0.00021, forward=1.2e9, backward=1.2e9)
SLOW = Link(rtt=0.151, forward=1.2e9, backward=1.2e9)  # 150 ms more each way round: the NFQUEUE delay of the e2e test


def ring(n: int, slow_nodes: tuple[int, ...] = (), slow: Link = SLOW, fast: Link = FAST) -> list[Link]:
    """Pair i is node i and node i + 1; a slow node makes both pairs touching it slow."""
    spoiled = {p % n for j in slow_nodes for p in (j - 1, j)}
    return [slow if i in spoiled else fast for i in range(n)]


def jittery(n: int, seed: int) -> list[Link]:
    rng = random.Random(seed)
    return [Link(rtt=rng.uniform(0.0001, 0.0005), forward=rng.uniform(0.8e9, 1.6e9), backward=rng.uniform(0.8e9, 1.6e9))
            for _ in range(n)]


def test_512_nodes_one_slow_node_is_named_exactly() -> None:
    links = ring(512, (300,))
    found = find_suspects(links)
    assert (found.suspects, found.ambiguous, dict(found.partners)) == ((300,), (), {300: 302})
    unhealthy = confirm(found, links, {300: SLOW})
    assert unhealthy == {300: "151 ms round trip to its neighbours (median 0.21 ms)"}
    assert network_line(300, "10.200.1.44", unhealthy[300]) == (
        "node 300 (10.200.1.44): network check: 151 ms round trip to its neighbours (median 0.21 ms)")


def test_the_line_of_the_issue() -> None:
    links = ring(8, (3,))
    unhealthy = confirm(find_suspects(links), links, {3: SLOW})
    assert network_line(3, "10.200.0.13", unhealthy[3]) == (
        "node 3 (10.200.0.13): network check: 151 ms round trip to its neighbours (median 0.21 ms)")


def test_512_nodes_none_slow_nobody_is_suspect() -> None:
    found = find_suspects(ring(512))
    assert found == Suspects(Baseline(rtt=0.00021, throughput=1.2e9))
    assert confirm(found, ring(512), {}) == {}


@pytest.mark.parametrize("seed", range(5))
def test_jittery_medians_name_nobody_and_still_find_the_slow_node(seed: int) -> None:
    links = jittery(512, seed)
    assert find_suspects(links).suspects == find_suspects(links).ambiguous == ()
    slow_node = random.Random(seed).randrange(512)
    links[slow_node - 1] = Link(0.151, 1.1e9, 1.0e9)
    links[slow_node] = Link(0.160, 0.9e9, 1.3e9)
    found = find_suspects(links)
    assert (found.suspects, found.ambiguous) == ((slow_node,), ())
    assert confirm(found, links, {slow_node: Link(0.155, 1e9, 1e9)}) == {
        slow_node: f"151 ms round trip to its neighbours (median {found.baseline.rtt * 1000:.3g} ms)"}


def test_a_slow_throughput_is_named_by_its_figures() -> None:
    links = ring(16, (5,), slow=Link(0.00021, 12.5e6, 1.2e9))
    links[4] = Link(0.00021, 1.2e9, 11e6)  # the best of its two pairs: at least this slow
    found = find_suspects(links)
    assert found.suspects == (5,)
    assert confirm(found, links, {5: Link(0.00021, 1.2e9, 11e6)}) == {
        5: "12.5 MB/s throughput with its neighbours (median 1.2 GB/s)"}


def test_two_node_ring_cannot_tell_who_is_slow() -> None:
    for links in (ring(2), ring(2, (1,)), [SLOW, FAST], [FAST]):
        found = find_suspects(links)
        assert (found.suspects, found.ambiguous, dict(found.partners)) == ((), (), {})
    assert find_suspects([]).suspects == ()


def test_three_node_ring_names_the_slow_node_against_a_node_that_talks_well() -> None:
    for slow_node in range(3):
        links = ring(3, (slow_node,))
        found = find_suspects(links)
        assert found.baseline == Baseline(rtt=FAST.rtt, throughput=FAST.throughput)  # the one healthy pair
        assert (found.suspects, found.ambiguous) == ((slow_node,), ())
        partner = found.partners[slow_node]
        assert partner == (slow_node + 1) % 3  # no node has two clean pairs: the nearest of the others, the next on a tie
        assert confirm(found, links, {slow_node: SLOW}) == {slow_node: "151 ms round trip to its neighbours (median 0.21 ms)"}
        assert find_suspects(ring(3)).suspects == ()


def test_four_node_ring_the_slow_pairs_are_not_the_median() -> None:
    links = ring(4, (2,))
    found = find_suspects(links)
    assert found.baseline.rtt == FAST.rtt  # a plain median would be (0.21 + 151) / 2 ms, and 151 ms under 3 times it
    assert (found.suspects, dict(found.partners)) == ((2,), {2: 0})


def test_a_lone_slow_pair_makes_both_its_nodes_ambiguous() -> None:
    links = ring(64)
    links[10] = SLOW  # the link between node 10 and node 11
    found = find_suspects(links)
    assert (found.suspects, found.ambiguous, dict(found.partners)) == ((), (10, 11), {10: 9, 11: 12})
    assert confirm(found, links, {10: FAST, 11: FAST}) == {}  # the link's fault, not a node's
    assert confirm(found, links, {10: FAST, 11: SLOW}) == {
        11: "151 ms round trip to its neighbour and a known-good node (median 0.21 ms)"}
    assert confirm(found, links, {10: SLOW, 11: FAST}) == {
        10: "151 ms round trip to its neighbour and a known-good node (median 0.21 ms)"}


def test_the_node_between_two_slow_neighbours_is_cleared_by_its_reprobe() -> None:
    links = ring(32, (9, 11))
    found = find_suspects(links)
    assert (found.suspects, found.ambiguous) == ((9, 10, 11), ())
    assert dict(found.partners) == {9: 7, 10: 13, 11: 13}  # the nearest node with two clean pairs (the next on a tie)
    assert set(confirm(found, links, {9: SLOW, 10: FAST, 11: SLOW})) == {9, 11}


def test_a_reprobe_with_other_figures_than_the_ring_names_its_own() -> None:
    links = ring(16, (4,))
    links[3] = Link(0.00021, 1e6, 1e6)  # slow by throughput with its predecessor, by round trip with its successor
    found = find_suspects(links)
    assert confirm(found, links, {4: Link(0.2, 1.2e9, 1.2e9)}) == {4: "200 ms round trip to a known-good node (median 0.21 ms)"}


def test_no_answer_is_unhealthy_and_a_node_not_reprobed_is_not_judged() -> None:
    links = ring(16, (4,), slow=Link(float("inf"), 0.0, 0.0))
    found = find_suspects(links)
    assert found.suspects == (4,)
    assert confirm(found, links, {}) == {}
    assert confirm(found, links, {4: None}) == {4: "no answer to a known-good node"}
    assert confirm(found, links, {4: Link(float("inf"), 0.0, 0.0)}) == {4: "no answer from its neighbours"}


def test_a_ring_with_no_known_good_node_names_nobody() -> None:
    # two lone slow pairs cover all four nodes: every node is ambiguous, none is left to re-probe against
    found = find_suspects([SLOW, FAST, SLOW, FAST])
    assert (found.suspects, found.ambiguous, dict(found.partners)) == ((), (), {})
    assert find_suspects([SLOW, FAST, SLOW, FAST, FAST]).ambiguous == (0, 1, 2, 3)  # node 4 is known-good


def test_a_run_of_slow_pairs_makes_the_nodes_inside_it_suspects() -> None:
    found = find_suspects([SLOW, SLOW, FAST, FAST, SLOW, SLOW, FAST, FAST, FAST])
    assert (found.suspects, found.ambiguous) == ((1, 5), ())
    assert dict(found.partners) == {1: 3, 5: 7}


def test_the_baseline_sets_aside_the_two_worst_pairs() -> None:
    links = [Link(r, t, t) for r, t in ((1.0, 1.0), (5.0, 5.0), (2.0, 2.0), (9.0, 9.0), (3.0, 3.0))]
    assert baseline(links) == Baseline(rtt=2.0, throughput=5.0)  # rtts 1 2 3 (5, 9 aside); rates 9 5 3 (2, 1 aside)
    assert baseline([Link(1.0, 4.0, 2.0)] * 3).throughput == 2.0  # a pair's slower direction


@pytest.mark.parametrize(("rtt", "median", "slow"), [
    (0.0030, 0.001, False),  # 3 times the median, but within 10 ms of it
    (0.0110, 0.001, False),  # exactly 10 ms over
    (0.0111, 0.001, True),
    (0.3000, 0.1, False),  # exactly 3 times
    (0.3100, 0.1, True),
    (0.0001, 0.1, False),
])
def test_a_round_trip_is_slow_over_three_times_and_10_ms_over_the_median(rtt: float, median: float, slow: bool) -> None:
    assert slow_rtt(Link(rtt, 1.0, 1.0), Baseline(median, 1.0)) is slow


@pytest.mark.parametrize(("forward", "backward", "slow"), [
    (1e9, 1e9, False), (0.34e9, 1e9, False), (1e9, 0.333e9, True), (0.2e9, 3e9, True), (3e9, 3e9, False)])
def test_throughput_is_slow_under_a_third_of_the_median_either_way(forward: float, backward: float, slow: bool) -> None:
    assert slow_throughput(Link(0.0, forward, backward), Baseline(0.0, 1e9)) is slow
    assert not slow_throughput(Link(0.0, 1e9 / 3, 1e9 / 3), Baseline(0.0, 1e9))


def test_the_figures_units() -> None:
    links = ring(8, (3,), slow=Link(0.00021, 950.0, 950.0))
    assert confirm(find_suspects(links), links, {3: links[3]}) == {3: "950 B/s throughput with its neighbours (median 1.2 GB/s)"}
    links = ring(8, (3,), slow=Link(0.00021, 3.5e3, 9e3))
    assert confirm(find_suspects(links), links, {3: links[3]})[3].startswith("3.5 kB/s ")
    links = ring(8, (3,), slow=Link(1.5104, 1.2e9, 1.2e9))
    assert confirm(find_suspects(links), links, {3: links[3]})[3] == "1510 ms round trip to its neighbours (median 0.21 ms)"
    links = ring(8, (3,), slow=Link(0.0123, 1.2e9, 1.2e9))
    assert confirm(find_suspects(links), links, {3: links[3]})[3] == "12.3 ms round trip to its neighbours (median 0.21 ms)"


@given(st.integers(0, 600), st.floats(1e-6, 10.0), st.floats(1.0, 1e12), st.floats(1.0, 1e12))
def test_with_all_pairs_equal_nobody_is_suspect(n: int, rtt: float, forward: float, backward: float) -> None:
    found = find_suspects([Link(rtt, forward, backward)] * n)
    assert (found.suspects, found.ambiguous, dict(found.partners)) == ((), (), {})


@given(st.integers(3, 600), st.data(), st.floats(1e-6, 1.0), st.floats(1.0, 1e12))
def test_one_slow_node_among_equal_pairs_is_the_one_suspect(n: int, data: st.DataObject, rtt: float, rate: float) -> None:
    slow_node = data.draw(st.integers(0, n - 1))
    slow = data.draw(st.sampled_from([Link(rtt * 3.01 + 0.0101, rate, rate), Link(rtt, rate / 3.01, rate)]))
    links = ring(n, (slow_node,), slow=slow, fast=Link(rtt, rate, rate))
    found = find_suspects(links)
    assert (found.suspects, found.ambiguous) == ((slow_node,), ())
    assert set(confirm(found, links, {slow_node: slow})) == {slow_node}
