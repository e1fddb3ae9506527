"""torchelastic's events from rankrun's: the names, the order and the JSON layout of torchrun's own lines (the
golden files), with real timestamps and the values torch leaves empty filled in.

The golden files are torchrun's stderr lines (torch 2.13), the JSON ones, from
``torchrun --nproc-per-node=2 --event-log-handler console --no-python true`` (``..._succeeded``) and
``... --no-python sh -c 'if [ "$LOCAL_RANK" = 0 ]; then exit 3; else sleep 30; fi'`` (``..._failed``).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from conftest import GOLDEN_DIR
from rankrun.events.records import from_json
from rankrun.events.torchelastic import TorchelasticEvents

RUN = "job-te"
# every state torch's agent records: its phases (record_duration), START, the final states (a WorkerState's value),
# and TERMINATED for a worker of a failed group without a failure of its own (_get_worker_state)
TORCH_STATES = {"RENDEZVOUS", "ASSIGN_WORKER_RANKS", "START", "SUCCEEDED", "FAILED", "TERMINATED"}


def _golden(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (GOLDEN_DIR / f"torchelastic_events_{name}.jsonl").read_text().splitlines()]


def _layout(line: dict[str, Any]) -> tuple[object, ...]:
    """What must match torch's: the name, the source, and the keys at each level, in order."""
    meta = line["metadata"]
    return (line["name"], line["source"], list(line), list(meta), list(json.loads(meta["metadata"])))


