"""The save/load rows of the ``checkpoint`` metric: ``ckpt_save.py DIR BYTES SAVES`` in ONE rank started by rankrun
(``--nproc-per-node 1 --max-restarts 1``).

Attempt 0 builds a state of BYTES bytes of float32 tensors (a model's two weights and an Adam-like optimizer's two
moments of each: six tensors) and saves it SAVES times with each of three ways, interleaved in rotating order, each
call timed by ``time.perf_counter`` around it alone:

- ``rankrun.checkpoint.save(step, state)`` (into the keeper's memory: returns once the copy is there);
- ``torch.save(state, DIR/state.pt)``, a local file, torch's defaults (zip records with CRC-32), no fsync: it returns
  with the bytes in the page cache;
- ``torch.distributed.checkpoint.save(state, checkpoint_id=DIR/dcp, no_dist=True)``: a local dir, one process, no
  fsync of ours.

It writes DIR/save.json (seconds per call, by way) and exits 1, so that rankrun starts attempt 1, which times one
load of each: ``rankrun.checkpoint.load()`` (tensors mapped from the keeper's copy) and the copy of its tensors into a
model's (preallocated, touched) ones, as ``load_state_dict`` does; ``torch.load(DIR/state.pt)`` and the same copy;
``dcp.load`` into those tensors (it copies in place). It writes DIR/load.json and exits 0.
"""

import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

import rankrun.checkpoint

warnings.simplefilter("ignore")  # dcp's no_dist notices: not what is measured
base, nbytes, saves = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
file, folder = os.path.join(base, "state.pt"), os.path.join(base, "dcp")


def make_state(fill: bool) -> dict[str, Any]:
    """Six float32 tensors of ``nbytes`` in all: two weights (a quarter each), their two moments (an eighth each)."""
    quarter, eighth = nbytes // 4 // 4, nbytes // 8 // 4

    def tensor(n: int) -> torch.Tensor:
        return torch.randn(n) if fill else torch.empty(n).fill_(0.0)  # touched either way: a live model's memory

    return {"model": {"w0": tensor(quarter), "w1": tensor(quarter)},
            "optim": {"state": {i: {"exp_avg": tensor(eighth), "exp_avg_sq": tensor(eighth)} for i in range(2)},
                      "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1]}]},
            "step": 0}


def tensors(state: dict[str, Any]) -> list[torch.Tensor]:
    model, optim = state["model"], state["optim"]
    return [*model.values(), *(t for moments in optim["state"].values() for t in moments.values())]


def timed(fn: Callable[..., object], *args: object) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def save_all() -> None:
    state = make_state(fill=True)
    ways = {
        "rankrun": lambda step: rankrun.checkpoint.save(step, state),
        "torch_save": lambda _step: torch.save(state, file),
        "dcp": lambda _step: dcp.save(state, checkpoint_id=folder, no_dist=True),
    }
    names = list(ways)
    out: dict[str, list[float]] = {name: [] for name in names}
    for step in range(1, saves + 1):
        state["step"] = step
        k = step % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(timed(ways[name], step))
    out["bytes"] = [float(sum(t.numel() * t.element_size() for t in tensors(state)))]
    with open(os.path.join(base, "save.json"), "w") as fh:
        json.dump(out, fh)


def copy_into(dest: list[torch.Tensor], state: dict[str, Any]) -> None:
    for d, s in zip(dest, tensors(state), strict=True):
        d.copy_(s)


def warm_up() -> None:
    """torch.load's and dcp.load's own first-call costs (lazy imports, the unpickler's set-up), paid before anything is
    timed: a small state each way (not through rankrun: its first load is the one measured)."""
    small = {"w": torch.ones(4), "step": 0}
    torch.save(small, os.path.join(base, "small.pt"))
    torch.load(os.path.join(base, "small.pt"))
    dcp.save(small, checkpoint_id=os.path.join(base, "small"), no_dist=True)
    dcp.load(small, checkpoint_id=os.path.join(base, "small"), no_dist=True)


def load_all() -> None:
    model = make_state(fill=False)
    dest = tensors(model)
    warm_up()
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    kept = rankrun.checkpoint.load()
    t1 = time.perf_counter()
    if kept is None:
        sys.exit("ckpt_save.py: attempt 1 found nothing kept")
    copy_into(dest, kept[1])
    out |= {"rankrun": t1 - t0, "rankrun_copy": time.perf_counter() - t0, "rankrun_step": kept[0]}
    t0 = time.perf_counter()
    loaded = torch.load(file)
    t1 = time.perf_counter()
    copy_into(dest, loaded)
    out |= {"torch_load": t1 - t0, "torch_load_copy": time.perf_counter() - t0}
    del loaded
    out["dcp"] = timed(lambda: dcp.load(model, checkpoint_id=folder, no_dist=True))
    with open(os.path.join(base, "load.json"), "w") as fh:
        json.dump(out, fh)


if attempt == 0:
    save_all()
    sys.exit(1)
load_all()
