"""What a node tells of how its last round ended (``agent.round.news``), pure: also after a round it skipped."""

from __future__ import annotations

from rankrun.agent.round import news
from rankrun.rendezvous.keys import Assignment, RoundWord
from rankrun.rendezvous.round import NodeRanks, Phase


def _place(round_: int, restarts: int) -> Assignment:
    return Assignment(round_, 0, 2, NodeRanks(0, 2, 0, 2), "127.0.0.1", 29500, restarts)


LATEST = RoundWord(3, Phase.RUNNING, 2, "node n3 reported a worker failure", failure={"rank": 2, "host": "h"})


def test_the_round_after_the_one_it_ran_tells_its_news():
    assert news(_place(2, 1), _place(3, 2), 1, LATEST) is LATEST


def test_a_skipped_round_that_failed_at_once_still_tells_the_restart_and_its_failure():
    """Round 2 failed while this node still stopped round 1's workers: it never took round 2, and hears round 3."""
    assert news(_place(1, 0), _place(3, 2), 1, LATEST) is LATEST


def test_only_regroups_between_tell_nothing_and_neither_does_a_first_round():
    regrouped = RoundWord(3, Phase.RUNNING, 1, "node n4 joined")
    assert news(_place(1, 1), _place(3, 1), 1, regrouped) is None
    assert news(None, _place(1, 0), 0, LATEST) is None
