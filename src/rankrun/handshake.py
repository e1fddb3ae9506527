"""The handshake of rankrun's secret-gated TCP endpoints on every launcher: the network check's probe endpoint
(``health.probe``) and the neighbour copy's keep endpoint (``checkpoint.peer``); each with a magic of its own.

Small frames (a 2-byte big-endian length, then at most ``MAX_FRAME`` bytes of JSON; byte strings as hex)::

    client → server   MAGIC {"hello": 1, "nonce": <16 random bytes>}
    server → client   {"version": 1, "challenge": <16 random bytes>, "auth": true|false}
    client → server   {"proof": client_proof(secret, challenge, nonce)}          ("" without a secret)
    server → client   {"ok": true, "proof": server_proof(secret, challenge, nonce)}
                      or {"ok": false, "error": "..."} and the connection is closed

The proofs are ``rankrun.proof``'s: the secret is never sent, and the client checks the server's proof too, so an
endpoint that does not know the secret cannot answer for a node of the job. A server without a secret asks no proof
(the probe's choice, as the rendezvous without a secret; the keep endpoint never runs without one). A leaf: standard
library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
from typing import Any

from rankrun.proof import client_proof, proof_matches, server_proof

VERSION = 1
MAX_FRAME = 1024  # a handshake frame's JSON

_FRAME = struct.Struct(">H")


class HandshakeError(Exception):
    """The client's side: the endpoint refused, speaks another version, or does not prove the secret (one line, without
    the endpoint's address: the caller names it)."""


class Stranger(Exception):
    """The server's side: a client that failed the proof. It was told; the caller logs it (once per address) and closes."""


def frame(obj: dict[str, Any]) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    return _FRAME.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any]:
    (size,) = _FRAME.unpack(await reader.readexactly(_FRAME.size))
    if size > MAX_FRAME:
        raise ValueError(f"a handshake frame of {size} bytes (limit {MAX_FRAME})")
    obj = json.loads(await reader.readexactly(size))
    if not isinstance(obj, dict):
        raise ValueError("a handshake frame that is not an object")
    return obj


def no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def unhex(value: object) -> bytes:
    if not isinstance(value, str):
        raise ValueError("expected hex text")
    return bytes.fromhex(value)


async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, magic: bytes, secret: bytes | None,
                 refusal: str) -> bool:
    """The server's side: True once the client proved the secret (or none is asked); False for a client that does not
    speak this handshake (closed without a word). Raises ``Stranger`` after telling a client that failed the proof
    ``refusal``. A garbled frame raises ``ValueError``, a short read ``EOFError``: the caller closes."""
    if await reader.readexactly(len(magic)) != magic:
        return False
    hello = await read_frame(reader)
    if hello.get("hello") != VERSION:
        return False
    nonce = unhex(hello.get("nonce"))
    challenge = os.urandom(16)
    writer.write(frame({"version": VERSION, "challenge": challenge.hex(), "auth": secret is not None}))
    answer = await read_frame(reader)
    if secret is not None and not proof_matches(client_proof(secret, challenge, nonce), answer.get("proof")):
        writer.write(frame({"ok": False, "error": refusal}))
        await writer.drain()
        raise Stranger(refusal)
    proof = server_proof(secret, challenge, nonce) if secret is not None else ""
    writer.write(frame({"ok": True, "proof": proof}))
    await writer.drain()
    return True


async def prove(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, magic: bytes, secret: bytes | None) -> None:
    """The client's side: returns once the server accepted this client and, with a secret, proved it too. Raises
    ``HandshakeError`` otherwise, ``ValueError`` for a garbled frame, ``asyncio.IncompleteReadError`` when the server
    closed."""
    nonce = os.urandom(16)
    writer.write(magic + frame({"hello": VERSION, "nonce": nonce.hex()}))
    offer = await read_frame(reader)
    if offer.get("version") != VERSION:
        raise HandshakeError(f"speaks version {offer.get('version')!r}, not {VERSION}")
    challenge = unhex(offer.get("challenge"))
    writer.write(frame({"proof": client_proof(secret, challenge, nonce) if secret is not None else ""}))
    answer = await read_frame(reader)
    if answer.get("ok") is not True:
        raise HandshakeError(f"refused: {answer.get('error')}")
    if secret is not None and not proof_matches(server_proof(secret, challenge, nonce), answer.get("proof")):
        raise HandshakeError("the endpoint does not know this job's secret")
