"""Failure reporting: worker results → root cause → text and JSON."""
