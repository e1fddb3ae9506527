"""``python -m rankrun`` and the ``rankrun`` console script.

The death-signal catcher is installed before anything else is imported, so a signal that
arrives while the launcher is still starting is recorded, never fatal.
"""

import contextlib
import os
import sys

from rankrun.proc.early import EarlyCatcher


def main_exit(*, legacy: bool = False) -> None:
    """Launch, and exit with the job's code; ``legacy``: ``python -m rankrun.launch``'s contract."""
    catcher = EarlyCatcher.install()
    _reopen_closed_stdio()

    # asyncio imports ssl eagerly (about 4 MB resident, 13 ms); the launcher speaks TLS only to an
    # etcd over https, and asyncio works without it. Workers are fresh interpreters and are not affected.
    if not _may_need_tls(sys.argv[1:], os.environ):
        sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]

    from rankrun.cli import main  # noqa: PLC0415 - after the catcher, on purpose

    code = main(catcher=catcher, legacy=legacy)
    catcher.settle()  # decided: a late signal must not turn it into a death by that signal during exit
    _exit_now(code)


def _exit_now(code: int) -> None:
    """Exit without the interpreter's teardown of every module (~15 ms, a sixth of the launch floor).

    Nothing rankrun leaves behind needs it: the console writes through its own file descriptors and is
    closed by now, worker log files are closed with their attempt, the event loop joined its threads,
    and the watchdog was told to exit. What Python itself buffered (``--help``, ``--version``) is
    flushed here; a reader that went away (``rankrun --help | head -1``) is no error of the launch.
    """
    if (logging := sys.modules.get("logging")) is not None:
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # None, a closed pipe, a closed file
            stream.flush()
    os._exit(code)


def _may_need_tls(argv: list[str], env: "os._Environ[str]") -> bool:
    """An etcd endpoint or ``--rdzv-conf protocol=https`` anywhere in the options (or their PET_ variables)."""
    texts = [*argv, env.get("PET_RDZV_ENDPOINT", ""), env.get("PET_RDZV_CONF", "")]
    return any("https" in text for text in texts)


def _reopen_closed_stdio() -> None:
    """Started with fd 0, 1 or 2 closed (``2>&-``), the next ``pipe()`` would land there and be
    clobbered later (the watchdog's pipe, the event loop's fds). Park /dev/null on them first."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


if __name__ == "__main__":
    main_exit()
