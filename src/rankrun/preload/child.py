"""What a forked worker does before the user's code: become the worker a cold start would have started.

In order: its own session and process group (pgid = pid, what the watchdog registers); the launcher's descriptors
on 0, 1 and 2 (and the terminal, for a rank on a pseudo-terminal), nothing else of the preloading process's kept but
what a preloaded module opened (a cold worker opens it too); its CPUs (``--numa-binding``: one thread now, so the mask
covers the process); then it waits for the launcher's go, which comes once the launcher holds its pidfd and the
watchdog knows its group, so no user code runs unwatched; ``PR_SET_PDEATHSIG`` (set now, after the re-parenting,
it fires when the launcher's main thread dies, as a cold worker's); the worker's working directory, environment and
command line; the random generators a fork copies reseeded (``random`` does so itself at a fork; numpy's global
state and torch's default generator do not: every rank would draw the same numbers); the stack shim's per-worker part
(``rankrun.stacks.shim.sitecustomize.attach``); rankrun's own modules forgotten; then the script or module runs as
``__main__``, as ``python -u SCRIPT`` or ``python -u -m MODULE`` runs it.

What still tells a forked worker from a cold one is listed in docs/design.md ("Warm starts"): the preloaded modules
in ``sys.modules``, ``/proc/<pid>/cmdline``
and ``/proc/<pid>/environ`` (the process's: what ``_environ`` reads),
the hash seed, import-time work done once per node, and the preloading process's frames under the user's
(``traceback.print_stack``, ``rankrun --stacks``). ``tests/integration/test_preload_parity.py`` compares the rest.
"""

from __future__ import annotations

import atexit
import fcntl
import io
import os
import signal
import sys
import termios
import types
from collections.abc import Set
from typing import Any

_PR_SET_PDEATHSIG = 1
_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def run(forked: tuple[dict[str, Any], list[int], Any], base: Set[str], loaded: Set[str]) -> None:
    """Become the worker the request describes and run its code; returns when it ends normally."""
    request, fds, prctl = forked
    _attach(request, fds, prctl)
    _fresh_stdin()
    os.chdir(request["cwd"])
    _environ(request["env"])
    argv: list[str] = request["argv"]
    process_path0 = _process_path0()
    sys.orig_argv[:] = argv
    _reseed()
    if "RANKRUN_STACKS_FILE" in os.environ or "RANKRUN_FR_FILE" in os.environ:
        before = frozenset(sys.modules)
        from rankrun.stacks.shim import sitecustomize  # noqa: PLC0415 - the worker's shim, as a cold one runs it

        sitecustomize.attach()
        # What the shim imported stays, as in a cold worker: faulthandler, once out of sys.modules, is collected with
        # the channel it holds, which closes the stacks file's descriptor (a later open() would take its number)
        loaded = loaded | {name for name in sys.modules.keys() - before if name.split(".")[0] != "rankrun"}
        if "sitecustomize" not in sys.modules:  # a cold worker's shim is ``sitecustomize`` (or the user's, chained)
            sys.modules["sitecustomize"] = sitecustomize
            loaded = loaded | {"sitecustomize"}
    _forget(base, loaded)
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=sys.modules["builtins"], __annotations__={})  # as the interpreter's __main__
    sys.modules["__main__"] = main
    try:
        if argv[2] == "-m":
            sys.argv[:] = ["-m", *argv[4:]]
            _path0(process_path0, os.getcwd())
            import runpy  # noqa: PLC0415 - after _forget: loaded as `python -m` loads it

            runpy._run_module_as_main(argv[3])  # type: ignore[attr-defined]  # what `python -m` calls
        else:
            _run_script(main, argv[2], argv[3:], process_path0)
    except SystemExit:
        raise
    except BaseException as exc:
        _uncaught(exc)


def _attach(request: dict[str, Any], fds: list[int], prctl: Any) -> None:
    os.setsid()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in set(fds[:3]):
        os.close(fd)
    go = fds[3]
    if request.get("tty"):
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    if request.get("cpus") is not None:
        try:
            os.sched_setaffinity(0, request["cpus"])
        except OSError:
            os._exit(126)
    said = os.read(go, 1)
    os.close(go)
    if said != b"g":
        os._exit(1)  # the launcher gave up on it, or died: nothing of the user's ran
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != request["launcher"]:
        os._exit(1)  # the launcher died between the go and prctl: follow it now


