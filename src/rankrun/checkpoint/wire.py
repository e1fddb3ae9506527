"""The messages between a rank and its node's keeper: pure, shared by both sides.

A rank reaches the keeper through the Unix socket ``RANKRUN_CHECKPOINT`` names (``VERSION:ADDRESS``, an abstract
``SOCK_SEQPACKET`` socket: no file to leak, no framing). One message is one datagram, a JSON object
``{"v": 1, "kind": KIND, ...}``, memory files attached with ``SCM_RIGHTS``, never pickle (the launcher reads it).

Rank to keeper: ``hello`` (who it is: ``rank``), ``room`` (a slot needs ``bytes``), ``kept`` (a save is complete:
``slot``, ``gen``, ``step``, ``bytes``, ``seconds``), ``fetch`` (a kept step's state: ``rank``), ``loaded`` (a fetched
state was read: ``seconds``). Keeper to rank: ``slots`` (the answer to ``hello``, with the header and the two slots
attached: ``local_rank``, ``world``, ``attempt``, ``capacity``), ``ok`` (room reserved: ``capacity``), ``refused``
(``why``: the rank's process may not keep state, or there is no room), ``state`` (the answer to ``fetch``, the bytes
attached: ``step``, ``world``, ``rank``, ``bytes``, ``source``), ``none`` (nothing kept: ``why``).
"""

from __future__ import annotations

from typing import Any

VERSION = 1
LIMIT = 64 << 10  # bytes of one message
ENV = "RANKRUN_CHECKPOINT"  # in every worker's environment: "VERSION:ADDRESS"


def encode(kind: str, **body: Any) -> bytes:
    import json  # noqa: PLC0415 - a launcher whose ranks never keep anything never loads it

    return json.dumps({"v": VERSION, "kind": kind, **body}, separators=(",", ":")).encode()


def decode(data: bytes) -> dict[str, Any]:
    """The message (its ``kind`` included); ``ValueError`` for anything else (another version, not an object)."""
    import json  # noqa: PLC0415 - see encode()

    obj = json.loads(data)
    if not isinstance(obj, dict) or obj.get("v") != VERSION or not isinstance(obj.get("kind"), str):
        raise ValueError(f"not a checkpoint message of version {VERSION}")
    return obj


def address(value: str) -> str:
    """The keeper's socket address from ``RANKRUN_CHECKPOINT``'s value; ``ValueError`` for another version."""
    version, _, name = value.partition(":")
    if version != str(VERSION) or not name.startswith("@"):
        raise ValueError(f"{ENV}={value!r} is not a keeper of version {VERSION}")
    return "\0" + name[1:]


def env_value(name: str) -> str:
    """``RANKRUN_CHECKPOINT``'s value for an abstract socket ``name`` (``@...``)."""
    return f"{VERSION}:{name}"


__all__ = ["ENV", "LIMIT", "VERSION", "address", "decode", "encode", "env_value"]
