"""A synchronous training loop for the straggler watch: every rank "computes" COMPUTE_S a step (SLOW_RANK SLOW_S),
then they all_reduce; until one rank has run RUN_S seconds (the all_reduce carries it: they stop together). SPIN=1 computes by spinning on the CPU (a CPU quota then slows the rank)
rather than sleeping. LOAD_EVERY=N: every N steps every rank "loads data" for LOAD_S first. SLOW_AFTER: the slow
rank is slow only from that many seconds on (it prints ``SLOW FROM <wall time>`` then). Prints ``READY`` after
init_process_group and ``DONE <steps>`` at the end. SLOW_NODE=1: every rank of this launcher is
slow, whatever its rank (a slow node, across restarts that renumber the ranks). STALL_AFTER=S: SLOW_RANK stops
for good after S seconds, before a collective (a stall: the others wait in it). RESTARTED_RUN_S: RUN_S of a later
attempt: restarted (TORCHELASTIC_RESTART_COUNT > 0) or, with FIRST_WORLD=N, re-formed with a world of other than N
ranks (a membership change spends no restart), so a test of what follows need not run the first attempt's length."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
compute, slow_s = float(os.environ.get("COMPUTE_S", "0.05")), float(os.environ.get("SLOW_S", "0.3"))
slow_rank = int(os.environ.get("SLOW_RANK", "-1"))
run_s, slow_after = float(os.environ.get("RUN_S", "10")), float(os.environ.get("SLOW_AFTER", "0"))
first_world = os.environ.get("FIRST_WORLD")
if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" or first_world not in (None, str(dist.get_world_size())):
    run_s = float(os.environ.get("RESTARTED_RUN_S", run_s))
load_every, load_s = int(os.environ.get("LOAD_EVERY", "0")), float(os.environ.get("LOAD_S", "1.0"))
spin = os.environ.get("SPIN") == "1"


def work(seconds: float) -> None:
    if not spin:
        time.sleep(seconds)
        return
    end = time.process_time() + seconds  # CPU time: under a quota it takes longer on the wall clock
    while time.process_time() < end:
        pass


print(f"READY rank {rank} pid {os.getpid()}", flush=True)
t = torch.ones(16)
start = time.monotonic()
steps, said = 0, False
while True:
    if load_every and steps % load_every == load_every - 1:
        time.sleep(load_s)  # every rank at once: nobody waits for anybody
    slow = (rank == slow_rank or os.environ.get("SLOW_NODE") == "1") and time.monotonic() - start >= slow_after
    if slow and not said:
        print(f"SLOW FROM {time.time():.3f}", flush=True)
        said = True
    if rank == slow_rank and os.environ.get("STALL_AFTER") and time.monotonic() - start >= float(os.environ["STALL_AFTER"]):
        time.sleep(3600)  # stuck, silent
    work(slow_s if slow else compute)
    t[0] = float(time.monotonic() - start >= run_s)  # the ranks stop together: once any rank's time is up
    dist.all_reduce(t)
    steps += 1
    if t[0] > 0:
        break
print(f"DONE {steps}", flush=True)
dist.destroy_process_group()
