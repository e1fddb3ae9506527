"""gloo all_reduce in a loop until FINISH_FILE exists: a worker that sits in collectives when its peers vanish."""

import os
import time

import torch
import torch.distributed as dist

if "TEST_PID_DIR" in os.environ:  # so a test can check that no worker outlives its agent
    with open(os.path.join(os.environ["TEST_PID_DIR"], f"g{os.getpid()}"), "w") as fh:
        fh.write(str(os.getpid()))
dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == world
print(f"READY rank {rank} world {world} restart {os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
finish = os.environ["FINISH_FILE"]
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    flag = torch.tensor([1.0 if os.path.exists(finish) else 0.0])
    dist.all_reduce(flag)  # everyone stops together once anyone sees the file
    if flag.item() > 0:
        break
dist.destroy_process_group()
