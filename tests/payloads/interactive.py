"""What a person does at a terminal: look at it, answer a prompt, resize it, use pdb."""

import os
import signal
import sys


def on_resize(signum: int, frame: object) -> None:
    size = os.get_terminal_size()
    print(f"RESIZED {size.columns}x{size.lines}", flush=True)


signal.signal(signal.SIGWINCH, on_resize)
size = os.get_terminal_size()
print(f"TTY {sys.stdin.isatty()} {sys.stdout.isatty()} {sys.stderr.isatty()} {size.columns}x{size.lines}", flush=True)
name = input("name? ")
print(f"hello {name}")
if os.environ.get("PAYLOAD_PDB") == "1":
    value = 41
    breakpoint()
    print(f"after pdb {value}")
input("wait for resize? ")
print("bye")
