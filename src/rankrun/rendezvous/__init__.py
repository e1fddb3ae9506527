"""Rendezvous: worker stores and the join algorithm."""
