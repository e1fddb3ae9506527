"""A node's health: the ``--health-check`` command run before each round, the checks rankrun ships
(``python -m rankrun.health``), and the pure rules that blame a node for a failure and find a network outlier.
Below the agent and the rendezvous, which hand it what it judges; it imports only the top-level leaves."""
