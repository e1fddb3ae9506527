"""A progress bar redrawn with \\r: each state waits until the test has seen it (an ack file).

Argv: STATES ACK_DIR. Rank 0 draws; with PAYLOAD_QUIET_OTHERS=1 the other ranks print nothing.
"""

import os
import sys
import time

rank = os.environ["RANK"]
states, ack_dir = int(sys.argv[1]), sys.argv[2]
if rank != "0" and os.environ.get("PAYLOAD_QUIET_OTHERS") == "1":
    sys.exit(0)
for i in range(states):
    sys.stdout.write(f"\rrank{rank} step {i}/{states}")
    sys.stdout.flush()
    ack = os.path.join(ack_dir, f"{rank}-{i}")
    deadline = time.monotonic() + 60
    while not os.path.exists(ack):  # the event: the test saw this state on its console
        if time.monotonic() > deadline:
            sys.exit(f"rank {rank}: state {i} was never seen")
        time.sleep(0.002)
sys.stdout.write("\n")
