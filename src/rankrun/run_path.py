"""Worker shim for ``--run-path``: run a script with ``runpy.run_path`` as torch's ``@record`` would.

Invoked as ``python -u -m rankrun.run_path SCRIPT ARGS...``. An uncaught exception is
written to ``$TORCHELASTIC_ERROR_FILE`` in torch's format, then re-raised, so the failure
report shows it exactly as it shows a ``@record``-decorated main.

The failure is the script's, as in a plain ``python script.py`` run: its traceback, in the
error file and on stderr, starts at the script's own frame; this shim's and ``runpy``'s are
left out (``rankrun.report.frames``).
"""

from __future__ import annotations

import os
import runpy
import sys


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
        from rankrun.report.frames import from_user_code, trimmed  # noqa: PLC0415

        record_exception(exc.with_traceback(from_user_code(exc.__traceback__)), os.environ.get("TORCHELASTIC_ERROR_FILE"))
        sys.excepthook = trimmed(sys.excepthook)  # the script's hook if it set one: it is the one Python calls
        raise


if __name__ == "__main__":
    main()
