"""Alternate stdout and stderr lines as fast as python -u writes them."""

import sys

for i in range(int(sys.argv[1])):
    print(f"o {i}")
    print(f"e {i}", file=sys.stderr)
