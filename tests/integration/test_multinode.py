"""Several rankrun agents as real processes on loopback "nodes": static, dynamic, elastic, failures, losses, secrets.

Each test gets a fresh loopback address (127.x.y.z) for its endpoint, so the fixed ports that
static and dynamic jobs need cannot collide with anything else on the machine; nothing probes
for a free port. Workers are plain Python (no torch): tests/e2e has the gloo runs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest

from conftest import alive, clean_environ, fresh_loopback, payload, wait_gone

pytestmark = pytest.mark.usefixtures("private_tmpdir")

SECRET = "integration-secret"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return clean_environ() | {"TEST_OUT_DIR": str(out), "RANKRUN_RDZV_SECRET": SECRET} | extra


def _starts(tmp_path: Path) -> list[dict[str, str]]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("*.json"))]


def _static(addr: str, nodes: int, rank: int, *extra: str) -> list[str]:
    return ["--nnodes", str(nodes), "--node-rank", str(rank), "--master-addr", addr, "--master-port", "29500",
            "--nproc-per-node", "2", *extra, payload("node_worker.py")]


def _dynamic(addr: str, nnodes: str, *extra: str, nproc: int = 2) -> list[str]:
    return ["--nnodes", nnodes, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr}:29400", "--rdzv-id", "itest",
            "--nproc-per-node", str(nproc), *extra, payload("node_worker.py")]


def test_static_three_nodes_started_in_reverse_order(launch, tmp_path):
    addr = fresh_loopback()
    env = _env(tmp_path)
    runs = [launch(*_static(addr, 3, rank), env=dict(env)) for rank in (2, 1, 0)]
    assert [r.finish() for r in runs] == [0, 0, 0], [r.err for r in runs]
    starts = _starts(tmp_path)
    assert sorted(int(s["RANK"]) for s in starts) == list(range(6))
    for s in starts:
        assert int(s["GROUP_RANK"]) == int(s["RANK"]) // 2  # ranks follow the node rank
        assert (s["WORLD_SIZE"], s["GROUP_WORLD_SIZE"], s["LOCAL_WORLD_SIZE"]) == ("6", "3", "2")
        assert (s["MASTER_ADDR"], s["MASTER_PORT"]) == (addr, "29500")  # the static master, for every node


def test_dynamic_two_nodes_with_heterogeneous_slots(launch, tmp_path):
    addr = fresh_loopback()
    env = _env(tmp_path)
    host = launch(*_dynamic(addr, "2", nproc=3), env=dict(env))
    other = launch(*_dynamic(addr, "2", nproc=1), env=dict(env))
    assert [host.finish(), other.finish()] == [0, 0], (host.err, other.err)
    starts = _starts(tmp_path)
    assert sorted(int(s["RANK"]) for s in starts) == [0, 1, 2, 3]
    by_group = {s["GROUP_RANK"] for s in starts}
    assert by_group == {"0", "1"}
    assert {s["MASTER_PORT"] for s in starts} == {"29400"}  # the workers' store shares the endpoint's port
    assert {s["TORCHELASTIC_RUN_ID"] for s in starts} == {"itest"}


def test_a_node_joining_mid_run_grows_the_world_without_using_a_restart(launch, tmp_path):
    addr = fresh_loopback()
    finish = tmp_path / "finish"
    env = _env(tmp_path, NODE_WAIT_FILE=str(finish))
    first = launch(*_dynamic(addr, "1:3", "--rdzv-conf", "last_call_timeout=0.2", nproc=1), env=dict(env))
    first.wait_for(r"READY rank 0 world 1 restart 0")
    late = launch(*_dynamic(addr, "1:3", "--rdzv-conf", "last_call_timeout=0.2", nproc=1), env=dict(env))
    first.wait_for(r"READY rank 0 world 2 restart 0")  # the round re-formed with the newcomer
    late.wait_for(r"READY rank 1 world 2 restart 0")
    finish.touch()
    assert [first.finish(), late.finish()] == [0, 0], (first.err, late.err)


def test_a_killed_node_is_noticed_and_the_survivors_reform_and_finish(launch, tmp_path):
    addr = fresh_loopback()
    finish = tmp_path / "finish"
    env = _env(tmp_path, NODE_WAIT_FILE=str(finish))
    conf = ("--rdzv-conf", "last_call_timeout=0.2,keep_alive_interval=0.5,keep_alive_max_attempt=2")
    host = launch(*_dynamic(addr, "1:2", *conf, nproc=1), env=dict(env))
    host.wait_for(r"READY rank 0 world 1")
    doomed = launch(*_dynamic(addr, "1:2", *conf, nproc=1), env=dict(env))
    doomed.wait_for(r"READY rank 1 world 2")
    host.wait_for(r"READY rank 0 world 2")
    started = time.monotonic()
    doomed.proc.kill()  # kill -9: its connection drops, its lease goes with it
    doomed.finish()
    host.wait_for(r"READY rank 0 world 1 restart 0")  # again: a smaller world, without using a restart
    assert time.monotonic() - started < 20
    finish.touch()
    assert host.finish() == 0, host.err


def test_a_worker_failure_restarts_every_node_on_one_budget(launch, tmp_path):
    addr = fresh_loopback()
    env = _env(tmp_path, NODE_FAIL_RANK="3", NODE_FAIL_RESTART="0")
    runs = [launch(*_static(addr, 2, rank, "--max-restarts", "1"), env=dict(env)) for rank in (0, 1)]
    assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
    starts = [(int(s["RANK"]), s["TORCHELASTIC_RESTART_COUNT"]) for s in _starts(tmp_path)]
    assert (3, "0") in starts  # the failure; the others may have been stopped before they said anything
    assert sorted(r for r, c in starts if c == "1") == [0, 1, 2, 3]  # then every node ran again...
    assert {c for _, c in starts} == {"0", "1"}  # ...counted once for the whole job


def test_budget_spent_every_node_fails_and_names_the_first_failure(launch, tmp_path):
    addr = fresh_loopback()
    env = _env(tmp_path, NODE_FAIL_RANK="3", NODE_FAIL_RESTART="0", NODE_WAIT_FILE=str(tmp_path / "never"))
    runs = [launch(*_static(addr, 2, rank), env=dict(env)) for rank in (0, 1)]
    assert [r.finish() for r in runs] == [1, 1]
    host_report = "\n".join(runs[0].err)
    assert "The job's first failure (on any node):" in host_report
    assert "rank 3 (local_rank 1) on" in host_report and "exit code 7" in host_report
    assert "stopped by rankrun" in host_report  # the host's own workers were stopped, not failed


def test_a_wrong_secret_is_refused_with_one_line(launch, tmp_path):
    addr = fresh_loopback()
    finish = tmp_path / "finish"
    host = launch(*_dynamic(addr, "1:2", "--rdzv-conf", "last_call_timeout=0.2", nproc=1),
                  env=_env(tmp_path, NODE_WAIT_FILE=str(finish)))
    host.wait_for(r"READY rank 0 world 1")
    intruder = launch(*_dynamic(addr, "1:2", nproc=1), env=_env(tmp_path) | {"RANKRUN_RDZV_SECRET": "guess"})
    assert intruder.finish() == 3
    assert intruder.err == [f"rankrun: error: rendezvous {addr}:29400: authentication failed: "
                            "this job's rendezvous needs its secret"]
    host.wait_for(r"rejected a connection from 127\.0\.0\.1 that does not know this job.s secret")
    finish.touch()
    assert host.finish() == 0


def test_a_second_job_on_a_running_jobs_endpoint_is_refused_at_once_naming_the_job_that_holds_it(launch, tmp_path):
    """Issue 34: another --rdzv-id on the same endpoint printed "0/2 nodes joined" and waited out its join_timeout
    (600 s by default) before exit 3. Refused at its handshake now: one line naming the endpoint and the job holding
    it, exit 3 within seconds (its join_timeout here is 120 s); the running job is undisturbed."""
    addr = fresh_loopback()
    finish = tmp_path / "finish"
    held = launch(*_dynamic(addr, "1:2", "--rdzv-conf", "last_call_timeout=0.2", nproc=1),
                  env=_env(tmp_path, NODE_WAIT_FILE=str(finish)))
    held.wait_for(r"READY rank 0 world 1")
    second = [*_dynamic(addr, "2", "--rdzv-conf", "join_timeout=120", nproc=1)]
    second[second.index("itest")] = "other-job"
    intruder = launch(*second, env=_env(tmp_path))
    assert intruder.finish(timeout=30) == 3  # not after its join_timeout
    assert intruder.err == [f"rankrun: error: rendezvous {addr}:29400: held by job itest, not this node's job other-job "
                            "(--rdzv-id): another job's rendezvous runs on this endpoint; give this job an endpoint of its "
                            "own (--rdzv-endpoint HOST:PORT)"]
    assert intruder.out == []
    finish.touch()
    assert held.finish() == 0, held.err
    assert not any("joined" in line or "round 2" in line for line in held.err), held.err


def test_a_missing_static_node_times_out_naming_it(launch, tmp_path):
    """No --rdzv-id: torchrun's default id ``none`` is the run's, but no line calls the rendezvous "none"."""
    addr = fresh_loopback()
    env = {k: v for k, v in _env(tmp_path).items() if k != "RANKRUN_RDZV_SECRET"}
    alone = launch(*_static(addr, 3, 0, "--rdzv-conf", "join_timeout=1"), env=env)
    assert alone.finish() == 3
    assert alone.err[0] == ("rankrun: rendezvous: no secret (RANKRUN_RDZV_SECRET or --rdzv-conf secret_file=PATH): any "
                            "host that can reach the endpoint can join this job")
    # the node's own join_timeout, or the coordinator's on the same node ending the job first: the same fact
    assert re.match(r"rankrun: error: rendezvous: (the job ended: )?timed out after 1 s \(join_timeout\) waiting for "
                    "the other", alone.err[-1]), alone.err[-1]
    assert alone.err[-1].endswith("1 of 3 joined; node ranks never seen: 1, 2")


def test_spares_wait_then_exit_with_the_job_and_late_joiners_are_turned_away(launch, tmp_path, reaper):
    addr = fresh_loopback()
    finish = tmp_path / "finish"
    env = _env(tmp_path, NODE_WAIT_FILE=str(finish))
    members = [launch(*_dynamic(addr, "2", nproc=1), env=dict(env)) for _ in range(2)]
    for m in members:
        m.wait_for(r"READY rank \d world 2")
    spare = launch(*_dynamic(addr, "2", nproc=1), env=dict(env))
    spare.wait_for(r"this node waits as a spare")
    os.kill(spare.proc.pid, signal.SIGSTOP)  # it cannot leave: the host lingers after the end, waiting for it
    try:
        finish.touch()
        host = next(m for m in members if any("READY rank 0" in line for line in m.out))
        host.wait_for(r"the job has ended; waiting up to 30 s for [12] other node\(s\) to leave")
        late = launch(*_dynamic(addr, "2", nproc=1), env=dict(env))
        assert late.finish() == 3
        assert late.err[-1] == "rankrun: error: the job has already finished"
    finally:
        os.kill(spare.proc.pid, signal.SIGCONT)
    assert spare.finish() == 0
    assert spare.err[-1].endswith("the job ended (succeeded) while this node waited as a spare")
    assert [m.finish() for m in members] == [0, 0]


def test_losing_the_host_ends_the_others_with_an_infrastructure_error(launch, tmp_path):
    addr = fresh_loopback()
    env = _env(tmp_path, NODE_WAIT_FILE=str(tmp_path / "never"))
    runs = [launch(*_dynamic(addr, "2", nproc=1), env=dict(env)) for _ in range(2)]
    for run in runs:
        run.wait_for(r"READY rank \d world 2")
    host, other = sorted(runs, key=lambda r: "READY rank 0" not in r.out[0])  # the first to bind hosts
    workers = [int(p.read_text()) for p in (tmp_path / "pids").glob("w*")]
    host.proc.kill()
    host.finish()
    assert other.finish() == 3
    assert f"{addr}:29400" in other.err[-1] and "lost" in other.err[-1]
    said = (f"this node lost its place in the job: the host at {addr}:29400 closed the connection; workers stopped",
            f"this node lost its place in the job: the connection to the host at {addr}:29400 was lost (Connection reset")
    assert any(s in other.err[-1] for s in said), other.err[-1]  # a FIN or a RST: the host is gone, not silent
    assert wait_gone(workers, 10.0) == []
    assert not any(alive(p) for p in workers)


def test_a_frozen_node_is_noticed_by_its_lease_and_leaves_cleanly_when_it_wakes(launch, tmp_path):
    """SIGSTOP keeps the node's sockets open: only the lease (keep-alive window) can tell the others."""
    addr = fresh_loopback()
    finish = tmp_path / "finish"
    env = _env(tmp_path, NODE_WAIT_FILE=str(finish))
    conf = ("--rdzv-conf", "last_call_timeout=0.2,keep_alive_interval=0.3,keep_alive_max_attempt=2")
    host = launch(*_dynamic(addr, "1:2", *conf, nproc=1), env=dict(env))
    host.wait_for(r"READY rank 0 world 1")
    frozen = launch(*_dynamic(addr, "1:2", *conf, nproc=1), env=dict(env))
    frozen.wait_for(r"READY rank 1 world 2")
    host.wait_for(r"READY rank 0 world 2")
    os.kill(frozen.proc.pid, signal.SIGSTOP)
    try:
        host.wait_for(r"READY rank 0 world 1 restart 0")  # its lease expired: the host re-formed without it
    finally:
        os.kill(frozen.proc.pid, signal.SIGCONT)
    assert frozen.finish() == 3  # woken up: it finds its place gone, stops its workers, says so
    assert "this node lost its place in the job: this node was frozen (stopped or starved) for" in frozen.err[-1], frozen.err
    assert "past its lease (0.6 s)" in frozen.err[-1]
    finish.touch()
    assert host.finish() == 0


