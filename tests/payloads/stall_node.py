"""A worker for the multi-node stall blame test (plain Python). Prints READY, then:

- on the node whose launcher has ``OUTLIER`` set: creates the file ``STARTED`` names, then retries in
  ``stuck_loading_data`` forever, printing a line five times a second (its node never falls silent, so its launcher
  never reports the stall: another node does);
- elsewhere, on the first attempt: waits (saying so, so as not to look stalled) until the outlier runs, then sleeps
  in ``wait_for_peers`` without a word: the stall, whose report then sees every rank's stack;
- elsewhere, on a restart: prints DONE and exits 0.
"""

import os
import time
from pathlib import Path

rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
started = Path(os.environ["STARTED"])
print(f"READY rank {rank} restart {restart} world {os.environ['WORLD_SIZE']}", flush=True)


def wait_for_peers() -> None:
    time.sleep(600)


def stuck_loading_data() -> None:
    for attempt in range(3000):
        print(f"rank {rank}: data not ready, retry {attempt}", flush=True)
        time.sleep(0.2)


if os.environ.get("OUTLIER"):
    started.touch()
    stuck_loading_data()
elif restart == 0:
    while not started.exists():  # a worker waiting on another machine's; bounded by the test's own timeout
        print(f"rank {rank}: waiting for the outlier to start", flush=True)
        time.sleep(0.05)
    print(f"rank {rank}: waiting for peers", flush=True)
    wait_for_peers()
else:
    print(f"DONE rank {rank}", flush=True)
