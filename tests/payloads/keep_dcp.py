"""``torch.distributed.checkpoint`` over the kept memory (``tests/e2e/test_checkpoint_dcp.py``), 2 ranks over gloo.

Attempt 0 saves steps 1 to 3 with ``dcp.save(state, storage_writer=MemoryWriter(step))``: ``w``, a 6x4 DTensor
sharded by rows over both ranks (each rank keeps 3 rows), ``b``, a plain tensor (kept by one rank only: DCP
de-duplicates it), and ``note``, a non-tensor object (a byte item). Every value is a function of the step. Rank
``KILL_RANK`` SIGKILLs itself in step ``KILL_AT``'s save once its first bytes went into the kept memory (the test's
own patch of the slot's file object): rank 0, the coordinator, dies writing its slot in ``finish`` after rank 1 has
kept that step; rank 1 dies in ``write_data``.

Attempt 1 loads the kept step three ways and writes ``$OUT/<rank>.json``: with DCP's re-sharding into ``w`` sharded
by columns (each rank's 6x2 block is read from both old ranks' slots), with ``no_dist=True`` (a world of one: the
whole tensors), and ``rankrun.checkpoint.load()``'s step, which must be the same one; and the steps this rank's
two slots hold complete.
"""

import json
import os
import signal

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import rankrun.checkpoint
from rankrun.checkpoint import client, serial, slots
from rankrun.checkpoint.dcp import MemoryReader, MemoryWriter


def whole(step: int) -> dict[str, object]:
    return {"w": torch.arange(24.0).reshape(6, 4) + 100 * step, "b": torch.full((5,), float(step)),
            "note": f"step {step}"}


def main() -> None:
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if attempt == 0:
        write = serial.SlotWriter.write

        def torn(self: serial.SlotWriter, data: object) -> int:
            if step == int(os.environ["KILL_AT"]) and rank == int(os.environ["KILL_RANK"]) and self.size > 0:
                os.kill(os.getpid(), signal.SIGKILL)
            return write(self, data)  # type: ignore[arg-type]

        serial.SlotWriter.write = torn  # type: ignore[method-assign]
        for step in (1, 2, 3):
            state = whole(step)
            state["w"] = distribute_tensor(state["w"], mesh, [Shard(0)])
            dcp.save(state, storage_writer=MemoryWriter(step))
        return
    reader = MemoryReader()
    step = reader.step
    expected = whole(step)
    resharded = {"w": distribute_tensor(torch.zeros(6, 4), mesh, [Shard(1)]), "b": torch.zeros(5), "note": ""}
    dcp.load(resharded, storage_reader=reader)
    alone = {"w": torch.zeros(6, 4), "b": torch.zeros(5), "note": ""}
    dcp.load(alone, storage_reader=MemoryReader(), no_dist=True)
    kept = rankrun.checkpoint.load()
    result = {
        "held": sorted(desc.step for _, desc in slots.complete(client.connect().header)),  # this rank's complete steps
        "step": step,
        "plain_load_step": None if kept is None else kept[0],
        "resharded": torch.equal(resharded["w"].to_local(), expected["w"][:, 2 * rank:2 * rank + 2])
        and torch.equal(resharded["b"], expected["b"]) and resharded["note"] == expected["note"],
        "whole": all(torch.equal(alone[k], expected[k]) for k in ("w", "b")) and alone["note"] == expected["note"],
    }
    with open(os.path.join(os.environ["OUT"], f"{rank}.json"), "w") as fh:
        json.dump(result, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