def test_is_host_decides_who_hosts(launch, tmp_path):
    addr = fresh_loopback()
    env = _env(tmp_path)
    guest = launch(*_dynamic(addr, "2", "--rdzv-conf", "is_host=0", nproc=1), env=dict(env))  # first, but told not to host
    host = launch(*_dynamic(addr, "2", nproc=1), env=dict(env))
    assert [guest.finish(), host.finish()] == [0, 0], (guest.err, host.err)
    assert any("READY rank 1" in line for line in guest.out) and any("READY rank 0" in line for line in host.out)
    elsewhere = launch(*_dynamic("192.0.2.1", "2", "--rdzv-conf", "is_host=1,join_timeout=1", nproc=1), env=dict(env))
    assert elsewhere.finish() == 3  # told to host an address that is not this machine's: a clear error, no hang
    assert elsewhere.err[-1].startswith("rankrun: error: cannot listen on 192.0.2.1:29400:")


def _reached(run) -> set[str]:
    """The store addresses this launcher's workers reached (``payloads/store_reach.py``'s STORE OK lines)."""
    return {m.group(1) for line in run.out if (m := re.search(r"STORE OK (\S+)", line))}


def test_a_host_whose_local_addr_is_not_the_endpoints_serves_its_workers_store_there(launch, tmp_path):
    # A management network for the endpoint, a fast one named by --local-addr: the workers are told the host's
    # --local-addr (as under torchrun) and must find their store there, not retry a closed port for 30 minutes.
    endpoint, first, second = fresh_loopback(), fresh_loopback(), fresh_loopback()
    args = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{endpoint}:29400", "--rdzv-id", "la",
            "--nproc-per-node", "1", "--rdzv-conf", "join_timeout=60"]
    runs = [launch(*args, "--local-addr", local, payload("store_reach.py"), env=_env(tmp_path)) for local in (first, second)]
    assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
    reached = _reached(runs[0]) | _reached(runs[1])
    assert len(reached) == 1, reached
    assert reached <= {f"{first}:29400", f"{second}:29400"}, reached  # the host's --local-addr, the endpoint's port


