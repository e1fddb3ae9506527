"""gloo all_reduces with one rank late to each (SLOW_RANK sleeps SLOW_S before every one): a straggler the others wait
for, ending after STEPS collectives, or STEPS_FOR seconds of them if that comes first; then, for up to ARRIVALS_WAIT
seconds, until the shim has written the last of them to the rank's arrivals file.

With MEASURE_DUMP set, each rank also says what 5 dumps of torch's Flight Recorder cost, taken and parsed from a side
thread as the shim does, while the main thread waits in all_reduce (``DUMP rank R ms ...``: a figure, not a check)."""

import _thread
import json
import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
slow_rank, slow_s = int(os.environ.get("SLOW_RANK", "1")), float(os.environ.get("SLOW_S", "0.2"))
steps, steps_for = int(os.environ.get("STEPS", "20")), float(os.environ.get("STEPS_FOR", "30"))
costs: list[float] = []


def measure() -> None:  # while the main thread sits in all_reduce (rank 0 waits for the slow rank)
    time.sleep(slow_s * 2.5)
    for _ in range(5):
        start = time.perf_counter()
        json.loads(torch._C._distributed_c10d._dump_fr_trace_json())
        costs.append(time.perf_counter() - start)


if os.environ.get("MEASURE_DUMP"):
    _thread.start_new_thread(measure, ())
t = torch.ones(4)
deadline = time.monotonic() + steps_for
done = 0
while done < steps and time.monotonic() < deadline:
    if rank == slow_rank:
        time.sleep(slow_s)
    dist.all_reduce(t)
    done += 1
# Before the end, the shim's next dump: the arrivals of every collective of the loop in this rank's file (rankrun's
# layout: <attempt dir>/straggler/rank_<rank>.fr, beside <attempt dir>/<local rank>/error.json), if it writes one.
arrivals = os.path.join(os.path.dirname(os.path.dirname(os.environ["TORCHELASTIC_ERROR_FILE"])), "straggler",
                        f"rank_{rank}.fr")
wait_until = time.monotonic() + float(os.environ.get("ARRIVALS_WAIT", "0"))
while time.monotonic() < wait_until:
    lines = []
    if os.path.exists(arrivals):
        with open(arrivals) as fh:
            lines = fh.read().splitlines()
    if lines and int(lines[-1].split()[1]) >= done:
        break
    time.sleep(0.05)
dist.barrier()
if costs:
    print(f"DUMP rank {rank} ms {' '.join(f'{c * 1e3:.2f}' for c in costs)}", flush=True)
print(f"DONE rank {rank} collectives {done}", flush=True)
dist.destroy_process_group()
sys.exit(0)
