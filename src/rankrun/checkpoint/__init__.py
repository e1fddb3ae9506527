"""Kept progress (``rankrun.checkpoint``): each rank's newest state in memory the launcher owns, a neighbour's copy and
``--checkpoint-dir`` on disk, so a restart resumes where the job was.

Two sides that share only pure, standard-library modules. The worker side runs in a rank and imports torch lazily,
inside its functions: ``client`` (the rank's connection to its node's keeper and the kept memory it is handed),
``serial`` (torch's own serialization into that memory, and back), ``dcp`` (``torch.distributed.checkpoint``'s
``StorageWriter``/``StorageReader`` over the same memory). The launcher side is standard library only: ``keeper`` (owns
the memory and serves the ranks), ``disk`` (``--checkpoint-dir``, written in the background), ``peer`` (the
neighbour's copy). Shared and pure: ``slots`` (the kept memory's layout and its commit rule), ``wire`` (the messages
between a rank and its keeper), ``rule`` (the step every rank has kept), ``manifest`` (the disk layout and what makes
a step complete there).
"""
