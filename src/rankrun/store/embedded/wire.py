"""The embedded store's wire format and handshake (pure: bytes in, bytes out; no sockets here).

A connection starts with the client sending ``RKRN`` (its first byte is never ``0x00``, so one
listening port can also serve torch's TCPStore clients, which always start with ``0x00``:
``tcpstore-protocol.md`` §5). After that both sides exchange *frames*: a 4-byte big-endian
length, then that many bytes of UTF-8 JSON (one object). Byte strings (keys are text, values are
bytes) travel as base64. Never pickle.

Handshake (versioned; with a per-job secret it is a mutual HMAC-SHA256 challenge-response,
the secret is never sent, and each side's fresh nonce makes a recorded exchange useless; the proofs are
``rankrun.proof``'s)::

    client → server   RKRN {"hello": 1, "nonce": <16 random bytes>, "job": <its run id>}
    server → client   {"version": 1, "challenge": <16 random bytes>, "auth": true|false}
    client → server   {"proof": HMAC(secret, "rankrun-client" | challenge | nonce)}   ("" without a secret)
    server → client   {"ok": true, "proof": HMAC(secret, "rankrun-server" | nonce | challenge)}
                      or {"ok": false, "error": "..."} and the connection is closed
                      ({"ok": false, "error": "...", "held": <the server's run id>} for a client of another job:
                      the server serves one job, and names it only to a client that proved the secret)

Then requests ``{"id": n, "op": "...", ...}`` get replies ``{"id": n, "r": ...}`` or
``{"id": n, "err": kind, "msg": text}``; the server also pushes ``{"watch": w, "ev": [...]}``
and ``{"lease_lost": id}``.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from rankrun.store.api import Entry, Event, EventKind

MAGIC = b"RKRN"
VERSION = 1
MAX_FRAME = 16 << 20
# a relay's frames carry its agents' frames in batches (``{"b": [...]}``) of at most this many, well below MAX_FRAME
# (a round key of a few KiB to each of them stays a few MiB)
BATCH = 1024
_LEN = struct.Struct(">I")
# one encoder and one decoder for every frame: ``json.dumps`` with its own separators builds a new encoder per call, and
# ``json.loads`` of bytes guesses their encoding first (UTF-8 it is, by definition here); the host makes a few of each
# per node a round
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
_DECODE = json.JSONDecoder().decode


class FrameError(ValueError):
    """The peer sent something that is not a frame of this protocol."""


def frame(obj: dict[str, Any]) -> bytes:
    body = _ENCODE(obj).encode()
    return _LEN.pack(len(body)) + body


class FrameReader:
    """Cuts a byte stream into decoded frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        out: list[dict[str, Any]] = []
        view = self._buffer
        pos = 0
        while len(view) - pos >= _LEN.size:
            (size,) = _LEN.unpack_from(view, pos)
            if size > MAX_FRAME:
                raise FrameError(f"a frame of {size} bytes (limit {MAX_FRAME})")
            if len(view) - pos - _LEN.size < size:
                break
            start = pos + _LEN.size
            try:
                obj = _DECODE(view[start : start + size].decode())
            except ValueError as exc:  # UnicodeDecodeError too
                raise FrameError(f"not JSON: {exc}") from None
            if not isinstance(obj, dict):
                raise FrameError("a frame that is not an object")
            out.append(obj)
            pos = start + size
        del self._buffer[:pos]
        return out


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise FrameError("expected base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise FrameError("bad base64") from None


def entry_to_wire(entry: Entry) -> dict[str, Any]:
    return {"k": entry.key, "v": b64(entry.value), "c": entry.create_revision, "m": entry.mod_revision, "l": entry.lease}


def entry_from_wire(obj: dict[str, Any]) -> Entry:
    return Entry(str(obj["k"]), unb64(obj["v"]), int(obj["c"]), int(obj["m"]), int(obj["l"]))


def event_to_wire(event: Event) -> dict[str, Any]:
    return {"t": event.kind.value, "k": event.key, "v": b64(event.value), "r": event.revision}


def event_from_wire(obj: dict[str, Any]) -> Event:
    return Event(EventKind(obj["t"]), str(obj["k"]), unb64(obj["v"]), int(obj["r"]))
