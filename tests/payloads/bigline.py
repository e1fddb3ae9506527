"""One line of SIZE bytes without a newline, written in 1 MiB pieces; waits for ACK_FILE before exiting."""

import os
import sys
import time

size, ack = int(sys.argv[1]), sys.argv[2]
piece = bytes(range(32, 127)) * ((1 << 20) // 95 + 1)
piece = piece[: 1 << 20]
written = 0
while written < size:
    chunk = piece[: size - written]
    sys.stdout.buffer.write(chunk)
    written += len(chunk)
sys.stdout.flush()
print("WROTE", file=sys.stderr, flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(ack) and time.monotonic() < deadline:
    time.sleep(0.005)
