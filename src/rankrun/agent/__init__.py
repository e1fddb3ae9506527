"""The agent. One node: its restart loop (``loop``: plan → env → worker group → decide → report). Several nodes: their
own loop of rounds (``multinode``), inside a rendezvous session (``rendezvous.session``), where the coordinator decides
each round (``rendezvous.round``, with the same ``policy.decide``). Either way, each attempt is ``attempt``."""
