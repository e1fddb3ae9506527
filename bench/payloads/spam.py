"""Console-throughput worker: ``spam.py LINES`` prints LINES numbered lines (run with ``python -u``)."""

import os
import sys

rank = os.environ["RANK"]
for i in range(int(sys.argv[1])):
    print(f"rank{rank} line {i} xxxxxxxxxxxxxxxxxxxx")
