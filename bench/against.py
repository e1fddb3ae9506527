"""rankrun of this tree against rankrun of an earlier commit, side by side in one run: for a reshape that must not
be slower. ``python bench/against.py REV [--reps N]``.

Each repetition launches, in rotating order, this tree's and REV's ``python -m rankrun`` (REV checked out in a
temporary git worktree, each imported through its own ``PYTHONPATH``, with one private bytecode cache, as
``bench/run.py`` does) on the same jobs:

- one node, 1, 8 and 32 no-op workers (``bench/launch_bench.py``'s job: exec → exit);
- two nodes on the c10d rendezvous (two fresh loopback addresses), 4 no-op workers each: the wall from the first
  launcher's exec until both have exited, and the CPU of both launchers and their workers.

It prints a Markdown table of the medians, REV's and this tree's, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from harness import PAYLOADS, PYTHON, REPO, Samples, cleanup, expect_ok, finish, log, median, pycache, run_timed, start

SIZES = (1, 8, 32)
NODES_NPROC = 4


def _fresh_address() -> str:
    """A loopback address outside 127.0.0.x, random: the rendezvous's fixed port on it cannot collide."""
    a, b, c = os.urandom(3)
    return f"127.{1 + a % 254}.{b}.{1 + c % 254}"


def _one_node(src: Path, nproc: int) -> tuple[float, float]:
    argv = [PYTHON, "-m", "rankrun", "--nproc-per-node", str(nproc), str(PAYLOADS / "noop.py")]
    timed = run_timed(argv, timeout=180, extra_env={"PYTHONPATH": str(src)})
    expect_ok(timed, argv)
    return timed.wall * 1000, timed.cpu * 1000


def _two_nodes(src: Path, run: int) -> tuple[float, float]:
    host, other = _fresh_address(), _fresh_address()
    procs = []
    t0 = time.perf_counter()
    for addr in (host, other):
        argv = [PYTHON, "-m", "rankrun", "--nnodes", "2", "--nproc-per-node", str(NODES_NPROC),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{host}:29400", "--rdzv-id", f"against-{run}",
                "--local-addr", addr, str(PAYLOADS / "noop.py")]
        procs.append(start(argv, extra_env={"PYTHONPATH": str(src), "RANKRUN_RDZV_SECRET": "bench"}))
    ends = [finish(proc, 180) for proc in procs]
    wall = time.perf_counter() - t0
    if any(end.rc != 0 for end in ends):
        raise SystemExit(f"two nodes of {src} exited {[end.rc for end in ends]}")
    return wall * 1000, sum(end.cpu for end in ends) * 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rev", help="the commit to compare against (e.g. a reshape's first parent)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rankrun-against-") as tmp, pycache():
        old = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(old), args.rev], check=True)
        try:
            trees = {"before": old / "src", "after": REPO / "src"}
            jobs = {f"one node, {n} noop worker{'s' if n > 1 else ''}": n for n in SIZES} | {"two nodes, 4 workers each": 0}
            wall = {job: Samples("ms") for job in jobs}
            cpu = {job: Samples("ms") for job in jobs}
            for key, src in trees.items():  # warm-up: each tree's bytecode compiled once
                _one_node(src, 1)
                _two_nodes(src, -1 if key == "before" else -2)
            for rep in range(args.reps):
                order = list(trees.items()) if rep % 2 == 0 else list(trees.items())[::-1]
                for job, n in jobs.items():
                    for key, src in order:
                        w, c = _one_node(src, n) if n else _two_nodes(src, rep * 2 + (key == "after"))
                        wall[job].add(key, w)
                        cpu[job].add(key, c)
                log(f"  rep {rep + 1}/{args.reps} done")
        finally:
            leftovers = cleanup()
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=False)
    print(f"| job ({args.reps} repetitions, medians) | before ({args.rev}) wall ms | after wall ms | after ÷ before | "
          "before CPU ms | after CPU ms | after ÷ before |")
    print("|---|---|---|---|---|---|---|")
    for job in jobs:
        bw, aw = median(wall[job].by_launcher["before"]), median(wall[job].by_launcher["after"])
        bc, ac = median(cpu[job].by_launcher["before"]), median(cpu[job].by_launcher["after"])
        print(f"| {job} | {bw:.1f} | {aw:.1f} | {aw / bw:.2f}x | {bc:.1f} | {ac:.1f} | {ac / bc:.2f}x |")
    if leftovers:
        print(f"left behind and stopped: {leftovers}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
