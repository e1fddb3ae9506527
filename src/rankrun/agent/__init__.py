"""The agent: rendezvous (one node, or several: ``multinode``) → plan → env → worker group → decide → report."""
