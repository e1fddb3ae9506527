"""The job secret's proofs: the mutual HMAC-SHA256 challenge-response every rankrun endpoint that answers only its own
job's agents uses (the embedded store's handshake, ``store.embedded.wire``; the handshake of the network check's probe
endpoint and of the neighbour copy's keep endpoint, ``handshake``; the store relays' handshake, ``workerstore.mux``,
which sends the proofs as bytes and checks them here as hex).

The server sends a fresh random ``challenge``, the client a fresh random ``nonce``; each side proves it holds the
secret by an HMAC over both, in an order and with a label of its own, so neither side's proof can be replayed as the
other's, nor a recorded exchange on a new connection. The secret itself is never sent. A leaf: standard library only.
"""

from __future__ import annotations

import hashlib
import hmac


def client_proof(secret: bytes, challenge: bytes, nonce: bytes) -> str:
    return hmac.new(secret, b"rankrun-client" + challenge + nonce, hashlib.sha256).hexdigest()


def server_proof(secret: bytes, challenge: bytes, nonce: bytes) -> str:
    return hmac.new(secret, b"rankrun-server" + nonce + challenge, hashlib.sha256).hexdigest()


def proof_matches(expected: str, given: object) -> bool:
    """``given`` (whatever the peer sent) is the expected proof, compared in constant time."""
    return isinstance(given, str) and hmac.compare_digest(expected, given)
