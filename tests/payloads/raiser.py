"""Rank 1 raises a ValueError; the others wait to be stopped."""

import os
import signal

signal.alarm(120)
rank = int(os.environ["RANK"])
with open(os.path.join(os.environ["TEST_PID_DIR"], f"r{rank}"), "w") as fh:
    fh.write(f"{os.getpid()}\n")


def helper() -> None:
    raise ValueError(f"boom from rank {rank}")


if rank == 1:
    helper()
signal.pause()
