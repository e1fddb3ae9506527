"""``rankrun.api.failures.node_failures``: one node's failures fitted to the store's limit, the first failure's text
kept longest (pure: files in, bytes out)."""

from __future__ import annotations

import json
import pickle

from rankrun.api.failures import TAIL, node_failures
from rankrun.api.results import ErrorRecord
from rankrun.api.values import VALUE_LIMIT


def _write(tmp_path, rank: int, traceback: str, exception: BaseException) -> None:
    record = ErrorRecord("ValueError", f"rank {rank} broke", traceback, pickle.dumps(exception))
    (tmp_path / f"{rank}.error").write_bytes(record.value())


def test_a_nodes_failures_travel_whole_when_they_fit(tmp_path):
    _write(tmp_path, 4, "Traceback ...\nValueError: rank 4 broke\n", ValueError("rank 4 broke"))
    node = json.loads(node_failures("n1", "gpu7", 4, [(4, 1), (5, -9)], tmp_path))
    assert (node["node"], node["host"], node["root"]) == ("n1", "gpu7", 4)
    four, five = node["failures"]
    assert (four["rank"], four["status"], four["exc_type"], four["message"]) == (4, 1, "ValueError", "rank 4 broke")
    assert four["traceback"].endswith("ValueError: rank 4 broke\n") and four["pickled"]
    assert (five["rank"], five["status"], five["exc_type"], five["traceback"]) == (5, -9, "", "")  # killed: no record


def test_too_much_drops_the_exceptions_then_every_text_but_the_first_failures_tail(tmp_path):
    huge = "x" * VALUE_LIMIT
    for rank in range(8):
        _write(tmp_path, rank, f"Traceback {rank}\n{huge}\nValueError: rank {rank} broke\n", ValueError(huge))
    value = node_failures("n0", "gpu0", 3, [(rank, 1) for rank in range(8)], tmp_path)
    assert len(value) <= VALUE_LIMIT
    records = json.loads(value)["failures"]
    assert [r["rank"] for r in records] == list(range(8)) and {r["status"] for r in records} == {1}
    assert not any(r["pickled"] for r in records)
    first = records[3]
    assert len(first["traceback"]) == TAIL and first["traceback"].endswith("ValueError: rank 3 broke\n")
    assert [r["traceback"] for r in records if r["rank"] != 3] == [""] * 7
    assert {r["exc_type"] for r in records} == {"ValueError"}
