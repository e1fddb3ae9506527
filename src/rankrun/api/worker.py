"""``python -m rankrun.api.worker PAYLOAD RESULTS [NAME]``: one rank of ``rankrun.launch(fn, ...)``, in a fresh
interpreter (``NAME``, ``fn``'s, is the launcher's, for its failure report).

It puts the caller's ``sys.path`` before its own (what the caller imports, a worker imports from the same
places), loads ``(fn, args)`` (``rankrun.api.ship``), calls ``fn(*args)``, and writes ``RESULTS/<rank>.value`` (the value,
pickled the same way), or, when ``fn`` raises, ``RESULTS/<rank>.error`` (``results.ErrorRecord``). Files are written
whole (a rename). The exception's traceback, in the record and on stderr, starts at the user's code
(``rankrun.report.frames``): an ``Exception`` goes to ``sys.excepthook`` with it, and the worker exits 1, as Python does
for an uncaught one; any other ``BaseException`` (``SystemExit``, ``KeyboardInterrupt``: Ctrl-C) is raised again, so
the worker ends the way Python ends on it, its printout trimmed the same way (``frames.trimmed``).
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from pathlib import Path

from rankrun.api.results import KINDS, ErrorRecord, write_whole
from rankrun.api.ship import dumps, loads
from rankrun.report.frames import from_user_code, trimmed


def type_name(cls: type[BaseException]) -> str:
    """An exception type's name as Python's tracebacks print it: bare for builtins (and ``__main__``), else
    ``module.QualName`` (``traceback.format_exception_only``'s rule)."""
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def main(payload: str, results: str) -> None:
    path, shipped = pickle.loads(Path(payload).read_bytes())  # noqa: S301 - written by this job's caller
    sys.path[:0] = [p for p in path if p not in sys.path]  # what the caller imports from, the workers import from
    rank = os.environ["RANK"]
    for kind in KINDS:  # an earlier attempt's (a restart runs every rank again), gone before anything can fail
        (Path(results) / f"{rank}.{kind}").unlink(missing_ok=True)
    fn, args = loads(shipped)
    try:
        value = fn(*args)
    except BaseException as exc:
        exc.__traceback__ = from_user_code(exc.__traceback__)
        _record(exc, Path(results) / f"{rank}.error")
        if not isinstance(exc, Exception):
            sys.excepthook = trimmed(sys.excepthook)  # Python prints it on its way out: without our frames too
            raise
        sys.excepthook(type(exc), exc, exc.__traceback__)  # what Python prints for an uncaught one, without our frames
        sys.exit(1)
    write_whole(Path(results) / f"{rank}.value", dumps(value))


def _record(exc: BaseException, path: Path) -> None:
    try:
        original: bytes | None = dumps(exc)
    except Exception:  # an exception that does not pickle still has its text
        original = None
    text = "".join(traceback.format_exception(exc))
    write_whole(path, ErrorRecord(type_name(type(exc)), str(exc), text, original).value())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
