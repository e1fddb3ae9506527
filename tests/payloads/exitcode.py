"""Rank FAIL_RANK exits with FAIL_CODE (or kills itself with FAIL_SIGNAL); the others wait to be stopped."""

import os
import signal
import sys

rank = int(os.environ["RANK"])
pid_file = os.path.join(os.environ["TEST_PID_DIR"], f"w{rank}-{os.environ['TORCHELASTIC_RESTART_COUNT']}")
with open(pid_file + ".tmp", "w") as fh:  # atomic: a reader never sees an empty pid file
    fh.write(f"{os.getpid()}\n")
os.replace(pid_file + ".tmp", pid_file)
signal.alarm(120)
print(f"READY rank {rank} restart {os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    if "FAIL_SIGNAL" in os.environ:
        os.kill(os.getpid(), int(os.environ["FAIL_SIGNAL"]))
    print(f"rank {rank} is failing on purpose", file=sys.stderr, flush=True)
    sys.exit(int(os.environ.get("FAIL_CODE", "1")))
if os.environ.get("OTHERS") == "exit0":
    sys.exit(0)
signal.pause()
