"""``rankrun.api.values.collect`` and ``rankrun.api.failures.collect`` on an in-memory store: what a node reads of the
other nodes when a ``rankrun.launch`` job ends, and what it must forget of earlier rounds."""

from __future__ import annotations

import asyncio
import json
import pickle

from fakes import FakeTimers
from rankrun.api import failures, values
from rankrun.api.node import ApiNode
from rankrun.api.results import ROOT, ErrorRecord
from rankrun.ranks import NodeRanks
from rankrun.rendezvous.keys import Assignment, Keys, RoundWord, result_value
from rankrun.rendezvous.member import Member
from rankrun.rendezvous.round import NodeInfo, Phase
from rankrun.report.failure import Ending, WorkerResult
from rankrun.store.memory import MemoryStore

KEYS = Keys.for_run("job")


def test_a_node_reads_the_other_ranks_values_and_forgets_what_an_earlier_round_left(tmp_path):
    for name in ("0.value", "5.value", "5.error", "4.at", "3.value", "2.failed"):  # 0 is this node's, the rest stale
        (tmp_path / name).write_bytes(b"old")

    async def main():
        store = MemoryStore(FakeTimers())
        await store.put(KEYS.value(7, 1), values.encode(1, "b", pickle.dumps("one")))
        await store.put(KEYS.value(7, 2), values.encode(2, "c", None, size=5 << 20, path="/shared/2.value"))
        await store.put(KEYS.value(6, 3), values.encode(3, "c", pickle.dumps("round 6")))  # an earlier round's
        await values.collect(store, KEYS, 7, 4, range(1), results=tmp_path)

    asyncio.run(main())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.value", "1.value", "2.at"]
    assert (tmp_path / "0.value").read_bytes() == b"old"  # this node's own, as its worker wrote it
    assert pickle.loads((tmp_path / "1.value").read_bytes()) == "one"
    assert json.loads((tmp_path / "2.at").read_text())["path"] == "/shared/2.value"


def _node(node_id: str, host: str, rank: int, message: str) -> bytes:
    record = {"rank": rank, "status": 1, "exc_type": "ValueError", "message": message,
              "traceback": f"ValueError: {message}\n", "pickled": ""}
    return json.dumps({"node": node_id, "host": host, "root": rank, "failures": [record]}).encode()


def test_the_jobs_first_failure_is_the_node_whose_report_came_first(tmp_path):
    """Two nodes failed at once; the coordinator's report names the first result it read, so does ``root``."""
    async def main():
        store = MemoryStore(FakeTimers())
        await store.put(KEYS.failures(3, 0), _node("n0", "gpu0", 1, "zero broke"))
        await store.put(KEYS.failures(3, 2), _node("n2", "gpu2", 5, "two broke"))
        await store.put(KEYS.result(3, "n2"), result_value(False, "rank 5 ..."))  # n2 reported first
        await store.put(KEYS.result(3, "n0"), result_value(False, "rank 1 ..."))
        await failures.collect(store, KEYS, 3, 3, range(2, 4), results=tmp_path)  # this node: group 1, ranks 2-3

    asyncio.run(main())
    assert json.loads((tmp_path / ROOT).read_text()) == {"rank": 5}
    assert json.loads((tmp_path / "5.failed").read_text()) == {"status": 1, "host": "gpu2"}
    assert ErrorRecord.parse((tmp_path / "1.error").read_bytes()).message == "zero broke"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1.error", "1.failed", "5.error", "5.failed", ROOT]


def test_a_value_that_cannot_be_spilled_still_reaches_the_others_as_the_reason(tmp_path):
    """A full or unwritable log_dir does not fail a job that succeeded: the other nodes say why they lack the value."""
    results, blocked = tmp_path / "results", tmp_path / "not-a-dir"
    results.mkdir()
    blocked.write_text("a file where the log directory should be")
    (results / "0.value").write_bytes(bytes(values.VALUE_LIMIT + 1))

    async def main():
        store = MemoryStore(FakeTimers())
        written = await values.publish(store, KEYS, 1, range(1), results=results, spill_dir=blocked / "values",
                                       host="gpu0", lease=0)
        assert written == [KEYS.value(1, 0)]
        other = tmp_path / "other"
        other.mkdir()
        await values.collect(store, KEYS, 1, 1, range(0), results=other)
        return other

    other = asyncio.run(main())
    try:
        values.read_spilled(other / "0.at")
    except OSError as exc:
        message = str(exc)
    assert message.startswith("rank 0's value (1,048,577 bytes, on gpu0) is larger than the 1,048,576 bytes")
    assert f"its node could not spill it to {blocked / 'values'}: " in message


def test_a_node_left_out_of_the_last_round_returns_nothing_of_its_own_earlier_round(tmp_path):
    """A new coordinator's placement left this node out of the round that succeeded: what its workers returned in an
    earlier round must not pass for the job's values."""
    (tmp_path / "2.value").write_bytes(pickle.dumps("round 1"))
    (tmp_path / "3.value").write_bytes(pickle.dumps("round 1"))

    async def main():
        store = MemoryStore(FakeTimers())
        member = Member(store, KEYS, NodeInfo("n1", 1, 2, "default", "127.0.0.2", "gpu1"), await store.grant(30))
        node = ApiNode(member, tmp_path, nproc=2, host="gpu1", address="gpu1/127.0.0.2", spill_dir=None, run_id="job",
                       close_timeout=5)
        placed = Assignment(1, 1, 2, NodeRanks(2, 4, 2, 4), "127.0.0.1", 29500, 0)
        await node.job_ended(RoundWord(2, Phase.ENDED, ok=True), placed, print)

    asyncio.run(main())
    assert list(tmp_path.iterdir()) == []


def test_a_node_deletes_its_previous_reports_keys_before_publishing_again(tmp_path):
    """A job that restarts often must not pile up values and failures it will never read: each report replaces the
    node's previous one (round 1 succeeded, round 2 failed, round 3 succeeded)."""
    (tmp_path / "2.value").write_bytes(pickle.dumps("two"))
    (tmp_path / "3.value").write_bytes(pickle.dumps("three"))

    def ended(status: int) -> list[WorkerResult]:
        ending = Ending.SUCCEEDED if status == 0 else Ending.FAILED
        return [WorkerResult(i, 2 + i, 100 + i, status, ending, 0.0, "", None, "") for i in range(2)]

    async def main():
        store = MemoryStore(FakeTimers())
        member = Member(store, KEYS, NodeInfo("n1", 1, 2, "default", "127.0.0.2", "gpu1"), await store.grant(30))
        node = ApiNode(member, tmp_path, nproc=2, host="gpu1", address="gpu1/127.0.0.2", spill_dir=None, run_id="job",
                       close_timeout=5)
        held = []
        for round_, status in ((1, 0), (2, 1), (3, 0)):
            await node.report(Assignment(round_, 1, 2, NodeRanks(2, 4, 2, 4), "127.0.0.1", 29500, 0), status != 0, ended(status))
            entries, _ = await store.range(KEYS.root)
            held.append(sorted(e.key[len(KEYS.root):] for e in entries if not e.key.startswith(KEYS.node("n1"))))
        return held

    assert asyncio.run(main()) == [["values/1/2", "values/1/3"], ["failures/2/1"], ["values/3/2", "values/3/3"]]
