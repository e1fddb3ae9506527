"""A worker for the legacy-launcher tests: writes its argv and identity environment to ``$TEST_OUT_DIR/<rank>.json``.

It runs as a script, as a module (``-m legacy_worker``), through ``--run-path``, and as a program (``--no-python``,
started through its shebang): the argv it got is what the launcher built.
"""

import json
import os
import sys

KEYS = ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS")
record = {"argv0": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in KEYS}}
with open(os.path.join(os.environ["TEST_OUT_DIR"], f"{os.environ['RANK']}.json"), "w") as out:
    json.dump(record, out)
