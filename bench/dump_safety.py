"""How safe a stack dump is on a busy torch worker: the measurement behind ``rankrun.proc.spawn.main_thread_kill``.

A worker (this file with ``--worker``) registers ``faulthandler`` on SIGUSR1, joins a one-rank gloo group and runs
``all_reduce`` in a loop: its main thread in and out of Python, gloo's threads making and freeing thread states to
drop each collective's tensors. The driver sends it SIGUSR1 every 0.5 ms for ``--seconds`` and notes whether it died.
Three ways, each ``--runs`` times:

- ``process, every thread``: ``kill`` (any thread may take it), ``all_threads=True`` (what rankrun did before);
- ``main thread, every thread``: ``tgkill`` to the main thread, ``all_threads=True``;
- ``main thread, itself``: ``tgkill`` to the main thread, ``all_threads=False`` (what rankrun does).

    python bench/dump_safety.py --runs 6 --seconds 15     # about 5 minutes; needs torch

Not a comparison with torchrun (which takes no stacks): it prints how many runs of each way died, and the dumps sent.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import subprocess
import sys
import time

from rankrun.proc.spawn import main_thread_kill

WAYS = {"process, every thread": (False, True), "main thread, every thread": (True, True),
        "main thread, itself": (True, False)}


def worker(all_threads: bool) -> None:
    out = open(os.devnull, "ab", buffering=0)  # noqa: SIM115 - faulthandler keeps it for the process's life
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=all_threads, chain=False)
    import torch  # noqa: PLC0415 - only the worker needs it, after its handler is registered (as the shim's is)
    import torch.distributed as dist  # noqa: PLC0415

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    print("READY", flush=True)
    while True:
        dist.all_reduce(torch.ones(4))


def one_run(to_main: bool, all_threads: bool, seconds: float) -> tuple[bool, int]:
    """Whether the worker died of SIGSEGV, and how many signals it was sent."""
    proc = subprocess.Popen([sys.executable, __file__, "--worker", str(int(all_threads))], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        sent, end = 0, time.monotonic() + seconds
        while time.monotonic() < end and proc.poll() is None:
            if to_main:
                main_thread_kill(proc.pid, signal.SIGUSR1)
            else:
                os.kill(proc.pid, signal.SIGUSR1)
            sent += 1
            time.sleep(0.0005)
        return proc.poll() == -signal.SIGSEGV, sent
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker == "1")
        return
    for name, (to_main, all_threads) in WAYS.items():
        results = [one_run(to_main, all_threads, args.seconds) for _ in range(args.runs)]
        died = sum(d for d, _ in results)
        print(f"{name}: died in {died} of {args.runs} runs; {sum(n for _, n in results):,} dumps asked", flush=True)


if __name__ == "__main__":
    main()
