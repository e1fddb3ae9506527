"""The layout of one rank's kept memory and its commit rule: pure, over any writable buffer (an ``mmap``).

A rank's kept state lives in three memory files its node's launcher owns: a header of ``HEADER`` bytes and two slots.
The header holds one 64-byte descriptor per slot: ``gen`` (a counter over both slots), ``step``, ``world`` and
``rank`` of the save, ``length`` (the bytes of the slot that hold it), ``state`` (``EMPTY``, ``WRITING``,
``COMPLETE``), when it was saved and how long ``save`` blocked, and a CRC-32 over the rest.

Why two slots and a CRC: a save writes into the slot that does not hold the newest complete step, and marks it
``WRITING`` before the first byte; it marks it ``COMPLETE`` with one store of the whole descriptor after the last. A
rank killed anywhere in between (in the data, in the length, halfway through the descriptor) leaves that slot
``WRITING`` or with a CRC that does not match: it never counts, and the other slot (the newest complete step) was never
touched. So ``newest`` is the previous step or the new one, never a torn one.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from dataclasses import dataclass

MAGIC = b"RKCKPT\x00\x01"
VERSION = 1
HEADER = 4096  # bytes of the header file (a page)
SLOTS = 2
EMPTY, WRITING, COMPLETE = 0, 1, 2

_HEAD = struct.Struct("<8sII")  # magic, version, slots
_DESC = struct.Struct("<QqIIQIQd")  # gen, step, world, rank, length, state, saved_ns, seconds
_CRC = struct.Struct("<I")
_AT = 64  # the first descriptor's offset; each takes 64 bytes
DESC_BYTES = _DESC.size + _CRC.size  # what one descriptor's store writes

Readable = memoryview | bytes | bytearray | mmap.mmap
Writable = memoryview | bytearray | mmap.mmap


@dataclass(frozen=True)
class Desc:
    """One slot's descriptor."""

    gen: int
    step: int
    world: int
    rank: int
    length: int
    state: int
    saved_ns: int = 0
    seconds: float = 0.0


def init(buf: Writable) -> None:
    """A fresh header: the magic and every slot ``EMPTY`` (a zeroed descriptor's CRC does not match: it never counts)."""
    buf[:_HEAD.size] = _HEAD.pack(MAGIC, VERSION, SLOTS)


def valid(buf: Readable) -> bool:
    """Whether ``buf`` starts with this layout's magic and version."""
    magic, version, slots = _HEAD.unpack_from(buf, 0)
    return bool(magic == MAGIC and version == VERSION and slots == SLOTS)


def read(buf: Readable, slot: int) -> Desc | None:
    """The slot's descriptor, ``None`` when its CRC does not match (never written, or torn)."""
    at = _AT + 64 * slot
    raw = bytes(buf[at:at + _DESC.size + _CRC.size])
    (crc,) = _CRC.unpack_from(raw, _DESC.size)
    if zlib.crc32(raw[:_DESC.size]) != crc:
        return None
    return Desc(*_DESC.unpack_from(raw, 0))


def write(buf: Writable, slot: int, desc: Desc) -> None:
    """The slot's descriptor, with its CRC, in one store."""
    raw = _DESC.pack(desc.gen, desc.step, desc.world, desc.rank, desc.length, desc.state, desc.saved_ns, desc.seconds)
    at = _AT + 64 * slot
    buf[at:at + len(raw) + _CRC.size] = raw + _CRC.pack(zlib.crc32(raw))


def complete(buf: Readable) -> list[tuple[int, Desc]]:
    """The complete slots, newest (highest ``gen``) first: a rank holds at most two steps."""
    found = [(i, d) for i in range(SLOTS) if (d := read(buf, i)) is not None and d.state == COMPLETE]
    return sorted(found, key=lambda pair: pair[1].gen, reverse=True)


def newest(buf: Readable) -> tuple[int, Desc] | None:
    """The slot and descriptor of the newest complete step, ``None`` when none is complete."""
    found = complete(buf)
    return found[0] if found else None


def choose(buf: Readable) -> tuple[int, int]:
    """Where the next save goes: the slot that does not hold the newest complete step, and the next ``gen``."""
    descs = [d for i in range(SLOTS) if (d := read(buf, i)) is not None]
    gen = max((d.gen for d in descs), default=0) + 1
    top = newest(buf)
    return (0 if top is None else 1 - top[0]), gen


__all__ = ["COMPLETE", "DESC_BYTES", "EMPTY", "HEADER", "SLOTS", "WRITING", "Desc", "choose", "complete", "init",
           "newest", "read", "valid", "write"]
