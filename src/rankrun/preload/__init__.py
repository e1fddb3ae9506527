"""Warm starts (``--preload MODULES``): the preloading process, which imports the modules once per node and forks
every Python worker of every attempt from that state. It runs under the workers' interpreter; the launcher imports
only ``wire`` of it (``rankrun.proc.preload`` is the launcher's side).

``__main__`` is the process's start (``python -u .../rankrun/preload/__main__.py``, by its file: record, import,
tell, serve), ``server`` its loop (the safety check, then the double fork that makes the worker the launcher's child;
the next request is served while an intermediate forks), ``child`` what a forked worker does before the user's code
(become the cold worker: session, descriptors, the launcher's go, environment, ``__main__``), ``safety`` the check that
the state about to be forked holds no thread, socket or CUDA context, and ``wire`` the messages between the launcher
and the process. ``docs/design.md`` ("Warm starts") has the
whole design.
"""
