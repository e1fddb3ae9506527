"""Blame and exclusion (pure): who is held to account for a round, when a node is left out, and what the job does then.

The rules are ``rankrun.rendezvous.round``'s; ``_Job`` below applies the steps as the coordinator does (the blame
counts, the excluded nodes left out of the view), so that a job of 512 nodes can be played round after round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from rankrun.rendezvous.round import (
    Exclude,
    Exclusion,
    Finish,
    NodeInfo,
    NodeSlots,
    Phase,
    Regroup,
    Restart,
    Result,
    Settings,
    Start,
    View,
    Wait,
    assign_node_ranks,
    blamed,
    next_step,
    over_limit,
)


def _node(i: int, *, host: bool = False, rank: int | None = None) -> NodeInfo:
    return NodeInfo(f"n{i}", joined=100 + i, nproc=2, role="default", addr=f"127.0.0.{i + 1}", host=f"h{i}",
                    static_rank=rank, is_host=host)


def _failed(revision: int, rank: int = 2) -> Result:
    return Result(False, revision, f"rank {rank} (local_rank 0) on h/127.0.0.9, pid 77: exited with exit code 1\nboom")


def _running(nodes, members, results, *, restarts=0, blame=None, unhealthy=None, round_=2) -> View:
    return View(tuple(nodes), Phase.RUNNING, round_, tuple(members), restarts, results=results, blame=blame,
                unhealthy=unhealthy)


def _forming(nodes, members=(), *, round_=1, unhealthy=None, min_since=0.0) -> View:
    return View(tuple(nodes), Phase.FORMING, round_, tuple(members), 0, min_since, unhealthy=unhealthy)


ELASTIC = Settings(min_nodes=2, max_nodes=3, last_call_timeout=30.0, max_restarts=3, max_node_failures=2)
NODES = [_node(0, host=True), _node(1), _node(2)]
MEMBERS = ("n0", "n1", "n2")


# --- blame


def test_the_first_failure_the_store_got_is_blamed_and_nothing_else():
    assert blamed({"n0": _failed(9), "n2": _failed(7), "n1": Result(True, 3)}) == "n2"
    assert blamed({"n0": Result(True, 5), "n1": Result(True, 6)}) is None
    assert blamed({}) is None  # a round stopped for a signal, a loss or a regroup has no failed result


def test_a_node_is_excluded_on_its_kth_blame_and_not_before():
    results = {"n2": _failed(7)}
    view = _running(NODES, MEMBERS, results, blame={"n2": 1})
    (out,) = [over_limit(view, ELASTIC, "n2")]
    assert out == Exclusion("n2", "blamed for 2 failures of the job (--max-node-failures 2); the last: rank 2 "
                                  "(local_rank 0) on h/127.0.0.9, pid 77: exited with exit code 1")
    assert over_limit(_running(NODES, MEMBERS, results), ELASTIC, "n2") is None  # its first
    assert over_limit(_running(NODES, MEMBERS, results, blame={"n1": 5}), ELASTIC, "n2") is None  # another's count
    never = Settings(2, 3, 30.0, 3, max_node_failures=0)
    assert over_limit(_running(NODES, MEMBERS, results, blame={"n2": 40}), never, "n2") is None
    once = Settings(2, 3, 30.0, 3, max_node_failures=1)
    assert over_limit(_running(NODES, MEMBERS, results), once, "n2") is not None


def test_a_failure_blames_its_node_and_restarts_the_others_without_it_on_the_kth():
    results = {"n2": _failed(7), "n0": _failed(9)}  # n0's workers failed after n2's, most likely because of it
    first = next_step(_running(NODES, MEMBERS, results), ELASTIC, 0.0)
    assert first == Restart("node n2 reported a worker failure") and first.blamed == "n2"
    second = next_step(_running(NODES, MEMBERS, results, blame={"n2": 1}, restarts=1), ELASTIC, 0.0)
    assert isinstance(second, Restart) and second.blamed == "n2"
    assert [e.node for e in second.excluded] == ["n2"]  # the failure's one restart, and only that one, is spent


def test_the_budget_spent_ends_the_job_as_before_and_still_excludes():
    step = next_step(_running(NODES, MEMBERS, {"n2": _failed(7)}, blame={"n2": 1}, restarts=3), ELASTIC, 0.0)
    assert isinstance(step, Finish) and not step.ok and not step.stranded
    assert step.reason == "node n2 reported a worker failure"
    assert [e.node for e in step.excluded] == ["n2"]


def test_excluding_below_min_without_a_spare_ends_every_node_now_naming_it():
    two = NODES[:2]
    step = next_step(_running(two, ("n0", "n1"), {"n1": _failed(7)}, blame={"n1": 1}), ELASTIC, 0.0)
    assert isinstance(step, Finish) and step.stranded and not step.ok
    assert step.reason.startswith("node n1 at 127.0.0.2 was excluded (blamed for 2 failures of the job")
    assert step.reason.endswith("): 1 node(s) left, min 2 needed")


def test_a_static_job_cannot_go_on_without_an_excluded_node():
    static = Settings(2, 2, 0.0, 3, static=True, max_node_failures=2)
    nodes = [_node(0, rank=0), _node(1, rank=1)]
    step = next_step(_running(nodes, ("n0", "n1"), {"n1": _failed(7)}, blame={"n1": 1}), static, 0.0)
    assert isinstance(step, Finish) and step.stranded
    assert step.reason.endswith("a static job (--nnodes 2) cannot go on without it")


def test_a_spare_takes_the_excluded_nodes_place():
    full = Settings(2, 2, 30.0, 3, max_node_failures=2)
    nodes = [*NODES]  # n2 waits as a spare
    step = next_step(_running(nodes, ("n0", "n1"), {"n1": _failed(7)}, blame={"n1": 1}), full, 0.0)
    assert isinstance(step, Restart) and [e.node for e in step.excluded] == ["n1"]
    after = next_step(_forming([NODES[0], NODES[2]], ("n0", "n1"), min_since=-100.0), full, 0.0)  # n1 left out
    assert isinstance(after, Start) and after.placement.members == ("n0", "n2")


def test_the_store_host_excluded_leaves_group_rank_0_to_the_next_node_and_ranks_start_at_0():
    eligible = NODES[1:]  # the host, n0, is excluded: the coordinator leaves it out of the view
    after = next_step(_forming(eligible, MEMBERS, min_since=-100.0), ELASTIC, 0.0)
    assert isinstance(after, Start) and after.placement.members == ("n1", "n2")
    ranks = assign_node_ranks([NodeSlots(n.role, n.nproc) for n in eligible])
    assert [(r.base_rank, r.world_size) for r in ranks] == [(0, 4), (2, 4)]


# --- unhealthy: one more input, excluded as at once as K blames


def test_an_unhealthy_node_is_excluded_at_once_while_forming():
    step = next_step(_forming(NODES, unhealthy={"n1": "GPU 3: uncorrectable ECC error"}), ELASTIC, 0.0)
    assert step == Exclude((Exclusion("n1", "unhealthy: GPU 3: uncorrectable ECC error"),))


def test_an_unhealthy_node_before_the_first_round_lets_the_others_wait_for_more_but_not_later():
    alone = [NODES[0], NODES[1]]
    before = next_step(_forming(alone, round_=0, unhealthy={"n1": "bad"}), ELASTIC, 0.0)
    assert isinstance(before, Exclude)  # more nodes may still come: join_timeout bounds it
    later = next_step(_forming(alone, ("n0", "n1"), round_=1, unhealthy={"n1": "bad"}), ELASTIC, 0.0)
    assert isinstance(later, Finish) and later.stranded and "n1 at 127.0.0.2 was excluded (unhealthy: bad)" in later.reason
    static = Settings(2, 2, 0.0, 3, static=True)
    first = next_step(_forming([_node(0, rank=0), _node(1, rank=1)], round_=0, unhealthy={"n1": "bad"}), static, 0.0)
    assert isinstance(first, Finish) and first.stranded


def test_an_unhealthy_member_regroups_without_a_restart_and_an_unhealthy_spare_changes_nothing_else():
    full = Settings(2, 2, 30.0, 3)
    member = next_step(_running(NODES, ("n0", "n1"), {}, unhealthy={"n1": "disk"}), full, 0.0)
    assert member == Regroup("node n1 at 127.0.0.2 was excluded: unhealthy: disk", excluded=(Exclusion("n1", "unhealthy: disk"),))
    spare = next_step(_running(NODES, ("n0", "n1"), {}, unhealthy={"n2": "disk"}), full, 0.0)
    assert spare == Exclude((Exclusion("n2", "unhealthy: disk"),))


def test_with_nothing_to_exclude_the_steps_are_unchanged():
    assert next_step(_running(NODES, MEMBERS, {}), ELASTIC, 0.0) == Wait(None)
    assert next_step(_running(NODES, MEMBERS, {}, unhealthy={}), ELASTIC, 0.0) == Wait(None)


# --- a job played round after round, as the coordinator applies the steps


@dataclass
class _Job:
    """The coordinator's bookkeeping around the pure steps: blame counts, exclusions, restarts, rounds."""

    nodes: list[NodeInfo]
    settings: Settings
    blame: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)
    restarts: int = 0
    members: tuple[str, ...] = ()
    round: int = 0
    ended: Finish | None = None

    def eligible(self) -> list[NodeInfo]:
        return [n for n in self.nodes if n.id not in self.excluded]

    def form(self) -> tuple[str, ...]:
        step = next_step(View(tuple(self.eligible()), Phase.FORMING, self.round, self.members, self.restarts, -1e9),
                         self.settings, 0.0)
        assert isinstance(step, Start), step
        self.members, self.round = step.placement.members, self.round + 1
        return self.members

    def fail(self, failing: list[str]) -> Restart | Finish:
        """The round's nodes ``failing`` fail, in this order (the store's revisions); the rest run on."""
        results = {node: _failed(10 + i) for i, node in enumerate(failing)}
        view = View(tuple(self.eligible()), Phase.RUNNING, self.round, self.members, self.restarts, results=results,
                    blame=self.blame)
        step = next_step(view, self.settings, 0.0)
        assert isinstance(step, Restart | Finish), step
        if step.blamed is not None:
            self.blame[step.blamed] = self.blame.get(step.blamed, 0) + 1
        self.excluded |= {e.node: e.reason for e in step.excluded}
        if isinstance(step, Restart):
            self.restarts += 1
        else:
            self.ended = step
        return step


