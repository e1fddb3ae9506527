"""Processes: the only package that starts workers, signals or reaps OS processes (``tests/unit/test_claims.py``)."""
