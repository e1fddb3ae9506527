"""Launching from Python (``rankrun.launch(fn, ...)``): the pieces, one module each (``ship``: functions by value)."""
