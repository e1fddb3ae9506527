"""The preloading process's loop: tell the launcher the import's outcome, then for each ``fork`` request check that
the state is safe to fork (``safety``) and fork the worker, one request at a time.

The worker is forked twice (the process forks an intermediate, which forks the worker and exits at once): orphaned,
the worker is re-parented to the nearest subreaper, the launcher (``rankrun.proc.watchdog.become_subreaper``), before
the intermediate is reaped here, so when ``forked`` reaches the launcher the worker is already its child: the launcher
waits for it, signals it by pidfd and reads its exact exit status as a cold worker's, and a dead preloading process
takes no running worker with it. (The standard library's forkserver stays the parent and reports exit statuses over
its socket instead: the launcher could not ``waitpid``, and the server's death would end every worker.)

After the imports, everything they made is frozen out of the garbage collector's sight (``gc.freeze``, after one
collection): a worker's collections then never write to those objects' pages, so the workers keep sharing them with
this process (measured: 4 workers' unique memory after ``import torch`` and a collection, 168 MiB without, 23 MiB with;
cold, 570 MiB). What was frozen is never collected, in the workers either, as CPython's documentation advises for a
process that forks.

Right after the imports, one throwaway fork lets every library's at-fork handler run once: a thread pool that takes
itself down at a fork (OpenBLAS's, which ``import numpy`` starts) is gone, so the safety check can demand one thread.
"""

from __future__ import annotations

import ctypes
import fcntl  # noqa: F401 - loaded here, before any fork: the child takes its terminal with it
import gc
import os
import socket
import termios  # noqa: F401 - the same
import traceback
from typing import Any

from rankrun.preload import safety, wire

Forked = tuple[dict[str, Any], list[int], Any]  # the request, its descriptors, libc's prctl


def failed(control: int, module: str, exc: BaseException) -> None:
    """Tell the launcher that ``module`` could not be imported, with the error's last line."""
    line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    with socket.socket(fileno=control) as sock:
        sock.send(wire.encode("error", {"module": module, "line": line}))


def serve(control: int, seconds: float) -> Forked | None:
    """Serve until the launcher closes the socket (``None``), or return in a forked worker, with its request."""
    sock = socket.socket(fileno=control)
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _throwaway()
    gc.collect()
    gc.freeze()  # what the imports made, out of the collector's sight: a worker's collections never write to its pages
    why = safety.verdict(safety.facts(control))
    if why is not None:
        sock.send(wire.encode("unsafe", {"why": why, "seconds": seconds}))
        return None
    sock.send(wire.encode("ready", {"pid": os.getpid(), "seconds": seconds}))
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, wire.LIMIT, wire.FDS)
        except OSError:
            return None
        if not data:
            return None
        try:
            kind, body = wire.decode(data)
        except ValueError:
            kind, body = "", {}
        if kind != "fork" or len(fds) != wire.FDS:
            _close(fds)
            continue
        why = safety.verdict(safety.facts(control))
        pid = _double_fork() if why is None else -1
        if pid == 0:
            sock.close()  # the worker's: nothing of the control socket
            return body, fds, prctl
        _close(fds)
        if pid > 0:
            sock.send(wire.encode("forked", {"id": body.get("id"), "pid": pid}))
        else:
            sock.send(wire.encode("refused", {"id": body.get("id"), "why": why or "fork() failed"}))


def _throwaway() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _double_fork() -> int:
    """0 in the worker; the worker's pid here (re-parented to the launcher by now); -1 if a fork failed."""
    r, w = os.pipe()
    try:
        first = os.fork()
    except OSError:
        _close([r, w])
        return -1
    if first == 0:  # the intermediate: fork the worker, say its pid, and go
        os.close(r)
        try:
            second = os.fork()
        except BaseException:
            os._exit(1)
        if second == 0:
            os.close(w)
            return 0
        try:
            os.write(w, b"%d" % second)
        finally:
            os._exit(0)
    os.close(w)
    with open(r, "rb") as said:
        data = said.read()  # until the intermediate has exited: the worker is the launcher's by then
    os.waitpid(first, 0)
    return int(data) if data else -1


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