def _environ(env: dict[str, str]) -> None:
    """The worker's environment, with what the preloaded modules changed in it at import (a cold worker's import
    makes the same change): the process's changes since its start, whose environment ``/proc/self/environ`` still
    shows (Python's writes go to new memory), put over ``env``."""
    with open("/proc/self/environ", "rb") as source:
        started = dict(item.partition(b"=")[::2] for item in source.read().split(b"\0") if b"=" in item)
    now = os.environb
    changed = {k: v for k, v in now.items() if started.get(k) != v}
    gone = started.keys() - now.keys()
    os.environ.clear()
    os.environ.update(env)
    os.environb.update(changed)
    for key in gone:
        os.environb.pop(key, None)


def _fresh_stdin() -> None:
    """``sys.stdin`` made again on the worker's descriptor 0, as the interpreter makes it at start: the preloading
    process's was made on ``/dev/null``, and its layers keep what they learnt of it (seekable, the block size), so a
    pipe or a terminal would say ``seekable()``. Left alone if a preloaded module replaced it (it wraps the old one,
    which reads the new descriptor 0 too). stdout and stderr are the same kind as the process's (pipes, or a terminal
    where stdin is one too: it is remade): nothing of theirs differs."""
    old = sys.stdin
    if old is not sys.__stdin__ or old is None:
        return
    buffered: Any = open(0, "rb", closefd=False)  # noqa: SIM115 - the interpreter's own stdin, never closed
    buffered.raw.name = "<stdin>"
    # line_buffering and write_through as the process's: under -u (every forked worker's, ``wire.forkable``) they
    # do not depend on what the descriptor is
    stdin = io.TextIOWrapper(buffered, old.encoding, old.errors, "\n", old.line_buffering, old.write_through)
    stdin.mode = "r"  # type: ignore[misc]
    sys.stdin = stdin
    setattr(sys, "__stdin__", stdin)  # noqa: B010 - typeshed calls it Final: the interpreter sets it, as here


def _reseed() -> None:
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    torch = sys.modules.get("torch")
    generator = getattr(torch, "default_generator", None)
    if generator is not None:
        generator.seed()  # not torch.seed(): that also seeds CUDA's generators, which a fresh interpreter leaves alone


def _forget(base: Set[str], loaded: Set[str]) -> None:
    """Drop the modules a cold worker would not have: what rankrun loaded after the user's imports, and rankrun's own
    from before them (unless a preloaded module is rankrun's: then only this package)."""
    users = any(name.split(".")[0] == "rankrun" for name in loaded - base)
    for name in list(sys.modules):
        ours = name in base and name.split(".")[0] == "rankrun" and (not users or name.startswith("rankrun.preload"))
        if name not in loaded or ours:
            del sys.modules[name]


def _process_path0() -> str | None:
    """The ``sys.path[0]`` the preloading process was given (``python -u .../__main__.py CONTROL PATH0 ...``)."""
    argv = sys.orig_argv
    at = next((i for i, arg in enumerate(argv) if arg == os.path.join(_HERE, "__main__.py")), -1)
    return argv[at + 2] if 0 <= at < len(argv) - 2 else None


def _path0(process: str | None, worker: str) -> None:
    """The worker's script folder (or, for -m, working directory) where the process's is in ``sys.path``, not at
    index 0: a preloaded module may have put an entry before it at import, as it does in a cold worker."""
    if not sys.flags.safe_path and process != worker and process in sys.path:
        sys.path[sys.path.index(process)] = worker


def _run_script(main: types.ModuleType, script: str, args: list[str], process_path0: str | None) -> None:
    sys.argv[:] = [script, *args]
    path = os.path.abspath(script)
    _path0(process_path0, os.path.dirname(os.path.realpath(script)))
    try:
        with open(path, "rb") as source:
            text = source.read()
    except OSError as exc:
        sys.stderr.write(f"{sys.executable}: can't open file {path!r}: [Errno {exc.errno}] {exc.strerror}\n")
        raise SystemExit(2) from None
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path)
    main.__dict__.update(__file__=path, __cached__=None, __loader__=loader, __spec__=None, __package__=None)
    exec(compile(text, path, "exec"), main.__dict__)  # noqa: S102 - what `python SCRIPT` does


def _uncaught(exc: BaseException) -> None:
    """Print ``exc`` as Python does for an uncaught exception, from the user's frames on, and end as Python would:
    exit 1, or death by SIGINT for ``KeyboardInterrupt`` (after the exit handlers)."""
    tb, start = exc.__traceback__, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(_HERE):
            start = tb.tb_next
        tb = tb.tb_next
    sys.excepthook(type(exc), exc.with_traceback(start), start)  # the hook prints the exception's own traceback
    if not isinstance(exc, KeyboardInterrupt):
        raise SystemExit(1)
    threading = sys.modules.get("threading")
    if threading is not None:
        threading._shutdown()  # what Python does first on its way out
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
