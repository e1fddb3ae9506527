"""The secret-gated handshake's frames and its refusals (``rankrun.handshake``), in memory: a stream reader fed bytes
and a writer that collects them. The whole exchange over real sockets is in tests/integration (the probe's and the
keep endpoint's tests)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from rankrun import handshake
from rankrun.proof import server_proof

MAGIC = b"TEST"


class Writer:
    """What the handshake writes, kept; a socket (or none) to set options on."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        self.sent = bytearray()
        self.sock = sock

    def write(self, data: bytes) -> None:
        self.sent += data

    async def drain(self) -> None:
        pass

    def get_extra_info(self, name: str) -> object:
        return self.sock if name == "socket" else None


def _reader(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


def _read(data: bytes) -> dict:
    async def main() -> dict:
        return await handshake.read_frame(_reader(data))

    return asyncio.run(main())


def test_a_frame_is_a_2_byte_length_then_compact_json():
    assert handshake.frame({"a": 1, "b": "x"}) == b'\x00\x0f{"a":1,"b":"x"}'
    assert _read(handshake.frame({"hello": 1, "nonce": "00ff"})) == {"hello": 1, "nonce": "00ff"}


def test_a_frame_of_the_most_it_may_be_is_read_and_one_more_byte_is_refused():
    body = json.dumps({"p": "x" * (handshake.MAX_FRAME - 9)}).encode()
    assert len(body) == handshake.MAX_FRAME
    assert _read(len(body).to_bytes(2, "big") + body) == {"p": "x" * 1015}
    with pytest.raises(ValueError, match=r"^a handshake frame of 1025 bytes \(limit 1024\)$"):
        _read((1025).to_bytes(2, "big") + b" " + body)


@pytest.mark.parametrize("body", [b"[]", b"1", b'"x"'])
def test_a_frame_that_is_not_an_object_is_refused(body):
    with pytest.raises(ValueError, match=r"^a handshake frame that is not an object$"):
        _read(len(body).to_bytes(2, "big") + body)


def test_unhex_reads_hex_text_only():
    assert handshake.unhex("00ff") == b"\x00\xff"
    for value in (5, None, b"00"):
        with pytest.raises(ValueError, match=r"^expected hex text$"):
            handshake.unhex(value)


def test_a_client_that_does_not_speak_this_handshake_is_closed_without_a_word():
    async def accept(data: bytes) -> tuple[bool, bytes]:
        writer = Writer()
        return await handshake.accept(_reader(data), writer, MAGIC, b"secret", "no"), bytes(writer.sent)

    hello = handshake.frame({"hello": 1, "nonce": "00"})
    assert asyncio.run(accept(b"ELSE" + hello)) == (False, b"")  # another magic
    assert asyncio.run(accept(MAGIC + handshake.frame({"hello": 2, "nonce": "00"}))) == (False, b"")  # another version
    with pytest.raises(ValueError, match="expected hex text"):
        asyncio.run(accept(MAGIC + handshake.frame({"hello": 1})))  # no nonce


def test_the_offer_says_whether_a_proof_is_asked():
    async def offer(secret: bytes | None) -> dict:
        writer = Writer()
        with pytest.raises(asyncio.IncompleteReadError):  # the client said no more
            await handshake.accept(_reader(MAGIC + handshake.frame({"hello": 1, "nonce": "00"})), writer, MAGIC, secret,
                                   "no")
        return json.loads(bytes(writer.sent[2:]))

    with_secret, without = asyncio.run(offer(b"secret")), asyncio.run(offer(None))
    assert with_secret["version"] == 1 and with_secret["auth"] is True and len(bytes.fromhex(with_secret["challenge"])) == 16
    assert without["auth"] is False


def test_without_a_secret_any_client_is_let_in_and_no_proof_given():
    async def main() -> tuple[bool, list[dict]]:
        writer = Writer()
        data = MAGIC + handshake.frame({"hello": 1, "nonce": "00"}) + handshake.frame({"proof": ""})
        ok = await handshake.accept(_reader(data), writer, MAGIC, None, "no")
        frames = []
        sent = bytes(writer.sent)
        while sent:
            size = int.from_bytes(sent[:2], "big")
            frames.append(json.loads(sent[2:2 + size]))
            sent = sent[2 + size:]
        return ok, frames

    ok, frames = asyncio.run(main())
    assert ok and frames[1] == {"ok": True, "proof": ""}


def _prove(offer: dict, answer: dict, secret: bytes | None = b"secret") -> bytes:
    async def main() -> bytes:
        writer = Writer()
        await handshake.prove(_reader(handshake.frame(offer) + handshake.frame(answer)), writer, MAGIC, secret)
        return bytes(writer.sent)

    return asyncio.run(main())


def test_a_client_refuses_another_version_or_a_refusal_or_a_wrong_proof():
    with pytest.raises(handshake.HandshakeError, match=r"^speaks version 2, not 1$"):
        _prove({"version": 2, "challenge": "00"}, {"ok": True})
    with pytest.raises(handshake.HandshakeError, match=r"^refused: go away$"):
        _prove({"version": 1, "challenge": "00"}, {"ok": False, "error": "go away"})
    with pytest.raises(handshake.HandshakeError, match=r"^refused: None$"):
        _prove({"version": 1, "challenge": "00"}, {"ok": 1})  # only true is a yes
    with pytest.raises(handshake.HandshakeError, match=r"^the endpoint does not know this job's secret$"):
        _prove({"version": 1, "challenge": "00"}, {"ok": True, "proof": "00" * 32})


def test_a_client_sends_its_magic_and_nonce_then_its_proof():
    sent = None

    class Seeing(Writer):
        def write(self, data: bytes) -> None:
            nonlocal sent
            super().write(data)
            sent = self.sent

    # the server's proof depends on the client's nonce: the answer is made once the hello is seen
    async def main() -> None:
        writer = Seeing()
        reader = asyncio.StreamReader()
        reader.feed_data(handshake.frame({"version": 1, "challenge": "ab" * 16}))
        task = asyncio.create_task(handshake.prove(reader, writer, MAGIC, b"secret"))
        while not sent or len(sent) <= len(MAGIC) + 2 + int.from_bytes(sent[4:6], "big"):
            await asyncio.sleep(0)
        hello = json.loads(bytes(sent[6:6 + int.from_bytes(sent[4:6], "big")]))
        proof_frame = json.loads(bytes(sent[6 + int.from_bytes(sent[4:6], "big") + 2:]))
        assert sent[:4] == MAGIC and hello["hello"] == 1 and len(bytes.fromhex(hello["nonce"])) == 16
        assert len(proof_frame["proof"]) == 64
        reader.feed_data(handshake.frame({"ok": True, "proof": server_proof(b"secret", b"\xab" * 16,
                                                                            bytes.fromhex(hello["nonce"]))}))
        await task

    asyncio.run(main())


def test_no_delay_sets_tcp_nodelay_where_there_is_a_socket():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        assert not sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        handshake.no_delay(Writer(sock))
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    handshake.no_delay(Writer(None))  # none: nothing to set, no error
