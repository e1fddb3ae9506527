"""The rendezvous algorithm over any ``store.api.Store``.

``round`` (the pure decisions), ``account`` (the job's account of its nodes: blame, exclusions, the blocklist; pure),
``keys`` (where each fact lives and how it is spelled), ``coordinator`` (decides every round), ``member`` (one node's
side), ``election`` (the coordinator on a shared store), ``listener`` (the one port the embedded store shares with the
workers' TCPStore), ``session`` (one node's part from joining to leaving: the backend, hosting or joining, the
election, closing).
Three features talk over the rendezvous's keys: ``netcheck`` (``--network-check``: each member measures its ring
neighbour, the coordinator judges), ``stragglers`` (``--straggler-window``: clock questions, each node's windows,
the host's verdicts) and ``kept`` (``rankrun.checkpoint``: each node's kept steps, the round's first node's plan).
"""
