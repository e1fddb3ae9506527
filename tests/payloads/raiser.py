"""Rank 1 raises a ValueError; the others wait to be stopped."""

import os
import signal

signal.alarm(120)
rank = int(os.environ["RANK"])
pid_file = os.path.join(os.environ["TEST_PID_DIR"], f"r{rank}")
with open(pid_file + ".tmp", "w") as fh:  # atomic: a reader never sees an empty pid file
    fh.write(f"{os.getpid()}\n")
os.replace(pid_file + ".tmp", pid_file)


def helper() -> None:
    raise ValueError(f"boom from rank {rank}")


if rank == 1:
    helper()
signal.pause()
