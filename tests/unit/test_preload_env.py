"""The preloading process's environment (``agent.env.preload_env``, golden) and ``--preload``'s module names
(``cli.preload_modules``): what every worker has alike and nothing of one rank's or attempt's; the names' rules."""

from __future__ import annotations

import pytest

from rankrun.agent.env import AttemptContext, WorkerIdentity, preload_env, worker_env
from rankrun.cli import preload_modules
from rankrun.errors import UsageError
from rankrun.spec import EntryKind, EntrySpec

BASE = {"HOME": "/home/u", "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "3,5", "TORCHELASTIC_ERROR_FILE": "/outer/e.json",
        "RANKRUN_REPORT_JSON": "/outer/report.json", "PYTHONHASHSEED": "0"}
CTX = AttemptContext(role="default", master_addr="10.0.0.7", master_port=29555, restart_count=2, max_restarts=3,
                     run_id="job", signals_to_handle="SIGTERM,SIGINT,SIGHUP,SIGQUIT")
# what worker_env sets for one rank of one attempt: none of it is the preloading process's
IDENTITY = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
            "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
            "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE", "RANKRUN_REPORT_JSON")


def test_preload_env_golden_nproc4():
    assert preload_env(BASE, 4) == {"HOME": "/home/u", "PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "3,5",
                                    "PYTHONHASHSEED": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                                    "OMP_NUM_THREADS": "1"}


@pytest.mark.parametrize(("base", "nproc", "omp"), [
    ({}, 2, "1"),  # unset and several ranks: torchrun's 1, read when OpenMP loads (at the import)
    ({}, 1, None),  # one rank: left alone
    ({"OMP_NUM_THREADS": "8"}, 4, "8"),  # set: kept
    ({"OMP_NUM_THREADS": ""}, 4, ""),  # set, even empty: kept, as worker_env keeps it
    ({"OMP_NUM_THREADS": "8"}, 1, "8"),
])
def test_omp_num_threads_as_the_workers_get_it(base, nproc, omp):
    assert preload_env(base, nproc).get("OMP_NUM_THREADS") == omp
    who = WorkerIdentity(0, 0, 0, 0, nproc, nproc, 1, nproc)
    assert worker_env(base, who, CTX, "/e.json").get("OMP_NUM_THREADS") == omp


@pytest.mark.parametrize("nccl", [None, "0", "3"])
def test_torch_nccl_async_error_handling_as_the_workers_get_it(nccl):
    base = BASE | ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": nccl} if nccl is not None else {})
    assert preload_env(base, 2)["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == (nccl if nccl is not None else "1")


@pytest.mark.parametrize("nproc", [1, 2, 8])
def test_every_variable_is_every_workers_and_none_is_one_ranks(nproc):
    """What a module reads at import in the preloading process, each worker of each attempt has with the same value;
    what differs between ranks or attempts is not there at all (not some rank's value)."""
    env = preload_env(BASE, nproc)
    assert not set(env) & set(IDENTITY)
    for restart in (0, 2):
        ctx = AttemptContext(**{**{name: getattr(CTX, name) for name in CTX.__match_args__}, "restart_count": restart})
        for rank in range(nproc):
            who = WorkerIdentity(rank, rank, 0, rank, nproc, nproc, 1, nproc)
            worker = worker_env(BASE, who, ctx, f"/logs/{restart}/{rank}/error.json")
            assert {k: worker[k] for k in env} == env
    assert env is not BASE and BASE["TORCHELASTIC_ERROR_FILE"] == "/outer/e.json"  # the base is not changed


def test_an_outer_launchers_identity_is_not_handed_to_the_preloading_process():
    """rankrun started by another launcher's worker inherits that worker's RANK, MASTER_ADDR, ...: no worker of this
    job has those values (worker_env gives each its own), so a module reading them at import must not see them."""
    outer = dict.fromkeys(IDENTITY, "7") | {"MASTER_ADDR": "10.9.9.9"}
    env = preload_env(BASE | outer, 2)
    assert not set(env) & set(IDENTITY), sorted(set(env) & set(IDENTITY))


PY = "/venv/bin/python"
SCRIPT = EntrySpec(EntryKind.SCRIPT, "train.py", (), PY)


@pytest.mark.parametrize(("value", "names"), [
    ("", ()),
    ("   ", ()),
    ("torch", ("torch",)),
    ("torch,numpy", ("torch", "numpy")),
    (" torch , numpy ", ("torch", "numpy")),  # spaces around a name
    ("torch,numpy,torch", ("torch", "numpy")),  # duplicates dropped, the first kept where it was
    ("numpy,torch,numpy,torch", ("numpy", "torch")),
    ("torch.distributed,torch", ("torch.distributed", "torch")),  # a submodule is its own name
    ("_private.mod_2", ("_private.mod_2",)),
    ("Ünïcode", ("Ünïcode",)),
])
def test_preload_modules(value, names):
    assert preload_modules(value, SCRIPT) == names


@pytest.mark.parametrize(("value", "reason"), [
    ("a..b", "'a..b' is not a module name"),
    ("1x", "'1x' is not a module name"),
    ("torch,1x", "'1x' is not a module name"),
    (".torch", "'.torch' is not a module name"),  # relative: there is no package to be relative to
    ("torch.", "'torch.' is not a module name"),
    ("my-module", "'my-module' is not a module name"),
    ("torch numpy", "'torch numpy' is not a module name"),  # spaces inside: a name, not a list
    ("a/b", "'a/b' is not a module name"),
    (",", "an empty module name"),
    ("torch,", "an empty module name"),
    (",torch", "an empty module name"),
    ("torch,,numpy", "an empty module name"),
    ("torch, ,numpy", "an empty module name"),
])
def test_a_malformed_name_is_a_usage_error_naming_the_flag_and_value(value, reason):
    with pytest.raises(UsageError) as raised:
        preload_modules(value, SCRIPT)
    assert (raised.value.flag, raised.value.value, raised.value.reason) == ("--preload", value, reason)
    assert str(raised.value) == f"--preload {value!r}: {reason}"


@pytest.mark.parametrize("kind", [EntryKind.SCRIPT, EntryKind.MODULE, EntryKind.RUN_PATH])
def test_every_python_worker_can_preload(kind):
    assert preload_modules("torch", EntrySpec(kind, "train", (), PY)) == ("torch",)


def test_no_python_cannot_preload():
    binary = EntrySpec(EntryKind.BINARY, "true", (), PY)
    with pytest.raises(UsageError) as raised:
        preload_modules("torch", binary)
    assert str(raised.value) == ("--preload 'torch': needs a Python worker: --no-python runs a program, which cannot be "
                                 "forked from a Python process")
    assert preload_modules("", binary) == ()  # no --preload: --no-python as ever
    with pytest.raises(UsageError, match="is not a module name"):  # a malformed name is said first
        preload_modules("a..b", binary)
