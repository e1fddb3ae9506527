"""The worker environment torchrun gives: the variables a worker is given (RANK, MASTER_ADDR, TORCHELASTIC_*, ...).

``worker_env`` is a pure function: the same inputs give the same mapping, pinned by a
golden test. The rules follow torchrun 2.13 exactly (the launcher's environment, then the
identity variables); see ``docs/design.md``. rankrun's own features add a few variables of theirs on top: the
round's, the same for every worker (``AttemptContext.extra``: GLOO/NCCL_SOCKET_IFNAME, ``agent.features.WorkerEnv``),
then each worker's, composed by the attempt's watch (``agent.watch.observed_env``): the stack dump channel's
(``stacks.channel.channel_env``), the Flight Recorder's (``stacks.flight.flight_env``) and, with
``--straggler-window`` on, the shim's arrivals file and period (``stacks.channel.arrivals_env``).
"""

from __future__ import annotations

from collections.abc import Mapping

from rankrun.record import record


@record
class WorkerIdentity:
    """Where one worker sits in the job."""

    local_rank: int
    rank: int
    group_rank: int
    role_rank: int
    local_world_size: int
    world_size: int
    group_world_size: int
    role_world_size: int


@record
class AttemptContext:
    """What every worker of one attempt shares."""

    role: str
    master_addr: str
    master_port: int
    restart_count: int
    max_restarts: int
    run_id: str
    signals_to_handle: str
    use_agent_store: bool = True
    virtual_local_rank: bool = False
    extra: tuple[tuple[str, str], ...] = ()  # set for every worker by the agent (e.g. GLOO_SOCKET_IFNAME)


def worker_env(base: Mapping[str, str], who: WorkerIdentity, ctx: AttemptContext, error_file: str) -> dict[str, str]:
    """The complete environment of one worker process."""
    env = dict(base)
    # A launcher started by another launcher must not hand its own error file down, nor the file where it hands its
    # report to rankrun.launch's caller (a launcher a worker starts would write its report there, not on its stderr).
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    env.pop("RANKRUN_REPORT_JSON", None)
    env.update(
        {
            "LOCAL_RANK": "0" if ctx.virtual_local_rank else str(who.local_rank),
            "RANK": str(who.rank),
            "GROUP_RANK": str(who.group_rank),
            "ROLE_RANK": str(who.role_rank),
            "ROLE_NAME": ctx.role,
            "LOCAL_WORLD_SIZE": str(who.local_world_size),
            "WORLD_SIZE": str(who.world_size),
            "GROUP_WORLD_SIZE": str(who.group_world_size),
            "ROLE_WORLD_SIZE": str(who.role_world_size),
            "MASTER_ADDR": ctx.master_addr,
            "MASTER_PORT": str(ctx.master_port),
            "TORCHELASTIC_RESTART_COUNT": str(ctx.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(ctx.max_restarts),
            "TORCHELASTIC_RUN_ID": ctx.run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(ctx.use_agent_store),
            "TORCHELASTIC_ERROR_FILE": error_file,
            "TORCHELASTIC_SIGNALS_TO_HANDLE": ctx.signals_to_handle,
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        }
    )
    env.update(ctx.extra)
    if "OMP_NUM_THREADS" not in base and who.local_world_size > 1:
        env["OMP_NUM_THREADS"] = "1"
    if ctx.virtual_local_rank:
        env["CUDA_VISIBLE_DEVICES"] = _visible_device(base.get("CUDA_VISIBLE_DEVICES"), who.local_rank)
    return env


def _visible_device(parent: str | None, local_rank: int) -> str:
    """torchrun's --virtual-local-rank rule: the local_rank-th entry of the parent's list, else the rank."""
    if parent:
        entries = [e.strip() for e in parent.split(",") if e.strip()]
        if local_rank < len(entries):
            return entries[local_rank]
    return str(local_rank)


# What worker_env gives one worker of one attempt (or takes away from it): never the preloading process's, not even a
# value inherited from a launcher that started this one (its worker's RANK is no worker's of this job).
_ONE_WORKERS = frozenset({
    "LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "RANKRUN_REPORT_JSON"})


def preload_env(base: Mapping[str, str], local_world_size: int) -> dict[str, str]:
    """The preloading process's environment (``--preload``): what every worker of every attempt has alike, so that a
    module reads at import what a worker would, and nothing of one rank's or one attempt's (each forked worker gets
    its whole ``worker_env`` with its request). ``OMP_NUM_THREADS`` is read when OpenMP loads, at the import."""
    env = {key: value for key, value in base.items() if key not in _ONE_WORKERS}  # an outer launcher's too
    env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if "OMP_NUM_THREADS" not in base and local_world_size > 1:
        env["OMP_NUM_THREADS"] = "1"
    return env
