"""A worker that answers torch's Flight Recorder dump pipe as ``ProcessGroupNCCL`` does, without NCCL or a GPU.

torch (with ``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0 and ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` set) makes the FIFO
``<pipe prefix><rank>.pipe``, reads it on a thread of its own, and on any byte writes the rank's trace to
``<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>``. This stands in for that side (the seam rankrun writes to), then
prints READY and waits in ``wait_in_a_collective`` like a rank stuck in ``all_reduce``.
"""

import os
import threading
import time

rank = os.environ["RANK"]
pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + rank + ".pipe"
dump = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + rank
os.mkfifo(pipe)


def answer() -> None:
    with open(pipe, "rb") as fh:
        if fh.read(1):
            with open(dump + ".tmp", "w") as out:
                out.write(f"flight recorder trace of rank {rank}\n")
            os.rename(dump + ".tmp", dump)


threading.Thread(target=answer, daemon=True).start()
print(f"READY rank {rank} fr {os.environ['TORCH_FR_DUMP_TEMP_FILE'] == os.environ['TORCH_NCCL_DEBUG_INFO_TEMP_FILE']}",
      flush=True)


def wait_in_a_collective() -> None:
    time.sleep(600)


wait_in_a_collective()
