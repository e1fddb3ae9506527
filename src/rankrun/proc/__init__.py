"""Processes: the only package of the launcher that starts workers (with ``--preload`` it asks the preloading process,
which forks them: below), and the only one that signals or reaps the launcher's processes.

Outside it, these modules run a process of their own: ``rankrun.api.launch`` starts the launcher from the caller's
process, and interrupts, kills and waits for it there; ``rankrun.devices`` runs ``nvidia-smi -L``;
``rankrun.health.check`` runs the ``--health-check`` command in a process group of its own and kills that group;
``rankrun.health.isolate`` (``python -m rankrun.health``) forks each probe in a process group of its own, runs
``nvidia-smi`` there, and kills and reaps the group at its timeout; under ``--preload``, the preloading process
(``rankrun.preload.server``) forks each worker (twice: the worker becomes the launcher's child) and reaps the
intermediate, and a forked worker (``rankrun.preload.child``) takes on its own environment and, ended by
``KeyboardInterrupt``, dies by SIGINT as Python does. Each use is allowed by name in
``tests/unit/test_claims.py``, which also checks that this list names every one.

``spawn`` starts the workers, ``group`` supervises one group to its end, ``output`` reads a worker's pipe or
terminal, ``terminal`` relays the user's terminal to an interactive worker, ``signals`` and ``early`` take the handled
signals (from the launcher's first instant), ``watchdog`` kills the workers if the launcher dies, and ``preload``
forks workers from the node's preloading process (``--preload``) and watches them.
"""
