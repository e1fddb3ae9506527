"""Failure reporting: worker results → root cause → text and JSON.

``failure`` picks the root cause and writes the report, ``cause`` finds the part of a worker's output that explains
its failure (pure), ``errorfile`` reads and writes torch's error file, and ``frames`` cuts a worker's traceback to the
user's code."""
