"""Launching from Python (``rankrun.launch(fn, ...)``): the pieces, one module each.

In the caller's process, ``launch`` runs the CLI's job and hands every rank's value back. In each worker, ``worker``
is the rank's main and ``ship`` brings its function (by reference, or by value); ``results`` is what the workers leave
behind and how it is read. In the agent of a several-node job, ``node`` is this node's part, ``values`` carries every
rank's value to every node and ``failures`` every node's failed ranks."""
