"""Multi-node jobs with real torch gloo workers on loopback "nodes": static, dynamic, a node killed mid-collective."""

from __future__ import annotations

import re
import time

import pytest

from conftest import clean_environ, fresh_loopback, payload

pytestmark = pytest.mark.usefixtures("private_tmpdir")
pytest.importorskip("torch")


def _env(tmp_path, **extra):
    return clean_environ() | {"RANKRUN_RDZV_SECRET": "e2e-secret"} | extra


def test_static_two_nodes_all_reduce(launch, tmp_path):
    addr = fresh_loopback()
    runs = [launch("--nnodes", "2", "--node-rank", str(r), "--master-addr", addr, "--master-port", "29500",
                   "--nproc-per-node", "2", payload("gloo_job.py"), env=_env(tmp_path)) for r in (1, 0)]
    assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
    sums = sorted(line for r in runs for line in r.out if "sum" in line)
    assert [re.sub(r"^\[default\d\]:", "", s) for s in sums] == [f"rank {r} restart 0 sum 10" for r in range(4)]


def test_dynamic_two_nodes_all_reduce(launch, tmp_path):
    addr = fresh_loopback()
    runs = [launch("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr}:29400", "--rdzv-id", "gloo2",
                   "--nproc-per-node", "2", payload("gloo_job.py"), env=_env(tmp_path)) for _ in range(2)]
    assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
    assert sum("sum 10" in line for r in runs for line in r.out) == 4


def test_nodes_whose_local_addr_is_not_the_endpoints_all_reduce(launch, tmp_path):
    # the endpoint on one address, each node's --local-addr another (the workers' MASTER_ADDR is the host's): this
    # hung in torch's 30-minute store retry when nothing listened there
    endpoint = fresh_loopback()
    runs = [launch("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{endpoint}:29400", "--rdzv-id", "la",
                   "--local-addr", fresh_loopback(), "--nproc-per-node", "1", payload("gloo_job.py"), env=_env(tmp_path))
            for _ in range(2)]
    assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
    assert sum("sum 3" in line for r in runs for line in r.out) == 2


def test_a_node_killed_while_its_peers_sit_in_all_reduce_is_noticed_and_they_reform(launch, tmp_path):
    addr = fresh_loopback()
    finish = tmp_path / "finish"
    conf = ("--rdzv-conf", "last_call_timeout=0.2,keep_alive_interval=0.5,keep_alive_max_attempt=2")
    args = ("--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr}:29400", "--rdzv-id", "loop", *conf,
            "--nproc-per-node", "1", payload("gloo_loop.py"))
    host = launch(*args, env=_env(tmp_path, FINISH_FILE=str(finish)))
    host.wait_for(r"READY rank 0 world 1")
    doomed = launch(*args, env=_env(tmp_path, FINISH_FILE=str(finish)))
    doomed.wait_for(r"READY rank 1 world 2")
    host.wait_for(r"READY rank 0 world 2")  # both now loop in all_reduce with each other
    killed = time.monotonic()
    doomed.proc.kill()
    doomed.finish()
    host.wait_for(r"READY rank 0 world 1")  # noticed, stopped the blocked worker, re-formed: no collective timeout
    assert time.monotonic() - killed < 30
    finish.touch()
    assert host.finish() == 0, host.err


def test_a_node_joining_a_running_gloo_job_grows_the_world(launch, tmp_path):
    addr = fresh_loopback()
    finish = tmp_path / "finish"
    args = ("--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{addr}:29400", "--rdzv-id", "grow",
            "--rdzv-conf", "last_call_timeout=0.2", "--nproc-per-node", "1", payload("gloo_loop.py"))
    first = launch(*args, env=_env(tmp_path, FINISH_FILE=str(finish)))
    first.wait_for(r"READY rank 0 world 1 restart 0")
    late = launch(*args, env=_env(tmp_path, FINISH_FILE=str(finish)))
    late.wait_for(r"READY rank 1 world 2 restart 0")  # a new process group of 2, not a restart
    first.wait_for(r"READY rank 0 world 2 restart 0")
    finish.touch()
    assert [first.finish(), late.finish()] == [0, 0], (first.err, late.err)
