"""The rendezvous's store: a seam shaped like etcd v3 (``api``), the in-memory reference (``memory``), and two backends.

``embedded/`` serves the in-memory store over TCP from the hosting agent (wire, server, client,
liveness, and the rendezvous relays: relay, routing); ``etcd/`` speaks etcd's v3 JSON gateway and is imported only by
etcd jobs. Nothing here knows the rendezvous algorithm (``rendezvous/``) or the workers' TCPStore (``workerstore/``).
"""
