"""torch's own serialization into a rank's kept memory, and back: worker side; torch is imported here, inside the
functions, never by the launcher.

A save is ``torch.save`` streamed into the mapped slot (no file, no copy in between), with the zip records' CRC-32
off for that call (it cost 2.9x the copy here), so its blocking time is the copy: the slot's pages were reserved and
mapped before. Its exact size comes first, from a ``torch.serialization.skip_data`` pass (the pickled skeleton only:
milliseconds). The bytes are an ordinary ``torch.save`` file: the keeper's disk copy is read by a plain ``torch.load``.
A state is loaded from a memory file that never changes (the keeper's copy of a slot, or a file of
``--checkpoint-dir``) with ``torch.load(mmap=True)``: no copy until the caller's ``load_state_dict``.
"""

from __future__ import annotations

import io
import os
import time
from typing import IO, TYPE_CHECKING, Any, cast

from rankrun.checkpoint import slots
from rankrun.checkpoint.client import Client, KeptError

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc's from Python 3.12

SLACK = 1.01  # room asked beyond a state's exact size, so that a state that grows a little needs no new reservation


class Overflow(Exception):
    """The state grew past the slot's reservation while it was being written."""


class _Counter(io.RawIOBase):
    """A file that only counts what is written to it: seekable, as ``skip_data`` seeks over the tensors' bytes."""

    def __init__(self) -> None:
        self.pos = self.size = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = offset if whence == io.SEEK_SET else self.pos + offset if whence == io.SEEK_CUR else self.size + offset
        self.size = max(self.size, self.pos)
        return self.pos

    def write(self, data: Buffer) -> int:
        n = memoryview(data).nbytes
        self.pos += n
        self.size = max(self.size, self.pos)
        return n


class SlotWriter(io.RawIOBase):
    """``torch.save``'s file: the mapped slot, written from its start."""

    def __init__(self, view: Any, capacity: int) -> None:  # an mmap
        self._view, self._capacity, self.size = view, capacity, 0
        self.overflowed = False  # torch may wrap the exception a write raises: this says it was ours

    def writable(self) -> bool:
        return True

    def write(self, data: Buffer) -> int:
        chunk = memoryview(data).cast("B")
        end = self.size + chunk.nbytes
        if end > self._capacity:
            self.overflowed = True
            raise Overflow
        self._view[self.size:end] = chunk
        self.size = end
        return chunk.nbytes


def size(state: object) -> int:
    """The exact bytes ``torch.save(state)`` writes."""
    import torch  # noqa: PLC0415 - a rank that never saves never loads torch through rankrun

    counter = _Counter()
    with torch.serialization.skip_data():
        torch.save(state, cast(IO[bytes], counter))
    return counter.size


def save(client: Client, step: int, state: object) -> tuple[int, float]:
    """``state`` kept as ``step`` in the slot that does not hold the newest complete step; the bytes and the seconds
    it blocked. ``KeptError`` when the keeper has no room for it (the previous step stays kept)."""
    import torch  # noqa: PLC0415 - see size()

    started = time.perf_counter()
    with client.lock:
        for _ in range(2):  # a state that grew between its sizing and its save is sized again, once
            need = size(state)
            index, gen = slots.choose(client.header)
            view = client.mapped(index, int(need * SLACK) if client.slots[index].capacity < need else need, step)
            slots.write(client.header, index, slots.Desc(gen, step, client.world, client.rank, 0, slots.WRITING))
            writer = SlotWriter(view, client.slots[index].capacity)
            crc = torch.serialization.get_crc32_options()
            torch.serialization.set_crc32_options(False)
            try:
                torch.save(state, cast(IO[bytes], writer))
            except Exception:
                if writer.overflowed:
                    continue
                raise
            finally:
                torch.serialization.set_crc32_options(crc)
            seconds = time.perf_counter() - started
            slots.write(client.header, index, slots.Desc(gen, step, client.world, client.rank, writer.size,
                                                         slots.COMPLETE, time.time_ns(), seconds))
            client.tell("kept", slot=index, gen=gen, step=step, bytes=writer.size, seconds=round(seconds, 6))
            return writer.size, seconds
    raise KeptError(f"rankrun.checkpoint: step {step}'s state kept growing while it was saved")


def load(client: Client, rank: int | None) -> tuple[int, object] | None:
    """The newest step every rank kept, with ``rank``'s state of it (this worker's own for ``None``); ``None`` when
    nothing is kept."""
    import torch  # noqa: PLC0415 - see size()

    answer, fds = client.ask("fetch", rank=rank)
    if answer["kind"] != "state":
        if answer["kind"] == "refused":
            raise ValueError(f"rankrun.checkpoint.load: {answer['why']}")
        return None
    (fd,) = fds
    started = time.perf_counter()
    try:
        state = torch.load(f"/proc/self/fd/{fd}", mmap=True, weights_only=False)
    finally:
        os.close(fd)
    client.tell("loaded", step=int(answer["step"]), bytes=int(answer["bytes"]),
                seconds=round(time.perf_counter() - started, 6))
    return int(answer["step"]), state


__all__ = ["SLACK", "Overflow", "SlotWriter", "load", "save", "size"]
