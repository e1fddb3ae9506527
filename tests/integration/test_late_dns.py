"""A master name that does not resolve yet (a Kubernetes Service, a pod hostname made after the pods start) is waited
for, with a line saying so, until join_timeout; then one line and exit 3. Hosts in network namespaces this test
creates, each with its own ``/etc/hosts`` and a resolver that asks nobody outside."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import PY, clean_environ, payload
from netns import switch

pytestmark = pytest.mark.usefixtures("private_tmpdir")


def test_a_master_name_added_to_a_hosts_file_late_is_waited_for(launch, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = clean_environ() | {"RANKRUN_RDZV_SECRET": "dns-secret", "TEST_OUT_DIR": str(out)}
    args = ("--nnodes", "2", "--master-addr", "master-0", "--master-port", "29500", "--nproc-per-node", "1",
            payload("node_worker.py"))
    with switch(2) as sw:
        sw.hosts(0, {"master-0": sw.addr(0)})
        late = sw.hosts(1, {})  # the other host does not know the name yet
        master = launch("--node-rank", "0", *args, env=dict(env), cmd=(*sw.exec(0), PY, "-m", "rankrun"))
        node = launch("--node-rank", "1", *args, env=dict(env), cmd=(*sw.exec(1), PY, "-m", "rankrun"))
        node.wait_for(r"rankrun: rendezvous master-0:29500: waiting for master-0 to resolve: ", timeout=60)
        with late.open("a") as hosts:
            hosts.write(f"{sw.addr(0)} master-0\n")  # the record appears
        assert [master.finish(), node.finish()] == [0, 0], (master.err, node.err)
        master_addr = sw.addr(0)
    starts = sorted((json.loads(p.read_text()) for p in out.glob("*.json")), key=lambda s: s["RANK"])
    assert [(s["RANK"], s["WORLD_SIZE"], s["MASTER_ADDR"]) for s in starts] == [("0", "2", master_addr), ("1", "2", master_addr)]


def test_a_name_that_never_resolves_is_one_line_and_exit_3():
    with switch(1) as sw:
        sw.hosts(0, {})
        done = subprocess.run([*sw.exec(0), PY, "-m", "rankrun", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                               "master-0", "--master-port", "29500", "--rdzv-conf", "join_timeout=1", "--no-python", "true"],
                              env=clean_environ() | {"RANKRUN_RDZV_SECRET": "s"}, capture_output=True, text=True,
                              timeout=60, check=False)
    assert done.returncode == 3
    assert done.stderr.splitlines()[-1].startswith(
        "rankrun: error: rendezvous master-0:29500: master-0 did not resolve within 1 s (join_timeout): ")
