"""The agent's straggler watch (``--straggler-window``), in one place: ``watch`` (one attempt's watch on this node,
and one node's judgment) and ``job`` (several nodes: a round's windows sent to the host, which judges the job). The
rules and records are ``rankrun.straggler``'s; the host's side of the exchange is ``rankrun.rendezvous.stragglers``."""
