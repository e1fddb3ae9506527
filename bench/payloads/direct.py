"""Baseline driver: start N workers directly, the way a launcher would, and wait for all.

Usage: ``python direct.py --nproc-per-node N SCRIPT [ARGS...]`` (the same argv shape as the
launchers, so the harness treats it as one more launcher). Each worker is
``sys.executable -u SCRIPT ARGS`` with RANK/LOCAL_RANK/WORLD_SIZE set; stdout and stderr are
inherited (whatever the harness gave this driver). Exit code: 0 if every worker exited 0.
"""

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--nproc-per-node":
        print("usage: direct.py --nproc-per-node N SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    nproc, script, args = int(argv[1]), argv[2], argv[3:]
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc))
        procs.append(subprocess.Popen([sys.executable, "-u", script, *args], env=env))
    codes = [p.wait() for p in procs]
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
