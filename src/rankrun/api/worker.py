"""``python -m rankrun.api.worker PAYLOAD RESULTS [NAME]``: one rank of ``rankrun.launch(fn, ...)``, in a fresh
interpreter (``NAME``, ``fn``'s, is the launcher's, for its failure report).

It puts the caller's ``sys.path`` before its own (what the caller imports, a worker imports from the same
places), loads ``(fn, args)`` (``rankrun.api.ship``), calls ``fn(*args)``, and writes ``RESULTS/<rank>.value`` (the value,
pickled the same way), or, when ``fn`` raises, ``RESULTS/<rank>.error`` (``results.ErrorRecord``). Files are written
whole (a rename). The exception's traceback, in the record and on stderr, starts at the user's code
(``from_user_code``): an ``Exception`` goes to ``sys.excepthook`` with it, and the worker exits 1, as Python does for an
uncaught one; any other ``BaseException`` (``SystemExit``, ``KeyboardInterrupt``) is raised again, so the worker ends
the way Python ends on it.
"""

from __future__ import annotations

import os
import pickle
import runpy
import sys
import traceback
from pathlib import Path
from types import TracebackType

import rankrun
from rankrun.api.results import KINDS, ErrorRecord, write_whole
from rankrun.api.ship import dumps, loads

_OURS = os.path.dirname(os.path.abspath(rankrun.__file__)) + os.sep  # rankrun's own files, the worker's frames among them


def type_name(cls: type[BaseException]) -> str:
    """An exception type's name as Python's tracebacks print it: bare for builtins (and ``__main__``), else
    ``module.QualName`` (``traceback.format_exception_only``'s rule)."""
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"


def _ours(tb: TracebackType) -> bool:
    path = tb.tb_frame.f_code.co_filename
    return path.startswith(_OURS) or path in ("<frozen runpy>", runpy.__file__)  # runpy: python -m's frames


def from_user_code(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without the frames above the user's code: rankrun's own (this worker's, by file) and runpy's. All of
    ``tb`` when nothing else is in it (``fn`` is one of rankrun's own functions): an empty traceback tells nothing."""
    start = tb
    while start is not None and _ours(start):
        start = start.tb_next
    return start if start is not None else tb


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
