"""The preloading process: ``python -u .../rankrun/preload/__main__.py CONTROL PATH0 MODULES [ARGV...]`` (by its file:
nothing is loaded before the user's modules but what the interpreter loads, and this file's folder leaves ``sys.path``
at once).

Started by the launcher (``rankrun.proc.preload``) under the workers' interpreter, with their environment (less each
rank's variables) and working directory: ``CONTROL`` is its end of the socket pair, ``PATH0`` the workers'
``sys.path[0]`` (so a module beside the script preloads from where the worker would import it), ``MODULES`` the
comma-separated names, ``ARGV`` what the first worker's ``sys.argv`` will be (a module reading it at import sees the
worker's). It records what the interpreter had loaded, imports the modules (first: nothing of rankrun's but what
``-m`` itself loaded precedes them), tells the launcher how it went, and serves forks until the launcher closes the
socket. A forked worker returns out of ``serve`` and becomes the cold worker here (``child.run``), so its exit is the
interpreter's own: ``SystemExit``'s code, atexit, non-daemon threads joined.
"""

import os
import sys
import time

_BASE = frozenset(sys.modules)  # what the interpreter loaded: nothing of it is dropped from a worker


def _main() -> None:
    control, path0, names = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
    if not sys.flags.safe_path:
        sys.path[0] = path0
    sys.argv[:] = sys.argv[4:] or [""]
    began = time.monotonic()
    for name in names:
        try:
            __import__(name)
        except BaseException as exc:
            from rankrun.preload import server  # noqa: PLC0415 - after the user's modules, always

            server.failed(control, name, exc)
            sys.stderr.flush()
            os._exit(0)  # the same: the launcher says the import's last line
    seconds = time.monotonic() - began
    loaded = frozenset(sys.modules)
    from rankrun.preload import server  # noqa: PLC0415 - after the user's modules: see the docstring

    forked = server.serve(control, seconds)
    if forked is None:  # the launcher closed the socket: the job is over on this node
        # Leave without the interpreter's finalization (a torch-loaded one takes a second here): nothing of the
        # user's ran in this process, and the exit handlers its imports registered run in every worker.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    from rankrun.preload import child  # noqa: PLC0415

    child.run(forked, _BASE, loaded)


_main()
