"""Everything a worker can observe of how it was started, as JSON, for comparing a worker forked by ``--preload``
with a cold one (``tests/integration/test_preload_parity.py``).

Writes ``$PROBE_OUT/<RANK>.<TORCHELASTIC_RESTART_COUNT>.json``, prints one ``probe RANK`` line, then ends as
``PROBE_END`` says (``PROBE_END_<RANK>_<ATTEMPT>`` for one rank's attempt only): ``ok`` (default), ``exit3`` (``sys.exit(3)``), ``exit5``
(``os._exit(5)``), ``raise`` (an uncaught exception), ``kbint`` (an uncaught ``KeyboardInterrupt``), ``wait`` (prints
``WAITING`` and sleeps until the launcher stops it: the stacks tests ask it meanwhile), ``stdin`` (reads stdin whole, into
the JSON), ``input`` (answers ``input()`` on its terminal). On the way out an atexit handler and a non-daemon thread
each append a line to ``$PROBE_OUT/<RANK>.marks``.
"""

import atexit
import ctypes
import fcntl
import json
import os
import random
import signal
import stat
import sys
import threading
import time

import __main__

PR_GET_PDEATHSIG = 2


def _fd_kind(fd: int) -> list[object]:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ["gone"]
    kind = target.split(":")[0] if target.split(":")[0] in ("pipe", "socket", "anon_inode") else target
    if kind.startswith("/dev/pts/"):
        kind = "/dev/pts"  # each launcher's terminal is a fresh one
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        cloexec = bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
    except OSError:
        return [kind, "closed"]
    return [kind, flags & ~os.O_LARGEFILE if hasattr(os, "O_LARGEFILE") else flags, cloexec]


def _fds() -> dict[str, object]:
    listing = os.listdir("/proc/self/fd")  # its own descriptor is in the listing, closed by now: "gone"
    return {name: _fd_kind(int(name)) for name in sorted(listing, key=int) if _fd_kind(int(name)) != ["gone"]}


def _stdio(stream: object) -> dict[str, object]:
    s = stream  # a TextIOWrapper
    return {
        "type": type(s).__name__, "fileno": s.fileno(), "isatty": s.isatty(), "encoding": s.encoding,
        "errors": s.errors, "line_buffering": s.line_buffering, "write_through": s.write_through,
        "buffer": type(s.buffer).__name__, "raw": type(getattr(s.buffer, "raw", s.buffer)).__name__,
        "name": s.name, "mode": s.mode, "seekable": s.seekable(), "readable": s.readable(), "writable": s.writable(),
        "closed": s.closed, "fstat_mode": stat.S_IFMT(os.fstat(s.fileno()).st_mode),
    }


def _disposition(handler: object) -> str:
    if handler in (signal.SIG_DFL, signal.SIG_IGN, None):
        return str(handler)
    return getattr(handler, "__qualname__", type(handler).__name__)


def _status(keys: tuple[str, ...]) -> dict[str, str]:
    with open("/proc/self/status") as fh:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)
    return {k: fields.get(k, "").strip() for k in keys}


def _terminal() -> list[object]:
    """Whether stdin is a terminal, and if so whether it is this process's controlling one, its group in front."""
    if not os.isatty(0):
        return [False]
    try:
        with open("/dev/tty", "rb", buffering=0):
            controlling = True
    except OSError:
        controlling = False
    return [True, controlling, os.tcgetpgrp(0) == os.getpgrp()]


def _pdeathsig() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    value = ctypes.c_int(-1)
    libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(value), 0, 0, 0)
    return value.value


