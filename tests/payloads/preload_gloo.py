"""A gloo job for ``--preload torch`` (``tests/e2e/test_preload_gloo.py``): each rank draws from torch's default
generator, ``numpy.random`` and ``random``, writes the draws to ``$PROBE_OUT/<RANK>.<ATTEMPT>.json`` (before
``init_process_group``: every rank has written before any can fail), joins the process group, and then rank
``FAIL_RANK`` raises on attempt 0 (``@record`` writes the error file); the others all_reduce and print the sum.
"""

import json
import os
import random

import numpy.random
import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def fail(rank: str) -> None:
    raise ValueError(f"boom from rank {rank}")


@record
def main() -> None:
    rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    drawn = {"torch": torch.rand(4).tolist(), "numpy": numpy.random.rand(4).tolist(), "random": random.random()}
    with open(os.path.join(os.environ["PROBE_OUT"], f"{rank}.{attempt}.json"), "w") as fh:
        json.dump(drawn, fh)
    dist.init_process_group("gloo")
    if rank == os.environ.get("FAIL_RANK") and attempt == "0":
        fail(rank)
    t = torch.ones(1) * (int(rank) + 1)
    dist.all_reduce(t)
    print(f"rank {rank} attempt {attempt} sum {t.item():.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
