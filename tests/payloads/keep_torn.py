"""A rank that SIGKILLs itself halfway through a save (``tests/e2e/test_checkpoint_gloo.py``).

One rank keeps a ``MB``-megabyte state (16 float32 tensors, each a function of the step) at steps 1 to 3. On attempt 0
the write of step 3's bytes into the kept memory kills the process once half of them went through (the test's own
patch of the slot's file object: where the kill lands is the test's choice, what survives it is the thing tested). On
attempt 1 the rank loads and writes ``$OUT/loaded.json``: the step, and whether every tensor is that step's exactly.
"""

import json
import os
import signal

import torch

import rankrun.checkpoint
from rankrun.checkpoint import serial

MB = int(os.environ.get("MB", "200"))


def state(step: int) -> dict[str, object]:
    n = MB * (1 << 20) // 4 // 16
    return {"tensors": [torch.full((n,), float(step * 100 + i)) for i in range(16)], "step": step}


def main() -> None:
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        write = serial.SlotWriter.write

        def torn(self: serial.SlotWriter, data: object) -> int:
            if step == 3 and self.size > MB * (1 << 20) // 2:
                os.kill(os.getpid(), signal.SIGKILL)
            return write(self, data)  # type: ignore[arg-type]

        serial.SlotWriter.write = torn  # type: ignore[method-assign]
        for step in (1, 2, 3):
            rankrun.checkpoint.save(step, state(step))
        return
    kept = rankrun.checkpoint.load()
    assert kept is not None
    step, loaded = kept
    expected = state(step)
    intact = loaded["step"] == step and all(torch.equal(a, b) for a, b in zip(loaded["tensors"], expected["tensors"], strict=True))
    with open(os.path.join(os.environ["OUT"], "loaded.json"), "w") as fh:
        json.dump({"step": step, "intact": intact}, fh)


if __name__ == "__main__":
    main()
