"""Print many long lines as fast as python -u allows (each print = two write() calls)."""

import os
import sys

rank = os.environ["RANK"]
lines = int(sys.argv[1])
width = int(sys.argv[2])
body = "x" * width
for i in range(lines):
    print(f"rank{rank}-line{i}-{body}-end")
print(f"partial-no-newline-rank{rank}", end="")
