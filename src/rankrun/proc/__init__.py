"""Processes: the only package that spawns, signals or reaps OS processes."""
