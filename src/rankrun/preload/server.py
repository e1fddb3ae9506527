"""The preloading process's loop: tell the launcher the import's outcome, then for each ``fork`` request check that
the state is safe to fork (``safety``) and fork the worker's intermediate; the next request is served while it forks
the worker.

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
import select
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
    if not _ready(sock, control, seconds):
        return None
    pending: dict[int, tuple[object, int]] = {}  # an intermediate's pid pipe → (the request's id, its pid)
    while True:
        ready = select.select([control, *pending], [], [])[0]
        for fd in ready:
            if fd in pending:
                _answer(sock, fd, *pending.pop(fd))
        if control not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, wire.LIMIT, wire.FDS)
        except OSError:
            data, fds = b"", []
        if not data:  # the launcher is done: answer what is under way (it reaps those workers), then leave
            for fd, (asked, first) in list(pending.items()):
                _answer(sock, fd, asked, first)
            return None
        request = _request(data, fds)
        if request is not None and _fork(sock, control, request, fds, pending):
            sock.close()  # the worker's: nothing of the control socket
            return request, fds, prctl


def _request(data: bytes, fds: list[int]) -> dict[str, Any] | None:
    """A fork request, or ``None`` (its descriptors closed) for anything else."""
    try:
        kind, body = wire.decode(data)
    except ValueError:
        kind, body = "", {}
    if kind == "fork" and len(fds) == wire.FDS:
        return body
    _close(fds)
    return None


def _fork(sock: socket.socket, control: int, request: dict[str, Any], fds: list[int],
          pending: dict[int, tuple[object, int]]) -> bool:
    """Start the request's worker, if safe (else refuse it); True in the worker."""
    why = safety.verdict(safety.facts(control))
    started = _intermediate(list(pending)) if why is None else None
    if started == (-1, 0):
        return True
    _close(fds)  # the intermediate has them: no later worker may inherit them (an output pipe held open)
    if started is None:
        sock.send(wire.encode("refused", {"id": request.get("id"), "why": why or "fork() failed"}))
    else:
        pending[started[0]] = (request.get("id"), started[1])
    return False


def _ready(sock: socket.socket, control: int, seconds: float) -> bool:
    """Make the imports' state the one every worker is forked from, and tell the launcher whether it is safe."""
    _throwaway()
    gc.collect()
    gc.freeze()  # what the imports made, out of the collector's sight: a worker's collections never write to its pages
    why = safety.verdict(safety.facts(control))
    if why is not None:
        sock.send(wire.encode("unsafe", {"why": why, "seconds": seconds}))
        return False
    sock.send(wire.encode("ready", {"pid": os.getpid(), "seconds": seconds}))
    return True


def _answer(sock: socket.socket, said: int, asked: object, first: int) -> None:
    """The intermediate ``first`` said its worker's pid on ``said`` and is gone: reap it (the worker is the
    launcher's child by then), and tell the launcher."""
    with open(said, "rb") as pipe:
        data = pipe.read()  # until the intermediate has exited
    os.waitpid(first, 0)
    if data:
        sock.send(wire.encode("forked", {"id": asked, "pid": int(data)}))
    else:
        sock.send(wire.encode("refused", {"id": asked, "why": "fork() failed"}))


def _throwaway() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _intermediate(others: list[int]) -> tuple[int, int] | None:
    """Fork an intermediate that forks the worker and exits at once. Here: its pid pipe and its pid (the next request
    is served while it forks); ``(-1, 0)`` in the worker; ``None`` if the fork failed. ``others``: the pid pipes of the
    intermediates still under way, which neither it nor its worker keeps."""
    r, w = os.pipe()
    try:
        first = os.fork()
    except OSError:
        _close([r, w])
        return None
    if first:
        os.close(w)
        return r, first
    os.close(r)  # the intermediate: fork the worker, say its pid, and go
    _close(others)
    try:
        second = os.fork()
    except BaseException:  # nothing of the intermediate may outlive this
        os._exit(1)
    if second == 0:
        os.close(w)
        return -1, 0
    try:
        os.write(w, b"%d" % second)
    finally:
        os._exit(0)


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
