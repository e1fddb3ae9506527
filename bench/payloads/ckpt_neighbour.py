"""The neighbour's-copy rows of the ``checkpoint`` metric: ``ckpt_neighbour.py BYTES STEPS PAUSE``, one rank per node
on two nodes (c10d, ``RANKRUN_RDZV_SECRET`` set: each node puts every step its rank kept to the other).

The rank holds BYTES bytes of float32 tensors (four) and runs steps 1..STEPS: a touch of the state,
``rankrun.checkpoint.save(step, state)``, then PAUSE seconds of sleep (a training step's time, long enough for the
neighbour's copy of a step to complete before the next save overtakes it; after the last step too, so that its copy
completes before the job ends). What is measured comes from each node's ``--events`` file: no collective, no output.
"""

import sys
import time

import torch

import rankrun.checkpoint

nbytes, steps, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
quarter = nbytes // 4 // 4
state = {f"t{i}": torch.rand(quarter) for i in range(4)}
for step in range(1, steps + 1):
    state["t0"][0] = step
    rankrun.checkpoint.save(step, state)
    time.sleep(pause)
