"""torch's error-file JSON (``TORCHELASTIC_ERROR_FILE``), read and written.

Format (torch ``@record``)::

    {"message": {"message": "ValueError: boom",
                 "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1796002631"}}}

A legacy form with ``"message": "<str>"`` and a top-level ``"timestamp"`` is read too.
When the launcher copies a child's error into its own error file it adds ``errorCode``.
Pure parsing plus two tiny file helpers; a malformed file is reported, never raised.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Mapping
from typing import Any

from rankrun.record import record


@record
class WorkerError:
    message: str
    traceback: str
    timestamp: int


def parse_error_json(text: str) -> WorkerError | None:
    """The error a worker wrote, or ``None`` if ``text`` is not torch's format."""
    import json  # noqa: PLC0415 - only a failed worker's file is read: a clean launch never pays for json

    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    msg = data.get("message")
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") if isinstance(msg.get("extraInfo"), dict) else {}
        assert isinstance(extra, dict)
        return WorkerError(
            message=str(msg.get("message", "")),
            traceback=str(extra.get("py_callstack", "")),
            timestamp=_int(extra.get("timestamp", 0)),
        )
    if isinstance(msg, str):
        return WorkerError(message=msg, traceback="", timestamp=_int(data.get("timestamp", 0)))
    return None


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def read_error_file(path: str) -> WorkerError | None:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return parse_error_json(fh.read())
    except OSError:
        return None


def error_json(message: str, py_callstack: str, timestamp: int, error_code: int | None = None,
               extra: Mapping[str, str] | None = None) -> str:
    body: dict[str, Any] = {"message": message,
                            "extraInfo": {"py_callstack": py_callstack, "timestamp": str(timestamp), **(extra or {})}}
    if error_code is not None:
        body["errorCode"] = error_code
    import json  # noqa: PLC0415 - see parse_error_json

    return json.dumps({"message": body})


def write_error_file(path: str, content: str) -> None:
    """Write atomically (a reader never sees half a file)."""
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(content)
    os.replace(tmp, path)


def record_exception(exc: BaseException, path: str | None) -> None:
    """What ``@record`` does for the ``--run-path`` shim: dump ``exc`` in torch's format."""
    if not path:
        return
    text = "".join(traceback.format_exception(exc))
    message = f"{type(exc).__name__}: {exc}"
    write_error_file(path, error_json(message, text, int(time.time())))
