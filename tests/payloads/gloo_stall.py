"""A real gloo job that stalls on attempt 0: ranks 0-2 wait in ``all_reduce`` for rank 3, which never joins.

Every rank joins the group over env:// and prints ``rank R ready``. Then, on attempt 0, rank 3 sleeps in
``rank_three_is_stuck_loading_data`` (silent, 0 % CPU) while the others block in gloo's ``all_reduce`` (in C++,
GIL released). On a restart (``TORCHELASTIC_RESTART_COUNT`` >= 1) all four reduce, print ``rank R sum S`` and
exit 0, so a restart that cures the stall shows.
"""

import os
import time

import torch
import torch.distributed as dist

if "TEST_PID_DIR" in os.environ:  # so a test can check that no worker outlives its launcher
    with open(os.path.join(os.environ["TEST_PID_DIR"], f"g{os.getpid()}"), "w") as fh:
        fh.write(str(os.getpid()))


def rank_three_is_stuck_loading_data() -> None:
    time.sleep(3600)


dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"rank {rank} ready (restart {restart})", flush=True)
t = torch.ones(1) * (rank + 1)
if restart == 0 and rank == 3:
    rank_three_is_stuck_loading_data()
dist.all_reduce(t)  # blocks on attempt 0: rank 3 never joins
print(f"rank {rank} sum {t.item():.0f}", flush=True)
dist.destroy_process_group()
