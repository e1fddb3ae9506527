"""A worker of a multi-node test: records who it is, says READY, then waits for a file (or a signal).

Env: TEST_OUT_DIR (a JSON file per start), NODE_WAIT_FILE (wait until it exists, bounded),
NODE_FAIL_RANK + NODE_FAIL_RESTART (that rank exits 7 on that restart count).
"""

import json
import os
import sys
import time

me = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                 "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
out = os.environ["TEST_OUT_DIR"]
name = f"rank{me['RANK']}-world{me['WORLD_SIZE']}-restart{me['TORCHELASTIC_RESTART_COUNT']}-pid{os.getpid()}.json"
with open(os.path.join(out, name + ".tmp"), "w") as fh:
    json.dump(me, fh)
os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
with open(os.path.join(os.environ["TEST_PID_DIR"], f"w{os.getpid()}"), "w") as fh:
    fh.write(str(os.getpid()))
print(f"READY rank {me['RANK']} world {me['WORLD_SIZE']} restart {me['TORCHELASTIC_RESTART_COUNT']}", flush=True)
if me["RANK"] == os.environ.get("NODE_FAIL_RANK") and me["TORCHELASTIC_RESTART_COUNT"] == os.environ.get("NODE_FAIL_RESTART"):
    print("failing on purpose", file=sys.stderr, flush=True)
    raise SystemExit(7)
wait = os.environ.get("NODE_WAIT_FILE")
deadline = time.monotonic() + 60
while wait and not os.path.exists(wait) and time.monotonic() < deadline:
    time.sleep(0.01)
