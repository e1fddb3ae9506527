"""Rendezvous: the store seam (in-memory, embedded over TCP), the pure round decisions, the join algorithm, and the
torch-wire worker store."""
