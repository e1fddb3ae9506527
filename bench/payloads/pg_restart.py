"""Warm-start worker: ``pg_restart.py DIR FAIL_RANK``; imports torch at its top, as a training script does.

Every rank of every attempt joins a gloo process group (``init_method="env://"``, the launcher's store) and publishes
``<time.time() entering init_process_group> <time.time() past it> <pid>`` in DIR/init/a<attempt>_r<rank>.
On attempt 0 (TORCHELASTIC_RESTART_COUNT) the ranks then idle (default SIGTERM action) until the launcher stops them,
except FAIL_RANK: it waits for the harness's DIR/fail file (the harness first samples the idle workers' memory),
writes ``time.time()`` to DIR/fail_ts and leaves with ``os._exit(1)``. On later attempts every rank passes a barrier
(so no rank leaves while a peer still sets up its pairs) and exits 0. Every wait is bounded, so a lost harness leaves
nothing behind.
"""

import os
import sys
import time
from datetime import timedelta

import torch.distributed as dist

base, fail_rank = sys.argv[1], sys.argv[2]
rank = os.environ["RANK"]
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def publish(sub: str, name: str, text: str) -> None:
    tmp = os.path.join(base, sub, f".{name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
    os.rename(tmp, os.path.join(base, sub, name))


entered = time.time()
dist.init_process_group(backend="gloo", init_method="env://", timeout=timedelta(seconds=300))
done = time.time()
publish("init", f"a{attempt}_r{rank}", f"{entered!r} {done!r} {os.getpid()}")
if attempt != "0":
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0)
deadline = time.monotonic() + 600
if rank == fail_rank:
    fail = os.path.join(base, "fail")
    while not os.path.exists(fail) and time.monotonic() < deadline:
        time.sleep(0.001)
    publish(".", "fail_ts", repr(time.time()))
    os._exit(1)
while time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3)
