"""A minimal distributed job: every rank contributes its rank, all_reduce sums them.

Run with: rankrun --standalone --nproc-per-node=4 examples/allreduce.py
"""

import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    expected = world * (world - 1) / 2
    print(f"rank {rank}/{world} (local {os.environ['LOCAL_RANK']}): all_reduce sum = {t.item():.0f} (expected {expected:.0f})")
    assert t.item() == expected
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
