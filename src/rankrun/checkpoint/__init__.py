"""Kept progress (``rankrun.checkpoint``): each rank's newest state in memory the launcher owns, a neighbour's copy and
``--checkpoint-dir`` on disk, so a restart resumes where the job was.

Two sides that share only pure, standard-library modules. The worker side runs in a rank and imports torch lazily,
inside its functions: ``client`` (the rank's connection to its node's keeper and the kept memory it is handed),
``serial`` (torch's own serialization into that memory, and back), ``dcp`` (``torch.distributed.checkpoint``'s
``StorageWriter``/``StorageReader`` over the same memory). The launcher side is standard library only: ``keeper`` (owns
the memory and serves the ranks), ``disk`` (``--checkpoint-dir``, written in the background), ``peer`` (the
neighbour's copy). Shared and pure: ``slots`` (the kept memory's layout and its commit rule), ``wire`` (the messages
between a rank and its keeper), ``rule`` (the step every rank has kept), ``plan`` (a round's
resume: the step, and where each rank's state is read, from every node's holdings), ``manifest`` (the disk layout and what makes
a step complete there).
"""

from __future__ import annotations

import os
import warnings

from rankrun.checkpoint.wire import ENV


def save(step: int, state: object) -> None:
    """Keep ``state`` (any picklable object; tensors by torch's own serialization) as ``step`` of this rank.

    Returns once the copy is complete in memory this node's launcher owns: it outlives this process, and a later
    attempt's ``load`` finds it. A save torn by this process's death is never seen. When the node has no room for it,
    the launcher says so on its console, the previous step stays kept and this returns (training goes on). Outside a
    rankrun job (no ``RANKRUN_CHECKPOINT``) it warns once and keeps nothing.
    """
    if not os.environ.get(ENV):
        _outside()
        return
    from rankrun.checkpoint import client, serial  # noqa: PLC0415 - torch and the socket only where a rank saves

    try:
        serial.save(client.connect(), step, state)
    except client.NoRoom:
        return


def reserve(nbytes: int) -> bool:
    """Room for a state of ``nbytes`` in both of this rank's slots, reserved and mapped now: the first saves then block
    for the copy only, not for the page faults of memory never touched before (about 0.5 s a GB here). Call it before
    the training loop, with the size of what ``save`` will keep (a state dict's tensors' bytes and a little more).
    Whether the room was given (the launcher says why not, once); ``False`` outside a rankrun job."""
    if not os.environ.get(ENV):
        return False
    from rankrun.checkpoint import client  # noqa: PLC0415 - see save()

    kept = client.connect()
    try:
        with kept.lock:
            for index in range(len(kept.slots)):
                kept.mapped(index, nbytes)
    except client.NoRoom:
        return False
    return True


def load(rank: int | None = None) -> tuple[int, object] | None:
    """The newest step every rank of the saving world kept, and this rank's state of it: ``(step, state)``.

    ``rank`` names another rank's state (a script whose world changed re-shards from any old rank's); ``None`` is
    this worker's ``RANK``, which must then be one of the saving world's (``ValueError`` otherwise). ``None`` when
    nothing is kept (and outside a rankrun job). Tensors come back mapped from memory that never changes; a
    ``load_state_dict`` copies them where they belong.
    """
    if not os.environ.get(ENV):
        return None
    from rankrun.checkpoint import client, serial  # noqa: PLC0415 - see save()

    return serial.load(client.connect(), rank)


_warned = False


def _outside() -> None:
    global _warned  # noqa: PLW0603 - said once per process
    if not _warned:
        _warned = True
        warnings.warn(f"rankrun.checkpoint.save: no {ENV}: this process was not started by rankrun, nothing is kept",
                      RuntimeWarning, stacklevel=3)


__all__ = ["load", "reserve", "save"]