def observe() -> dict[str, object]:
    import resource  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    return {
        "name": __name__,
        "main_is_this": main is __main__,
        "main_keys": sorted(vars(main)),
        "file": getattr(main, "__file__", None),
        "cached": getattr(main, "__cached__", "absent"),
        "package": getattr(main, "__package__", "absent"),
        "doc": getattr(main, "__doc__", "absent") is not None,
        "builtins": type(vars(main).get("__builtins__")).__name__,
        "spec": None if spec is None else [spec.name, spec.origin, type(spec.loader).__name__, spec.parent],
        "loader": type(getattr(main, "__loader__", None)).__name__,
        "loader_path": getattr(getattr(main, "__loader__", None), "path", None),
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "executable": sys.executable,
        "path": sys.path,
        "cwd": os.getcwd(),
        "environ": dict(os.environ),
        "flags": list(sys.flags),
        "xoptions": sys._xoptions,
        "warnoptions": sys.warnoptions,
        "warning_filters": [repr(f) for f in warnings.filters],
        "recursionlimit": sys.getrecursionlimit(),
        "switchinterval": sys.getswitchinterval(),
        "hooks": [sys.excepthook is sys.__excepthook__, sys.displayhook is sys.__displayhook__,
                  sys.gettrace() is None, sys.getprofile() is None, sys.breakpointhook is sys.__breakpointhook__],
        "std_is_dunder": [sys.stdin is sys.__stdin__, sys.stdout is sys.__stdout__, sys.stderr is sys.__stderr__],
        "stdin": _stdio(sys.stdin), "stdout": _stdio(sys.stdout), "stderr": _stdio(sys.stderr),
        "own_session": os.getsid(0) == os.getpid(),
        "own_group": os.getpgid(0) == os.getpid(),
        "pdeathsig": _pdeathsig(),
        "ppid": os.getppid(),
        "fds": _fds(),
        "signals": {signal.Signals(s).name: _disposition(signal.getsignal(s))
                    for s in sorted(signal.valid_signals()) if s < signal.SIGRTMIN and s not in (9, 19)},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "status": _status(("SigBlk", "SigIgn", "SigCgt", "NoNewPrivs", "Seccomp", "CapEff", "Threads",
                           "Cpus_allowed_list", "Mems_allowed_list")),
        "affinity": sorted(os.sched_getaffinity(0)),
        "umask": os.umask(os.umask(0o22)),
        "nice": os.nice(0),
        "sched": os.sched_getscheduler(0),
        "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")},
        "terminal": _terminal(),
        "oom_score_adj": open("/proc/self/oom_score_adj").read().strip(),
        "threads": [t.name for t in threading.enumerate()],
        "main_thread": threading.main_thread() is threading.current_thread(),
        "random": random.random(),
        "modules": sorted(sys.modules),
        "pid": os.getpid(),
    }


def _mark(line: str) -> None:
    with open(os.path.join(os.environ["PROBE_OUT"], f"{os.environ['RANK']}.marks"), "a") as fh:
        fh.write(line + "\n")


def _late_thread() -> None:
    threading.Event().wait(0.2)  # still running when the main thread ends: the interpreter must join it
    _mark("thread joined")


def _end(how: str, seen: dict[str, object]) -> None:
    if how == "wait":
        _write(seen)
        print("WAITING", os.environ["RANK"])
        time.sleep(600)  # until the launcher stops it: the stacks tests ask for its stacks meanwhile
        return
    if how == "stdin":
        seen["read"] = sys.stdin.read()
    elif how == "input":
        seen["answer"] = input("name? ")
    _write(seen)
    print("probe", os.environ["RANK"])
    atexit.register(_mark, "atexit ran")
    threading.Thread(target=_late_thread, name="late").start()
    if how == "exit3":
        sys.exit(3)
    if how == "exit5":
        os._exit(5)
    if how == "raise":
        fail("a probe's failure")
    if how == "kbint":
        raise KeyboardInterrupt


def _write(seen: dict[str, object]) -> None:
    name = f"{os.environ['RANK']}.{os.environ['TORCHELASTIC_RESTART_COUNT']}.json"
    with open(os.path.join(os.environ["PROBE_OUT"], name), "w") as fh:
        json.dump(seen, fh)


def fail(message: str) -> None:
    raise ValueError(message)


def _how() -> str:
    mine = f"PROBE_END_{os.environ['RANK']}_{os.environ['TORCHELASTIC_RESTART_COUNT']}"
    return os.environ.get(mine, os.environ.get("PROBE_END", "ok"))


if __name__ == "__main__":
    _end(_how(), observe())
