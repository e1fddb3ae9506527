"""A stall's outlier node is blamed, not the node that reported the stall first (issue 23): real launchers on
loopback "nodes", each its own --local-addr, with plain-Python workers.

Three nodes ``--nnodes 2:3 --hang-action fail --hang-timeout 1 --max-node-failures 1``. The outlier's worker retries
in ``stuck_loading_data`` printing all the while, so its node never sees a stall and never reports one; the two
healthy nodes' workers fall silent in ``wait_for_peers``, their watches report the job's stall and fail their
rounds. The job's stack report names the outlier's node (the smallest group of stacks); that node, never the first
to report, is the one excluded: its launcher exits 4 saying why, and the healthy two finish on the restart.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import clean_environ, fresh_loopback, payload

pytestmark = pytest.mark.usefixtures("private_tmpdir")


def _node(endpoint: str, local: str, events: Path, *, host: bool) -> list[str]:
    conf = f"is_host={int(host)},last_call_timeout=20,join_timeout=60"
    return ["--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{endpoint}:29400", "--rdzv-id", "stallblame",
            "--rdzv-conf", conf, "--max-restarts", "1", "--local-addr", local, "--events", str(events),
            "--hang-timeout", "1", "--hang-action", "fail", "--shutdown-timeout", "2", "--max-node-failures", "1",
            "--nproc-per-node", "1", payload("stall_node.py")]


def _events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_stalled_outliers_node_is_excluded_not_the_first_to_report(launch, tmp_path):
    endpoint, b, odd = fresh_loopback(), fresh_loopback(), fresh_loopback()
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "stallblame-secret", "STARTED": str(tmp_path / "outlier-started")}
    host = launch(*_node(endpoint, endpoint, tmp_path / "host.jsonl", host=True), env=dict(env))
    other = launch(*_node(endpoint, b, tmp_path / "other.jsonl", host=False), env=dict(env))
    outlier = launch(*_node(endpoint, odd, tmp_path / "outlier.jsonl", host=False), env=env | {"OUTLIER": "1"})

    assert outlier.finish(timeout=90) == 4, (outlier.err, host.err, other.err)
    # (no frame where the outlier's stack did not come back in time: a loaded machine)
    assert re.fullmatch(rf"rankrun: this node \(\S+, {re.escape(odd)}\) is excluded from job stallblame: blamed for 1 "
                        r"failures of the job \(--max-node-failures 1\); the last: the job stalled: no output for [\d.]+ s; "
                        rf"rank [12] on \S+/{re.escape(odd)} \(the smallest group of stacks\)"
                        r"( at \S+stall_node\.py:\d+ in stuck_loading_data)?; drain it or reschedule elsewhere",
                        outlier.err[-1]), outlier.err
    assert [host.finish(timeout=60), other.finish(timeout=60)] == [0, 0], (host.err, other.err)
    for node in (host, other):
        node.wait_for(r"DONE rank [01]", timeout=1)  # the restart ran without the outlier, and finished

    # the healthy nodes reported the stall (the outlier's never did), and it is the outlier that was excluded
    reporters = [e for node in ("host", "other") for e in _events(tmp_path / f"{node}.jsonl")
                 if e["event"] == "workers.end" and e.get("outcome") == "stalled"]
    assert reporters, (host.err, other.err)
    assert not any(e["event"] == "workers.end" and e.get("outcome") == "stalled" for e in _events(tmp_path / "outlier.jsonl"))
    for name in ("host", "other"):
        events = _events(tmp_path / f"{name}.jsonl")
        (excluded,) = [e for e in events if e["event"] == "node.excluded"]
        assert excluded["nodes"][0].endswith(f" at {odd}"), excluded  # type: ignore[index]
        (restart,) = [e for e in events if e["event"] == "restart"]
        assert re.match(r"node \S+ reported a stall: no output for [\d.]+ s; rank [12] on \S+ \(the smallest group of stacks\)",
                        str(restart["reason"])), restart
    assert any(re.search(rf"node \S+ at {re.escape(odd)} is excluded from the job: blamed for 1 failures", line)
               for line in host.err), host.err
    assert [e["exit_code"] for e in _events(tmp_path / "outlier.jsonl") if e["event"] == "job.end"] == [4]
