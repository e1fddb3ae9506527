"""The store relays' wire (pure: bytes in, bytes out; no sockets here): the handshake, the multiplexing frames, and
the walks over TCPStore requests and replies that tell a relay where one request (or reply) ends, by the layouts of
``workerstore.queries`` (the store's own table).

A store relay (``workerstore.relay``) serves one node's workers and forwards their TCPStore connections to the host's
store over ONE connection, each worker connection a *virtual connection* (a ``u32`` id, never reused) on it. That
connection starts with :data:`MAGIC` (its first byte is neither ``0x00``, a TCPStore client's VALIDATE, nor ``R``, a
rankrun agent's ``RKRN``: ``rendezvous.listener`` tells the three apart by that byte) and a mutual challenge-response
with the job's secret (``rankrun.proof``, as the rendezvous's: the secret is never sent)::

    relay → host   MAGIC | u8 version | 16-byte nonce
    host  → relay  u8 version | u8 auth (1: the host has a secret) | 16-byte challenge
    relay → host   32-byte client proof (HMAC-SHA256; zeros without a secret)
    host  → relay  u8 ok | 32-byte server proof; not ok: the host closes

Then both sides send frames, ``u8 kind | u32 id | u32 length | payload``: the relay OPENs a virtual connection,
sends its client's request bytes as DATA and CLOSEs it when the client goes; the host sends DATA (the replies) and
CLOSE (it dropped that connection: a protocol error, a reset for a new attempt, close()).

A *shared wait* (``SHARED``, its key as payload: a connection of the relay's own for the WAITs of several clients on
one key) gets a JOIN per waiter (their index: 0, 1, ... in order) and a LEAVE (``u32`` index) for a waiter that
canceled or went. The host answers ``u8 kind | u32 number``: ``ALL`` n, the key got a value and the first n waiters are
released (every one joined so far, as every WAIT on the key would be); ``ONE`` i, a queue push released waiter i (a
push releases only the oldest WAIT, ours or another's; each waiter keeps its place, its arrival at the host).
"""

from __future__ import annotations

import os
import struct
from collections import deque

from rankrun.proof import client_proof, proof_matches, server_proof
from rankrun.workerstore.queries import LAYOUTS, MAX_KEY_COUNT, MAX_KEY_LEN, MAX_VALUE_LEN, Query

__all__ = ["CLOSE", "DATA", "HEADER", "JOIN", "LEAVE", "MAGIC", "OPEN", "SHARED", "ReplyTracker", "RequestCutter", "frame"]

MAGIC = b"rkrl"
VERSION = 1
NONCE_LEN = 16
PROOF_LEN = 32
HELLO_LEN = len(MAGIC) + 1 + NONCE_LEN
CHALLENGE_LEN = 2 + NONCE_LEN
VERDICT_LEN = 1 + PROOF_LEN
MAX_FRAME = 16 << 20  # a frame carries one read of a client's bytes (or replies): far below this

OPEN, DATA, CLOSE, SHARED, JOIN, LEAVE = 1, 2, 3, 4, 5, 6
ALL_RELEASED, ONE_RELEASED = 0, 2  # a shared wait's replies
RELEASE = struct.Struct("<BI")  # a shared wait's reply: kind, number
INDEX = struct.Struct("<I")  # a LEAVE's payload: the waiter's index
HEADER = struct.Struct("<BII")
_NO_PROOF = bytes(PROOF_LEN)


class MuxError(ValueError):
    """The peer sent something that is not this protocol: close the whole multiplexed connection."""


def frames(buf: bytes | bytearray) -> tuple[list[tuple[int, int, int, int]], int]:
    """The complete frames at the start of ``buf``, each as (kind, client id, payload start, payload end), and where
    the incomplete rest begins (pure). ``MuxError`` for a frame announced over ``MAX_FRAME``."""
    out: list[tuple[int, int, int, int]] = []
    pos, end, size_h = 0, len(buf), HEADER.size
    while end - pos >= size_h:
        kind, cid, size = HEADER.unpack_from(buf, pos)
        if size > MAX_FRAME:
            raise MuxError(f"a frame of {size} bytes (limit {MAX_FRAME})")
        if end - pos - size_h < size:
            break
        start = pos + size_h
        pos = start + size
        out.append((kind, cid, start, pos))
    return out, pos


def frame(kind: int, cid: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, cid, len(payload)) + payload


# -- handshake (each side's next message, and the check of the other's) ------------------


def hello() -> tuple[bytes, bytes]:
    """The relay's first message and its nonce."""
    nonce = os.urandom(NONCE_LEN)
    return MAGIC + bytes([VERSION]) + nonce, nonce


def read_hello(data: bytes) -> bytes:
    """The nonce of a relay's hello (``HELLO_LEN`` bytes); MuxError if it is not one."""
    if data[: len(MAGIC)] != MAGIC or data[len(MAGIC)] != VERSION:
        raise MuxError("not a rankrun store relay (or another version)")
    return data[len(MAGIC) + 1 : HELLO_LEN]