def test_a_local_addr_the_store_cannot_listen_on_falls_back_to_the_endpoint_in_one_line(launch, tmp_path):
    endpoint, local = fresh_loopback(), fresh_loopback()
    with socket.create_server((local, 29400)):  # the endpoint's port is taken on --local-addr's address
        run = launch("--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{endpoint}:29400", "--rdzv-id", "la",
                     "--rdzv-conf", "last_call_timeout=0.1", "--nproc-per-node", "1", "--local-addr", local,
                     payload("store_reach.py"), env=_env(tmp_path))
        assert run.finish() == 0, run.err
    assert _reached(run) == {f"{endpoint}:29400"}
    err = "\n".join(run.err)
    assert f"cannot listen on --local-addr {local} as well" in err
    assert f"the workers reach it at the endpoint's address, {endpoint}:29400" in err


def test_static_workers_reach_the_master_addr_whatever_the_nodes_local_addr(launch, tmp_path):
    master = fresh_loopback()
    runs = [launch("--nnodes", "2", "--node-rank", str(rank), "--master-addr", master, "--master-port", "29500",
                   "--nproc-per-node", "1", "--local-addr", fresh_loopback(), payload("store_reach.py"), env=_env(tmp_path))
            for rank in (0, 1)]
    assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
    assert _reached(runs[0]) | _reached(runs[1]) == {f"{master}:29500"}  # --master-addr, as under torchrun


