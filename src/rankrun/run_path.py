"""Worker shim for ``--run-path``: run a script with ``runpy.run_path`` as torch's ``@record`` would.

Invoked as ``python -u -m rankrun.run_path SCRIPT ARGS...``. An uncaught exception is
written to ``$TORCHELASTIC_ERROR_FILE`` in torch's format, then re-raised, so the failure
report shows it exactly as it shows a ``@record``-decorated main.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    except BaseException as exc:
        from rankrun.report.errorfile import record_exception  # noqa: PLC0415 - only on failure

        record_exception(exc, os.environ.get("TORCHELASTIC_ERROR_FILE"))
        raise


if __name__ == "__main__":
    main()
