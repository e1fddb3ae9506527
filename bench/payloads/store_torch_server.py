"""torch's own TCPStore server (libuv backend, C++) in its own process, for ``store_bench``.

Usage: ``store_torch_server.py``. Prints ``READY <port>`` once listening. Commands on stdin, one per line: ``RESET``
(deletes every key through the master's own client, answered ``RESET-OK``; torch's server has no reset, and the one key a
client cannot delete, ``init/``, is a counter that nothing waits on). EOF on stdin exits.
"""

import sys
from datetime import timedelta

import torch.distributed as dist

store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, use_libuv=True, timeout=timedelta(seconds=60))
print(f"READY {store.port}", flush=True)
for line in sys.stdin:
    if line.strip() == "RESET":
        for key in store.list_keys():
            store.delete_key(key)
        print("RESET-OK", flush=True)
