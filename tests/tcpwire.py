"""torch's TCPStore requests, as bytes (query codes from ``reference/tcpstore-protocol.md`` §2.1): for the worker
store's protocol tests (real sockets, ``integration/``) and its parser tests (a fake transport, ``unit/``)."""

from __future__ import annotations

import struct

U32 = struct.Struct("<I")
I64 = struct.Struct("<q")
U64 = struct.Struct("<Q")
STOP, CANCELED = b"\x00", b"\x01"


# -- request builders (query codes from reference/tcpstore-protocol.md §2.1) -----------


def s(data: bytes) -> bytes:
    """A length-prefixed string."""
    return U64.pack(len(data)) + data


def kl(*keys: bytes) -> bytes:
    """A key list."""
    return U64.pack(len(keys)) + b"".join(s(k) for k in keys)


def i64(n: int) -> bytes:
    return I64.pack(n)


def validate(magic: int = 0x3C85F7CE) -> bytes:
    return b"\x00" + U32.pack(magic)


def ping(nonce: bytes = b"\x7fNCE") -> bytes:
    return b"\x0d" + nonce


def set_(key: bytes, value: bytes) -> bytes:
    return b"\x01" + s(key) + s(value)


def cas(key: bytes, expected: bytes, desired: bytes) -> bytes:
    return b"\x02" + s(key) + s(expected) + s(desired)


def get(key: bytes) -> bytes:
    return b"\x03" + s(key)


def add(key: bytes, delta: int) -> bytes:
    return b"\x04" + s(key) + i64(delta)


def check(*keys: bytes) -> bytes:
    return b"\x05" + kl(*keys)


def wait(*keys: bytes) -> bytes:
    return b"\x06" + kl(*keys)


NUMKEYS = b"\x07"


def delete(key: bytes) -> bytes:
    return b"\x08" + s(key)


def append(key: bytes, value: bytes) -> bytes:
    return b"\x09" + s(key) + s(value)


def multi_get(*keys: bytes) -> bytes:
    return b"\x0a" + kl(*keys)


def multi_set(*pairs: tuple[bytes, bytes]) -> bytes:
    return b"\x0b" + U64.pack(len(pairs)) + b"".join(s(k) + s(v) for k, v in pairs)


CANCEL_WAIT = b"\x0c"


def qpush(key: bytes, value: bytes) -> bytes:
    return b"\x0e" + s(key) + s(value)


def qpop(key: bytes) -> bytes:
    return b"\x0f" + s(key)


def qlen(key: bytes) -> bytes:
    return b"\x10" + s(key)


LIST_KEYS = b"\x11"


def barrier(key: bytes, world_size: int) -> bytes:
    return b"\x12" + s(key) + i64(world_size)