class Job:
    """Feeds rankrun events, stamped now, and keeps the lines written."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.events = TorchelasticEvents(self.lines.append, hostname="node-a")
        self.mono0 = time.monotonic()

    def __call__(self, name: str, *, mono_offset: float = 0.0, **keys: object) -> None:
        self.events.on_event(from_json({"v": 1, "ts": time.time(), "mono": self.mono0 + mono_offset, "run": RUN,
                                        "node": "127.0.0.1", "event": name, **keys}))

    def parsed(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]

    def start(self, nproc: int = 2, attempt: int = 0, mono_offset: float = 0.0) -> None:
        if attempt == 0:
            self("job.start", nproc_per_node=nproc, nnodes="1", max_restarts=1, rdzv_backend="c10d", entry="train.py")
        self("rdzv.round", round=attempt, nodes=1, world_size=nproc, group_rank=0, seconds=0.25,
             mono_offset=mono_offset)
        self("workers.start", attempt=attempt, ranks=f"0-{nproc - 1}", pids=[4000 + attempt * 10 + r
                                                                             for r in range(nproc)],
             mono_offset=mono_offset)


def test_a_succeeding_job_has_torchruns_lines_names_order_and_layout():
    job = Job()
    before = int(time.time() * 1000)
    job.start()
    job("startup", attempt=0, total=1.0, rendezvous=0.25, spawn=0.1, script_p50=None, script_max=None,
        script_slowest=None, store_p50=None, store_max=None, store_slowest=None)  # nothing of torch's: no line
    job("workers.end", attempt=0, outcome="succeeded", mono_offset=3.7)
    job("job.end", exit_code=0, outcome="succeeded", mono_offset=3.8)
    after = int(time.time() * 1000)
    ours = job.parsed()
    assert [_layout(line) for line in ours] == [_layout(line) for line in _golden("succeeded")]
    for line in ours:
        assert before <= line["timestamp"] <= after  # real, in milliseconds; torch's are all 0
        assert line["metadata"]["run_id"] == RUN
        assert line["metadata"]["group_rank"] == 0  # torch's first two say null
        assert json.loads(line["metadata"]["metadata"])["group_world_size"] == 1  # torch's first two say null


def test_the_workers_lines_say_their_ranks_and_pids():
    job = Job()
    job.start(nproc=3)
    starts = [line["metadata"] for line in job.parsed() if line["name"].endswith(".START")]
    assert [(m["global_rank"], m["worker_id"]) for m in starts] == [(0, "4000"), (1, "4001"), (2, "4002")]
    inner = [json.loads(m["metadata"]) for m in starts]
    assert [(i["local_rank"], i["role_rank"], i["role_world_size"], i["worker_pid"], i["exit_code"]) for i in inner] \
        == [([r], [r], [3], [4000 + r], [None]) for r in range(3)]
    assert {i["entry_point"] for i in inner} == {"train.py"}
    rendezvous = job.parsed()[0]["metadata"]
    assert rendezvous["duration_ms"] == 250.0
    assert rendezvous["rdzv_backend"] == "c10d"
    assert rendezvous["hostname"] == "node-a"


@pytest.mark.parametrize("failure_first", [False, True])
def test_a_failed_attempt_names_its_root_cause_failed_and_the_others_terminated(failure_first):
    job = Job()
    job.start()
    failure = {"attempt": 0, "rank": 0, "host": "127.0.0.1", "exit_code": 3, "signal": None,
               "exception": "ValueError: bad batch"}
    if failure_first:
        job("failure", **failure)
    job("workers.end", attempt=0, outcome="failed")
    if not failure_first:
        job("failure", **failure)
    job("job.end", exit_code=1, outcome="failed")
    ours = job.parsed()
    golden = _golden("failed")  # torchrun's: rank 0 exits 3, rank 1 is ended by torch's SIGTERM
    assert [_layout(line)[1:] for line in ours] == [_layout(line)[1:] for line in golden]
    assert [line["name"].removeprefix("torchelastic.worker.status.") for line in ours] == [
        "RENDEZVOUS", "ASSIGN_WORKER_RANKS", "START", "START", "FAILED", "TERMINATED", "SUCCEEDED"]
    cause = ours[4]["metadata"]
    assert cause["global_rank"] == 0
    assert json.loads(cause["raw_error"]) == {"message": "ValueError: bad batch"}
    assert json.loads(cause["metadata"])["exit_code"] == [3]
    assert ours[5]["metadata"]["raw_error"] is None
    assert ours[-1]["source"] == "AGENT"  # torch's agent "succeeded": it ran its course, whatever the workers did


def test_a_root_cause_on_another_node_leaves_every_worker_here_terminated_and_a_signal_is_minus_signum():
    job = Job()
    job.start()
    job("workers.end", attempt=0, outcome="failed")
    job("failure", attempt=0, rank=5, host="node-b", exit_code=None, signal="SIGKILL", exception=None)
    job("job.end", exit_code=1, outcome="failed")
    assert [line["name"].rsplit(".", 1)[1] for line in job.parsed()[4:6]] == ["TERMINATED", "TERMINATED"]

    job = Job()
    job.start()
    job("failure", attempt=0, rank=1, host="127.0.0.1", exit_code=None, signal="SIGKILL", exception=None)
    job("workers.end", attempt=0, outcome="failed")
    cause = job.parsed()[5]["metadata"]
    assert (cause["state"], cause["global_rank"]) == ("FAILED", 1)
    assert json.loads(cause["metadata"])["exit_code"] == [-9]  # torch's exit code for a worker a signal ended
    assert json.loads(cause["raw_error"]) == {"message": "<NONE>"}


def test_a_restart_counts_in_agent_restarts_and_the_run_time_grows():
    job = Job()
    job.start()
    job("failure", attempt=0, rank=1, host="127.0.0.1", exit_code=1, signal=None, exception=None)
    job("workers.end", attempt=0, outcome="failed", mono_offset=2.0)
    job("restart", attempt=1, reason="worker failed", restarts_left=0, mono_offset=2.1)
    job.start(attempt=1, mono_offset=5.5)
    job("workers.end", attempt=1, outcome="succeeded", mono_offset=9.0)
    job("job.end", exit_code=0, outcome="succeeded", mono_offset=9.2)
    states = [(m["state"], m["global_rank"], m["agent_restarts"], m["total_run_time"])
              for m in (line["metadata"] for line in job.parsed())]
    assert states == [
        ("RENDEZVOUS", None, 0, 0), ("ASSIGN_WORKER_RANKS", None, 0, 0), ("START", 0, 0, 0), ("START", 1, 0, 0),
        ("TERMINATED", 0, 0, 2), ("FAILED", 1, 0, 2),
        ("RENDEZVOUS", None, 1, 5), ("ASSIGN_WORKER_RANKS", None, 1, 5), ("START", 0, 1, 5), ("START", 1, 1, 5),
        ("SUCCEEDED", 0, 1, 9), ("SUCCEEDED", 1, 1, 9), ("SUCCEEDED", None, 1, 9),
    ]
    restarted = [json.loads(line["metadata"]["metadata"])["worker_pid"] for line in job.parsed()[8:10]]
    assert restarted == [[4010], [4011]]


@pytest.mark.parametrize(("outcome", "state"), [("succeeded", "SUCCEEDED"), ("failed", "SUCCEEDED"),
                                                ("interrupted", "FAILED"), ("error", "FAILED")])
def test_the_agents_last_line_is_torchs(outcome, state):
    job = Job()
    job.start()
    job("job.end", exit_code=0, outcome=outcome)
    last = job.parsed()[-1]
    assert (last["name"], last["source"]) == (f"torchelastic.worker.status.{state}", "AGENT")


def test_every_name_is_one_torch_records_and_other_events_write_nothing():
    job = Job()
    job("stall", ranks="0", title="stalled")
    job("straggler", rank=1, where="node-a/127.0.0.1", verdict="named", lag=0.1, share=0.9, collectives=10, line="x")
    job("node.lost", nodes=["node-b"], reason="its lease ended")
    job("node.excluded", nodes=["node-b"], reason="unhealthy")
    job("startup", attempt=0, total=1.0, rendezvous=0.1, spawn=0.1, script_p50=None, script_max=None,
        script_slowest=None, store_p50=None, store_max=None, store_slowest=None)
    job("preload", modules="torch", seconds=2.31, state="ready", why="")
    job("warm", attempt=0, forked="0-1", cold="", fork_p50=0.004, fork_max=0.005)
    job("checkpoint.kept", step=5, ranks="0-1", bytes=1024, seconds=0.01, state="kept", why=None)
    job("checkpoint.written", step=5, to="disk", where="/ckpt/step-5", bytes=1024, seconds=0.2, state="complete")
    job("checkpoint.restored", attempt=1, step=5, source="memory", ranks="0-1", bytes=1024, seconds=0.01)
    job("workers.start", attempt=0, ranks="not-a-range", pids=[])
    assert job.lines == []
    job.start()
    job("workers.end", attempt=0, outcome="stopped")
    job("job.end", exit_code=130, outcome="interrupted")
    names = {json.loads(line)["name"] for line in job.lines}
    assert {n.removeprefix("torchelastic.worker.status.") for n in names} <= TORCH_STATES
    assert {line["name"] for golden in ("succeeded", "failed") for line in _golden(golden)} <= {
        f"torchelastic.worker.status.{s}" for s in TORCH_STATES}


def test_torchs_own_event_class_reads_every_line_back_to_the_same_text():
    """torch's ``Event.deserialize`` takes each line, and its ``serialize`` gives back the very same text: the same
    keys, in the same order, of the same kinds."""
    api = pytest.importorskip("torch.distributed.elastic.events.api")
    job = Job()
    job.start()
    job("failure", attempt=0, rank=1, host="127.0.0.1", exit_code=1, signal=None, exception="KeyError: 'x'")
    job("workers.end", attempt=0, outcome="failed")
    job("job.end", exit_code=1, outcome="failed")
    for line in job.lines:
        event = api.Event.deserialize(line)
        assert event.source in (api.EventSource.WORKER, api.EventSource.AGENT)
        assert event.serialize() == line


def test_a_root_cause_that_comes_after_its_attempt_ended_writes_the_workers_lines_at_once():
    job = Job()
    job.start()
    job("workers.end", attempt=0, outcome="failed")
    assert len(job.lines) == 4  # the workers' last lines wait for the root cause
    job("failure", attempt=0, rank=1, host="127.0.0.1", exit_code=None, signal=None, exception="KeyError: 'x'")
    assert [line["metadata"]["state"] for line in job.parsed()[4:]] == ["TERMINATED", "FAILED"]
    assert json.loads(job.parsed()[5]["metadata"]["metadata"])["exit_code"] == [None]  # no exit code, no signal known


def test_what_the_events_leave_out_or_repeat():
    job = Job()
    job("workers.end", attempt=0, outcome="failed")  # no workers started here yet: nothing to end
    job("failure", attempt=0, rank=0, host="127.0.0.1", exit_code=1, signal="SIGKILL", exception=None)
    assert job.lines == []
    job.start()
    job("workers.end", attempt=0, outcome="failed")
    assert json.loads(job.parsed()[4]["metadata"]["metadata"])["exit_code"] == [1]  # the exit code known wins
    for attempt in (1, 2):
        job("restart", attempt=attempt, reason="worker failed", restarts_left=2 - attempt)
    job("workers.start", attempt=2, ranks="0-1", pids=[4100])  # a pid fewer than its ranks
    started = job.parsed()[-2:]
    assert [line["metadata"]["agent_restarts"] for line in started] == [2, 2]
    assert [json.loads(line["metadata"]["metadata"])["worker_pid"] for line in started] == [[4100], [None]]
    assert [line["metadata"]["worker_id"] for line in started] == ["4100", None]
