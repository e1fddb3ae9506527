"""Inside a Slurm step (``srun rankrun train.py``): the job's shape from Slurm's variables, no flags needed (pure).

A step is recognised by ``SLURM_JOB_ID``, ``SLURM_STEP_ID``, ``SLURM_NODEID``, a node list
(``SLURM_STEP_NODELIST``, else ``SLURM_JOB_NODELIST``) and a node count (``SLURM_STEP_NUM_NODES``, else
``SLURM_NNODES``). A batch script or an ``salloc`` shell has no step id (or one of Slurm's reserved ids, at the
top of the 32-bit range): it is not a step. From a step:

- nnodes: the step's node count; node rank: ``SLURM_NODEID``;
- master: the first host of the expanded node list (``rankrun.hostlist``; Slurm lists nodes in node-id order);
- port: the first of ``SLURM_STEP_RESV_PORTS`` (``srun --resv-ports``: reserved by Slurm, collision-free), else
  ``derived_port``: 20000 + (job id x 100 + step id) mod 12000, below Linux's ephemeral range (32768-60999) so no
  outgoing connection holds it; the master binds it and holds it for the job (exit 3 if taken);
- the rendezvous id: ``<job id>.<step id>``; workers per node: ``SLURM_GPUS_ON_NODE``, else 1;
- this node's tasks in the step (``SLURM_STEP_TASKS_PER_NODE``, e.g. ``8(x2),4``, else ``SLURM_NTASKS_PER_NODE``):
  more than one would make N agents each start N workers, which the CLI refuses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from rankrun import hostlist
from rankrun.record import record

RESERVED_STEP_IDS = 4294967290  # and above: Slurm's batch, extern, interactive... pseudo-steps, not an srun step
PORT_BASE, PORT_SPAN = 20000, 12000


@record
class Step:
    job_id: str
    step_id: str
    node_id: int
    nnodes: int
    nodelist: str  # the variable it came from, for the message
    master: str
    port: int
    port_from: str  # "SLURM_STEP_RESV_PORTS" or "SLURM_JOB_ID"
    gpus: int | None  # SLURM_GPUS_ON_NODE
    tasks_here: int
    restart_count: str | None  # SLURM_RESTART_COUNT, for the failure report

    @property
    def run_id(self) -> str:
        return f"{self.job_id}.{self.step_id}"


def derived_port(job_id: str, step_id: str) -> int:
    """A port for the master from the job and step ids alone, the same on every node of the step."""
    return PORT_BASE + (int(job_id) * 100 + int(step_id)) % PORT_SPAN


def tasks_on_node(spec: str, node_id: int) -> int:
    """This node's count in Slurm's compressed task list: ``2(x3),1`` is 2, 2, 2, 1 for nodes 0-3."""
    counts: list[int] = []
    for item in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if m is None:
            raise ValueError(f"{spec!r} is not a task list like 2(x3),1")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node_id] if node_id < len(counts) else counts[-1]


def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else None


def step_from(env: Mapping[str, str]) -> Step | None:
    """The step this process runs in, or None outside one. ``ValueError`` (a bad node list) says why."""
    job, step = env.get("SLURM_JOB_ID", "").strip(), env.get("SLURM_STEP_ID", "").strip()
    node_id = _int(env, "SLURM_NODEID")
    nodelist_var = next((v for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST") if env.get(v, "").strip()), None)
    nnodes = _int(env, "SLURM_STEP_NUM_NODES") or _int(env, "SLURM_NNODES")
    if not job.isdigit() or not step.isdigit() or int(step) >= RESERVED_STEP_IDS or node_id is None \
            or nodelist_var is None or nnodes is None:
        return None
    hosts = hostlist.expand(env[nodelist_var])
    ports = re.match(r"\s*(\d+)", env.get("SLURM_STEP_RESV_PORTS", ""))
    tasks = env.get("SLURM_STEP_TASKS_PER_NODE", "").strip() or env.get("SLURM_NTASKS_PER_NODE", "").strip() or "1"
    return Step(job, step, node_id, nnodes, nodelist_var, hosts[0],
                int(ports.group(1)) if ports else derived_port(job, step),
                "SLURM_STEP_RESV_PORTS" if ports else "SLURM_JOB_ID", _int(env, "SLURM_GPUS_ON_NODE"),
                tasks_on_node(tasks, node_id), env.get("SLURM_RESTART_COUNT"))


def job_words(env: Mapping[str, str]) -> dict[str, str]:
    """What the failure report and the root-cause JSON say of the Slurm job, if any: its id, step and restart count."""
    names = {"job": "SLURM_JOB_ID", "step": "SLURM_STEP_ID", "restart": "SLURM_RESTART_COUNT"}
    found = {k: env[v].strip() for k, v in names.items() if env.get(v, "").strip()}
    return found if "job" in found else {}
