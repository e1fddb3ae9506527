"""torch's TCPStore for the workers: what ``MASTER_ADDR:MASTER_PORT`` and ``init_method="env://"`` reach.

``queries`` describes the protocol's queries once (codes, request fields, reply shapes, limits); ``tcpstore`` speaks
it (one asyncio protocol per connection, an incremental parser); ``keyspace`` holds the keys, queues and blocked
waiters (pure state, no I/O). The store relays (``--store-relays``): ``mux`` is their wire (handshake, frames, walks
over requests and replies by ``queries``' layouts), ``relay`` a node's side, ``relayhost`` the host's. Nothing here
knows the rendezvous or its store (``rankrun.store``); only ``rendezvous.listener`` and ``rendezvous.session`` know
both (``tests/unit/test_import_directions.py``).
"""
