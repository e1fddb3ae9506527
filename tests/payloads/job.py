"""Rank 0 asks a question on its terminal; the other ranks wait (bounded) until it has its answer."""

import os
import sys
import time

done = os.path.join(os.environ["TEST_PID_DIR"], "answered")
if os.environ["RANK"] == "0":
    print(f"TTY {sys.stdin.isatty()}", flush=True)
    name = input("name? ")
    print(f"hello {name}", flush=True)
    open(done, "w").close()
else:
    deadline = time.monotonic() + 120
    while not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(0.01)
