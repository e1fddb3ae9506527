"""Slurm's variables → the job's shape (pure), and the CLI taking it when no option shapes the job."""

from __future__ import annotations

import json

import pytest

from rankrun.cli import spec_from_args
from rankrun.errors import UsageError
from rankrun.report.failure import Ending, WorkerResult, render_report, root_cause_json
from rankrun.slurm import PORT_BASE, PORT_SPAN, derived_port, job_words, step_from, tasks_on_node
from rankrun.spec import Standalone, StaticRendezvous

STEP = {"SLURM_JOB_ID": "48213", "SLURM_STEP_ID": "0", "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "rack[0-1]-node[01-02]",
        "SLURM_STEP_NUM_NODES": "4", "SLURM_STEP_TASKS_PER_NODE": "1(x4)", "SLURM_GPUS_ON_NODE": "8"}


def test_a_step_gives_nodes_rank_master_port_and_run_id() -> None:
    step = step_from(STEP)
    assert step is not None
    assert (step.nnodes, step.node_id, step.master, step.run_id, step.gpus, step.tasks_here) == (
        4, 1, "rack0-node01", "48213.0", 8, 1)
    assert step.port == derived_port("48213", "0") and PORT_BASE <= step.port < PORT_BASE + PORT_SPAN < 32768
    assert step_from(STEP | {"SLURM_STEP_RESV_PORTS": "12010-12013"}).port == 12010  # type: ignore[union-attr]
    old = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP_")} | {
        "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[7-8]", "SLURM_NNODES": "2"}
    assert (step_from(old).master, step_from(old).nnodes) == ("n7", 2)  # type: ignore[union-attr]  # the job's, without the step's
    assert step_from(STEP | {"SLURM_STEP_ID": "4294967289"}) is not None  # below Slurm's pseudo-steps: an srun step


def test_the_derived_port_is_the_same_on_every_node_and_differs_between_steps() -> None:
    assert [derived_port("48213", "0"), derived_port("48213", "1"), derived_port("48333", "0")] == [29300, 29301, 29300]  # mod 12000
    assert [derived_port("48214", "0"), derived_port("0", "0")] == [29400, 20000]


def test_the_steps_other_variables_are_read_where_the_step_lacks_its_own() -> None:
    step = step_from({k: v for k, v in STEP.items() if k != "SLURM_STEP_TASKS_PER_NODE"} | {
        "SLURM_NTASKS_PER_NODE": "2", "SLURM_RESTART_COUNT": "3", "SLURM_STEP_RESV_PORTS": "12010-12013"})
    assert step is not None
    assert (step.tasks_here, step.restart_count, step.port, step.port_from) == (2, "3", 12010, "SLURM_STEP_RESV_PORTS")
    assert step_from(STEP).port_from == "SLURM_JOB_ID"  # type: ignore[union-attr]


def test_inside_a_step_the_steps_node_count_wins_over_the_jobs() -> None:
    """``srun --preserve-env`` (or a step on part of the allocation) keeps the job's ``SLURM_NNODES``: the step's own
    count is the one that comes, else the job waits for nodes that never join."""
    step = step_from(STEP | {"SLURM_NNODES": "8", "SLURM_JOB_NODELIST": "rack[0-3]-node[01-02]"})
    assert step is not None and step.nnodes == 4 and step.nodelist == "SLURM_STEP_NODELIST"


@pytest.mark.parametrize("env", [
    {k: v for k, v in STEP.items() if k != "SLURM_STEP_ID"},  # a batch script or an salloc shell
    STEP | {"SLURM_STEP_ID": "4294967291"},  # the batch pseudo-step
    STEP | {"SLURM_STEP_ID": "4294967290"},  # SLURM_INTERACTIVE_STEP (0xfffffffa): an salloc shell
    {k: v for k, v in STEP.items() if k != "SLURM_NODEID"},
    {k: v for k, v in STEP.items() if k != "SLURM_STEP_NUM_NODES"},  # no node count at all
    {},
])
def test_outside_a_step_there_is_no_step(env: dict[str, str]) -> None:
    assert step_from(env) is None