def test_after_a_membership_change_the_restart_line_gives_the_workers_restart_count_too(launch, tmp_path):
    # attempt 0: the first node alone; attempt 1: both (a membership change, no restart spent), where rank 1 fails
    addr = fresh_loopback()
    env = _env(tmp_path, NODE_WAIT_FILE=str(tmp_path / "finish"), NODE_FAIL_RANK="1", NODE_FAIL_RESTART="0")
    conf = ("--rdzv-conf", "last_call_timeout=0.2", "--max-restarts", "1")
    first = launch(*_dynamic(addr, "1:2", *conf, nproc=1), env=dict(env))
    first.wait_for(r"READY rank 0 world 1 restart 0")
    late = launch(*_dynamic(addr, "1:2", *conf, nproc=1), env=dict(env))
    failed = r"rank 1 on \S+ exited 7; restarting workers \(1/1 restarts used\)"
    first.wait_for(rf"rankrun: attempt 1 \(TORCHELASTIC_RESTART_COUNT=0\) failed: {failed}")
    late.wait_for(rf"rankrun: attempt 0 failed: {failed}")  # its first attempt: the two numbers agree, one is said
    first.wait_for(r"READY rank 0 world 2 restart 1")
    late.wait_for(r"READY rank 1 world 2 restart 1")
    (tmp_path / "finish").touch()
    assert [first.finish(), late.finish()] == [0, 0], (first.err, late.err)


