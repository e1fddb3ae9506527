"""A stall's blame (issue 23, pure): the node holding the stall's outliers is held to account, not the node that
happened to report the stall first.

``stacks.report.stall_outlier`` names the node from the job's stacks; the name travels in the stall report
(``JobReport.blame``) and the failed result (``Result.stall``/``blame``, through ``rendezvous.keys``), and
``rendezvous.round.blamed`` prefers it over the first reporter. Recorded results below are what three nodes report
when the outlier's node is not the first to report (or reports nothing: its worker kept printing).
"""

from __future__ import annotations

import json

from rankrun.rendezvous.keys import result_from, result_value
from rankrun.rendezvous.round import NodeInfo, Phase, Restart, Result, Settings, View, blamed, next_step
from rankrun.stacks.dump import Dump, Frame, ThreadStack
from rankrun.stacks.report import ProcState, RankSample, stall_outlier
from rankrun.stacks.wire import Answer, JobReport

COLLECTIVE = (Frame("/job/train.py", 10, "main"), Frame("/job/train.py", 40, "wait_for_peers"))
LOADER = (Frame("/job/train.py", 10, "main"), Frame("/job/train.py", 60, "stuck_loading_data"))
ELSEWHERE = (Frame("/job/train.py", 10, "main"), Frame("/job/train.py", 80, "stuck_saving"))


def _rank(rank: int, main: tuple[Frame, ...], *, gone: bool = False) -> RankSample:
    return RankSample(rank, f"h{rank // 2}/127.0.0.{rank // 2 + 1}", Dump((ThreadStack(1, True, main),)),
                      None if gone else ProcState("S", 0.0, ""))


# ranks 0-5, two a node: n0 holds 0-1, n1 holds 2-3, n2 holds 4-5
OWNERS = {r: f"n{r // 2}" for r in range(6)}


def _job(stacks: dict[int, tuple[Frame, ...]], *, gone: tuple[int, ...] = ()) -> list[RankSample]:
    return [_rank(r, stacks.get(r, COLLECTIVE), gone=r in gone) for r in range(6)]


# --- who holds the outliers


def test_the_node_holding_the_smallest_group_is_named() -> None:
    assert stall_outlier(_job({5: LOADER}), OWNERS) == "n2"
    assert stall_outlier(_job({4: LOADER, 5: LOADER}), OWNERS) == "n2"  # two outliers, one node


def test_nobody_stands_out_without_one_node_holding_a_unique_smallest_group() -> None:
    assert stall_outlier(_job({}), OWNERS) is None  # every rank waits in the same place: the job's hang, not a node's
    assert stall_outlier(_job({1: LOADER, 5: LOADER}), OWNERS) is None  # the outliers on two nodes
    assert stall_outlier(_job({1: LOADER, 5: ELSEWHERE}), OWNERS) is None  # two groups of one: a tie
    assert stall_outlier(_job({0: LOADER, 1: LOADER, 2: LOADER}), OWNERS) is None  # 3 against 3: a tie
    assert stall_outlier(_job({5: LOADER}), {}) is None  # a node's stacks were missing: no owners given
    assert stall_outlier(_job({5: LOADER}), {r: n for r, n in OWNERS.items() if r != 5}) is None  # rank 5's node unknown


def test_ranks_that_exited_are_not_outliers() -> None:
    # ranks 4-5 exited 0 (their own group of two, "gone"); rank 3 is the one stuck elsewhere among the running
    assert stall_outlier(_job({3: LOADER}, gone=(4, 5)), OWNERS) == "n1"


# --- on the wire, backward-safe


def test_the_blame_travels_in_the_answer_the_report_and_the_result() -> None:
    answer = Answer.parse(Answer(3, 1, 2, "h2/127.0.0.3", tuple(_job({})[4:]), "n2").value())
    assert answer is not None and answer.id == "n2" and [s.rank for s in answer.samples] == [4, 5]
    report = JobReport(7, 1, "stall", "ab12", ("rankrun: job j stalled: ...",), "no output for 3 s; rank 5 ...", "n2")
    assert JobReport.parse(report.value()) == report
    result = result_from(result_value(False, "the workers on h0 stalled: ...", stall="no output for 3 s", blame="n2"), 9)
    assert (result.stall, result.blame, result.root) == ("no output for 3 s", "n2", None)


