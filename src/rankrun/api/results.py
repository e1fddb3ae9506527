"""What the workers of ``rankrun.launch`` leave behind, and what the caller makes of it (records, pure reading)."""

from __future__ import annotations

import json
import os
import pickle
import signal
from pathlib import Path
from typing import Any

from rankrun.record import record

KINDS = ("value", "at", "error", "failed")  # what a results directory holds per rank (``<rank>.<kind>``)
ROOT = "root"  # in the results directory, from the other nodes' records: the job's first failure, {"rank": N}


def write_whole(path: Path, data: bytes) -> None:
    """``data`` at ``path``, never seen half written (a rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(path)


@record
class ErrorRecord:
    """A worker's exception: its type's name as Python prints it (``ValueError``, ``mymodule.MyError``), its message, its
    traceback (from the user's code on), and itself pickled if it would."""

    exc_type: str
    message: str
    traceback: str
    pickled: bytes | None

    def value(self) -> bytes:
        return pickle.dumps((self.exc_type, self.message, self.traceback, self.pickled))

    @classmethod
    def parse(cls, data: bytes) -> ErrorRecord:
        exc_type, message, tb, pickled = pickle.loads(data)  # noqa: S301 - written by this job's own workers
        return cls(str(exc_type), str(message), str(tb), pickled)


@record
class Failure:
    """One failed rank, as ``WorkerError.failures`` gives it."""

    exc_type: str  # "" when the worker died without raising (a signal, os._exit)
    message: str
    traceback: str  # the worker's own
    exit_code: int | None  # None when a signal ended it
    signal: str | None  # e.g. "SIGKILL"
    host: str


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def failures(report: dict[str, Any], results: Path) -> dict[int, Failure]:
    """Every rank that failed (ranks that were stopped are not failures), with what its worker recorded: this node's
    from the launcher's report, the other nodes' from ``<rank>.failed`` (``rankrun.api.failures``)."""
    failed = {int(w["rank"]): (int(w["status"]), str(report.get("host", "")))
              for w in report.get("workers", []) if w.get("ending") == "failed"}
    for path in results.glob("*.failed"):
        other = json.loads(path.read_text())
        failed.setdefault(int(path.name.split(".")[0]), (int(other["status"]), str(other.get("host") or "")))
    out: dict[int, Failure] = {}
    for rank, (status, host) in sorted(failed.items()):
        error_file = results / f"{rank}.error"
        error = ErrorRecord.parse(error_file.read_bytes()) if error_file.exists() else None
        out[rank] = Failure(error.exc_type if error else "", error.message if error else "", error.traceback if error else "",
                            status if status >= 0 else None, _signal_name(-status) if status < 0 else None, host)
    return out


def root_rank(report: dict[str, Any], results: Path) -> int | None:
    """The job's first failure: on several nodes, the one the other nodes' records name (``rankrun.api.failures``),
    else this node's."""
    try:
        return int(json.loads((results / ROOT).read_text())["rank"])
    except (OSError, ValueError, KeyError, TypeError):
        root = report.get("root")
        return int(root) if root is not None else None


def cause(results: Path, rank: int | None) -> BaseException | None:
    """The root cause's own exception, rebuilt when it unpickles here."""
    if rank is None or not (results / f"{rank}.error").exists():
        return None
    pickled = ErrorRecord.parse((results / f"{rank}.error").read_bytes()).pickled
    if pickled is None:
        return None
    try:
        exc = pickle.loads(pickled)  # noqa: S301 - written by this job's own workers
    except Exception:  # a class the caller cannot import: no cause, the record says it all
        return None
    return exc if isinstance(exc, BaseException) else None


def read_report(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