def test_every_node_that_receives_sigint_says_so(launch, tmp_path):
    # Ctrl-C of a terminal running both nodes, or a scheduler signalling every node: each says what it did
    addr = fresh_loopback()
    env = _env(tmp_path, NODE_WAIT_FILE=str(tmp_path / "never"))
    conf = ("--rdzv-conf", "last_call_timeout=0.2")
    nodes = [launch(*_dynamic(addr, "2", *conf, nproc=1), env=dict(env)) for _ in range(2)]
    for node in nodes:
        node.wait_for(r"READY rank \d world 2 restart 0")
    for node in nodes:
        node.proc.send_signal(signal.SIGINT)
    assert [node.finish() for node in nodes] == [130, 130], [node.err for node in nodes]
    for node in nodes:
        said = [line for line in node.err if line.startswith("rankrun: received SIGINT")]
        assert len(said) == 1, node.err


JOIN_TIMEOUT = 8.0
HONOURED = JOIN_TIMEOUT + 2.5  # join_timeout, the interpreter's start and a loaded machine's slack; it was 5 s more


def test_a_first_round_that_never_forms_ends_every_node_at_the_hosts_join_timeout(launch, tmp_path):
    # the host gives up join_timeout after it began, and ends the job for the node that came 5 s later too (before,
    # that node waited its own join_timeout, and the host waited for it to leave: 13 s for join_timeout=8)
    addr = fresh_loopback()
    conf = ("--rdzv-conf", f"join_timeout={JOIN_TIMEOUT:g}")
    started = time.monotonic()
    host = launch(*_dynamic(addr, "3", *conf, nproc=1), env=_env(tmp_path))
    host.wait_for(r"rendezvous itest: 1/3 nodes joined")  # its progress line, 5 s in
    late = launch(*_dynamic(addr, "3", *conf, nproc=1), env=_env(tmp_path))
    assert (host.finish(), late.finish()) == (3, 3)
    assert time.monotonic() - started < HONOURED
    assert late.err[-1] == ("rankrun: error: rendezvous itest: the job ended: timed out after 8 s (join_timeout)"
                            " waiting for the other nodes: 2 of 3 joined")


def test_a_node_that_waited_for_the_host_to_listen_still_gives_up_at_its_join_timeout(launch, tmp_path):
    # reaching the host is part of joining: the wait for the first round gets what is left of join_timeout (before,
    # a whole join_timeout more: 19 s for join_timeout=12 and a host that came 6 s late)
    addr = fresh_loopback()
    started = time.monotonic()
    # join_timeout=9: the host, started at that line, has 4 s to listen and be joined; broken, the node would end at
    # 5 + 9 s, past the bound
    early = launch(*_dynamic(addr, "3", "--rdzv-conf", "is_host=0,join_timeout=9", nproc=1), env=_env(tmp_path))
    early.wait_for(r"Connection refused; retrying \(waited \d+ s of 9\)")  # its line, 5 s in
    host = launch(*_dynamic(addr, "3", "--rdzv-conf", "join_timeout=60", nproc=1), env=_env(tmp_path))
    assert early.finish() == 3
    assert time.monotonic() - started < 9 + 2.5
    assert early.err[-1] == ("rankrun: error: rendezvous itest: timed out after 9 s (join_timeout) waiting for the"
                             " other nodes: 2 of 3 joined")
    host.proc.send_signal(signal.SIGTERM)
    assert host.finish() == 128 + signal.SIGTERM
