"""A plain-Python rank that reaches its node's keeper (``tests/integration/test_checkpoint_keeper.py``): no torch.

It connects (``rankrun.checkpoint.client``, standard library only), maps its header and both slots, says what it was
handed, then forks a child that tries to connect too (a DataLoader worker would be such a child) and says how that
went. With ``ASK=N`` it asks for room for N bytes in its other slot and says whether it got it. With ``HOLD=1`` it then
prints READY with its pid and waits, the kept memory mapped.
"""

import os
import signal
import time

from rankrun.checkpoint import client

signal.alarm(120)  # safety net: never outlive a broken test
kept = client.connect()
views = [kept.mapped(i, 4096) for i in range(2)]  # a reservation asked for, and the slots mapped
print(f"rank {kept.rank} local {kept.info['local_rank']} world {kept.world} capacity {kept.slots[0].capacity}",
      flush=True)
child = os.fork()
if child == 0:
    try:
        client.connect()
        print("child connected", flush=True)
    except client.KeptError as exc:
        print(f"child refused: {exc}", flush=True)
    os._exit(0)
os.waitpid(child, 0)
if os.environ.get("ASK"):  # room for a state of ASK bytes in slot 1
    try:
        kept.mapped(1, int(os.environ["ASK"]))
        print("reserved", flush=True)
    except client.NoRoom as exc:
        print(f"no room: {exc}", flush=True)
if os.environ.get("HOLD"):
    print(f"READY {os.getpid()}", flush=True)
    time.sleep(120)
