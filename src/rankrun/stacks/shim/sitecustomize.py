"""Run by ``site`` in every Python worker rankrun starts: lets rankrun ask the worker for its stacks.

rankrun puts this folder first on the worker's ``PYTHONPATH`` and says in ``RANKRUN_STACKS_FILE`` and
``RANKRUN_STACKS_SIGNAL`` where and on which signal. ``faulthandler`` then writes every thread's stack to that
file when the signal comes, from C, so it works while the main thread holds the GIL in a C call (a
regex, a blocked collective) where no Python handler would run. No chaining: at start-up the signal's
previous action is the default one, which ``chain=True`` would re-raise, ending the worker after its dump.
The header line names the main thread (faulthandler marks the thread that ran the handler), and says when
the interpreter came up (``up=``, ``time.monotonic()``: CLOCK_MONOTONIC, one clock for every process on the
machine, so the launcher reads it on its own clock): the rank's first sign of life for the start-up timeline
(``rankrun.agent.startup``), taken just before the interpreter runs the user's script (or, with ``-m``, finds
its module). It costs the worker nothing more than the header it already wrote: no other file, no other
syscall, one ``write`` of under 128 bytes to a file opened for appending, which the launcher reads only once it
ends in a newline (a read that races the write sees no line, and looks again later).

Then it leaves no trace: the two variables are removed, ``PYTHONPATH`` is put back as the user set it
(``RANKRUN_USER_PYTHONPATH``; absent: it was not set), this folder leaves ``sys.path``, and the user's own
``sitecustomize``, if there is one further on the path, runs in its place (an error in it is reported
by ``site`` as usual). Only builtin modules are imported here: every worker's start-up pays for this file.
"""

import os
import sys
import time  # builtin, and already imported by the interpreter's start-up (zipimport): a dict look-up


def _install() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.pop("RANKRUN_STACKS_FILE", "")
    signum = os.environ.pop("RANKRUN_STACKS_SIGNAL", "")
    user_path = os.environ.pop("RANKRUN_USER_PYTHONPATH", None)
    if user_path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = user_path
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    if path and signum:
        try:
            import _thread  # noqa: PLC0415 - builtin; threading would cost every worker a millisecond
            import faulthandler  # noqa: PLC0415

            channel = open(path, "ab", buffering=0)  # noqa: SIM115 - faulthandler keeps it for the process's life
            faulthandler.register(int(signum), file=channel, all_threads=True, chain=False)
            channel.write(f"rankrun-stacks main=0x{_thread.get_ident():016x} pid={os.getpid()} "
                          f"up={time.monotonic():.6f}\n".encode())
        except (OSError, ValueError, RuntimeError):
            pass  # no dumps for this worker: rankrun then shows its /proc state instead
    _chain()


def _chain() -> None:
    """The user's own ``sitecustomize``, further on the path, run in this one's place (it takes the name).

    Through the import system's own frozen modules, which every interpreter has loaded before ``site`` runs:
    ``importlib.util`` would pull in ``contextlib``, ``collections`` and ``functools``, ~4 ms of every worker's
    start-up (``-X importtime``).
    """
    finder = sys.modules["_frozen_importlib_external"].PathFinder  # importlib.machinery.PathFinder
    spec = finder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = sys.modules["_frozen_importlib"].module_from_spec(spec)  # importlib.util.module_from_spec
    sys.modules["sitecustomize"] = module  # site's import then finds the user's module under the name
    spec.loader.exec_module(module)


_install()
