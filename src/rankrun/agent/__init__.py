"""The agent: rendezvous (single node for now) → ranks → env → worker group → decide → report."""
