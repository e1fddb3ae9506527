"""The failure rows of the ``checkpoint`` metric: ``ckpt_restart.py DIR MODE BYTES KILL_AT DISK_EVERY [STEPS [STEP_S]]``
on 2 gloo ranks under ``--max-restarts 1``; imports torch at its top, as a training script does.

Each rank holds a state of BYTES bytes of float32 tensors and runs steps 1, 2, ...: a step is STEP_S seconds of
sleep (the step's compute; default 0), an all-reduce (every rank past it has finished the previous step, its save
included), a touch of the state, and a save:

- MODE ``keep``: ``rankrun.checkpoint.save(step, state)`` every step; a rank of a later attempt resumes from
  ``rankrun.checkpoint.load()``.
- MODE ``disk``: what scripts do today without it: every DISK_EVERY steps ``torch.save`` to DIR/rank<R>.pt (written to
  a temp name and renamed, no fsync); a later attempt resumes from ``torch.load`` of that file.

On attempt 0, rank 1 writes ``time.time()`` to DIR/fail_ts and SIGKILLs itself in step KILL_AT (past its all-reduce,
before its save). Every rank of every attempt writes DIR/a<attempt>_r<rank>.json: ``time.time()`` at its first line,
past ``init_process_group``, past ``load()``/``torch.load`` and past the copy into its own tensors (as
``load_state_dict`` does), the step it resumed from, the seconds each of its saves blocked, and ``time.time()`` past
its newest save (``last_save``). A resumed attempt runs to step STEPS (default 0: one more step) and exits 0: the
goodput bench (``goodput_bench.py``) gives the job a fixed amount of work, which a restart from an older step redoes.
"""

import time

started = time.time()

import json  # noqa: E402 - the first line above is the time the process reached the script
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import rankrun.checkpoint  # noqa: E402

base, mode, nbytes, kill_at, disk_every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
steps = int(sys.argv[6]) if len(sys.argv) > 6 else 0
step_s = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
file = os.path.join(base, f"rank{rank}.pt")
record: dict[str, object] = {"started": started}


def publish(name: str, data: object) -> None:
    tmp = os.path.join(base, f".{name}.tmp")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.rename(tmp, os.path.join(base, name))


def resume(state: dict[str, torch.Tensor]) -> int:
    """The step this rank's state was restored to (0: nothing kept), copied into ``state``'s tensors."""
    if mode == "keep":
        kept = rankrun.checkpoint.load()
        if kept is None:
            return 0
        step, saved = kept
    else:
        if not os.path.exists(file):
            return 0
        saved = torch.load(file)
        step = saved.pop("step")
    record["fetched"] = time.time()  # the state is here (mapped, or read); the copy into this rank's tensors follows
    for key, tensor in state.items():
        tensor.copy_(saved[key])
    return int(step)


def save(step: int, state: dict[str, torch.Tensor]) -> None:
    if mode == "keep":
        rankrun.checkpoint.save(step, state)
    elif step % disk_every == 0:
        torch.save({**state, "step": step}, file + ".tmp")
        os.replace(file + ".tmp", file)


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    record["init"] = time.time()
    quarter = nbytes // 4 // 4
    state = {f"t{i}": torch.full((quarter,), float(rank)) for i in range(4)}
    record["resumed"] = first = resume(state)
    record["loaded"] = time.time()
    saves: list[float] = []
    record["saves"] = saves
    publish(f"a{attempt}_r{rank}.json", record)
    last = kill_at if attempt == 0 else steps or first + 1
    for step in range(first + 1, last + 1):
        if step_s:
            time.sleep(step_s)
        dist.all_reduce(torch.ones(1))
        if attempt == 0 and rank == 1 and step == kill_at:
            publish("fail_ts", time.time())
            os.kill(os.getpid(), signal.SIGKILL)
        state["t0"][0] = step
        t0 = time.perf_counter()
        save(step, state)
        if mode == "keep" or step % disk_every == 0:
            saves.append(time.perf_counter() - t0)
            record["last_save"] = time.time()
            publish(f"a{attempt}_r{rank}.json", record)
    dist.barrier()
    dist.destroy_process_group()


main()
