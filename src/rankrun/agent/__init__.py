"""The agent: one node's loop — plan → env → worker group → decide → report; several nodes run it round after round
(``multinode``) inside a rendezvous session (``rendezvous.session``)."""
