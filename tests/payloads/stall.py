"""A worker for the stall tests. Prints READY, then, by ``PAYLOAD_STALL`` (default ``wait``) and its rank:

- ``wait``: rank ``PAYLOAD_ODD_RANK`` (default: the last) sleeps in ``stuck_loading_data``, the others in
  ``wait_for_peers`` (both silent, 0 % CPU);
- ``regex``: the odd rank backtracks in ``re.match`` with the GIL held, the others wait;
- ``compute``: every rank computes in Python for ``PAYLOAD_SECONDS`` without a word (its stack depth moves with
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


def descend(depth: int) -> int:
    return descend(depth - 1) + 1 if depth else 0


def compute() -> None:
    end = time.monotonic() + float(os.environ.get("PAYLOAD_SECONDS", "4"))
    total = 0
    while time.monotonic() < end:
        total += descend(int(time.monotonic() * 10) % 20 + 1)
    sys.exit(0 if total else 1)


if mode == "compute":
    compute()
elif rank == odd:
    (stuck_in_a_regex if mode == "regex" else stuck_loading_data)()
else:
    wait_for_peers()
