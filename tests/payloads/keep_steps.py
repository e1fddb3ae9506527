"""A deterministic training loop that keeps its progress with ``rankrun.checkpoint`` (``tests/e2e/test_checkpoint_gloo.py``).

Each rank of a gloo group trains a small linear model for ``STEPS`` steps: the data of a step is a function of the step
and the rank, the gradients are averaged with an all-reduce, the learning rate is a function of the step, and every
step ends with ``save(step, {model, optimizer, torch's RNG state})``. At its start a rank ``load()``s: the kept step's
state, or nothing (step 0, the seeded initial model). Rank ``KILL_RANK`` SIGKILLs itself in step ``KILL_AT`` of attempt
0, before that step's save; a rank whose world changed since the kept step loads old ranks 0 and 1 by rank (their
models are the same: gradients are averaged) and goes on from rank 0's; with ``HOLD_AT``, every rank of attempt 0 prints ``HELD <step>`` after that step's save and
waits there (for the test's SIGTERM). Each rank writes ``$OUT/<rank>.<attempt>.json``: the step it resumed from, the steps it ran,
and its final parameters.

The optimizer is SGD with momentum written out here, its ``state_dict`` the shape of ``torch.optim.SGD``'s (state by
parameter index, param_groups): torch.optim imports torch._dynamo (and sympy) at an optimizer's first use, as long as
``import torch`` itself, in every rank of every attempt. ``OPTIM=torch``: ``torch.optim.SGD`` itself.
"""

import json
import os
import signal
import time

import torch
import torch.distributed as dist

import rankrun.checkpoint

STEPS = int(os.environ.get("STEPS", "12"))


class SGD:
    """``torch.optim.SGD(params, lr, momentum)``'s step (no dampening, no weight decay, not Nesterov), and its state."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float, momentum: float) -> None:
        self.params = params
        self.param_groups = [{"lr": lr, "momentum": momentum, "dampening": 0, "weight_decay": 0, "nesterov": False,
                              "params": list(range(len(params)))}]
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        for i, p in enumerate(self.params):
            assert p.grad is not None
            if i in self.state:
                buf = self.state[i]["momentum_buffer"].mul_(group["momentum"]).add_(p.grad)
            else:
                buf = self.state.setdefault(i, {"momentum_buffer": p.grad.clone()})["momentum_buffer"]
            p.add_(buf, alpha=-group["lr"])

    def state_dict(self) -> dict[str, object]:
        return {"state": self.state, "param_groups": self.param_groups}

    def load_state_dict(self, state: dict[str, object]) -> None:
        kept, groups = state["state"], state["param_groups"]
        assert isinstance(kept, dict) and isinstance(groups, list) and len(groups) == 1
        self.state = {int(i): {"momentum_buffer": s["momentum_buffer"].clone()} for i, s in kept.items()}
        self.param_groups = [dict(groups[0])]


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(16, 8, generator=g)
    return x, x @ torch.arange(8.0).unsqueeze(1) + torch.randn(16, 1, generator=g)


def main() -> None:
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    if os.environ.get("OPTIM") == "torch":
        optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        optim = SGD(list(model.parameters()), lr=0.01, momentum=0.9)
    resharded = None
    try:
        kept = rankrun.checkpoint.load()
    except ValueError:  # the world changed: every old rank's state is there, by rank, to re-shard from
        kept, other = rankrun.checkpoint.load(rank=0), rankrun.checkpoint.load(rank=1)
        assert kept is not None and other is not None
        resharded = {"steps": [kept[0], other[0]], "same": all(
            torch.equal(a, b) for a, b in zip(kept[1]["model"].values(), other[1]["model"].values(), strict=True))}
    first = 1
    if kept is not None:
        step, state = kept
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"])
        first = step + 1
    dist.init_process_group("gloo")
    ran = []
    for step in range(first, STEPS + 1):
        if attempt == 0 and rank == int(os.environ.get("KILL_RANK", "-1")) and step == int(os.environ["KILL_AT"]):
            os.kill(os.getpid(), signal.SIGKILL)
        for group in optim.param_groups:
            group["lr"] = 0.01 / step
        x, y = batch(step, rank)
        optim.zero_grad()
        torch.nn.functional.mse_loss(model(x), y + 0.01 * torch.randn(16, 1)).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optim.step()
        rankrun.checkpoint.save(step, {"model": model.state_dict(), "optim": optim.state_dict(),
                                       "rng": torch.get_rng_state()})
        if "KILL_AT" in os.environ:  # every rank's save of this step complete before the kill at the next: without it,
            dist.barrier()  # the launcher's teardown may tear rank 0's save of step 6 (resuming from 5 is then right)
        ran.append(step)
        if attempt == 0 and step == int(os.environ.get("HOLD_AT", "-1")):  # a preemption's SIGTERM comes here
            print(f"HELD {step}", flush=True)
            time.sleep(120)
    result = {"resumed": first - 1, "ran": ran, "params": [p.tolist() for p in model.parameters()],
              "world": dist.get_world_size(), "resharded": resharded}
    with open(os.path.join(os.environ["OUT"], f"{rank}.{attempt}.json"), "w") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
