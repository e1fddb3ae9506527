"""Baseline driver: start N workers directly, the way a launcher would, and wait for all.

Usage: ``python direct.py --nproc-per-node N [--stdout-dir DIR] SCRIPT [ARGS...]`` (the same argv
shape as the launchers, so the harness treats it as one more launcher). Each worker is
``sys.executable -u SCRIPT ARGS`` with RANK/LOCAL_RANK/WORLD_SIZE set; stdout and stderr are
inherited (whatever the harness gave this driver), or stdout goes to DIR/<rank>.txt with
``--stdout-dir``. Exit code: 0 if every worker exited 0.
"""

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--nproc-per-node":
        print("usage: direct.py --nproc-per-node N SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    nproc, rest = int(argv[1]), argv[2:]
    stdout_dir = None
    if rest[:1] == ["--stdout-dir"]:
        stdout_dir, rest = rest[1], rest[2:]
    script, args = rest[0], rest[1:]
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc))
        out = open(os.path.join(stdout_dir, f"{rank}.txt"), "wb") if stdout_dir else None  # noqa: SIM115
        procs.append(subprocess.Popen([sys.executable, "-u", script, *args], env=env, stdout=out))
        if out is not None:
            out.close()
    codes = [p.wait() for p in procs]
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
