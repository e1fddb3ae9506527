"""A worker that reaches its store as ``init_method="env://"`` would: connect to MASTER_ADDR:MASTER_PORT, VALIDATE,
PING (the store echoes the nonce), without torch. Prints ``STORE OK addr:port`` and exits 0, or says why and exits 3.
"""

import os
import socket
import struct
import sys

addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
nonce = struct.pack("<I", os.getpid())
try:
    with socket.create_connection((addr, port), timeout=20) as sock:
        sock.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x0d" + nonce)
        echoed = b""
        while len(echoed) < 4:
            chunk = sock.recv(4 - len(echoed))
            if not chunk:
                break
            echoed += chunk
except OSError as exc:
    print(f"STORE UNREACHABLE {addr}:{port}: {exc}", file=sys.stderr, flush=True)
    raise SystemExit(3) from None
if echoed != nonce:
    print(f"STORE ANSWERED {echoed!r} at {addr}:{port}", file=sys.stderr, flush=True)
    raise SystemExit(3)
print(f"STORE OK {addr}:{port} rank {os.environ['RANK']}", flush=True)
