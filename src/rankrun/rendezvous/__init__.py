"""The rendezvous algorithm over any ``store.api.Store``: the pure round decisions (``round``), the coordinator and
the members (``join``), the coordinator's election on a shared store (``election``), and the one listening port the
embedded store shares with the workers' TCPStore (``listener``)."""
