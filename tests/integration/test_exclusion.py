"""A black-hole node excluded from a job of real launchers on loopback "nodes" (issue 23), each its own --local-addr.

Three nodes ``--nnodes 2:3 --max-restarts 3``; one node's workers exit 1 at start on every attempt (a ``--no-python
sh -c`` worker keyed on an environment variable only that node has). After ``--max-node-failures`` (2) failures it
is excluded: its launcher says why and exits 4, the other two finish 0 on two restarts; started again, it is refused
at join within 5 s and the running job is not re-formed. When the black hole is the node hosting the store, it serves
the job without workers until it ends, and leaves with its exit code.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from conftest import clean_environ, fresh_loopback

pytestmark = pytest.mark.usefixtures("private_tmpdir")

# A failing node's worker says what a broken GPU says and exits 1 at once; a healthy one runs until the restart that
# leaves the black hole out (stopped before), then until the test lets it finish.
WORKER = (
    'if [ -n "$BLACK_HOLE" ]; then echo "RuntimeError: CUDA error: uncorrectable ECC error encountered" >&2; exit 1; fi; '
    'echo "READY rank $RANK world $WORLD_SIZE restart $TORCHELASTIC_RESTART_COUNT group $GROUP_RANK '
    'master $MASTER_ADDR:$MASTER_PORT"; '
    'if [ "$TORCHELASTIC_RESTART_COUNT" -lt 2 ]; then exec sleep 300; fi; '
    'while [ ! -e "$FINISH" ]; do sleep 0.05; done'
)


def _node(endpoint: str, local: str, events: Path, *, host: bool) -> list[str]:
    conf = f"is_host={int(host)},last_call_timeout=20,join_timeout=60"
    return ["--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{endpoint}:29400", "--rdzv-id", "exclusion",
            "--rdzv-conf", conf, "--max-restarts", "3", "--local-addr", local, "--events", str(events),
            "--nproc-per-node", "1", "--no-python", "sh", "-c", WORKER]


def _events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_black_hole_node_is_excluded_after_two_failures_refused_when_it_comes_back_and_the_others_finish(launch, tmp_path):
    endpoint, b, hole_addr = fresh_loopback(), fresh_loopback(), fresh_loopback()
    finish = tmp_path / "finish"
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "exclusion-secret", "FINISH": str(finish)}
    host = launch(*_node(endpoint, endpoint, tmp_path / "host.jsonl", host=True), env=dict(env))
    other = launch(*_node(endpoint, b, tmp_path / "other.jsonl", host=False), env=dict(env))
    hole = launch(*_node(endpoint, hole_addr, tmp_path / "hole.jsonl", host=False), env=env | {"BLACK_HOLE": "1"})

    assert hole.finish(timeout=60) == 4, (hole.err, host.err, other.err)
    assert re.fullmatch(rf"rankrun: this node \(\S+, {re.escape(hole_addr)}\) is excluded from job exclusion: blamed for 2 "
                        rf"failures of the job \(--max-node-failures 2\); the last: rank \d on {re.escape(hole_addr)} exited 1"
                        r"(: .*)?; drain it or reschedule elsewhere", hole.err[-1]), hole.err
    for node in (host, other):
        node.wait_for(r"READY rank [01] world 2 restart 2")

    # the black hole's launcher started again (a scheduler's retry): refused at join, the job left as it is
    started = time.monotonic()
    again = launch(*_node(endpoint, hole_addr, tmp_path / "again.jsonl", host=False), env=env | {"BLACK_HOLE": "1"})
    assert again.finish(timeout=30) == 4, again.err
    took = time.monotonic() - started
    assert took < 5.0, took
    assert re.fullmatch(rf"rankrun: this node \(\S+, {re.escape(hole_addr)}\) was excluded from job exclusion at "
                        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: blamed for 2 failures of the job .*; drain it or reschedule "
                        r"elsewhere", again.err[-1]), again.err
    finish.touch()
    assert [host.finish(timeout=60), other.finish(timeout=60)] == [0, 0], (host.err, other.err)

    host_events = _events(tmp_path / "host.jsonl")
    # (a node still stopping its workers may skip a round that failed at once: it hears of the next one)
    rounds = [(e["round"], e["nodes"]) for e in host_events if e["event"] == "rdzv.round"]
    assert rounds[-1] == (3, 2) and all(nodes == 3 for _, nodes in rounds[:-1]), rounds  # no round after the comeback
    assert [e["restarts_left"] for e in host_events if e["event"] == "restart"][-1] == 1  # 2 of 3 restarts spent
    (excluded,) = [e for e in host_events if e["event"] == "node.excluded"]
    assert excluded["nodes"][0].endswith(f" at {hole_addr}") and str(excluded["reason"]).startswith("blamed for 2 failures")
    assert any(re.search(rf"node \S+ at {re.escape(hole_addr)} is excluded from the job: blamed for 2 failures", line)
               for line in host.err), host.err
    assert not any(e["event"] == "workers.start" for e in _events(tmp_path / "again.jsonl"))
    assert [e["exit_code"] for e in _events(tmp_path / "hole.jsonl") if e["event"] == "job.end"] == [4]

    # the time from the black hole's second failure to the job running without it (one monotonic clock: one machine)
    second = [e["mono"] for e in _events(tmp_path / "hole.jsonl") if e["event"] == "workers.end"][-1]
    running = [e["mono"] for e in host_events if e["event"] == "workers.start"][-1]
    print(f"second failure → running without the black hole: {running - second:.3f} s; refused comeback in {took:.3f} s")
    assert 0 < running - second < 10


def test_the_store_host_as_the_black_hole_serves_the_job_without_workers_and_leaves_with_its_exit_code(launch, tmp_path):
    endpoint, b, c = fresh_loopback(), fresh_loopback(), fresh_loopback()
    finish = tmp_path / "finish"
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "exclusion-secret", "FINISH": str(finish)}
    host = launch(*_node(endpoint, endpoint, tmp_path / "host.jsonl", host=True), env=env | {"BLACK_HOLE": "1"})
    others = [launch(*_node(endpoint, addr, tmp_path / f"{addr}.jsonl", host=False), env=dict(env)) for addr in (b, c)]
    host.wait_for(r"is excluded from job exclusion since .* UTC: blamed for 2 failures of the job .*; it keeps serving "
                  r"the rendezvous and the workers' store, without workers, until the job ends")
    ready = [node.wait_for(r"READY rank [01] world 2 restart 2")[0] for node in others]
    # group rank 0 moved to another node; the workers' store is still the host's, where MASTER_ADDR points
    assert sorted(line.split()[8] for line in ready) == ["0", "1"], ready
    assert {line.split()[10] for line in ready} == {f"{endpoint}:29400"}, ready
    finish.touch()
    assert [node.finish(timeout=60) for node in others] == [0, 0], [node.err for node in others]
    assert host.finish(timeout=60) == 0, host.err
    assert any(line.startswith("rankrun: rendezvous exclusion: the job ended (succeeded); this node served it without "
                               f"workers: excluded: blamed for 2 failures of the job (--max-node-failures 2); the last: rank 0 "
                               f"on {endpoint} exited 1") for line in host.err), host.err
    assert [e["event"] for e in _events(tmp_path / "host.jsonl")].count("workers.start") == 2
