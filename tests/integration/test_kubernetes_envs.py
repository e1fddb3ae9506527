"""``command: [rankrun, w.py]`` with the variables Kubeflow's operators write into each pod, on two network-namespace
"pods" whose own ``/etc/hosts`` give the operators' DNS names. The env sets are copied from the operators' code:
training-operator v1.9.0 ``pkg/controller.v1/pytorch/{envvar,master,elastic}.go`` and Trainer v2.3.0's torch plugin.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import PY, clean_environ, payload
from netns import switch
from rankrun.devices import cpu_count  # PET_NPROC_PER_NODE=auto: the CPUs, without a GPU

pytestmark = pytest.mark.usefixtures("private_tmpdir")


def _pytorchjob_static(pod: int) -> dict[str, str]:
    """PyTorchJob v1, Master + 1 Worker, no elasticPolicy: every pod gets the master's Service name, RANK per pod."""
    return {"PYTHONUNBUFFERED": "1", "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "job-master-0",
            "PET_MASTER_ADDR": "job-master-0", "WORLD_SIZE": "2", "RANK": str(pod), "PET_NODE_RANK": str(pod),
            "PET_NPROC_PER_NODE": "auto", "PET_NNODES": "2"}


def _pytorchjob_elastic(pod: int) -> dict[str, str]:
    """PyTorchJob v1, 2 Workers, elasticPolicy {minReplicas 1, maxReplicas 2, standalone: true, nProcPerNode 1}."""
    del pod
    return {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": "1", "PET_RDZV_ENDPOINT": "job-worker-0:23456",
            "PET_RDZV_BACKEND": "c10d", "PET_NNODES": "1:2", "PET_STANDALONE": ""}


def _trainjob(pod: int) -> dict[str, str]:
    """Trainer v2 (JobSet): node rank from the completion index, the master as node 0's pod DNS name."""
    return {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(pod), "PET_MASTER_ADDR": "tj-node-0-0.tj",
            "PET_MASTER_PORT": "29500", "JOB_COMPLETION_INDEX": str(pod)}


@pytest.mark.parametrize(("envs", "names", "world"), [
    pytest.param(_pytorchjob_static, ("job-master-0", "job-worker-0"), 2 * cpu_count(), id="pytorchjob-v1-static"),
    pytest.param(_pytorchjob_elastic, ("job-worker-0", "job-worker-1"), 2, id="pytorchjob-v1-elastic"),
    pytest.param(_trainjob, ("tj-node-0-0.tj", "tj-node-0-1.tj"), 2, id="trainer-v2"),
])
def test_each_operators_env_set_runs_unchanged(launch, tmp_path: Path, envs, names, world):
    out = tmp_path / "out"
    out.mkdir()
    with switch(2) as sw:
        for pod in range(2):
            sw.hosts(pod, {name: sw.addr(i) for i, name in enumerate(names)})
        pods = [launch(payload("node_worker.py"), cmd=(*sw.exec(pod), PY, "-m", "rankrun"),
                       env=clean_environ() | envs(pod) | {"TEST_OUT_DIR": str(out), "RANKRUN_RDZV_SECRET": "k8s"})
                for pod in range(2)]
        assert [p.finish() for p in pods] == [0, 0], [p.err for p in pods]
    starts = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert sorted(int(s["RANK"]) for s in starts) == list(range(world))  # the pod's own RANK never reaches a worker
    assert {s["WORLD_SIZE"] for s in starts} == {str(world)}  # nor its WORLD_SIZE
    assert sorted(int(s["GROUP_RANK"]) for s in starts) == [i * 2 // world for i in range(world)]  # half on each pod
