"""The messages between the launcher and the preloading process: pure, shared by both sides.

One message is one datagram of a ``SOCK_SEQPACKET`` socket pair (no framing, descriptors attached with
``SCM_RIGHTS``): a JSON object ``{"v": 1, KIND: BODY}``, never pickle (the launcher reads it). The pair is anonymous, so
no other process can connect to either end. Launcher to process: ``fork`` (the cold worker's exact command line, its
environment, working directory, and four descriptors: stdin, stdout, stderr and the go pipe). Process to launcher:
first one of ``ready``, ``unsafe`` or ``error`` (the import), then for each ``fork`` one ``forked`` (the worker's pid)
or ``refused`` (why: a cold start instead).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

VERSION = 1
LIMIT = 4 << 20  # bytes of one message: the socket's buffers are raised to it (a large environment is ~50 KB)
FDS = 4  # stdin, stdout, stderr, go


def encode(kind: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"v": VERSION, kind: body}, separators=(",", ":")).encode()


def decode(data: bytes) -> tuple[str, dict[str, Any]]:
    """The message's kind and body; ``ValueError`` for anything else (another version, not one object)."""
    obj = json.loads(data)
    if not isinstance(obj, dict) or obj.get("v") != VERSION or len(obj) != 2:
        raise ValueError(f"not a preload message of version {VERSION}")
    kind = next(key for key in obj if key != "v")
    body = obj[kind]
    if not isinstance(body, dict):
        raise ValueError(f"preload message {kind!r} without a body")
    return kind, body


def forkable(argv: Sequence[str], python: str) -> bool:
    """Whether a worker's command line is one the preloading process can become: the workers' interpreter running a
    script (``python -u SCRIPT ...``) or a module (``python -u -m MODULE ...``), as ``agent.attempt.worker_argv``
    writes them. Anything else starts cold."""
    if len(argv) < 3 or argv[0] != python or argv[1] != "-u":
        return False
    if argv[2] == "-m":
        return len(argv) >= 4 and bool(argv[3]) and not argv[3].startswith("-")
    return not argv[2].startswith("-")


def path0(argv: Sequence[str], cwd: str) -> str:
    """``sys.path[0]`` of the cold interpreter ``argv`` starts in ``cwd``: the script's folder (its link resolved, as
    CPython does), or the working directory for ``-m``."""
    if argv[2] == "-m":
        return cwd
    return os.path.dirname(os.path.realpath(os.path.join(cwd, argv[2])))
