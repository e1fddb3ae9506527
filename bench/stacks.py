"""How fast one node's stack report comes: ``python bench/stacks.py [--ranks 8,64,512] [--reps 3]``.

Starts N real Python workers with rankrun's dump channel (the shim first on ``PYTHONPATH``, as the launcher sets
it), each parked in one of two functions (rank 0 elsewhere, the rest together, like a hang), waits until every
worker has registered its handler, then times, per repetition, the real sampling path: ``Sampler.sample`` (signal
every worker, read every answer, /proc state) and ``render`` (grouping and layout), from the request to the last
line. Prints one line per N: median milliseconds, the report's lines, and the dump bytes read per rank.
The workers are killed by PID at the end. Not yet here: the multi-node form (bytes per node through the store).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rankrun.stacks.channel import DUMP_SIGNAL, channel_env
from rankrun.stacks.report import render
from rankrun.stacks.sampler import Sampler, Target, catches

WORKER = """\
import os, time
def waiting_in_a_collective():
    time.sleep(3600)
def stuck_elsewhere():
    time.sleep(3600)
(stuck_elsewhere if os.environ["RANK"] == "0" else waiting_in_a_collective)()
"""
READY_TIMEOUT = 300.0


def _signal_of(proc: subprocess.Popen[bytes]):  # type: ignore[no-untyped-def]
    def send(signum: int) -> bool:
        if proc.poll() is not None:
            return False
        os.kill(proc.pid, signum)
        return True

    return send


def measure(ranks: int, reps: int) -> tuple[float, int, float]:
    with tempfile.TemporaryDirectory(prefix="rankrun-bench-stacks-") as tmp:
        script = Path(tmp) / "worker.py"
        script.write_text(WORKER)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            targets = []
            for rank in range(ranks):
                dump = Path(tmp) / f"{rank}.stacks"
                env = channel_env(dict(os.environ, RANK=str(rank)), str(dump))
                proc = subprocess.Popen([sys.executable, str(script)], env=env)
                procs.append(proc)
                targets.append(Target(rank, "bench", proc.pid, dump, _signal_of(proc)))
            deadline = time.monotonic() + READY_TIMEOUT
            while not all(catches(p.pid, DUMP_SIGNAL) and (Path(tmp) / f"{r}.stacks").exists()
                          for r, p in enumerate(procs)):
                if time.monotonic() > deadline:
                    raise SystemExit(f"stacks.py: {ranks} workers did not register within {READY_TIMEOUT} s")
                time.sleep(0.05)
            times, lines = [], 0
            for _ in range(reps):
                t0 = time.perf_counter()
                samples = asyncio.run(Sampler().sample(targets, timeout=10.0))
                report = render(f"rankrun: job bench: on request; {ranks} ranks", samples)
                times.append((time.perf_counter() - t0) * 1000)
                lines = len(report)
                assert all(s.dump is not None for s in samples), "a worker did not answer"
            dump_bytes = statistics.mean((Path(tmp) / f"{r}.stacks").stat().st_size for r in range(ranks)) / reps
            return statistics.median(times), lines, dump_bytes
        finally:
            for proc in procs:
                proc.kill()
            for proc in procs:
                proc.wait(timeout=60)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="8,64,512", help="comma-separated worker counts")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    print("| ranks | request → report (median ms) | report lines | dump bytes per rank |")
    print("|---|---|---|---|")
    for n in (int(x) for x in args.ranks.split(",")):
        ms, lines, per_rank = measure(n, args.reps)
        print(f"| {n} | {ms:.0f} | {lines} | {per_rank:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
