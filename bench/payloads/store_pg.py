"""init_process_group through a given store, for ``store_bench``: torch is imported once here, workers are forked.

Usage: ``store_pg.py``; prints ``READY``, then obeys ``RUN PORT N`` lines on stdin: forks N workers, each with torchrun's
environment (``TORCHELASTIC_USE_AGENT_STORE=True``, MASTER_ADDR/PORT = the store), released together through one pipe,
each timing its own ``init_process_group(backend="gloo", init_method="env://")`` (then a barrier, so nobody leaves
while a peer still connects). Answers one JSON line
``{"seconds": [per rank], "failed": [ranks]}``. EOF on stdin exits.
"""

import json
import os
import select
import sys
import time
from datetime import timedelta

import torch.distributed as dist

TIMEOUT_S = 60


def worker(rank: int, n: int, port: int, go: int, report: int) -> None:
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
        "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0", "GLOO_SOCKET_IFNAME": "lo",
    })
    os.read(go, 1)  # EOF once the parent has forked everyone
    t0 = time.perf_counter()
    dist.init_process_group(backend="gloo", init_method="env://", timeout=timedelta(seconds=TIMEOUT_S))
    elapsed = time.perf_counter() - t0
    os.write(report, f"{rank} {elapsed}\n".encode())
    dist.barrier()  # a rank that left at once could close a gloo pair a slower peer is still setting up
    dist.destroy_process_group()


def run(port: int, n: int) -> dict[str, list[float] | list[int]]:
    go_r, go_w = os.pipe()
    rep_r, rep_w = os.pipe()
    pids = []
    for rank in range(n):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(go_w)
                os.close(rep_r)
                worker(rank, n, port, go_r, rep_w)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(go_r)
    os.close(rep_w)
    os.close(go_w)  # go
    data = b""
    deadline = time.monotonic() + TIMEOUT_S + 10
    while time.monotonic() < deadline:
        if not select.select([rep_r], [], [], max(deadline - time.monotonic(), 0))[0]:
            break
        chunk = os.read(rep_r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(rep_r)
    seconds = {}
    for line in data.decode().splitlines():
        rank, value = line.split()
        seconds[int(rank)] = float(value)
    failed = []
    for rank, pid in enumerate(pids):
        if rank not in seconds:
            os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
        if rank not in seconds or os.waitstatus_to_exitcode(status) != 0:
            failed.append(rank)
    return {"seconds": [seconds.get(r, float("nan")) for r in range(n)], "failed": failed}


print("READY", flush=True)
for line in sys.stdin:
    words = line.split()
    if words and words[0] == "RUN":
        print(json.dumps(run(int(words[1]), int(words[2]))), flush=True)
