"""The embedded store: the in-memory store served over TCP by the agent that hosts the rendezvous.

``wire`` (frames and the HMAC handshake, pure), ``server`` (serves ``store.memory``), ``client``
(the ``store.api.Store`` seam over one connection), ``liveness`` (how either side notices a silent peer).
"""
