"""``rankrun.checkpoint.dcp`` against a keeper in this process, a world of one (``no_dist``): what a slot holds, the
step a reader reads, a plain ``save``'s step refused by name, nothing kept, and the checkpoint ids it takes.
Re-sharding across ranks and a save killed midway: ``tests/e2e/test_checkpoint_dcp.py``."""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from rankrun.checkpoint import client, serial  # noqa: E402 - after the skip
from rankrun.checkpoint.dcp import FORMAT, MemoryReader, MemoryWriter, own_bytes, step_of  # noqa: E402
from rankrun.checkpoint.keeper import Keeper  # noqa: E402
from rankrun.checkpoint.plan import Plan  # noqa: E402

# a world of one without a process group: DCP says it assumes one process, which is the point here
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.fixture(autouse=True)
def _fresh_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(client, "_client", None)
    yield
    if client._client is not None:
        client._client._sock.close()


def runs(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


async def _keeper(monkeypatch: pytest.MonkeyPatch) -> Keeper:
    keeper = Keeper(1, say=lambda line: None, told=lambda what, facts: None, room=lambda growth: None)
    monkeypatch.setenv("RANKRUN_CHECKPOINT", await keeper.start())
    keeper.attempt_starts(0, 1)
    keeper.workers({os.getpid(): (0, 0)})
    return keeper


def _state(step: int) -> dict[str, Any]:
    return {"w": torch.arange(12.0).reshape(3, 4) + step, "note": f"step {step}"}


def _restart(keeper: Keeper) -> None:
    keeper.attempt_ended()
    keeper.attempt_starts(1, 1)
    keeper.workers({os.getpid(): (0, 0)})


@runs
async def test_dcp_save_keeps_the_step_with_its_metadata_and_dcp_load_reads_it(monkeypatch):
    keeper = await _keeper(monkeypatch)
    try:
        for step in (3, 4):
            await asyncio.to_thread(dcp.save, _state(step), storage_writer=MemoryWriter(step), no_dist=True)
        _restart(keeper)
        assert isinstance(keeper.plan, Plan) and keeper.plan.step == 4
        kept = await asyncio.to_thread(lambda: serial.load(client.connect(), None))
        assert kept is not None
        step, raw = kept
        assert step == 4 and raw["format"] == FORMAT and "metadata" in raw
        assert sorted(type(v).__name__ for v in raw["items"].values()) == ["Tensor", "bytes"]
        reader = MemoryReader()
        assert await asyncio.to_thread(lambda: reader.step) == 4  # the keeper answers on this thread's loop
        into = {"w": torch.zeros(3, 4), "note": ""}
        await asyncio.to_thread(dcp.load, into, storage_reader=reader, no_dist=True)
        assert torch.equal(into["w"], _state(4)["w"]) and into["note"] == "step 4"
        with pytest.raises(ValueError, match="step 3 is not the kept one"):
            await asyncio.to_thread(MemoryReader().reset, 3)
        await asyncio.to_thread(MemoryReader().reset, 4)
    finally:
        await keeper.close()


@runs
async def test_a_step_kept_by_a_plain_save_is_refused_by_name_and_nothing_kept_is_none(monkeypatch):
    keeper = await _keeper(monkeypatch)
    try:
        assert await asyncio.to_thread(lambda: MemoryReader().step) is None
        await asyncio.to_thread(lambda: serial.save(client.connect(), 7, {"w": torch.ones(2)}))
        _restart(keeper)
        with pytest.raises(client.KeptError, match=r"rank 0's step 7 was not kept by MemoryWriter .*load\(\)"):
            await asyncio.to_thread(lambda: MemoryReader().step)
    finally:
        await keeper.close()


@runs
async def test_a_step_without_the_coordinators_metadata_is_not_loadable(monkeypatch):
    keeper = await _keeper(monkeypatch)
    try:
        await asyncio.to_thread(lambda: serial.save(client.connect(), 5, {"format": FORMAT, "items": {}}))
        _restart(keeper)
        reader = MemoryReader()
        assert await asyncio.to_thread(lambda: reader.step) == 5
        with pytest.raises(client.KeptError, match="no rank kept step 5's metadata"):
            await asyncio.to_thread(reader.read_metadata)
    finally:
        await keeper.close()


@runs
async def test_a_dcp_save_refused_for_room_keeps_nothing_and_returns(monkeypatch):
    keeper = Keeper(1, say=lambda line: None, told=lambda what, facts: None, room=lambda growth: "no room")
    monkeypatch.setenv("RANKRUN_CHECKPOINT", await keeper.start())
    try:
        keeper.attempt_starts(0, 1)
        keeper.workers({os.getpid(): (0, 0)})
        await asyncio.to_thread(dcp.save, _state(1), storage_writer=MemoryWriter(1), no_dist=True)
        _restart(keeper)
        assert not isinstance(keeper.plan, Plan)
    finally:
        await keeper.close()


def test_checkpoint_ids_are_steps():
    assert step_of(5) == 5 and step_of("12") == 12
    for bad in (True, "last", 1.5, None):
        with pytest.raises(ValueError, match=f"checkpoint_id {bad!r} is not a step"):
            step_of(bad)
    assert MemoryWriter.validate_checkpoint_id(3) and not MemoryWriter.validate_checkpoint_id("dir/x")
    assert MemoryReader.validate_checkpoint_id("3") and not MemoryReader.validate_checkpoint_id(2.0)
    writer = MemoryWriter(2)
    writer.reset()
    assert writer.step == 2
    writer.reset("9")
    assert writer.step == 9 and writer.storage_meta() is not None and writer.storage_meta().checkpoint_id == "9"


def test_a_view_is_kept_as_its_own_elements_only():
    whole = torch.arange(100.0)
    part = own_bytes(whole[10:20])
    assert torch.equal(part, whole[10:20]) and part.untyped_storage().nbytes() == 40
    column = own_bytes(whole.reshape(10, 10)[:, 3])
    assert column.is_contiguous() and torch.equal(column, whole.reshape(10, 10)[:, 3])
    assert own_bytes(whole).data_ptr() == whole.data_ptr()  # all of its storage already: no copy
