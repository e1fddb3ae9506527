"""The job's account of its nodes (``rendezvous.account``), pure: blame, exclusions, the blocklist, the unhealthy
nodes, and a straggler's blame, as the coordinator feeds it."""

from __future__ import annotations

from rankrun.rendezvous.account import Account, Reported, Warned
from rankrun.rendezvous.keys import Blocked
from rankrun.rendezvous.round import Exclusion, NodeInfo, Settings

RUN = "job7"


def _node(i: int, *, unhealthy: str | None = None) -> NodeInfo:
    return NodeInfo(f"n{i}", 100 + i, 1, "default", f"127.0.0.{i + 1}", f"h{i}", unhealthy=unhealthy)


def _account(min_nodes: int = 2, max_node_failures: int = 2) -> Account:
    return Account(RUN, Settings(min_nodes, 8, 1.0, 3, max_node_failures=max_node_failures))


def test_a_node_on_the_blocklist_is_refused_once_and_excluded():
    account = _account()
    record = Blocked("job7", "unhealthy: no GPU", 12.5)
    account.blocklisted([("h1@127.0.0.2", record)])
    assert account.joined(_node(1)) is record
    assert account.excluded == {"n1": "unhealthy: no GPU"}
    assert account.joined(_node(1)) is None  # told once; its key written again is not a second refusal
    assert account.joined(_node(2)) is None  # another host, another address: welcome
    assert account.excluded == {"n1": "unhealthy: no GPU"}
    assert account.exclusions == []  # a refusal is not one of the job's exclusions: the node never was in it


def test_a_node_whose_check_failed_is_unhealthy_from_its_join_unless_refused():
    account = _account()
    assert account.joined(_node(1, unhealthy="health check: exit 1")) is None
    assert account.unhealthy == {"n1": "health check: exit 1"}
    account.blocklisted([("h2@127.0.0.3", Blocked(RUN, "blamed", 1.0))])
    account.joined(_node(2, unhealthy="health check: exit 2"))
    assert account.unhealthy == {"n1": "health check: exit 1"}  # excluded already: not counted again


def test_an_excluded_nodes_word_that_it_is_unhealthy_changes_nothing():
    account = _account()
    account.said_unhealthy("n1", "network: slow link")
    assert account.unhealthy == {"n1": "network: slow link"}
    account.exclude(Exclusion("n1", "unhealthy: network: slow link"), _node(1), 5.0)
    assert account.unhealthy == {}
    account.said_unhealthy("n1", "again")
    assert account.unhealthy == {}


def test_an_exclusion_blocklists_the_nodes_host_and_address_and_names_it():
    account = _account()
    record = account.exclude(Exclusion("n1", "blamed for 2 failures"), _node(1), 42.0)
    assert record == Blocked(RUN, "blamed for 2 failures", 42.0)
    assert account.blocked == {"h1@127.0.0.2": record}
    assert account.excluded == {"n1": "blamed for 2 failures"}
    assert account.exclusions == [("n1 at 127.0.0.2", "blamed for 2 failures")]


def test_a_node_excluded_after_it_went_is_named_by_its_id_and_blocklists_nothing():
    account = _account()
    assert account.exclude(Exclusion("n3", "unhealthy: gone"), None, 1.0) is None
    assert account.blocked == {}
    assert account.excluded == {"n3": "unhealthy: gone"}
    assert account.exclusions == [("n3", "unhealthy: gone")]


def test_the_eligible_nodes_are_the_live_ones_not_excluded():
    account = _account()
    nodes = {f"n{i}": _node(i) for i in range(3)}
    assert account.eligible(nodes) is nodes  # nobody excluded: the coordinator's own dict, no copy
    account.exclude(Exclusion("n1", "why"), nodes["n1"], 1.0)
    assert account.eligible(nodes) == {"n0": nodes["n0"], "n2": nodes["n2"]}


def test_blame_counts_per_node_and_nobody_blamed_counts_nothing():
    account = _account()
    account.blamed(None)
    account.blamed("n1")
    account.blamed("n2")
    account.blamed("n1")
    assert account.blame == {"n1": 2, "n2": 1}


def test_a_straggler_is_blamed_and_said_until_its_limit_then_reported():
    account = _account(min_nodes=2, max_node_failures=2)
    first = account.straggler("n1", "n1 at 127.0.0.2", "rank 3 late", members=3, spares=False)
    assert first == Warned("rendezvous: node n1 at 127.0.0.2 blamed for a straggler (1 of --max-node-failures 2): "
                           "rank 3 late")
    second = account.straggler("n1", "n1 at 127.0.0.2", "rank 3 late again", members=3, spares=False)
    assert second == Reported("blamed for 2 stragglers (--max-node-failures 2); the last: rank 3 late again")
    assert account.blame == {"n1": 2}
    assert account.excluded == {}  # reported, not excluded: its unhealthy key makes the next decision exclude it


def test_a_straggler_the_job_cannot_lose_stays_unless_a_spare_waits():
    account = _account(min_nodes=2, max_node_failures=1)
    stays = account.straggler("n1", "n1", "slow", members=2, spares=False)
    assert stays == Warned("rendezvous: node n1 is a straggler again (slow), but the job cannot go on without it "
                           "(2 nodes, at least 2, no spare): it stays")
    assert account.straggler("n1", "n1", "slow", members=2, spares=True) == Reported(
        "blamed for 2 stragglers (--max-node-failures 1); the last: slow")
    assert account.straggler("n2", "n2", "slow", members=3, spares=False) == Reported(
        "blamed for 1 stragglers (--max-node-failures 1); the last: slow")


def test_without_max_node_failures_a_straggler_is_only_said():
    account = _account(max_node_failures=0)
    for count in (1, 2, 3):
        assert account.straggler("n1", "n1", "slow", members=4, spares=True) == Warned(
            f"rendezvous: node n1 blamed for a straggler ({count} of --max-node-failures 0): slow")


def test_an_excluded_straggler_is_not_blamed_again():
    account = _account()
    account.exclude(Exclusion("n1", "why"), _node(1), 1.0)
    assert account.straggler("n1", "n1", "slow", members=3, spares=False) is None
    assert account.blame == {}