def test_the_task_list_is_read_for_this_node() -> None:
    assert [tasks_on_node("2(x3),1", n) for n in range(4)] == [2, 2, 2, 1]
    assert tasks_on_node("4", 0) == 4
    assert [tasks_on_node("4,1,3", n) for n in range(3)] == [4, 1, 3]
    with pytest.raises(ValueError, match="not a task list"):
        tasks_on_node("2x3", 0)


def _spec(tmp_path, env, *flags):
    (tmp_path / "t.py").write_text("")
    return spec_from_args([*flags, str(tmp_path / "t.py")], env)


def test_srun_rankrun_with_no_flags_takes_slurms_shape(tmp_path, capsys) -> None:
    spec = _spec(tmp_path, STEP)
    rdzv = spec.rendezvous
    assert isinstance(rdzv, StaticRendezvous)
    assert (rdzv.nodes, rdzv.node_rank, rdzv.master_addr, rdzv.master_port, rdzv.run_id, spec.worker.nproc) == (
        4, 1, "rack0-node01", derived_port("48213", "0"), "48213.0", 8)
    assert capsys.readouterr().err == (
        f"rankrun: Slurm step 48213.0: node 1 of 4, master rack0-node01:{derived_port('48213', '0')} (the first host of "
        "SLURM_STEP_NODELIST; port from SLURM_JOB_ID), 8 worker(s) a node (SLURM_GPUS_ON_NODE)\n")


def test_explicit_flags_win_and_shaping_flags_turn_slurm_off(tmp_path, capsys) -> None:
    spec = _spec(tmp_path, STEP, "--nproc-per-node", "2", "--master-port", "29600", "--rdzv-id", "mine")
    rdzv = spec.rendezvous
    assert isinstance(rdzv, StaticRendezvous) and (rdzv.master_port, rdzv.run_id, spec.worker.nproc) == (29600, "mine", 2)
    assert "port from --master-port" in capsys.readouterr().err
    assert isinstance(_spec(tmp_path, STEP, "--standalone").rendezvous, Standalone)  # one node inside an allocation
    alone = _spec(tmp_path, STEP | {"PET_NNODES": "1"})  # as --nnodes 1: torchrun's implicit single node
    assert isinstance(alone.rendezvous, Standalone) and alone.rendezvous.max_nodes == 1
    assert capsys.readouterr().err == ""


def test_several_tasks_on_a_node_and_a_bad_node_list_are_refused(tmp_path) -> None:
    with pytest.raises(UsageError, match=r"srun --ntasks-per-node=1"):
        _spec(tmp_path, STEP | {"SLURM_STEP_TASKS_PER_NODE": "8(x4)"})
    with pytest.raises(UsageError, match=r"SLURM_STEP_NODELIST 'n\[1-': '\[' without '\]'"):
        _spec(tmp_path, STEP | {"SLURM_STEP_NODELIST": "n[1-"})


def test_the_failure_report_and_the_root_cause_json_name_the_slurm_job() -> None:
    words = job_words(STEP | {"SLURM_RESTART_COUNT": "2"})
    failed = WorkerResult(0, 0, 100, 1, Ending.FAILED, 1.0, "", None, "boom\n")
    text = render_report("train.py", "host1", 0, [failed], slurm=words)
    assert text.splitlines()[1:3] == ["rankrun: train.py FAILED (attempt 0)", "Slurm job 48213, step 0, restart 2"]
    extra = json.loads(root_cause_json(failed, words))["message"]["extraInfo"]
    assert (extra["slurm_job"], extra["slurm_step"], extra["slurm_restart"]) == ("48213", "0", "2")
    assert job_words({"SLURM_STEP_ID": "0"}) == {} and "Slurm" not in render_report("t", "h", 0, [failed], slurm={})
