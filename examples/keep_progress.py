"""A plain training loop that keeps its progress in the launcher's memory with ``rankrun.checkpoint``.

Every 5 steps each rank keeps its model, its optimizer and its RNG state (``save``: a memory copy into memory the
launcher owns, no disk); at its start it ``load``s the newest step every rank kept, so a restart resumes there, not
at step 0. ``KILL_AT=N`` makes rank 1 SIGKILL itself at step N of the first attempt, to see it:

Run with: KILL_AT=12 rankrun --nproc-per-node 2 --max-restarts 1 examples/keep_progress.py

The first attempt dies at step 12; the restart says ``resumed from step 10`` and trains steps 11 to STEPS (20).
"""

import os
import signal

import torch
import torch.distributed as dist

import rankrun.checkpoint

STEPS = int(os.environ.get("STEPS", "20"))
EVERY = 5


def main() -> None:
    dist.init_process_group("gloo")
    rank, attempt = dist.get_rank(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    first = 1
    kept = rankrun.checkpoint.load()  # None on a first start: nothing kept yet
    if kept is not None:
        step, state = kept
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        first = step + 1
    print(f"rank {rank} (attempt {attempt}): " + (f"resumed from step {first - 1}" if kept else "starting at step 1"))
    kill_at = int(os.environ.get("KILL_AT", "0"))
    true_w = torch.arange(8.0).unsqueeze(1)
    loss = torch.tensor(float("nan"))  # a job resumed at its last step has nothing left to train
    for step in range(first, STEPS + 1):
        if attempt == 0 and rank == 1 and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # the demo's fault: a rank lost mid-training
        x = torch.randn(32, 8)
        loss = torch.nn.functional.mse_loss(model(x), x @ true_w)
        optim.zero_grad()
        loss.backward()
        for p in model.parameters():  # data parallel by hand: average the gradients
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optim.step()
        if step % EVERY == 0:
            rankrun.checkpoint.save(step, {"model": model.state_dict(), "optim": optim.state_dict(),
                                           "rng": torch.get_rng_state()})
    print(f"rank {rank}: done at step {STEPS}, loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
