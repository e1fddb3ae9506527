"""``python -m rankrun.api.worker PAYLOAD RESULTS [NAME]``: one rank of ``rankrun.launch(fn, ...)``, in a fresh
interpreter (``NAME``, ``fn``'s, is the launcher's, for its failure report).

It puts the caller's ``sys.path`` before its own (what the caller imports, a worker imports from the same
places), loads ``(fn, args)`` (``rankrun.api.ship``), calls ``fn(*args)``, and writes ``RESULTS/<rank>.value`` (the value,
pickled the same way), or, when ``fn`` raises, ``RESULTS/<rank>.error`` (``results.ErrorRecord``) and re-raises, so the
traceback reaches the launcher's failure report as it does for any worker. Files are written whole (a rename).
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from pathlib import Path

from rankrun.api.results import KINDS, ErrorRecord, write_whole
from rankrun.api.ship import dumps, loads


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
        try:
            original: bytes | None = dumps(exc)
        except Exception:  # an exception that does not pickle still has its text
            original = None
        record = ErrorRecord(f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc), traceback.format_exc(), original)
        write_whole(Path(results) / f"{rank}.error", record.value())
        raise
    write_whole(Path(results) / f"{rank}.value", dumps(value))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
