"""A worker for the stall tests. Prints READY, then, by ``PAYLOAD_STALL`` (default ``wait``) and its rank:

- ``wait``: rank ``PAYLOAD_ODD_RANK`` (default: the last) sleeps in ``stuck_loading_data``, the others in
  ``wait_for_peers`` (both silent, 0 % CPU);
- ``regex``: the odd rank backtracks in ``re.match`` with the GIL held, the others wait;
- ``tick``: every rank prints ``tick <rank> <i>`` ten times a second, forever (a healthy job);
- ``exit``: every rank but the odd one exits 0 at once; the odd one waits (an exit that hangs);
- ``compute``: every rank computes in Python for ``PAYLOAD_SECONDS`` without a word (its stack moves with
  time), then exits 0.
"""

import os
import re
import sys
import time

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
mode = os.environ.get("PAYLOAD_STALL", "wait")
odd = int(os.environ.get("PAYLOAD_ODD_RANK", str(world - 1)))
print(f"READY rank {rank}", flush=True)
if os.environ.get("USER_SITECUSTOMIZE_RAN"):
    print(f"user sitecustomize ran in rank {rank}", flush=True)


def wait_for_peers() -> None:
    time.sleep(600)


def stuck_loading_data() -> None:
    time.sleep(600)


def stuck_in_a_regex() -> None:
    re.match(r"(a+)+$", "a" * 64 + "b")


def nest(levels: int, until: float) -> None:
    if levels:
        return nest(levels - 1, until)
    while time.monotonic() < until:
        pass
    return None


def compute() -> None:
    """Busy in Python, its stack one call deeper every 0.3 s (mod 7): samples half a second to two seconds apart
    always differ, as a real computation's do (here without relying on chance)."""
    end = time.monotonic() + float(os.environ.get("PAYLOAD_SECONDS", "4"))
    while (now := time.monotonic()) < end:
        bucket = int(now / 0.3)
        nest(bucket % 7, (bucket + 1) * 0.3)
    sys.exit(0)


if mode == "tick":
    for i in range(10**9):
        print(f"tick {rank} {i}", flush=True)
        time.sleep(0.1)
if mode == "compute":
    compute()
elif mode == "exit" and rank != odd:
    sys.exit(0)
elif rank == odd:
    (stuck_in_a_regex if mode == "regex" else stuck_loading_data)()
else:
    wait_for_peers()
