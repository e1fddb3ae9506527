"""``srun rankrun w.py`` with no flags: two loopback "nodes" under a fake ``srun`` step's variables form one job.

On loopback the node list names one fresh address twice (both agents run here); on two network-namespace hosts
it is ``n[01-02]``, each host's own ``/etc/hosts`` naming both. The master is the list's first host, the port is
derived from the job id (rankrun.slurm), ranks follow ``SLURM_NODEID``.
"""

from __future__ import annotations

import json

import pytest

from conftest import PY, clean_environ, fresh_loopback, payload, run_cli
from netns import switch
from rankrun.slurm import derived_port

pytestmark = pytest.mark.usefixtures("private_tmpdir")


def _step(nodelist: str, node_id: int, **extra: str) -> dict[str, str]:
    """An srun step's variables on node ``node_id`` (``nodelist``: a hostlist, or one address for both nodes)."""
    nodes = nodelist if "[" in nodelist else f"{nodelist},{nodelist}"
    return {"SLURM_JOB_ID": "7301", "SLURM_STEP_ID": "2", "SLURM_NODEID": str(node_id), "SLURM_STEP_NUM_NODES": "2",
            "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": "2"} | extra


def test_two_nodes_form_one_job_from_slurms_variables_alone(launch, tmp_path):
    addr = fresh_loopback()
    out = tmp_path / "out"
    out.mkdir()
    env = clean_environ() | {"TEST_OUT_DIR": str(out), "NODE_WAIT_FILE": str(tmp_path / "go")}
    runs = [launch(payload("node_worker.py"), env=env | _step(addr, node)) for node in (1, 0)]
    for run, node in zip(runs, (1, 0), strict=True):
        run.wait_for(rf"READY rank {2 * node}\b", timeout=60)
        assert run.err[0] == (f"rankrun: Slurm step 7301.2: node {node} of 2, master {addr}:{derived_port('7301', '2')} "
                              "(the first host of SLURM_STEP_NODELIST; port from SLURM_JOB_ID), 2 worker(s) a node "
                              "(SLURM_GPUS_ON_NODE)")
    (tmp_path / "go").touch()
    assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
    starts = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert sorted((s["RANK"], s["GROUP_RANK"], s["WORLD_SIZE"]) for s in starts) == [
        ("0", "0", "4"), ("1", "0", "4"), ("2", "1", "4"), ("3", "1", "4")]  # ranks follow SLURM_NODEID
    assert {(s["MASTER_ADDR"], s["TORCHELASTIC_RUN_ID"]) for s in starts} == {(addr, "7301.2")}


def test_several_tasks_per_node_start_nothing_and_standalone_stays_one_node(tmp_path):
    (tmp_path / "w.py").write_text("import os; print('worker', os.environ['WORLD_SIZE'])\n")
    env = clean_environ() | _step(fresh_loopback(), 0, SLURM_STEP_TASKS_PER_NODE="2(x2)")
    refused = run_cli("w.py", env=env, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == ("rankrun: error: srun '2 tasks on this node': rankrun starts every worker of a node itself: run "
                              "one task per node (srun --ntasks-per-node=1), or 2 launchers would each start the node's "
                              "workers\n")
    alone = run_cli("--standalone", "w.py", env=env, cwd=tmp_path)
    assert (alone.returncode, alone.stdout, alone.stderr) == (0, "worker 1\n", "")


def test_on_two_hosts_the_node_list_names_them_and_the_first_is_the_master(launch, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    env = clean_environ() | {"TEST_OUT_DIR": str(out)}
    with switch(2) as sw:
        for host in range(2):
            sw.hosts(host, {"n01": sw.addr(0), "n02": sw.addr(1)})
        runs = [launch(payload("node_worker.py"), cmd=(*sw.exec(node), PY, "-m", "rankrun"),
                       env=env | _step("n[01-02]", node)) for node in (1, 0)]
        assert [r.finish() for r in runs] == [0, 0], [r.err for r in runs]
        master = sw.addr(0)
    starts = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert sorted((s["RANK"], s["GROUP_RANK"]) for s in starts) == [("0", "0"), ("1", "0"), ("2", "1"), ("3", "1")]
    assert {(s["WORLD_SIZE"], s["MASTER_ADDR"]) for s in starts} == {("4", master)}