def challenge(secret: bytes | None) -> tuple[bytes, bytes]:
    """The host's answer to a hello and its challenge."""
    fresh = os.urandom(NONCE_LEN)
    return bytes([VERSION, int(secret is not None)]) + fresh, fresh


def answer(secret: bytes | None, data: bytes, nonce: bytes) -> tuple[bytes, bytes]:
    """The relay's proof for the host's challenge message, and the challenge; MuxError where the two sides do not agree
    on having a secret (a relay that has one never talks to a host that cannot prove it has it too)."""
    if data[0] != VERSION:
        raise MuxError(f"the host speaks relay protocol {data[0]}, this relay {VERSION}")
    auth, fresh = bool(data[1]), data[2:CHALLENGE_LEN]
    if auth != (secret is not None):
        raise MuxError("the host has a job secret and this node none" if auth else
                       "this node has a job secret and the host none")
    proof = bytes.fromhex(client_proof(secret, fresh, nonce)) if secret is not None else _NO_PROOF
    return proof, fresh


def verdict(secret: bytes | None, proof: bytes, fresh: bytes, nonce: bytes) -> tuple[bytes, bool]:
    """The host's last handshake message for a relay's ``proof``, and whether the relay is admitted."""
    if secret is None:
        return b"\x01" + _NO_PROOF, True
    if not proof_matches(client_proof(secret, fresh, nonce), proof.hex()):
        return b"\x00" + _NO_PROOF, False
    return b"\x01" + bytes.fromhex(server_proof(secret, fresh, nonce)), True


def host_proven(secret: bytes | None, data: bytes, fresh: bytes, nonce: bytes) -> None:
    """The relay's check of the host's verdict; MuxError if refused or if the host did not prove the secret."""
    if data[0] != 1:
        raise MuxError("the host refused this relay: it does not share the job's secret")
    if secret is not None and not proof_matches(server_proof(secret, fresh, nonce), data[1:VERDICT_LEN].hex()):
        raise MuxError("the host did not prove the job's secret")


# -- TCPStore request and reply layouts, as ``workerstore.queries`` describes them ------------------------------------

_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
# plain ints, the query byte's value, for the walks (``queries.Layout`` says what the letters mean)
_FIELDS: dict[int, str] = {int(query): layout.request for query, layout in LAYOUTS.items()}
REPLIES: dict[int, str] = {int(query): layout.reply for query, layout in LAYOUTS.items()}
WAIT, GET, CANCEL_WAIT, BARRIER = int(Query.WAIT), int(Query.GET), int(Query.CANCEL_WAIT), int(Query.BARRIER)


class RequestCutter:
    """Where each request in a client's byte stream ends, resumable across reads (a long key list is walked once)."""

    __slots__ = ("_at", "_count", "_field", "_left")

    def __init__(self) -> None:
        self._field = -1  # the field of the request being walked; -1: at a query byte
        self._at = 0  # where the walk stands, from the request's first byte
        self._left = 0  # strings left in the current list
        self._count = 0  # the current list's count (a MULTI_GET's reply has one value per key)

    def cut(self, buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int, int] | None:  # noqa: PLR0911, PLR0912 - one resumable walk
        """(query code, end of the request, its key count) of the request at ``pos``, or None while it is incomplete
        (call again, with the same ``pos``, once more bytes came). MuxError for an unknown code."""
        code = buf[pos]
        fields = _FIELDS.get(code)
        if fields is None:
            raise MuxError(f"unknown query type {code}")
        if self._field < 0:
            self._field, self._at, self._left, self._count = 0, 1, -1, 0
        while self._field < len(fields):
            kind = fields[self._field]
            at = pos + self._at
            if kind in "48":
                if end - at < int(kind):
                    return None
                self._at += int(kind)
            elif kind in "KV":
                if end - at < 8:
                    return None
                size = 8 + _checked(_U64.unpack_from(buf, at)[0], kind)
                if end - at < size:
                    return None
                self._at += size
            else:  # a list: its count, then its strings
                if self._left < 0:
                    if end - at < 8:
                        return None
                    self._count = _U64.unpack_from(buf, at)[0]
                    if self._count > MAX_KEY_COUNT:
                        raise MuxError(f"{self._count} keys in one request (limit {MAX_KEY_COUNT})")
                    self._left = self._count * (2 if kind == "p" else 1)
                    self._at += 8
                while self._left:
                    at = pos + self._at
                    if end - at < 8:
                        return None
                    # in a pair list an odd count left means a value
                    size = 8 + _checked(_U64.unpack_from(buf, at)[0], "V" if kind == "p" and self._left & 1 else "K")
                    if end - at < size:
                        return None
                    self._at += size
                    self._left -= 1
                self._left = -1
            self._field += 1
        length, self._field = self._at, -1
        return code, pos + length, self._count


def _checked(size: int, kind: str) -> int:
    """A key's or value's size, within the store's limits (beyond them the store closes the connection: the relay
    passes the bytes on as they come rather than wait for a request that is never complete)."""
    if size > (MAX_KEY_LEN if kind == "K" else MAX_VALUE_LEN):
        raise MuxError(f"a {'key' if kind == 'K' else 'value'} of {size} bytes")
    return size


