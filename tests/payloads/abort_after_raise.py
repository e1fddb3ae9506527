"""Rank 0 fails as a torch worker does that raises after ``init_process_group``: its traceback on stderr, then death
by SIGABRT in its teardown (``terminate called without an active exception``), here an atexit ``os.abort()``.

Each attempt first prints a traceback it handles and goes on from (a retried download), which must never be blamed.
Attempt 1 then aborts after more than five lines with no traceback just before; the others raise, then abort.
"""

import atexit
import os
import resource
import sys
import traceback

resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an abort that leaves no core file behind
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def abort() -> None:
    print("terminate called without an active exception", file=sys.stderr, flush=True)
    os.abort()


try:
    raise ConnectionError("download failed, retrying")
except ConnectionError:
    traceback.print_exc()
for step in range(8):
    print(f"step {step}", file=sys.stderr, flush=True)
atexit.register(abort)
if restart != 1:
    raise ValueError(f"bad lr in attempt {restart}")
os.abort()
