"""``torch.distributed.checkpoint`` over the kept memory: a ``StorageWriter`` and a ``StorageReader`` (worker side).

``dcp.save(state, storage_writer=MemoryWriter(step))`` keeps each rank's part of a (sharded) state as ``step`` in
that rank's kept memory, the same memory ``rankrun.checkpoint.save`` keeps into: the keeper's consistency rule sees
it, a restart resumes from it. ``dcp.load(state, storage_reader=MemoryReader())`` loads the step the attempt resumes
from, re-sharded by DCP's own planner to whatever layout ``state`` has now (another placement, another world size, or
``no_dist=True``: one process, whole tensors).

What a slot holds: one ``torch.save`` stream (``serial.save``: the copy is the blocking time, the commit rule is the
slots') of ``{"format": FORMAT, "items": {n: tensor or bytes}}`` — ``n`` numbers this rank's write items — and, in the
coordinator's slot only, ``"metadata"``: DCP's ``Metadata``, whose ``storage_data`` says for each item the rank
whose slot holds it and its ``n``. A rank that is not the coordinator keeps its slot in ``write_data``; the
coordinator keeps its own in ``finish``, with the metadata. So a step is complete everywhere only once the metadata
is kept: a coordinator killed before ``finish`` leaves that step unkept by one rank, and the keeper's rule takes the
previous one. Reading maps each old rank's slot once (``torch.load(mmap=True)`` over a copy that never changes),
and copies each requested chunk from it (``narrow`` by DCP's offsets) into the destination.

torch is imported at this module's top: only a script that imports ``rankrun.checkpoint.dcp`` pays for it.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from rankrun.checkpoint import client, serial

FORMAT = "rankrun.dcp/1"  # what a slot written by MemoryWriter says it is


def step_of(checkpoint_id: object) -> int:
    """A checkpoint id as a step: an int, or a string of one; ``ValueError`` naming it otherwise."""
    if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int | str):
        raise ValueError(f"rankrun.checkpoint.dcp: checkpoint_id {checkpoint_id!r} is not a step (an int)")
    try:
        return int(checkpoint_id)
    except ValueError:
        raise ValueError(f"rankrun.checkpoint.dcp: checkpoint_id {checkpoint_id!r} is not a step (an int)") from None


def own_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU, detached, holding only its own elements: ``torch.save`` writes a view's whole storage
    (a shard of a flat parameter would keep the whole parameter), so a view that is not all of its storage is
    copied."""
    out = tensor.detach().cpu()
    if not out.is_contiguous() or out.untyped_storage().nbytes() != out.numel() * out.element_size():
        out = out.clone(memory_format=torch.contiguous_format)
    return out


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class MemoryWriter(StorageWriter):
    """DCP's storage for ``dcp.save``: this rank's part kept as ``step`` (``checkpoint_id``, when given, sets the
    step)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step_of(step)
        self.coordinator = False
        self._items: dict[int, torch.Tensor | bytes] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id is not None:
            self.step = step_of(checkpoint_id)
        self._items = {}

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:  # noqa: ARG002 - DCP's
        self.coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans  # one slot per rank: no file names to hand out

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        conn = client.connect()
        results = []
        self._items = {}
        for n, item in enumerate(plan.items):
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                value: torch.Tensor | bytes = data.getvalue()
                nbytes = len(value)
            else:
                assert isinstance(data, torch.Tensor)
                value = own_bytes(data)
                nbytes = value.numel() * value.element_size()
            self._items[n] = value
            results.append(WriteResult(index=item.index, size_in_bytes=nbytes, storage_data=(conn.rank, n)))
        if not self.coordinator:
            self._keep(conn, None)
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator's slot, last, with the metadata: where every rank's items are (as a storage fills in)."""
        metadata.storage_data = {result.index: result.storage_data for rank in results for result in rank}
        self._keep(client.connect(), metadata)

    def _keep(self, conn: client.Client, metadata: Metadata | None) -> None:
        state: dict[str, Any] = {"format": FORMAT, "items": self._items}
        if metadata is not None:
            state["metadata"] = metadata
        try:
            serial.save(conn, self.step, state)
        except client.NoRoom:
            pass  # the launcher said so; this rank has not kept the step, so it is not loadable: the previous one is
        finally:
            self._items = {}

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.step))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        try:
            step_of(checkpoint_id)
        except ValueError:
            return False
        return True


class MemoryReader(StorageReader):
    """DCP's storage for ``dcp.load``: the step this attempt resumes from (``step``, ``None`` when nothing is kept),
    read from every old rank's kept state that the new layout needs (``fetch`` by rank: the world may have
    changed)."""

    def __init__(self) -> None:
        super().__init__()
        self._states: dict[int, dict[str, Any]] = {}
        self._metadata: Metadata | None = None
        self._step: int | None = None
        self._storage: dict[MetadataIndex, Any] = {}

    @property
    def step(self) -> int | None:
        """The kept step ``dcp.load`` reads; ``None`` when nothing is kept (a first start)."""
        return None if self._state(0) is None else self._step

    def _state(self, rank: int) -> dict[str, Any] | None:
        """Old ``rank``'s kept state of the resume step (fetched once); ``None`` when nothing is kept."""
        if rank not in self._states:
            kept = serial.load(client.connect(), rank)
            if kept is None:
                return None
            step, state = kept
            if not isinstance(state, dict) or state.get("format") != FORMAT:
                raise client.KeptError(f"rankrun.checkpoint.dcp: rank {rank}'s step {step} was not kept by "
                                       "MemoryWriter (rankrun.checkpoint.save's: read it with load())")
            self._step = step
            self._states[rank] = state
        return self._states[rank]

    def _find_metadata(self) -> Metadata:
        """The coordinator's metadata: in rank 0's slot (DCP's default coordinator), else the first rank's that has
        it."""
        rank = 0
        while self._metadata is None:
            try:
                state = self._state(rank)
            except ValueError:  # past the saving world (the keeper refused that rank)
                raise client.KeptError(f"rankrun.checkpoint.dcp: no rank kept step {self._step}'s metadata") from None
            if state is None:
                raise client.KeptError("rankrun.checkpoint.dcp: nothing is kept to load")
            self._metadata = state.get("metadata")
            rank += 1
        return self._metadata

    def reset(self, checkpoint_id: Any = None) -> None:
        if checkpoint_id is not None and self.step is not None and step_of(checkpoint_id) != self._step:
            raise ValueError(f"rankrun.checkpoint.dcp: step {checkpoint_id} is not the kept one ({self._step}): "
                             "a restart resumes from the step every rank kept")

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:  # noqa: ARG002 - DCP's
        return self._find_metadata()

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:  # noqa: ARG002
        self._storage = dict(metadata.storage_data)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for req in plan.items:
            rank, n = self._storage[req.storage_index]
            state = self._state(rank)
            if state is None:
                raise client.KeptError(f"rankrun.checkpoint.dcp: rank {rank}'s kept state is gone")
            value = state["items"][n]
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(value))
                continue
            chunk = narrow_tensor_by_index(value, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != chunk.size():
                raise ValueError(f"rankrun.checkpoint.dcp: {req.storage_index.fqn}: kept {tuple(chunk.size())}, "
                                 f"asked {tuple(target.size())}")
            target.copy_(chunk)
            planner.commit_tensor(req, target)
        return _done(None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return MemoryWriter.validate_checkpoint_id(checkpoint_id)


__all__ = ["FORMAT", "MemoryReader", "MemoryWriter", "own_bytes", "step_of"]
