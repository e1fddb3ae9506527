"""How safe asking a busy torch worker for its stack is: the measurement behind the stack shim's two signals.

A worker (this file with ``--worker``) is asked for its stack every 0.5 ms while it does one of two things:

- ``all_reduce``: a loop of gloo ``all_reduce`` on a one-rank group for ``--seconds``: its main thread in and out of
  Python, gloo's threads making and freeing thread states to drop each collective's tensors;
- ``import``: ``import torch`` (the busiest Python there is: it ends the run).

Two ways of asking, each ``--runs`` times a scenario:

- ``before``: ``kill`` (any thread may take it) and ``faulthandler``'s dump of every thread, which rankrun did before;
- ``now``: what ``rankrun.stacks.sampler`` does, with the shim a worker gets (``channel_env``): to the main thread
  (``tgkill``), the Python handler while ``/proc`` says that thread runs (``R``), ``faulthandler``'s dump of that
  thread alone otherwise.

    python bench/dump_safety.py --runs 6 --seconds 15     # about 10 minutes; needs torch

Not a comparison with torchrun, which takes no stacks: it prints how many runs died (SIGSEGV) of each way.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rankrun.proc.spawn import main_thread_kill
from rankrun.stacks.channel import DUMP_SIGNAL, RUNNING_SIGNAL, channel_env
from rankrun.stacks.sampler import proc_stat

SCENARIOS = ("all_reduce", "import")
WAYS = ("before", "now")


def worker(scenario: str, before: bool) -> None:
    if before:
        out = open(os.devnull, "ab", buffering=0)  # noqa: SIM115 - faulthandler keeps it for the process's life
        faulthandler.register(DUMP_SIGNAL, file=out, all_threads=True, chain=False)
    print("READY", flush=True)
    import torch  # noqa: PLC0415 - asked for stacks while it imports
    import torch.distributed as dist  # noqa: PLC0415

    if scenario == "import":
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    while True:
        dist.all_reduce(torch.ones(4))


def one_run(scenario: str, way: str, seconds: float) -> tuple[bool, int]:
    """Whether the worker died of SIGSEGV, and how many times it was asked."""
    with tempfile.TemporaryDirectory(prefix="rankrun-dump-safety-") as tmp:
        env = dict(os.environ)
        if way == "now":
            env = channel_env(env, str(Path(tmp) / "stacks.txt"))
        proc = subprocess.Popen([sys.executable, __file__, "--worker", scenario, "--way", way], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "READY"
            asked, end = 0, time.monotonic() + seconds
            while time.monotonic() < end and proc.poll() is None:
                if way == "before":
                    os.kill(proc.pid, DUMP_SIGNAL)
                else:
                    stat = proc_stat(proc.pid)
                    main_thread_kill(proc.pid, RUNNING_SIGNAL if stat is not None and stat[0] == "R" else DUMP_SIGNAL)
                asked += 1
                time.sleep(0.0005)
            return proc.poll() == -signal.SIGSEGV, asked
        finally:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=15.0, help="each all_reduce run (an import run: the import)")
    parser.add_argument("--only", choices=SCENARIOS)
    parser.add_argument("--worker", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.way == "before")
        return
    for scenario in [args.only] if args.only else SCENARIOS:
        for way in WAYS:
            results = [one_run(scenario, way, args.seconds) for _ in range(args.runs)]
            died = sum(d for d, _ in results)
            print(f"{scenario}, {way}: died in {died} of {args.runs} runs; asked {sum(n for _, n in results):,} times",
                  flush=True)


if __name__ == "__main__":
    main()
