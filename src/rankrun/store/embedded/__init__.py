"""The embedded store: the in-memory store served over TCP by the agent that hosts the rendezvous.

``wire`` (frames and the HMAC handshake, pure), ``server`` (serves ``store.memory``), ``client``
(the ``store.api.Store`` seam over one connection), ``liveness`` (how either side notices a silent peer). Past what
the host can hold, agents connect through rendezvous relays: ``routing`` (which agents the host serves, which it sends
to a relay; pure) and ``relay`` (one agent holding others' connections over one to the host).
"""
