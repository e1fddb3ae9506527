"""Failure / restart worker: ``fail.py DIR FAIL_RANK``.

Records ``<start time.time()> <pid>`` in DIR/starts/a<attempt>_r<rank>, prints READY, then marks
itself in DIR/ready/a<attempt>_r<rank>. On attempt 0 (TORCHELASTIC_RESTART_COUNT) the rank
FAIL_RANK waits until every rank of the attempt is ready, writes ``time.time()`` to DIR/fail_ts and
leaves with ``os._exit(1)``; the other ranks idle (default SIGTERM action, bounded to 120 s) until the
launcher stops them. On later attempts every rank exits 0 at once.
"""

import os
import sys
import time

start = time.time()
base, fail_rank = sys.argv[1], sys.argv[2]
rank = os.environ["RANK"]
world = int(os.environ["WORLD_SIZE"])
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
tag = f"a{attempt}_r{rank}"


def publish(sub: str, name: str, text: str) -> None:
    tmp = os.path.join(base, sub, f".{name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
    os.rename(tmp, os.path.join(base, sub, name))


publish("starts", tag, f"{start!r} {os.getpid()}")
print(f"READY {tag}", flush=True)
publish("ready", tag, "")
if attempt != "0":
    sys.exit(0)
deadline = time.monotonic() + 120
if rank == fail_rank:
    ready = os.path.join(base, "ready")
    while sum(1 for n in os.listdir(ready) if n.startswith("a0_")) < world and time.monotonic() < deadline:
        time.sleep(0.001)
    publish(".", "fail_ts", repr(time.time()))
    os._exit(1)
while time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3)
