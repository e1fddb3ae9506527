"""init_process_group over env:// with gloo, then all_reduce; rank FAIL_RANK raises on attempt 0 (after init).

argv: [--record] to wrap main with torch's @record.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def main() -> None:
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if rank == int(os.environ.get("FAIL_RANK", "-1")) and restart == 0:
        raise ValueError(f"boom from rank {rank}")
    t = torch.ones(1) * (rank + 1)
    dist.all_reduce(t)
    print(f"rank {rank} restart {restart} sum {t.item():.0f}", flush=True)
    assert t.item() == world * (world + 1) / 2
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    (record(main) if "--record" in sys.argv else main)()
