"""A node's health: the ``--health-check`` command run before each round (``check``), the checks rankrun ships
(``python -m rankrun.health``: ``probes``, ``isolate``), and the network check's measurements (``probe``) and outlier
rule (``outliers``). Below the agent and the rendezvous, which hand it what it judges (who is blamed for a failure
and excluded is ``rendezvous.round``'s); it imports only the top-level leaves."""
