"""``python -m rankrun``."""

import sys

from rankrun.cli import main

if __name__ == "__main__":
    sys.exit(main())
