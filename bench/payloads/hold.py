"""RSS worker: ``hold.py DIR`` marks itself ready in DIR/ready, then waits for DIR/go to appear.

Waiting is a bounded polling loop (never more than 120 s), so a lost harness leaves nothing behind.
"""

import os
import sys
import time

base = sys.argv[1]
rank = os.environ["RANK"]
tmp = os.path.join(base, "ready", f".{rank}.tmp")
with open(tmp, "w") as fh:
    fh.write(str(os.getpid()))
os.rename(tmp, os.path.join(base, "ready", rank))
go = os.path.join(base, "go")
deadline = time.monotonic() + 120
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.005)
