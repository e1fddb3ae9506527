"""A no-op worker that writes the wall-clock time at which its script began to ``$STAMP_DIR/<RANK>``."""

import os
import time

now = time.time()
with open(os.path.join(os.environ["STAMP_DIR"], os.environ["RANK"]), "w") as fh:
    fh.write(repr(now))
