"""The stacks exchange's records through the store: what a node sends decodes to what it sampled, and stays small."""

from __future__ import annotations

import zlib

from rankrun.stacks.dump import Dump, Frame, ThreadStack
from rankrun.stacks.report import Child, ProcState, RankSample
from rankrun.stacks.wire import Answer, Ask, JobReport

TORCH = "/home/user/venv/lib/python3.11/site-packages/torch"
TRAIN = tuple(Frame("/home/user/project/train.py", 100 + i, f"level_{i}") for i in range(6))
COLLECTIVE = (*TRAIN, Frame(f"{TORCH}/distributed/c10d_logger.py", 81, "wrapper"),
              Frame(f"{TORCH}/distributed/distributed_c10d.py", 2501, "all_reduce"))
LOADER = (*TRAIN, Frame(f"{TORCH}/utils/data/dataloader.py", 631, "__next__"),
          Frame(f"{TORCH}/utils/data/dataloader.py", 1329, "_next_data"),
          Frame("/usr/lib/python3.11/multiprocessing/queues.py", 113, "get"))
PIN = (Frame("/usr/lib/python3.11/threading.py", 1002, "_bootstrap"), Frame("/usr/lib/python3.11/threading.py", 1045, "_bootstrap_inner"),
       Frame(f"{TORCH}/utils/data/_utils/pin_memory.py", 54, "_pin_memory_loop"), Frame("/usr/lib/python3.11/queue.py", 180, "get"))


def _rank(rank: int, main: tuple[Frame, ...], *, children: tuple[Child, ...] = ()) -> RankSample:
    threads = (ThreadStack(0x7F00 + rank, True, main), ThreadStack(0x8F00 + rank, False, PIN))
    return RankSample(rank, "node-7/10.0.0.8", Dump(threads), ProcState("S", 0.01, ""), children=children)


def _node(first: int, n: int = 8) -> tuple[RankSample, ...]:
    """A node of ``n`` ranks, all in ``all_reduce`` but its first, which waits on its DataLoader."""
    loader_children = tuple(Child(9000 + i, "pt_data_worker", "S") for i in range(4))
    return tuple(_rank(r, LOADER if r == first else COLLECTIVE, children=loader_children if r == first else ())
                 for r in range(first, first + n))


def test_an_answer_decodes_to_the_samples_it_was_made_of() -> None:
    samples = (*_node(8, 3), RankSample(11, "node-7/10.0.0.8", None, None),
               RankSample(12, "node-7/10.0.0.8", None, ProcState("D", None, "io_schedule")),
               RankSample(13, "node-7/10.0.0.8", None, ProcState("T", 0.0), answered=False))
    answer = Answer.parse(Answer(7, 2, 1, "node-7/10.0.0.8", samples).value())
    assert answer is not None and (answer.ask, answer.round, answer.node, answer.host) == (7, 2, 1, "node-7/10.0.0.8")
    for sent, got in zip(samples, answer.samples, strict=True):
        assert (got.rank, got.host, got.proc, got.answered, got.children) == (sent.rank, sent.host, sent.proc, sent.answered,
                                                                               sent.children)
        if sent.dump is None:
            assert got.dump is None
        else:
            assert got.dump is not None and got.dump.main is not None and sent.dump.main is not None
            assert got.dump.main.frames == sent.dump.main.frames
            assert [t.frames for t in got.dump.others] == [t.frames for t in sent.dump.others]


def test_a_node_of_eight_ranks_sends_its_stacks_once_each_in_under_4_kb() -> None:
    eight = Answer(1, 0, 3, "node-7/10.0.0.8", _node(24)).value()
    one = Answer(1, 0, 3, "node-7/10.0.0.8", _node(24, 1)).value()
    assert len(eight) <= 4096
    raw = zlib.decompress(eight)
    assert raw.count(b'"all_reduce"') == 1 and raw.count(b'"_pin_memory_loop"') == 1  # every distinct stack once
    assert raw.count(f"{TORCH}/utils/data/dataloader.py".encode()) == 1  # and every file name once
    assert len(eight) < 2 * len(one)  # seven more ranks cost their states, not their stacks


def test_the_ask_and_the_report_round_trip_and_anything_else_reads_as_nothing() -> None:
    ask = Ask(3, "node-a", "stall")
    assert Ask.parse(ask.value()) == ask
    report = JobReport(12, 3, "stall", "ab12", ("rankrun: job j stalled: ...", "  rank 3 on h"), "no output for 5 s")
    assert JobReport.parse(report.value()) == report
    for junk in (b"", b"{}", zlib.compress(b"[1, 2]"), zlib.compress(b'{"ask": "x"}'), b"\x00garbage"):
        assert Ask.parse(junk) is None and JobReport.parse(junk) is None and Answer.parse(junk) is None
