"""Write this worker's environment and argv as JSON to $TEST_OUT/<rank>.json."""

import json
import os
import sys

with open(os.path.join(os.environ["TEST_OUT"], f"{os.environ['RANK']}.json"), "w") as fh:
    json.dump({"env": dict(os.environ), "argv": sys.argv}, fh)