def test_an_older_launchers_records_read_as_no_blame() -> None:
    old = Answer(3, 1, 2, "h2/127.0.0.3", ())
    assert Answer.parse(old.value()) == old and old.id == ""
    assert JobReport.parse(JobReport(7, 1, "stall", "ab12", (), "no output for 3 s").value()).blame == ""  # type: ignore[union-attr]
    plain = result_from(json.dumps({"ok": False, "summary": "the workers on h0 stalled: ..."}).encode(), 4)
    assert (plain.stall, plain.blame) == (None, None)
    assert json.loads(result_value(False, "boom")) == {"ok": False, "summary": "boom"}  # a worker failure: as before


# --- the rule, with recorded results

MEMBERS = ("n0", "n1", "n2")
CAUSE = "no output for 3.2 s; rank 5 on h2/127.0.0.3 (the smallest group of stacks) at /job/train.py:60 in stuck_loading_data"


def _stall(revision: int, host: str, blame: str | None = "n2") -> Result:
    return Result(False, revision, f"the workers on {host} stalled: {CAUSE}", stall=CAUSE, blame=blame)


def _crash(revision: int) -> Result:
    return Result(False, revision, "rank 1 (local_rank 1) on h0/127.0.0.1, pid 7: exited with exit code 1",
                  root={"rank": 1, "host": "127.0.0.1", "exit_code": 1, "signal": None, "exception": None})


def test_the_stall_report_names_the_node_not_the_first_to_report() -> None:
    # n1 reported first, n0 next; n2 (the outlier's node) reported nothing: its worker kept printing
    assert blamed({"n1": _stall(11, "h1"), "n0": _stall(12, "h0")}, MEMBERS) == "n2"
    # the outlier's node reported too, last: still it, not the first
    assert blamed({"n1": _stall(11, "h1"), "n0": _stall(12, "h0"), "n2": _stall(13, "h2")}, MEMBERS) == "n2"


def test_a_stall_that_names_nobody_blames_nobody() -> None:
    assert blamed({"n1": _stall(11, "h1", None), "n0": _stall(12, "h0", None)}, MEMBERS) is None
    # the first reporter fell back on its own report (the store was slow): a later result names the node
    assert blamed({"n1": _stall(11, "h1", None), "n0": _stall(12, "h0")}, MEMBERS) == "n2"
    # a name that is not the round's (damaged, stale) is no one's
    assert blamed({"n1": _stall(11, "h1", "n7")}, MEMBERS) is None


def test_a_worker_failure_first_is_its_nodes_and_an_older_launchers_stall_too() -> None:
    assert blamed({"n0": _crash(10), "n1": _stall(11, "h1")}, MEMBERS) == "n0"
    assert blamed({"n1": Result(False, 11, "the workers on h1 stalled: ..."), "n0": _stall(12, "h0")}, MEMBERS) == "n1"
    assert blamed({"n1": Result(True, 11)}, MEMBERS) is None


def test_the_named_node_is_excluded_at_its_limit_and_the_lines_say_the_stall() -> None:
    nodes = tuple(NodeInfo(f"n{i}", joined=100 + i, nproc=2, role="default", addr=f"127.0.0.{i + 1}", host=f"h{i}",
                           is_host=i == 0) for i in range(3))
    settings = Settings(min_nodes=2, max_nodes=3, last_call_timeout=30.0, max_restarts=3, max_node_failures=1)
    view = View(nodes, Phase.RUNNING, 2, MEMBERS, 0, results={"n1": _stall(11, "h1"), "n0": _stall(12, "h0")})
    step = next_step(view, settings, now=0.0)
    assert isinstance(step, Restart) and step.blamed == "n2"
    assert step.reason == f"node n1 reported a stall: {CAUSE}"
    (excluded,) = step.excluded
    assert excluded.node == "n2"
    assert excluded.reason == f"blamed for 1 failures of the job (--max-node-failures 1); the last: the job stalled: {CAUSE}"
    # nobody named: a restart, nobody excluded
    quiet = View(nodes, Phase.RUNNING, 2, MEMBERS, 0, results={"n1": _stall(11, "h1", None)})
    step = next_step(quiet, settings, now=0.0)
    assert isinstance(step, Restart) and step.blamed is None and step.excluded == ()
