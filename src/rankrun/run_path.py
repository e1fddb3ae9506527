"""Worker shim for ``--run-path``: run a script with ``runpy.run_path`` as torch's ``@record`` would.

Invoked as ``python -u -m rankrun.run_path SCRIPT ARGS...``. An uncaught exception is
written to ``$TORCHELASTIC_ERROR_FILE`` in torch's format, then re-raised, so the failure
report shows it exactly as it shows a ``@record``-decorated main.

The failure is the script's, as in a plain ``python script.py`` run: its traceback, in the
error file and on stderr, starts at the script's own frame. The frames of this shim and of
``runpy`` (``-m``'s and ``run_path``'s) are left out: the stderr traceback by a wrapper around
whatever ``sys.excepthook`` is set when the exception reaches the top (the script's own hook,
e.g. one that prefixes ranks, included), so Python's exit stays its own (1, or death by SIGINT
for ``KeyboardInterrupt``).
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Callable
from types import TracebackType

Hook = Callable[[type[BaseException], BaseException, TracebackType | None], object]

# the files of the frames above the script's: this shim's, and runpy's (frozen since 3.11, a file before)
SHIM_FILES = frozenset({os.path.abspath(__file__), "<frozen runpy>", os.path.abspath(runpy.__file__ or "runpy")})


def user_frames(tb: TracebackType | None, skip: frozenset[str] = SHIM_FILES) -> TracebackType | None:
    """``tb`` from its first frame that is not the shim's or runpy's (pure); all of it if every frame is theirs (the
    script itself could not be read: runpy's frames are then the story)."""
    first = tb
    while first is not None and _file(first) in skip:
        first = first.tb_next
    return first if first is not None else tb


def _file(tb: TracebackType) -> str:
    name = tb.tb_frame.f_code.co_filename
    return name if name.startswith("<") else os.path.abspath(name)


def trimmed(hook: Hook) -> Hook:
    """``hook`` (an ``sys.excepthook``) shown the script's frames only."""

    def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> object:
        tb = user_frames(tb)
        return hook(kind, value.with_traceback(tb), tb)  # Python's own hook prints the exception's __traceback__

    return excepthook


def main() -> None:
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    try:
        runpy.run_path(os.path.abspath(script), run_name="__main__")  # __file__ absolute, as in `python script.py`
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    except BaseException as exc:
        from rankrun.report.errorfile import record_exception  # noqa: PLC0415 - only on failure

        record_exception(exc.with_traceback(user_frames(exc.__traceback__)), os.environ.get("TORCHELASTIC_ERROR_FILE"))
        sys.excepthook = trimmed(sys.excepthook)  # the script's hook if it set one: it is the one Python calls
        raise


if __name__ == "__main__":
    main()
