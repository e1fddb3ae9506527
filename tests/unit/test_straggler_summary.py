"""One node's window as the host gets it (``rankrun.straggler.summary``): a sample of the collectives that every
node's sample holds, a few hundred bytes, merged across nodes and windows, and judged as one job."""

from __future__ import annotations

import random

import pytest

from rankrun.straggler import summary, verdict
from rankrun.straggler.summary import Merge, NodeWindow
from rankrun.straggler.verdict import RankWindow


def _steps(ranks: range, seqs: range, slow: int | None, *, seed: int = 3) -> dict[tuple[str, int], dict[int, float]]:
    rng = random.Random(seed)
    out, t = {}, 1_796_000_000.0  # wall clock seconds, as the Flight Recorder's
    for seq in seqs:
        out[("0", seq)] = {r: t + 0.05 + (0.25 if r == slow else 0.0) + rng.uniform(-0.002, 0.002) for r in ranks}
        t = max(out[("0", seq)].values())
    return out


@pytest.mark.parametrize("count", [1, 16, 17, 100, 640, 10_000])
def test_the_stride_keeps_at_most_sixteen_and_nodes_counting_apart_share_the_coarser_sample(count):
    step = summary.stride(count)
    assert step & (step - 1) == 0 and count // step <= summary.KEEP
    other = summary.stride(count + count // 3)  # another node counted a few more in its window
    assert max(step, other) % min(step, other) == 0  # the coarser multiples are among the finer ones


def test_a_summary_reads_back_within_its_resolution_and_is_a_few_hundred_bytes():
    arrivals = summary.pick(_steps(range(8), range(1, 641), slow=5))
    assert len(arrivals) <= summary.KEEP
    ranks = tuple(RankWindow(r, "node-1/127.0.0.3", 0, 0, 0.97, "R") for r in range(8))
    w = NodeWindow("n1", 4, ranks, arrivals, 640, 60.0)
    value = summary.encode(w)
    assert len(value) < 1500, len(value)  # 8 ranks; two ranks' nodes send under 500 bytes
    back = summary.decode(value)
    assert (back.node, back.number, back.ranks, back.total, back.length) == ("n1", 4, ranks, 640, 60.0)
    assert back.arrivals.keys() == arrivals.keys()
    for key, when in arrivals.items():
        assert back.arrivals[key] == pytest.approx(when, abs=summary.TICK)
    with pytest.raises(ValueError, match="not a straggler summary"):
        summary.decode(b'{"node": 1}')


def test_the_host_judges_a_rank_on_another_node_from_both_nodes_samples():
    arrivals = _steps(range(4), range(1, 201), slow=3)
    merge = Merge()
    for node, ranks in (("n0", (0, 1)), ("n1", (2, 3))):
        mine = {k: {r: t for r, t in when.items() if r in ranks} for k, when in arrivals.items()}
        # n1 counted 260 in its window (its window started earlier): a coarser stride, nested in n0's
        total = 200 if node == "n0" else 260
        sent = {k: v for k, v in mine.items() if k[1] % summary.stride(total) == 0}
        where = f"node-{node[1]}/127.0.0.{2 + int(node[1])}"
        merge.add(NodeWindow(node, 1, tuple(RankWindow(r, where, cpu=1.0, state="R") for r in ranks), sent, total, 60.0))
    ranks, ready, length, total = merge.take()
    assert len(ready) >= verdict.MIN_COLLECTIVES
    found = verdict.judge(ranks, ready, length, scale=total / len(ready))
    assert found is not None and [(s.rank, s.where) for s in found] == [(3, "node-1/127.0.0.3")]
    assert found[0].total == 260 and 0.2 <= found[0].lag <= 0.3  # type: ignore[operator]


def test_a_collective_waits_for_the_other_nodes_then_goes_stale():
    merge = Merge()
    merge.add(NodeWindow("n0", 1, (), {("0", 8): {0: 1.0, 1: 1.0}}, 8, 60.0))
    merge.add(NodeWindow("n1", 1, (), {("0", 16): {2: 2.0, 3: 2.0}}, 16, 60.0))
    _, ready, _, _ = merge.take()
    assert ready == {}  # seq 8 lacks n1's ranks, seq 16 n0's
    merge.add(NodeWindow("n1", 2, (), {("0", 8): {2: 1.0, 3: 1.0}}, 8, 60.0))
    _, ready, _, _ = merge.take()
    assert list(ready) == [("0", 8)]
    for _ in range(summary.STALE):
        assert merge.take()[1] == {}
    merge.add(NodeWindow("n0", 2, (), {("0", 16): {0: 2.0, 1: 2.0}}, 16, 60.0))  # too late: dropped meanwhile
    assert merge.take()[1] == {}