def test_512_nodes_with_one_black_hole_run_without_it_after_k_failures_and_k_restarts():
    nodes = [_node(0, host=True), *(_node(i) for i in range(1, 512))]
    job = _Job(nodes, Settings(256, 512, 30.0, 5, max_node_failures=2))
    hole = "n300"
    for _ in range(2):
        assert hole in job.form()
        job.fail([hole, "n7", "n0"])  # the others' workers fail too, later: the black hole's failure is the first
    assert job.excluded.keys() == {hole} and "blamed for 2 failures" in job.excluded[hole]
    members = job.form()
    assert hole not in members and len(members) == 511 and members[0] == "n0"
    assert job.restarts == 2 and job.ended is None
    assert job.blame == {hole: 2}  # n7 and n0 failed after it: not blamed


def test_512_nodes_without_a_black_hole_exclude_nobody():
    nodes = [_node(0, host=True), *(_node(i) for i in range(1, 512))]
    job = _Job(nodes, Settings(256, 512, 30.0, 5, max_node_failures=2))
    for culprit in ("n3", "n400", "n17", "n256", "n3"):  # five failures, none twice in a row, n3 twice in all
        job.form()
        job.fail([culprit])
    assert "n3" in job.excluded and len(job.excluded) == 1  # blame counts for the job's life, not in a row
    job2 = _Job(nodes, Settings(256, 512, 30.0, 5, max_node_failures=2))
    for culprit in ("n1", "n2", "n3", "n4", "n5"):
        job2.form()
        job2.fail([culprit])
    assert job2.excluded == {} and len(job2.form()) == 512


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=12), st.integers(0, 3))
def test_a_node_is_excluded_exactly_when_blamed_k_times_and_never_placed_again(culprits, limit):
    nodes = [_node(0, host=True), *(_node(i) for i in range(1, 6))]
    job = _Job(nodes, Settings(1, 6, 30.0, 100, max_node_failures=limit))
    for index in culprits:
        if job.ended is not None:
            break
        members = job.form()
        assert not set(members) & job.excluded.keys()
        culprit = f"n{index}"
        if culprit not in members:
            continue
        job.fail([culprit])
    counts = job.blame
    assert set(job.excluded) == {n for n, c in counts.items() if limit and c >= limit}
