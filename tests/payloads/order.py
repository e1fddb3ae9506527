"""20,000 stdout lines, one stderr line, then an uncaught exception."""

import sys

for i in range(20000):
    print(f"out {i}")
print("STDERR-LINE", file=sys.stderr)
raise ValueError("the real error")
