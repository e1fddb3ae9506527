"""A worker's traceback from the user's code on (``--run-path``'s shim, ``rankrun.launch``'s worker): the frames above
it, rankrun's own (the shim's, by file) and runpy's (``python -m``'s, ``run_path``'s), left out, in what the worker
records and in what Python prints when the exception ends it.

Python prints an uncaught exception through ``sys.excepthook``, after the frames it passed through on its way up (the
shim's, runpy's) were added to its traceback; ``trimmed`` wraps the hook set at that moment (the user's own, e.g. one
that prefixes ranks, included), so the printout starts at the user's code and Python's exit stays its own (1, or
death by SIGINT for ``KeyboardInterrupt``).
"""

from __future__ import annotations

import os
import runpy
from collections.abc import Callable
from types import TracebackType

Hook = Callable[[type[BaseException], BaseException, TracebackType | None], object]

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # rankrun's own files
_RUNPY = ("<frozen runpy>", runpy.__file__)  # frozen since 3.11; a file in a build without frozen modules


def ours(tb: TracebackType) -> bool:
    """Whether ``tb``'s frame is rankrun's own or runpy's."""
    path = tb.tb_frame.f_code.co_filename
    return path.startswith(_OURS) or path in _RUNPY


def from_user_code(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without the frames above the user's code (``ours``). All of ``tb`` when nothing else is in it (the user's
    code is one of rankrun's own functions, or the script could not be read): an empty traceback tells nothing."""
    start = tb
    while start is not None and ours(start):
        start = start.tb_next
    return start if start is not None else tb


def trimmed(hook: Hook) -> Hook:
    """``hook`` (a ``sys.excepthook``) shown the traceback from the user's code on."""

    def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> object:
        tb = from_user_code(tb)
        return hook(kind, value.with_traceback(tb), tb)  # Python's own hook prints the exception's __traceback__

    return excepthook
