"""A worker of the events tests: rank FAIL_RANK raises ValueError on the first attempt (restart count 0); every
other start says READY and waits for WAIT_FILE (when set; bounded).

Env: FAIL_RANK, WAIT_FILE, TEST_PID_DIR (the test's reaper watches the pids written there).
"""

import os
import time

rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
pid_dir = os.environ.get("TEST_PID_DIR")
if pid_dir:
    with open(os.path.join(pid_dir, f"w{os.getpid()}"), "w") as fh:
        fh.write(str(os.getpid()))
if attempt == "0" and rank == os.environ.get("FAIL_RANK"):
    raise ValueError(f"bad batch on rank {rank}")
print(f"READY rank {rank} attempt {attempt}", flush=True)
wait = os.environ.get("WAIT_FILE")
deadline = time.monotonic() + 60
while wait and not os.path.exists(wait) and time.monotonic() < deadline:
    time.sleep(0.01)