def keys_of(buf: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[bytes, ...]:
    """The keys of a complete GET/WAIT/CHECK request at ``pos`` (what a relay coalesces on)."""
    if buf[pos] == GET:
        size = _U64.unpack_from(buf, pos + 1)[0]
        return (bytes(buf[pos + 9 : pos + 9 + size]),)
    count = _U64.unpack_from(buf, pos + 1)[0]
    keys, at = [], pos + 9
    for _ in range(count):
        size = _U64.unpack_from(buf, at)[0]
        keys.append(bytes(buf[at + 8 : at + 8 + size]))
        at += 8 + size
    del end
    return tuple(keys)


class ReplyTracker:
    """Which replies a connection still owes, followed through its reply bytes (resumable across reads).

    ``expect`` is told each forwarded request's reply shape (``REPLIES``); ``feed`` walks reply bytes and returns how
    many replies they completed (and, with ``collect``, their bytes). A WAIT's or BARRIER's reply may be replaced by a
    CANCEL_WAIT's: ``01`` where ``00`` was owed, with a CANCEL_WAIT owed next, answers both (the wait was forgotten).
    """

    __slots__ = ("_buf", "_collect", "_done", "_head", "_need", "_owed", "_steps", "waits")

    def __init__(self, *, collect: bool = False) -> None:
        self._owed: deque[tuple[str, int]] = deque()  # (shape, key count) per reply owed, oldest first
        self._steps: list[tuple[str, int]] = []  # the reply being read: what is left of it, last first
        self._head = bytearray()  # a header (up to 8 bytes) read so far
        self._need = 0  # bytes of a value still to skip
        self._collect = collect
        self._buf = bytearray()  # collect: the reply being read, so far
        self._done: list[bytes] = []
        self.waits = 0  # WAITs and BARRIERs owed: their replies may come after later requests' (the host answers
        # those at once), so a connection that sends anything but CANCEL_WAIT behind one cannot be followed

    @property
    def owed(self) -> int:
        return len(self._owed) + (1 if self._steps else 0)

    def expect(self, shape: str, count: int = 0) -> None:
        if shape and (shape != "n" or count):  # a MULTI_GET of no keys gets no bytes back
            self._owed.append((shape, count))
            self.waits += shape == "w"

    def feed(self, data: bytes | memoryview) -> tuple[int, list[bytes]]:  # noqa: PLR0912, PLR0915 - one resumable walk
        """Walk ``data``: (replies completed, their bytes when collecting); MuxError for bytes nobody is owed."""
        view = memoryview(data)
        done = 0
        pos = 0
        while pos < len(view):
            if not self._steps:
                if not self._owed:
                    raise MuxError("a reply that no request asked for")
                shape, count = self._owed.popleft()
                self.waits -= shape == "w"
                if shape == "w" and view[pos] == 1 and self._owed and self._owed[0][0] == "c":
                    self._owed.popleft()  # the wait was canceled: this 01 is the CANCEL_WAIT's
                    done += 1
                self._steps = _steps_of(shape, count)
            kind, n = self._steps[-1]
            if kind == "b":  # n bytes, as they are
                take = min(n, len(view) - pos)
                self._keep(view[pos : pos + take])
                pos += take
                if take < n:
                    self._steps[-1] = ("b", n - take)
                    continue
                self._steps.pop()
            elif kind == "v":  # n sized values
                if not self._need:
                    take = min(8 - len(self._head), len(view) - pos)
                    self._head += view[pos : pos + take]
                    pos += take
                    if len(self._head) < 8:
                        continue
                    self._keep(self._head)
                    self._need = _U64.unpack_from(self._head)[0]
                    self._head.clear()
                if self._need:
                    take = min(self._need, len(view) - pos)
                    self._keep(view[pos : pos + take])
                    pos += take
                    self._need -= take
                    if self._need:
                        continue
                self._count_down()
            else:  # "q"/"l": an i64, then values
                take = min(8 - len(self._head), len(view) - pos)
                self._head += view[pos : pos + take]
                pos += take
                if len(self._head) < 8:
                    continue
                value = _I64.unpack_from(self._head)[0]
                self._keep(self._head)
                self._head.clear()
                self._steps.pop()
                more = (1 if value > 0 else 0) if kind == "q" else max(value, 0)
                if more:
                    self._steps.append(("v", more))
            if not self._steps:
                done += 1
                if self._collect:
                    self._done.append(bytes(self._buf))
                    self._buf.clear()
        out, self._done = self._done, []
        return done, out

    def _count_down(self) -> None:
        kind, n = self._steps.pop()
        if n > 1:
            self._steps.append((kind, n - 1))

    def _keep(self, data: bytes | bytearray | memoryview) -> None:
        if self._collect:
            self._buf += data


def _steps_of(shape: str, count: int) -> list[tuple[str, int]]:
    if shape in "1wc":
        return [("b", 1)]
    if shape in "48":
        return [("b", int(shape))]
    if shape == "s":
        return [("v", 1)]
    if shape == "n":
        return [("v", count)]
    return [(shape, 0)]  # "q", "l"
